package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provdb"
	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
	"github.com/kipimo-hpc/kipimo/internal/provenance/storetest"
)

var updateQueryGolden = flag.Bool("update", false, "rewrite the golden files of kipimo query")

// queryStore fills a SQLite store with a fixed-seed set of anomalies and
// normal executions from two programs.
func queryStore(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	path, s := tempStore(ctx, t)
	defer s.Close()
	an := storetest.Generate(storetest.GenConfig{Seed: 2026, N: 300, Programs: 2, Ranks: 4, Steps: 6, Anomaly: true})
	ne := storetest.Generate(storetest.GenConfig{Seed: 2027, N: 60, Programs: 2, Ranks: 4, Steps: 6})
	for _, b := range []provenance.Batch{{Kind: provenance.KindAnomalies, Execs: an}, {Kind: provenance.KindNormalExecs, Execs: ne}} {
		if err := s.Write(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	meta, _, _, _ := storetest.GenerateOthers(0, 4)
	if err := s.Write(ctx, provenance.Batch{Kind: provenance.KindMetadata, Metadata: meta}); err != nil {
		t.Fatal(err)
	}
	return path
}

func runQuery(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	root := NewRoot(&out, &errb)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

// TestQueryGolden pins each kind of query's output, as a table and as JSON
// lines, read from the store directly and through provdb's HTTP API (both
// must print the same). Refresh with -update.
func TestQueryGolden(t *testing.T) {
	path := queryStore(t)
	st, err := sqlitestore.Open(context.Background(), path, sqlitestore.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	srv := httptest.NewServer(provdb.NewHTTPHandler(st, "tok"))
	defer srv.Close()
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("tok\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Pick a GPU anomaly to show.
	gpu, err := st.Query(context.Background(), provenance.Query{GPUOnly: true, PID: new(uint32), Limit: 1})
	if err != nil || len(gpu) == 0 {
		t.Fatalf("no GPU anomaly in the fixed set (%v)", err)
	}
	cases := []struct {
		name string
		args []string
	}{
		{"list_default", []string{"query", "list", "--limit", "12"}},
		{"list_rank_func_re_sorted", []string{"query", "list", "--rank", "2", "--func-re", "^MPI_", "--sort", "runtime_total", "--desc"}},
		{"list_filters", []string{"query", "list", "--pid", "1", "--tid", "0", "--step-min", "2", "--step-max", "3", "--min-runtime", "5000", "--min-score", "20", "--sort", "outlier_score", "--desc"}},
		{"list_time_gpu", []string{"query", "list", "--gpu", "--from", "1700000001000000", "--to", "1700000004000000", "--sort", "runtime_exclusive"}},
		{"list_func_exact_json", []string{"query", "list", "--func", "halo_exchange", "--limit", "3", "--json"}},
		{"list_normalexecs", []string{"query", "list", "--kind", "normalexecs", "--sort", "entry", "--limit", "8"}},
		{"show_gpu", []string{"query", "show", gpu[0].EventID}},
		{"show_json", []string{"query", "show", gpu[0].EventID, "--json"}},
		{"count_all", []string{"query", "count"}},
		{"count_filtered", []string{"query", "count", "--rank", "1", "--min-score", "50"}},
		{"count_metadata_json", []string{"query", "count", "--kind", "metadata", "--json"}},
		{"agg_rank", []string{"query", "agg", "--by", "rank"}},
		{"agg_func", []string{"query", "agg", "--by", "func"}},
		{"agg_step", []string{"query", "agg", "--by", "step", "--pid", "0"}},
		{"agg_rank_func", []string{"query", "agg", "--by", "rank,func", "--limit", "10"}},
		{"agg_rank_func_json", []string{"query", "agg", "--by", "rank,func", "--limit", "5", "--json"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := runQuery(t, append(tc.args, "--store", path)...)
			if err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", "query", tc.name+".golden")
			if *updateQueryGolden {
				if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if got != string(want) {
				t.Fatalf("output differs from %s:\n%s", golden, got)
			}
			viaHTTP, err := runQuery(t, append(tc.args, "--url", srv.URL, "--token-file", tokenFile)...)
			if err != nil {
				t.Fatal(err)
			}
			if viaHTTP != got {
				t.Fatalf("output through the HTTP API differs:\n%s", viaHTTP)
			}
		})
	}
}

func TestQueryErrors(t *testing.T) {
	path := queryStore(t)
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"bad sort", []string{"query", "list", "--sort", "doc"}, `cannot sort by "doc"`},
		{"bad regexp", []string{"query", "list", "--func-re", "(x"}, "--func-re"},
		{"empty step range", []string{"query", "count", "--step-min", "4", "--step-max", "1"}, "io_step range 4..1 is empty"},
		{"bad grouping", []string{"query", "agg", "--by", "host"}, `cannot group by "host"`},
		{"negative limit", []string{"query", "list", "--limit", "-1"}, `limit "-1" is not a non-negative integer`},
		{"list metadata", []string{"query", "list", "--kind", "metadata"}, "cannot be listed"},
		{"bad event id", []string{"query", "show", "12"}, `event_id "12"`},
		{"missing record", []string{"query", "show", "99:0:0"}, "not found"},
		{"both sources", []string{"query", "count", "--url", "http://127.0.0.1:1"}, "not both"},
		{"missing store", []string{"query", "count", "--store", filepath.Join(t.TempDir(), "none.db")}, "no such file"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if tc.name != "missing store" {
				args = append(args, "--store", path)
			}
			_, err := runQuery(t, args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// TestQueryListPaged lists with --limit 0 and with limits above one page
// through provdb's HTTP API in pages of 7 records, which must print what
// the store read directly prints.
func TestQueryListPaged(t *testing.T) {
	path := queryStore(t)
	st, err := sqlitestore.Open(context.Background(), path, sqlitestore.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	srv := httptest.NewServer(provdb.NewHTTPHandler(st, "", provdb.WithListPage(7)))
	defer srv.Close()
	cases := []struct {
		name  string
		args  []string
		lines int // records printed
	}{
		{"all", []string{"--limit", "0"}, 300},
		{"all by runtime, descending, json", []string{"--limit", "0", "--sort", "runtime_total", "--desc", "--json"}, 300},
		{"all of a function by score", []string{"--limit", "0", "--func", "MPI_Send", "--sort", "outlier_score"}, -1},
		{"limit above the total", []string{"--limit", "1000", "--sort", "runtime_exclusive"}, 300},
		{"limit", []string{"--limit", "20", "--json"}, 20},
		{"normal executions", []string{"--limit", "0", "--kind", "normalexecs", "--json"}, 60},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"query", "list"}, tc.args...)
			direct, err := runQuery(t, append(args, "--store", path)...)
			if err != nil {
				t.Fatal(err)
			}
			paged, err := runQuery(t, append(args, "--url", srv.URL)...)
			if err != nil {
				t.Fatal(err)
			}
			if paged != direct {
				t.Fatalf("paged through HTTP:\n%s\ndirect:\n%s", paged, direct)
			}
			n := strings.Count(direct, "\n")
			if !slices.Contains(tc.args, "--json") {
				n -= 2 // header and footer
			}
			if tc.lines >= 0 && n != tc.lines {
				t.Fatalf("%d records printed, want %d", n, tc.lines)
			}
		})
	}
}

// query show prints why an execution was flagged.
func TestQueryShowExplanation(t *testing.T) {
	ctx := context.Background()
	path, s := tempStore(ctx, t)
	e := storetest.Generate(storetest.GenConfig{Seed: 9, N: 1, Ranks: 1, Steps: 1, Anomaly: true})[0]
	e.Explanation = &provenance.Explanation{Key: e.Func, Value: 2100, NaturalMin: 12, NaturalMax: 700, LowThreshold: 2,
		Threshold: 980, Ratio: 3, P99: 310, LogSigmas: 6.1, Excess: 1400, Text: "3.0× the largest natural runtime of " + e.Func}
	if err := s.Write(ctx, provenance.Batch{Kind: provenance.KindAnomalies, Execs: []provenance.Exec{e}}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	out, err := runQuery(t, "query", "show", e.EventID, "--pid", strconv.FormatUint(uint64(e.PID), 10), "--store", path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"├─ why: 3.0× the largest natural runtime of " + e.Func,
		"natural range of " + e.Func + ": 12 to 700 µs; flagged below 2 or above 980 µs",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("query show lacks %q:\n%s", want, out)
		}
	}
}

// query list relabels anomalies with the final models' natural ranges (the
// func_stats records): final ones by default, unflagged ones on request,
// from the store and through provdb alike.
func TestQueryListFinalLabels(t *testing.T) {
	ctx := context.Background()
	path, s := tempStore(ctx, t)
	es := storetest.Generate(storetest.GenConfig{Seed: 11, N: 3, Ranks: 1, Steps: 1, Anomaly: true})
	for i, v := range []float64{500, 120, 10} { // beyond, inside, below the final range
		es[i].Explanation = &provenance.Explanation{Key: "k", Value: v, Text: "t"}
	}
	fs := []provenance.GlobalFuncStats{{Func: "k", Stats: provenance.FuncStats{Count: 1}, NaturalRange: &provenance.Range{Low: 50, High: 200}}}
	for _, b := range []provenance.Batch{{Kind: provenance.KindAnomalies, Execs: es}, {Kind: provenance.KindFuncStats, FuncStats: fs}} {
		if err := s.Write(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	st, err := sqlitestore.Open(ctx, path, sqlitestore.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	srv := httptest.NewServer(provdb.NewHTTPHandler(st, ""))
	defer srv.Close()
	want := map[string][]string{ // event ids by label
		provenance.FinalAnomalyLabel: {es[0].EventID, es[2].EventID},
		provenance.FinalUnflagged:    {es[1].EventID},
	}
	for _, src := range [][]string{{"--store", path}, {"--url", srv.URL}} {
		for _, tc := range []struct {
			labels string
			want   []string
		}{
			{"final", want[provenance.FinalAnomalyLabel]},
			{"unflagged", want[provenance.FinalUnflagged]},
			{"all", append(slices.Clone(want[provenance.FinalAnomalyLabel]), want[provenance.FinalUnflagged]...)},
		} {
			t.Run(src[0]+"/"+tc.labels, func(t *testing.T) {
				out, err := runQuery(t, append([]string{"query", "list", "--labels", tc.labels, "--limit", "0", "--json"}, src...)...)
				if err != nil {
					t.Fatal(err)
				}
				var got []string
				for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
					if l == "" {
						continue
					}
					var e provenance.Exec
					if err := json.Unmarshal([]byte(l), &e); err != nil {
						t.Fatal(err)
					}
					if !slices.Contains(want[e.FinalLabel], e.EventID) {
						t.Errorf("%s labelled %q", e.EventID, e.FinalLabel)
					}
					got = append(got, e.EventID)
				}
				slices.Sort(got)
				w := slices.Clone(tc.want)
				slices.Sort(w)
				if !slices.Equal(got, w) {
					t.Errorf("--labels %s listed %v, want %v", tc.labels, got, w)
				}
			})
		}
	}
	if _, err := runQuery(t, "query", "list", "--labels", "some", "--store", path); err == nil || !strings.Contains(err.Error(), "--labels") {
		t.Errorf("bad --labels: %v", err)
	}
}
