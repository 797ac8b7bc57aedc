package diff_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/diff"
	"github.com/kipimo-hpc/kipimo/internal/run"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

// kipimoRun makes a small synthetic Kipimo run (2 ranks, 1 thread, 8 steps)
// with the anomaly injection rates multiplied by scale, and returns its run
// directory and summary.
func kipimoRun(t *testing.T, out, id string, seed uint64, scale float64) (string, *run.Summary) {
	t.Helper()
	wl := workload.DefaultConfig()
	wl.Ranks, wl.ThreadsPerRank, wl.Steps, wl.EventsPerStep, wl.Seed = 2, 1, 8, 3000, seed
	wl.Rates = wl.Rates.Scale(scale)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, err := run.Start(ctx, run.Config{Out: out, RunID: id, Workload: wl}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	sum, err := p.Execute(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(out, id), sum
}

// Two runs of the same workload, the second with ten times the anomaly
// injection of the first: the anomaly counts diff reads from each run's
// provenance store are the ones its detectors reported, and anomalies per
// 1,000 calls rise overall and where B has most of them.
func TestKipimoRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole pipeline twice")
	}
	out := t.TempDir()
	dirA, sumA := kipimoRun(t, out, "low", 5, 0.5)
	dirB, sumB := kipimoRun(t, out, "high", 5, 5)
	ctx := context.Background()
	a, err := diff.LoadPath(ctx, dirA, "")
	if err != nil {
		t.Fatal(err)
	}
	b, err := diff.LoadPath(ctx, dirB, "")
	if err != nil {
		t.Fatal(err)
	}
	if a.Kind != diff.KindRun || b.Kind != diff.KindRun {
		t.Fatalf("kinds %q, %q; want run", a.Kind, b.Kind)
	}
	r, err := diff.Compare(a, b, diff.Options{Quantity: diff.Anomalies})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		side diff.SideInfo
		sum  *run.Summary
	}{{r.A, sumA}, {r.B, sumB}} {
		if c.side.Anomalies == nil || *c.side.Anomalies != int64(c.sum.Anomalies) {
			t.Errorf("%s: diff counted %v anomalies, the run's detectors %d", c.side.Source, c.side.Anomalies, c.sum.Anomalies)
		}
		if c.side.Threads != c.sum.Ranks {
			t.Errorf("%s: %d threads, want %d (one per rank)", c.side.Source, c.side.Threads, c.sum.Ranks)
		}
	}
	if sumB.Anomalies <= sumA.Anomalies {
		t.Fatalf("the run with ten times the injection has %d anomalies, the other %d", sumB.Anomalies, sumA.Anomalies)
	}
	// Anomalies per 1,000 calls over all functions, from the rows' totals
	// (anomaly counts) and the calls diff reports separately.
	calls, err := diff.Compare(a, b, diff.Options{Quantity: diff.Calls})
	if err != nil {
		t.Fatal(err)
	}
	var anomA, anomB, callsA, callsB float64
	for _, row := range r.Functions {
		anomA += row.TotalA
		anomB += row.TotalB
	}
	for _, row := range calls.Functions {
		callsA += row.TotalA
		callsB += row.TotalB
	}
	if int64(anomA) != *r.A.Anomalies || int64(anomB) != *r.B.Anomalies {
		t.Errorf("rows hold %v and %v anomalies, the sides %d and %d: some anomaly has no function in the profile", anomA, anomB, *r.A.Anomalies, *r.B.Anomalies)
	}
	rateA, rateB := 1000*anomA/callsA, 1000*anomB/callsB
	t.Logf("anomalies per 1,000 calls: %.3f (%v of %v) -> %.3f (%v of %v)", rateA, anomA, callsA, rateB, anomB, callsB)
	if rateB <= rateA {
		t.Errorf("anomalies per 1,000 calls %.3f -> %.3f: want a rise", rateA, rateB)
	}
	top := r.Functions[0]
	if top.TotalB <= top.TotalA || top.B <= top.A {
		t.Errorf("the function with the largest change, %s: %v -> %v anomalies, %.3f -> %.3f per 1,000 calls; want a rise", top.Name, top.TotalA, top.TotalB, top.A, top.B)
	}
	// Compared by time, each row carries its anomaly counts; they add up
	// to the detectors' counts.
	byTime, err := diff.Compare(a, b, diff.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var nA, nB int64
	for _, row := range byTime.Functions {
		if row.AnomaliesA == nil || row.AnomaliesB == nil {
			t.Fatalf("%s has no anomaly counts", row.Name)
		}
		nA += *row.AnomaliesA
		nB += *row.AnomaliesB
	}
	if nA != int64(sumA.Anomalies) || nB != int64(sumB.Anomalies) {
		t.Errorf("the rows' anomaly counts add up to %d and %d, the detectors flagged %d and %d", nA, nB, sumA.Anomalies, sumB.Anomalies)
	}
	if _, err := diff.Compare(a, b, diff.Options{Quantity: diff.Anomalies, CallPaths: true}); err == nil {
		t.Error("anomalies per call path compared; they are counted per function")
	}
}
