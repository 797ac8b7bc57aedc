package provdb

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
	"github.com/kipimo-hpc/kipimo/internal/provenance/storetest"
)

func filledStore(t *testing.T) (*sqlitestore.Store, []provenance.Exec) {
	t.Helper()
	ctx := context.Background()
	s, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "prov.db"), sqlitestore.Options{Synchronous: "OFF"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	execs := storetest.Generate(storetest.GenConfig{Seed: 9, N: 300, Anomaly: true})
	if err := s.Write(ctx, provenance.Batch{Kind: provenance.KindAnomalies, Execs: execs}); err != nil {
		t.Fatal(err)
	}
	return s, execs
}

func get(t *testing.T, srv *httptest.Server, path, token string) (int, []byte, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, body, resp.Header
}

func TestHTTPAPI(t *testing.T) {
	s, execs := filledStore(t)
	srv := httptest.NewServer(NewHTTPHandler(s, "", WithAllowOrigin("http://127.0.0.1:8080")))
	defer srv.Close()
	ctx := context.Background()

	t.Run("records match the store", func(t *testing.T) {
		for _, raw := range []string{"", "rank=3&sort=runtime_total&order=desc&limit=5", "func_re=%5EMPI_&min_score=20", "gpu=true", "step_min=2&step_max=4&kind=anomalies"} {
			code, body, hdr := get(t, srv, "/api/v1/records?"+raw, "")
			if code != http.StatusOK {
				t.Fatalf("%s: %d %s", raw, code, body)
			}
			if hdr.Get("Access-Control-Allow-Origin") != "http://127.0.0.1:8080" {
				t.Fatalf("CORS header %q", hdr.Get("Access-Control-Allow-Origin"))
			}
			var got struct{ Records []provenance.Exec }
			if err := json.Unmarshal(body, &got); err != nil {
				t.Fatal(err)
			}
			v, _ := url.ParseQuery(raw)
			q, err := provenance.ParseQuery(v)
			if err != nil {
				t.Fatal(err)
			}
			want, err := s.Query(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			if len(want) == 0 {
				t.Fatalf("%s: test query matches nothing", raw)
			}
			if !reflect.DeepEqual(got.Records, want) {
				t.Fatalf("%s: %d records differ from the store's %d", raw, len(got.Records), len(want))
			}
		}
	})
	t.Run("one record whole", func(t *testing.T) {
		e := execs[17]
		code, body, _ := get(t, srv, "/api/v1/records/anomalies/0/"+url.PathEscape(e.EventID), "")
		if code != http.StatusOK {
			t.Fatalf("%d %s", code, body)
		}
		var got provenance.Exec
		if err := json.Unmarshal(body, &got); err != nil || !reflect.DeepEqual(got, e) {
			t.Fatalf("record differs (%v)", err)
		}
		if code, _, _ := get(t, srv, "/api/v1/records/anomalies/0/99:99:99", ""); code != http.StatusNotFound {
			t.Fatalf("missing record: %d", code)
		}
	})
	t.Run("count and aggregate", func(t *testing.T) {
		code, body, _ := get(t, srv, "/api/v1/count?rank=1", "")
		var c struct{ Count int64 }
		if code != 200 || json.Unmarshal(body, &c) != nil {
			t.Fatalf("%d %s", code, body)
		}
		want := 0
		for _, e := range execs {
			if e.RID == 1 {
				want++
			}
		}
		if c.Count != int64(want) {
			t.Fatalf("count %d, want %d", c.Count, want)
		}
		code, body, _ = get(t, srv, "/api/v1/aggregate?by=rank,func&limit=3", "")
		var a struct{ Groups []provenance.Group }
		if code != 200 || json.Unmarshal(body, &a) != nil {
			t.Fatalf("%d %s", code, body)
		}
		if w := storetest.Aggregate(execs, provenance.ByRankFunc, 3); !reflect.DeepEqual(a.Groups, w) {
			t.Fatalf("groups %+v, want %+v", a.Groups, w)
		}
	})
	t.Run("bad requests", func(t *testing.T) {
		for path, want := range map[string]string{
			"/api/v1/records?rnak=1":                `unknown query parameter \"rnak\"`,
			"/api/v1/records?sort=doc":              "cannot sort by",
			"/api/v1/records?by=rank":               "belongs to /api/v1/aggregate",
			"/api/v1/records?kind=metadata":         "cannot be listed",
			"/api/v1/aggregate?by=pid":              "cannot group by",
			"/api/v1/records/users/0/1:2:3":         "not anomalies or normalexecs",
			"/api/v1/records/anomalies/x/1:2:3":     "not a non-negative",
			"/api/v1/records/anomalies/0/1:2":       "not <rank>:<io_step>:<idx>",
			"/api/v1/count?func_re=%28":             "func_re",
			"/api/v1/health?verbose=1":              "no parameters",
			"/api/v1/records?limit=1&limit=2":       "given 2 times",
			"/api/v1/records?step_min=9&step_max=1": "empty",
		} {
			code, body, _ := get(t, srv, path, "")
			if code != http.StatusBadRequest || !strings.Contains(string(body), want) {
				t.Errorf("%s: %d %s, want 400 with %q", path, code, body, want)
			}
		}
		resp, err := srv.Client().Post(srv.URL+"/api/v1/records", "application/json", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("POST: %d, want 405", resp.StatusCode)
		}
	})
}

func TestHTTPToken(t *testing.T) {
	s, _ := filledStore(t)
	srv := httptest.NewServer(NewHTTPHandler(s, "s3cret"))
	defer srv.Close()
	for token, want := range map[string]int{"": 401, "wrong": 401, "s3cret": 200} {
		code, body, _ := get(t, srv, "/api/v1/health", token)
		if code != want {
			t.Errorf("token %q: %d %s, want %d", token, code, body, want)
		}
	}
}

// pageAnswer is an answer of /api/v1/records.
type pageAnswer struct {
	Records []provenance.Exec `json:"records"`
	Next    string            `json:"next"`
}

// TestHTTPRecordsPages follows the cursor of /api/v1/records through records
// whose sort values tie, and checks every record comes once, in order.
func TestHTTPRecordsPages(t *testing.T) {
	ctx := context.Background()
	s, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "prov.db"), sqlitestore.Options{Synchronous: "OFF"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	execs := storetest.TiedExecs(storetest.Generate(storetest.GenConfig{Seed: 11, N: 300, Programs: 2, Anomaly: true}))
	if err := s.Write(ctx, provenance.Batch{Kind: provenance.KindAnomalies, Execs: execs}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(NewHTTPHandler(s, "", WithListPage(37)))
	defer srv.Close()
	cases := []struct {
		name, params string
		wantPages    int // answers until one without "next"
		wantN        int // records in all
	}{
		{"all by entry", "limit=0", 9, 300},
		{"all by runtime, descending", "limit=0&sort=runtime_total&order=desc", 9, 300},
		{"all by score, filtered", "limit=0&sort=outlier_score&pid=1", 0, 0},
		{"limit pages", "limit=100&sort=runtime_exclusive", 3, 300},
		{"one page", "limit=300", 1, 300},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v, err := url.ParseQuery(tc.params)
			if err != nil {
				t.Fatal(err)
			}
			q, err := provenance.ParseQuery(v)
			if err != nil {
				t.Fatal(err)
			}
			q.Limit = provenance.NoLimit
			var want []string
			if err := s.Each(ctx, q, func(e provenance.Exec) error {
				want = append(want, provenance.ExecKey(e.PID, e.EventID))
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			var got []string
			pages := 0
			for cursor := ""; ; {
				p := url.Values{}
				for k, vs := range v {
					p[k] = vs
				}
				if cursor != "" {
					p.Set("cursor", cursor)
				}
				code, body, _ := get(t, srv, "/api/v1/records?"+p.Encode(), "")
				if code != http.StatusOK {
					t.Fatalf("%d: %s", code, body)
				}
				var a pageAnswer
				if err := json.Unmarshal(body, &a); err != nil {
					t.Fatal(err)
				}
				pages++
				for _, e := range a.Records {
					got = append(got, provenance.ExecKey(e.PID, e.EventID))
				}
				if a.Next == "" {
					break
				}
				cursor = a.Next
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("got %d records, want %d in the store's order", len(got), len(want))
			}
			if tc.wantPages > 0 && (pages != tc.wantPages || len(got) != tc.wantN) {
				t.Fatalf("%d answers, %d records; want %d, %d", pages, len(got), tc.wantPages, tc.wantN)
			}
		})
	}
	t.Run("a cursor of another order is refused", func(t *testing.T) {
		code, body, _ := get(t, srv, "/api/v1/records?limit=5", "")
		var a pageAnswer
		if err := json.Unmarshal(body, &a); err != nil || code != http.StatusOK || a.Next == "" {
			t.Fatalf("%d %s %v", code, body, err)
		}
		code, body, _ = get(t, srv, "/api/v1/records?sort=runtime_total&cursor="+a.Next, "")
		if code != http.StatusBadRequest || !strings.Contains(string(body), "another order") {
			t.Fatalf("%d %s", code, body)
		}
	})
	t.Run("an error after the first record cuts the answer", func(t *testing.T) {
		srv := httptest.NewServer(NewHTTPHandler(failingStore{s}, ""))
		defer srv.Close()
		resp, err := srv.Client().Get(srv.URL + "/api/v1/records?limit=0")
		if err != nil {
			return // cut before the headers went out
		}
		defer resp.Body.Close()
		var a pageAnswer
		if err := json.NewDecoder(resp.Body).Decode(&a); err == nil {
			t.Fatalf("a cut answer decoded whole: %d records", len(a.Records))
		}
	})
}

// failingStore fails each stream after its first record.
type failingStore struct{ provenance.Store }

func (f failingStore) Each(ctx context.Context, q provenance.Query, fn func(provenance.Exec) error) error {
	n := 0
	return f.Store.Each(ctx, q, func(e provenance.Exec) error {
		if n++; n > 1 {
			return errors.New("disk on fire")
		}
		return fn(e)
	})
}
