package cli

import (
	"cmp"
	"context"
	"encoding/json"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provdb"
	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
	"github.com/kipimo-hpc/kipimo/internal/provenance/storetest"
)

// query list orders anomalies by the time they lost, costliest first: on
// --sort time-lost and by default under a limit; records that do not say
// come last, in entry order; other sort fields are the store's, and a
// listing of every record streams in entry order, as before.
func TestQueryListTimeLost(t *testing.T) {
	ctx := context.Background()
	path, s := tempStore(ctx, t)
	es := storetest.Generate(storetest.GenConfig{Seed: 31, N: 8, Ranks: 1, Steps: 2, Anomaly: true})
	ne := storetest.Generate(storetest.GenConfig{Seed: 32, N: 4, Ranks: 1, Steps: 2})
	slices.SortFunc(es, func(a, b provenance.Exec) int { return cmp.Compare(a.Entry, b.Entry) })
	// time lost by entry order; -1 has no explanation
	lost := []float64{30, 900, -1, 5, 900, 4000, -1, 70}
	for i, x := range lost {
		if x >= 0 {
			es[i].Explanation = &provenance.Explanation{Key: es[i].Func, Value: 100 + x, NaturalMax: 100, Excess: x, Text: "t"}
		}
	}
	for _, b := range []provenance.Batch{{Kind: provenance.KindAnomalies, Execs: es}, {Kind: provenance.KindNormalExecs, Execs: ne}} {
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
	ids := func(idx ...int) []string {
		var out []string
		for _, i := range idx {
			out = append(out, es[i].EventID)
		}
		return out
	}
	costliest := ids(5, 1, 4, 7, 0, 3, 2, 6)
	for _, src := range [][]string{{"--store", path}, {"--url", srv.URL}} {
		for _, tc := range []struct {
			name string
			args []string
			want []string
		}{
			{"default", nil, costliest},
			{"time-lost", []string{"--sort", "time-lost", "--limit", "0"}, costliest},
			{"time-lost limited", []string{"--sort", "time-lost", "--limit", "3"}, costliest[:3]},
			{"time-lost of a step", []string{"--sort", "time-lost", "--step-min", "1"}, nil},
			{"entry", []string{"--sort", "entry"}, ids(0, 1, 2, 3, 4, 5, 6, 7)},
			{"every record, streamed", []string{"--limit", "0"}, ids(0, 1, 2, 3, 4, 5, 6, 7)},
		} {
			t.Run(src[0]+"/"+tc.name, func(t *testing.T) {
				want := tc.want
				if want == nil { // the records of io_step 1, costliest first
					for _, id := range costliest {
						if i := slices.IndexFunc(es, func(e provenance.Exec) bool { return e.EventID == id }); es[i].IOStep >= 1 {
							want = append(want, id)
						}
					}
				}
				out, err := runQuery(t, append(append([]string{"query", "list", "--json"}, tc.args...), src...)...)
				if err != nil {
					t.Fatal(err)
				}
				if got := listedIDs(t, out); !slices.Equal(got, want) {
					t.Errorf("listed %v, want %v", got, want)
				}
			})
		}
		t.Run(src[0]+"/normalexecs by entry", func(t *testing.T) {
			out, err := runQuery(t, append([]string{"query", "list", "--json", "--kind", "normalexecs"}, src...)...)
			if err != nil {
				t.Fatal(err)
			}
			got := listedIDs(t, out)
			var entries []uint64
			for _, id := range got {
				i := slices.IndexFunc(ne, func(e provenance.Exec) bool { return e.EventID == id })
				entries = append(entries, ne[i].Entry)
			}
			if len(got) != len(ne) || !slices.IsSorted(entries) {
				t.Errorf("normal executions listed %v (entries %v), want all %d by entry", got, entries, len(ne))
			}
		})
	}
}

// listedIDs are the event ids of query list --json output, in order.
func listedIDs(t *testing.T, out string) []string {
	t.Helper()
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l == "" {
			continue
		}
		var e provenance.Exec
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatal(err)
		}
		got = append(got, e.EventID)
	}
	return got
}
