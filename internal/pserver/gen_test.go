package pserver

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/stats"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// genRun builds the sync requests of a synthetic run: ranks detectors, each
// sending one request per step with every function's delta, its counters and
// its step summary. Rank slow has ten times more anomalies than the others.
// reqs[i] is the i-th step's requests, one per rank, Seq = step+1.
type genRun struct {
	ranks, steps, funcs int
	slow                uint32
	reqs                [][]syncproto.SyncRequest
}

func funcName(i int) string { return fmt.Sprintf("solver::kernel_%03d", i) }

func newGenRun(ranks, steps, funcs int, slow uint32, seed uint64) *genRun {
	g := &genRun{ranks: ranks, steps: steps, funcs: funcs, slow: slow}
	rng := rand.New(rand.NewPCG(seed, 7))
	for step := range steps {
		var row []syncproto.SyncRequest
		for r := range ranks {
			req := syncproto.SyncRequest{PID: 0, Rank: uint32(r), Seq: uint64(step + 1), Step: uint64(step), Algorithm: "sstd"}
			sum := syncproto.StepSummary{Step: uint64(step), MinTS: uint64(step) * 1000, MaxTS: uint64(step)*1000 + 999, FuncAnomalies: map[string]uint64{}}
			for f := range funcs {
				var m stats.Moments
				n := 1 + rng.IntN(20)
				base := 10 * float64(f+1)
				vals := make([]float64, n)
				for i := range n {
					vals[i] = base + rng.NormFloat64()*base/10
					m.Push(vals[i])
				}
				var hist *stats.Histogram
				if f%4 == 0 { // an HBOS-keyed function: the delta carries a histogram
					h := stats.BuildHistogram(vals, stats.DefaultBins)
					hist = &h
				}
				var anom uint64
				if rng.Float64() < 0.05 {
					anom = 1
				}
				if uint32(r) == slow && f%3 == 0 {
					anom += 3 + uint64(rng.IntN(5))
				}
				req.Models = append(req.Models, syncproto.ModelDelta{Key: funcName(f), Moments: m, Histogram: hist, Anomalies: anom})
				sum.Executions += uint64(n)
				sum.Events += 2 * uint64(n)
				if anom > 0 {
					var sc, sv stats.Moments
					for range anom {
						sc.Push(6 + rng.Float64()*10)
						sv.Push(base * (2 + rng.Float64()))
					}
					sum.Anomalies += anom
					sum.Scores.Merge(sc)
					sum.Severity.Merge(sv)
					sum.Funcs = append(sum.Funcs, syncproto.FuncAnomalyMetrics{Func: funcName(f), Count: anom, Score: sc, Severity: sv, FirstTS: sum.MinTS + 1, LastTS: sum.MaxTS - 1})
					sum.FuncAnomalies[funcName(f)] = anom
				}
			}
			if step%5 == 3 && r == 1 {
				sum.BadFrames = 1
			}
			for c := range 2 {
				var m stats.Moments
				for range 3 {
					m.Push(rng.Float64() * 1e6)
				}
				req.Counters = append(req.Counters, syncproto.CounterDelta{Name: fmt.Sprintf("PAPI_counter_%d", c), Moments: m})
			}
			req.Steps = []syncproto.StepSummary{sum}
			row = append(row, req)
		}
		g.reqs = append(g.reqs, row)
	}
	return g
}

// all returns every request in step order.
func (g *genRun) all() []syncproto.SyncRequest {
	var out []syncproto.SyncRequest
	for _, row := range g.reqs {
		out = append(out, row...)
	}
	return out
}

// splitShards splits a request the way a detector routes it: each model key
// to syncproto.Shard(key, n); counters and step summaries to shard 0. Every part
// keeps the request's Seq (each shard numbers a detector's requests alone).
func splitShards(req syncproto.SyncRequest, n int) []syncproto.SyncRequest {
	parts := make([]syncproto.SyncRequest, n)
	for i := range parts {
		parts[i] = syncproto.SyncRequest{PID: req.PID, Rank: req.Rank, Seq: req.Seq, Step: req.Step, Algorithm: req.Algorithm}
	}
	for _, m := range req.Models {
		i := syncproto.Shard(m.Key, n)
		parts[i].Models = append(parts[i].Models, m)
	}
	parts[0].Counters = req.Counters
	parts[0].Steps = req.Steps
	return parts
}

func reference(t testing.TB, reqs []syncproto.SyncRequest, window int) *State {
	t.Helper()
	st := NewState(window)
	for i := range reqs {
		if _, err := st.Apply(&reqs[i]); err != nil {
			t.Fatalf("apply request %d: %v", i, err)
		}
	}
	return st
}

func closeRel(a, b float64) bool {
	if a == b {
		return true
	}
	d := math.Abs(a - b)
	return d <= 1e-9*math.Max(math.Abs(a), math.Abs(b)) || d < 1e-9
}

func momentsEqual(a, b stats.Moments) bool {
	return a.N == b.N && a.Min == b.Min && a.Max == b.Max &&
		closeRel(a.Mean, b.Mean) && closeRel(a.M2, b.M2) && closeRel(a.M3, b.M3) && closeRel(a.M4, b.M4)
}

