package pserver

import (
	"context"
	"fmt"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
)

// kipimo serve counts anomalies as kipimo query does: those that stand
// after the end-of-run relabelling, in the header, the heat map and the
// function table; the summary says so and how many were unflagged.
func TestStoreDashboardFinalLabels(t *testing.T) {
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "prov.db"), sqlitestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var anom []provenance.Exec
	stand := 0
	for i := range 90 {
		v := []float64{500, 120, 900}[i%3] // the range is 50..200: 120 is unflagged
		if v != 120 {
			stand++
		}
		anom = append(anom, provenance.Exec{RID: uint32(i % 3), EventID: fmt.Sprintf("%d:%d:%d", i%3, i/9, i), Func: "compute",
			Entry: uint64(1000*i + 1), Exit: uint64(1000*i + 2), IOStep: uint64(i / 9), RuntimeExclusive: uint64(v), OutlierScore: 5,
			Explanation: &provenance.Explanation{Key: "compute", Value: v, Text: "t"}})
	}
	if err := st.Write(ctx, provenance.Batch{Kind: provenance.KindAnomalies, Execs: anom}); err != nil {
		t.Fatal(err)
	}
	fs := []provenance.GlobalFuncStats{{Func: "compute", Stats: provenance.FuncStats{Count: 1000, Mean: 100}, Anomalies: 90, NaturalRange: &provenance.Range{Low: 50, High: 200}}}
	d, err := NewStoreDashboard(ctx, st, StoreOptions{Run: "stored", FuncStats: fs})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(d.Handler())
	defer ts.Close()
	var sum Summary
	getJSON(t, ts.URL+"/api/summary", &sum)
	if sum.Totals.Anomalies != uint64(stand) || sum.Labels != LabelsFinal || sum.Unflagged != int64(90-stand) || sum.StartTS != 1 {
		t.Errorf("summary %+v: want %d anomalies (final labels), %d unflagged, start 1", sum, stand, 90-stand)
	}
	var funcs []FuncRow
	getJSON(t, ts.URL+"/api/functions", &funcs)
	if len(funcs) != 1 || funcs[0].Anomalies != uint64(stand) {
		t.Errorf("function table %+v: want %d anomalies", funcs, stand)
	}
	var heat HeatMap
	getJSON(t, ts.URL+"/api/heatmap", &heat)
	var cells uint64
	for _, c := range heat.Cells {
		cells += c[2]
	}
	if cells != uint64(stand) {
		t.Errorf("heat map holds %d anomalies, want %d", cells, stand)
	}
}
