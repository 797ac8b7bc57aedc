package run

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
	"github.com/kipimo-hpc/kipimo/internal/provenance/storetest"
)

// The summary's top list is ordered by the time the functions' anomalies
// lost (the sum of their explanation.excess), not by their count; it says
// that time in its JSON (time_lost_us) and its text.
func TestSummaryTopFunctionsByTimeLost(t *testing.T) {
	ctx := context.Background()
	s, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "prov.db"), sqlitestore.Options{Synchronous: "OFF"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	es := storetest.Generate(storetest.GenConfig{Seed: 7, N: 14, Ranks: 2, Steps: 3, Anomaly: true})
	// many cheap anomalies of "often", two costly ones of "rare", one of
	// "fast" (flagged as too fast: it lost nothing), two of "chimbuko"
	// (no explanation)
	funcs := []string{"often", "often", "often", "often", "often", "often", "often", "often", "rare", "rare", "fast", "chimbuko", "chimbuko", "often"}
	excess := []float64{10, 10, 10, 10, 10, 10, 10, 10, 40_000, 2_500, -80, 0, 0, 10}
	for i := range es {
		es[i].Func = funcs[i]
		if funcs[i] != "chimbuko" {
			es[i].Explanation = &provenance.Explanation{Key: funcs[i], Excess: excess[i], Text: "t"}
		}
	}
	if err := s.Write(ctx, provenance.Batch{Kind: provenance.KindAnomalies, Execs: es}); err != nil {
		t.Fatal(err)
	}
	top, err := topFunctions(ctx, s, 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []TopFunction{{Func: "rare", Count: 2, TimeLostUs: 42_500}, {Func: "often", Count: 9, TimeLostUs: 90}, {Func: "chimbuko", Count: 2}}
	if len(top) != len(want) {
		t.Fatalf("top %+v, want %+v", top, want)
	}
	for i := range want {
		if top[i] != want[i] {
			t.Errorf("top[%d] = %+v, want %+v", i, top[i], want[i])
		}
	}
	sum := &Summary{RunID: "r", Algorithm: "tail", Stored: map[provenance.Kind]int64{}, TopFunctions: top}
	var b bytes.Buffer
	if err := sum.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Top []map[string]any `json:"top_functions"`
	}
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Top) != 3 || got.Top[0]["func"] != "rare" || got.Top[0]["time_lost_us"] != 42_500.0 || got.Top[0]["count"] != 2.0 {
		t.Errorf("top_functions %v", got.Top)
	}
	b.Reset()
	if err := sum.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	text := strings.Join(strings.Fields(b.String()), " ")
	if w := "top functions rare (2, 42.5ms lost), often (9, 90µs lost), chimbuko (2, 0s lost)"; !strings.Contains(text, w) {
		t.Errorf("text lacks %q:\n%s", w, text)
	}
}

// The top list counts the anomalies that stand after the end-of-run
// relabelling, as the summary's anomaly count does: a function whose
// anomalies the final model unflagged leaves it, and the others count only
// what stands.
func TestSummaryTopFunctionsCountFinalLabels(t *testing.T) {
	ctx := context.Background()
	s, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "prov.db"), sqlitestore.Options{Synchronous: "OFF"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	es := storetest.Generate(storetest.GenConfig{Seed: 8, N: 6, Ranks: 2, Steps: 3, Anomaly: true})
	// "send": two of three beyond the final range [0, 100]; "wait": both inside
	funcs := []string{"send", "send", "send", "wait", "wait", "send"}
	values := []float64{500, 50, 900, 20, 30, 700}
	for i := range es {
		es[i].Func = funcs[i]
		es[i].Explanation = &provenance.Explanation{Key: funcs[i], Value: values[i], Excess: values[i] - 100, Text: "t"}
	}
	if err := s.Write(ctx, provenance.Batch{Kind: provenance.KindAnomalies, Execs: es}); err != nil {
		t.Fatal(err)
	}
	ranges := map[string]provenance.Range{"send": {Low: 0, High: 100}, "wait": {Low: 0, High: 100}}
	top, err := topFunctions(ctx, s, 5, func(e *provenance.Exec) bool { return provenance.FinalAnomaly(e, ranges) })
	if err != nil {
		t.Fatal(err)
	}
	if want := (TopFunction{Func: "send", Count: 3, TimeLostUs: 1_800}); len(top) != 1 || top[0] != want {
		t.Errorf("top %+v, want only %+v", top, want)
	}
}
