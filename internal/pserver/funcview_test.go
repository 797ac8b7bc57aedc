package pserver

import (
	"context"
	"fmt"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
	"github.com/kipimo-hpc/kipimo/internal/stats"
)

// With the default algorithm (tail) a live server's function view is drawn
// from the merged natural-range histogram: it has bins, the normal body is
// not anomalous and the slow runtimes beyond the natural range are, and the
// thresholds are the range's.
func TestFuncViewFromTailModel(t *testing.T) {
	st := NewState(16)
	var tail stats.TailHist
	var mom stats.Moments
	for i := range 2000 {
		x := 20 + float64(i%3) // the body: 20..22 µs
		if i%100 == 0 {
			x = 5000 // rare slow calls
		}
		tail.Add(x)
		mom.Push(x)
	}
	st.Models["compute"] = &Model{Key: "compute", Summary: stats.Summary{Moments: mom, Tail: tail}}
	st.TailRule = &stats.TailRule{Ratio: 1.4, Recur: 5, RecurFrac: 0.05, Resolution: 1}
	v, ok := funcView(st, "compute", liveFuncModel(st, "compute"))
	if !ok || len(v.Bins) == 0 || v.Model != ModelNaturalRange || v.Total != 2000 {
		t.Fatalf("function view %+v: want the natural-range histogram's bins", v)
	}
	if v.ThresholdRuntime < 22 || v.ThresholdRuntime >= 5000 || v.LowThreshold > 20 {
		t.Errorf("thresholds %g..%g, want the range around 20..22 µs", v.LowThreshold, v.ThresholdRuntime)
	}
	for _, b := range v.Bins {
		slow := b.Lo >= 1000
		if b.Anomalous != slow {
			t.Errorf("bin %+v: anomalous %v, want %v", b, b.Anomalous, slow)
		}
	}
}

// kipimo serve draws a function from its stored normal executions, never
// from a sample that is mostly anomalies: with many slow anomalies stored
// and a few normal 21 µs executions, the body is not anomalous, the
// anomalies are not in the histogram, and the final natural range (or,
// without one, HBOS on the normal executions) labels the bins.
func TestStoredFuncViewNotFromAnomalies(t *testing.T) {
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "prov.db"), sqlitestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var normal, anom []provenance.Exec
	for i := range 400 {
		e := provenance.Exec{RID: uint32(i % 4), EventID: fmt.Sprintf("%d:%d:%d", i%4, i/40, i), Func: "compute",
			Entry: uint64(1000 * i), IOStep: uint64(i / 40)}
		if i%8 == 0 {
			e.RuntimeExclusive = 20 + uint64(i%3)
			normal = append(normal, e)
			continue
		}
		e.RuntimeExclusive = 5000 + uint64(i)
		e.OutlierScore = 20
		anom = append(anom, e)
	}
	for _, b := range []provenance.Batch{{Kind: provenance.KindAnomalies, Execs: anom}, {Kind: provenance.KindNormalExecs, Execs: normal}} {
		if err := st.Write(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name  string
		rng   *provenance.Range
		model string
	}{
		{"final natural range", &provenance.Range{Low: 5, High: 40}, ModelNaturalRange},
		{"no natural range (Chimbuko's rules)", nil, ModelHBOS},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := []provenance.GlobalFuncStats{{Func: "compute", Stats: provenance.FuncStats{Count: 400, Mean: 4000}, Anomalies: uint64(len(anom)), NaturalRange: tc.rng}}
			d, err := NewStoreDashboard(ctx, st, StoreOptions{Run: "stored", FuncStats: fs})
			if err != nil {
				t.Fatal(err)
			}
			ts := httptest.NewServer(d.Handler())
			defer ts.Close()
			var v FuncView
			if code := getJSON(t, ts.URL+"/api/function?func="+url.QueryEscape("compute"), &v); code != 200 {
				t.Fatalf("GET /api/function: %d", code)
			}
			if v.Model != tc.model || v.Total != uint64(len(normal)) || len(v.Bins) == 0 {
				t.Fatalf("function view %+v: want %s bins of the %d normal executions", v, tc.model, len(normal))
			}
			fullest := v.Bins[0]
			for _, b := range v.Bins {
				if b.Hi > 1000 {
					t.Errorf("bin %+v: the anomalies are in the histogram", b)
				}
				if tc.rng != nil && b.Anomalous {
					t.Errorf("bin %+v of the normal 20..22 µs body is beyond the natural range", b)
				}
				if b.Count > fullest.Count {
					fullest = b
				}
			}
			if fullest.Anomalous {
				t.Errorf("the fullest bin %+v, the normal body, is anomalous", fullest)
			}
		})
	}
}