// compareModels reports every difference between the models and counters of
// two states: counts exactly, floating-point moments to a relative 1e-9 (the
// exact merge is exact in real arithmetic; its rounding depends on order).
func compareModels(t *testing.T, what string, want, got *State) {
	t.Helper()
	if len(want.Models) != len(got.Models) {
		t.Errorf("%s: %d models, want %d", what, len(got.Models), len(want.Models))
	}
	for k, w := range want.Models {
		g := got.Models[k]
		switch {
		case g == nil:
			t.Errorf("%s: model %q missing", what, k)
		case !momentsEqual(w.Moments, g.Moments):
			t.Errorf("%s: model %q moments %+v, want %+v", what, k, g.Moments, w.Moments)
		case w.Anomalies != g.Anomalies:
			t.Errorf("%s: model %q anomalies %d, want %d", what, k, g.Anomalies, w.Anomalies)
		case w.Histogram.Empty() != g.Histogram.Empty():
			t.Errorf("%s: model %q histogram %v, want %v", what, k, g.Histogram, w.Histogram)
		case !w.Histogram.Empty() && (w.Histogram.Total() != g.Histogram.Total() || w.Histogram.Min != g.Histogram.Min ||
			w.Histogram.Max != g.Histogram.Max || len(w.Histogram.Counts) != len(g.Histogram.Counts)):
			// Bin contents depend on the merge order (re-binning rounds);
			// the total, range and bin count do not.
			t.Errorf("%s: model %q histogram total %d range [%v, %v] %d bins, want %d [%v, %v] %d", what, k,
				g.Histogram.Total(), g.Histogram.Min, g.Histogram.Max, len(g.Histogram.Counts),
				w.Histogram.Total(), w.Histogram.Min, w.Histogram.Max, len(w.Histogram.Counts))
		}
	}
	compareCounters(t, what, want, got)
}

func compareCounters(t *testing.T, what string, want, got *State) {
	t.Helper()
	if len(want.Counters) != len(got.Counters) {
		t.Errorf("%s: %d counters, want %d", what, len(got.Counters), len(want.Counters))
	}
	for k, w := range want.Counters {
		if g := got.Counters[k]; g == nil || !momentsEqual(*w, *g) {
			t.Errorf("%s: counter %q = %+v, want %+v", what, k, g, *w)
		}
	}
}

// compareAggregates checks every count of the aggregates.
func compareAggregates(t *testing.T, what string, want, got *State) {
	t.Helper()
	wa, ga := want.Agg, got.Agg
	if wt, gt := wa.Total(), ga.Total(); wt != gt {
		t.Errorf("%s: totals %+v, want %+v", what, gt, wt)
	}
	if len(wa.Steps) != len(ga.Steps) {
		t.Errorf("%s: %d steps in window, want %d", what, len(ga.Steps), len(wa.Steps))
	}
	for step, ws := range wa.Steps {
		gs := ga.Steps[step]
		if gs == nil {
			t.Errorf("%s: step %d missing", what, step)
			continue
		}
		if ws.Anomalies != gs.Anomalies || ws.Executions != gs.Executions || ws.Frames != gs.Frames || len(ws.Ranks) != len(gs.Ranks) {
			t.Errorf("%s: step %d = %d anomalies %d executions %d frames, want %d %d %d", what, step, gs.Anomalies, gs.Executions, gs.Frames, ws.Anomalies, ws.Executions, ws.Frames)
		}
		for id, c := range ws.Ranks {
			if gs.Ranks[id] != c {
				t.Errorf("%s: step %d rank %v = %+v, want %+v", what, step, id, gs.Ranks[id], c)
			}
		}
	}
	for id, w := range wa.Ranks {
		g := ga.Ranks[id]
		if g == nil || g.Totals != w.Totals || g.FirstStep != w.FirstStep || g.LastStep != w.LastStep || !momentsEqual(g.Severity, w.Severity) {
			t.Errorf("%s: rank %v = %+v, want %+v", what, id, g, w)
		}
	}
	if len(wa.RankFunc) != len(ga.RankFunc) {
		t.Errorf("%s: %d (rank, function) metrics, want %d", what, len(ga.RankFunc), len(wa.RankFunc))
	}
	for k, w := range wa.RankFunc {
		g := ga.RankFunc[k]
		if g == nil || g.Count != w.Count || g.FirstStep != w.FirstStep || g.LastStep != w.LastStep || !momentsEqual(g.Score, w.Score) {
			t.Errorf("%s: metrics of %v = %+v, want %+v", what, k, g, w)
		}
	}
	for k, w := range wa.Funcs {
		if g := ga.Funcs[k]; g == nil || g.Count != w.Count {
			t.Errorf("%s: function %q anomaly metrics %+v, want %+v", what, k, g, w)
		}
	}
	for id, s := range want.LastSeq {
		if got.LastSeq[id] != s {
			t.Errorf("%s: last Seq of %v = %d, want %d", what, id, got.LastSeq[id], s)
		}
	}
}
