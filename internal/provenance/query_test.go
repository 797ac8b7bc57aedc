package provenance

import (
	"encoding/json"
	"net/url"
	"reflect"
	"strings"
	"testing"
)

func TestParseQuery(t *testing.T) {
	cases := []struct {
		name, raw string
		want      string // substring of the error; empty: accepted
	}{
		{"empty", "", ""},
		{"all filters", "kind=normalexecs&pid=1&rank=2&tid=0&func_re=%5EMPI_&step_min=1&step_max=9&from=10&to=20&min_runtime=5&min_score=2.5&gpu=true&sort=outlier_score&order=desc&limit=10", ""},
		{"unknown parameter", "rnak=1", `unknown query parameter "rnak"`},
		{"repeated", "rank=1&rank=2", `"rank" given 2 times`},
		{"negative rank", "rank=-1", `rank "-1"`},
		{"rank too big", "rank=4294967296", `rank "4294967296"`},
		{"bad step", "step_min=x", `step_min "x"`},
		{"empty step range", "step_min=5&step_max=1", "io_step range 5..1 is empty"},
		{"bad sort", "sort=doc", `cannot sort by "doc"`},
		{"injection in sort", "sort=entry%3BDROP%20TABLE%20anomalies", "cannot sort by"},
		{"bad order", "order=up", `order "up"`},
		{"negative limit", "limit=-1", `limit "-1"`},
		{"no limit", "limit=0", ""},
		{"huge limit", "limit=1000001", ""},
		{"cursor", "sort=runtime_total&order=desc&cursor=" + (&Cursor{Sort: SortRuntimeTotal, Desc: true, Value: 1 << 62, PID: 3, EventID: "1:2:3"}).String(), ""},
		{"score cursor", "sort=outlier_score&cursor=" + (&Cursor{Sort: SortOutlierScore, Score: 0.1, EventID: "1:2:3"}).String(), ""},
		{"cursor of another order", "sort=entry&cursor=" + (&Cursor{Sort: SortRuntimeTotal, EventID: "1:2:3"}).String(), "another order"},
		{"cursor of another direction", "cursor=" + (&Cursor{Sort: SortEntry, Desc: true, EventID: "1:2:3"}).String(), "another order"},
		{"bad cursor", "cursor=abc", `cursor "abc"`},
		{"cursor with a bad event id", "cursor=" + (&Cursor{Sort: SortEntry, EventID: "x"}).String(), "cursor"},
		{"bad regexp", "func_re=(a", "func_re"},
		{"func and func_re", "func=a&func_re=b", "not both"},
		{"nan score", "min_score=NaN", "finite"},
		{"bad gpu", "gpu=maybe", `gpu "maybe"`},
		{"bad kind", "kind=users", `unknown kind "users"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v, err := url.ParseQuery(tc.raw)
			if err != nil {
				t.Fatal(err)
			}
			q, err := ParseQuery(v)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				back, err := ParseQuery(q.Values())
				if err != nil || !reflect.DeepEqual(back, q) {
					t.Fatalf("round trip: %+v, %v; want %+v", back, err, q)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// FuzzParseQuery checks the filter parser never panics, and that what it
// accepts survives a round trip through Values.
func FuzzParseQuery(f *testing.F) {
	for _, s := range []string{"", "rank=1&func_re=^MPI", "sort=runtime_total&order=desc&limit=5", "step_min=1&step_max=0", "min_score=1e308&gpu=1", "func_re=%28"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		v, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		q, err := ParseQuery(v)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		back, err := ParseQuery(q.Values())
		if err != nil {
			t.Fatalf("accepted %q but not its own Values %q: %v", raw, q.Values().Encode(), err)
		}
		if !reflect.DeepEqual(back, q) {
			t.Fatalf("round trip of %q: %+v != %+v", raw, back, q)
		}
	})
}

// FuzzDecodeBatch checks the batch decoder never panics and that what it
// accepts re-encodes to a batch it accepts again with the same records.
func FuzzDecodeBatch(f *testing.F) {
	f.Add("anomalies", `[{"event_id":"0:1:2","rid":0,"io_step":1,"entry":5,"exit":9}]`)
	f.Add("metadata", `[{"descr":"Hostname","pid":0,"rid":1,"tid":0,"value":"n1"}]`)
	f.Add("func_stats", `[{"pid":0,"fid":1,"func":"f","stats":{"count":1}}]`)
	f.Add("profiles", `[{"pid":0,"rank":0,"tid":0,"io_step":3,"timers":null}]`)
	f.Add("anomalies", `[{"event_id":"0:1"}]`)
	f.Add("normalexecs", `{}`)
	f.Fuzz(func(t *testing.T, kind, data string) {
		b, err := DecodeBatch(Kind(kind), []byte(data))
		if err != nil {
			return
		}
		var enc []byte
		switch b.Kind {
		case "anomalies", "normalexecs":
			enc, err = json.Marshal(b.Execs)
		case "metadata":
			enc, err = json.Marshal(b.Metadata)
		case "func_stats":
			enc, err = json.Marshal(b.FuncStats)
		case "counter_stats":
			enc, err = json.Marshal(b.CounterStats)
		case "profiles":
			enc, err = json.Marshal(b.Profiles)
		}
		if err != nil {
			t.Fatal(err)
		}
		b2, err := DecodeBatch(Kind(kind), enc)
		if err != nil {
			t.Fatalf("re-encoded batch refused: %v", err)
		}
		if b2.Len() != b.Len() {
			t.Fatalf("re-decoded %d records, want %d", b2.Len(), b.Len())
		}
	})
}

func TestParseEventID(t *testing.T) {
	for _, ok := range []string{"0:12:225", "4294967295:0:0"} {
		if _, _, _, err := ParseEventID(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "0:1", "0:1:2:3", "a:1:2", "4294967296:0:0", "0::1", "-1:0:0"} {
		if _, _, _, err := ParseEventID(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
