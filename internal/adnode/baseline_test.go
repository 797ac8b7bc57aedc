package adnode

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/kipimo-hpc/kipimo/internal/ad"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
	"github.com/kipimo-hpc/kipimo/internal/stats"
)

// --baseline reads a finished run's store into the detectors' config;
// without it nothing is read, and a reference that is not a run says so.
func TestBaselineFlags(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := sqlitestore.Open(ctx, filepath.Join(dir, "provenance.db"), sqlitestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var h stats.TailHist
	for i := range 500 {
		h.Add(float64(10 + i%3))
	}
	fs := []provenance.GlobalFuncStats{{Func: "MPI_Wait", Stats: provenance.FuncStats{Count: 500, Accumulate: 5500}, NaturalHist: &h, IOSteps: 5}}
	if err := st.Write(ctx, provenance.Batch{Kind: provenance.KindFuncStats, FuncStats: fs}); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want bool   // a baseline is loaded
		err  string // the error says
	}{
		{"none", nil, false, ""},
		{"run directory", []string{"--baseline", dir}, true, ""},
		{"missing", []string{"--baseline", filepath.Join(dir, "nowhere")}, false, "--baseline"},
		{"taudb without a database", []string{"--baseline", "taudb:3", "--baseline-dsn", ""}, false, "no TAUdb"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("KIPIMO_TAUDB_DSN", "")
			var c ad.Config
			var b BaselineFlags
			f := pflag.NewFlagSet("ad", pflag.ContinueOnError)
			AddFlags(f, &c)
			AddBaselineFlags(f, &b)
			if err := f.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			err := b.Load(ctx, &c)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Load: %v, want an error saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Baseline != nil; got != tc.want {
				t.Fatalf("baseline loaded %v, want %v", got, tc.want)
			}
			if tc.want {
				if k := c.Baseline.Keys["MPI_Wait"]; k == nil || k.Calls != 500 || !k.HasModes() || c.Baseline.IOSteps != 5 {
					t.Errorf("MPI_Wait %+v: want its 500 calls and histogram", k)
				}
			}
		})
	}
}
