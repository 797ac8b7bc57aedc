package cli

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provdb"
	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
)

// query recurring lists the func_stats records' recurring slow modes, the
// largest share of time first, from the store and through provdb alike.
func TestQueryRecurring(t *testing.T) {
	ctx := context.Background()
	path, s := tempStore(ctx, t)
	fs := []provenance.GlobalFuncStats{
		{Func: "MPI_Irecv", Stats: provenance.FuncStats{Count: 7000}, Recurring: &provenance.RecurringMode{
			Calls: 42, CallsFraction: 0.006, TypicalUs: 25100, LowUs: 25003, HighUs: 25410, TimeShare: 0.91, FirstIOStep: 2, Ranks: []uint32{0, 1}}},
		{Func: "compute", Stats: provenance.FuncStats{Count: 100}},
		{Func: "relax_boundary", Stats: provenance.FuncStats{Count: 1400}, Recurring: &provenance.RecurringMode{
			Calls: 70, CallsFraction: 0.05, TypicalUs: 20050, LowUs: 20001, HighUs: 20310, TimeShare: 0.95, FirstIOStep: 0, Ranks: []uint32{0, 1, 2, 3}}},
	}
	if err := s.Write(ctx, provenance.Batch{Kind: provenance.KindFuncStats, FuncStats: fs}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	st, err := sqlitestore.Open(ctx, path, sqlitestore.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	srv := httptest.NewServer(provdb.NewHTTPHandler(st, ""))
	defer srv.Close()
	for _, src := range [][]string{{"--store", path}, {"--url", srv.URL}} {
		t.Run(src[0], func(t *testing.T) {
			out, err := runQuery(t, append([]string{"query", "recurring", "--json"}, src...)...)
			if err != nil {
				t.Fatal(err)
			}
			var got []recurringRow
			for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
				var r recurringRow
				if err := json.Unmarshal([]byte(l), &r); err != nil {
					t.Fatalf("%q: %v", l, err)
				}
				got = append(got, r)
			}
			if len(got) != 2 || got[0].Func != "relax_boundary" || got[1].Func != "MPI_Irecv" || got[1].CallsFraction != 0.006 || len(got[0].Ranks) != 4 {
				t.Errorf("recurring %+v, want relax_boundary then MPI_Irecv", got)
			}
			out, err = runQuery(t, append([]string{"query", "recurring"}, src...)...)
			if err != nil {
				t.Fatal(err)
			}
			text := strings.Join(strings.Fields(out), " ")
			if want := "MPI_Irecv 0.6% (42) 25.1ms 91% 2 2"; !strings.Contains(text, want) {
				t.Errorf("table lacks %q:\n%s", want, out)
			}
		})
	}
}
