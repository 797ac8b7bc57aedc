package stats_test

import (
	"context"
	"sort"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/stats"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

// replayRecorded replays the evaluation's real traces (workload.EvalApps: a
// 12-rank MPI code and an OpenCL application traced by TAU, a PyTorch
// inference run) at 8 ranks with their recorded exclusive times in recorded
// order and nothing injected, io_step by io_step, and gives step every
// function's exclusive runtimes (µs) in that io_step, all ranks together.
func replayRecorded(t *testing.T, steps int, step func(runtimes map[string][]float64)) {
	t.Helper()
	cfg := workload.DefaultTraceConfig(workload.EvalApps("../workload/testdata/eval")...)
	cfg.Rate, cfg.Steps = 0, steps
	w, err := workload.FromTraces(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	type open struct {
		fid          uint32
		entry, child uint64
	}
	type rankState struct {
		g      *workload.RankGen
		names  map[uint32]string
		stacks map[uint32][]open
	}
	ranks := make([]rankState, cfg.Ranks)
	for r := range ranks {
		ranks[r] = rankState{g: w.Rank(uint32(r)), names: map[uint32]string{}, stacks: map[uint32][]open{}}
	}
	var f frame.Frame
	for range steps {
		runtimes := map[string][]float64{}
		for r := range ranks {
			rk := &ranks[r]
			if _, err := rk.g.Next(&f); err != nil {
				t.Fatal(err)
			}
			for _, n := range f.Funcs {
				rk.names[n.ID] = n.Name
			}
			for _, e := range f.Events {
				st := rk.stacks[e.Tid]
				if e.Kind == frame.Entry {
					rk.stacks[e.Tid] = append(st, open{fid: e.FID, entry: e.TS})
					continue
				}
				if len(st) == 0 || st[len(st)-1].fid != e.FID {
					t.Fatalf("rank %d thread %d: exit of %d does not match its stack", r, e.Tid, e.FID)
				}
				top := st[len(st)-1]
				st = st[:len(st)-1]
				incl := e.TS - top.entry
				if len(st) > 0 {
					st[len(st)-1].child += incl
				}
				rk.stacks[e.Tid] = st
				name := rk.names[e.FID]
				runtimes[name] = append(runtimes[name], float64(incl-min(top.child, incl)))
			}
		}
		step(runtimes)
	}
}

// TestFalseAlarmRateOnRecordedRuntimes measures, on real runtimes replayed
// in their recorded order with nothing injected (8 ranks x 220 io_steps,
// 12.6M executions), the fraction of each function's calls outside the
// natural range its final model reads (what the end-of-run labels flag),
// for false-alarm rates 1e-3, 1e-4 and 1e-5: it must stay at or below the
// rate on at least 90% of the functions with at least 10/rate calls. It
// also reports the fraction flagged live: each io_step's calls judged
// against the model that includes that step.
func TestFalseAlarmRateOnRecordedRuntimes(t *testing.T) {
	if testing.Short() {
		t.Skip("replays 12.6M executions twice")
	}
	const steps = 220
	alphas := []float64{1e-3, 1e-4, 1e-5}
	rules := make([]stats.TailRule, len(alphas))
	for i, a := range alphas {
		rules[i] = stats.TailRule{Ratio: 1.4, Recur: 5, RecurFrac: 0.005, Resolution: 1, Alpha: a}
	}
	outside := func(r stats.TailRule, lo, hi, x float64) bool { return x > r.Threshold(hi) || x < r.LowThreshold(lo) }
	hists := map[string]*stats.TailHist{}
	live := map[string][]int{}
	replayRecorded(t, steps, func(runtimes map[string][]float64) {
		for name, xs := range runtimes {
			h := hists[name]
			if h == nil {
				h = &stats.TailHist{}
				hists[name] = h
				live[name] = make([]int, len(alphas))
			}
			for _, x := range xs {
				h.Add(x)
			}
			for i, r := range rules {
				lo, hi := h.NaturalRange(r)
				for _, x := range xs {
					if outside(r, lo, hi, x) {
						live[name][i]++
					}
				}
			}
		}
	})
	final := map[string][]int{}
	replayRecorded(t, steps, func(runtimes map[string][]float64) {
		for name, xs := range runtimes {
			if final[name] == nil {
				final[name] = make([]int, len(alphas))
			}
			for i, r := range rules {
				lo, hi := hists[name].NaturalRange(r)
				for _, x := range xs {
					if outside(r, lo, hi, x) {
						final[name][i]++
					}
				}
			}
		}
	})
	names := make([]string, 0, len(hists))
	for n := range hists {
		names = append(names, n)
	}
	sort.Strings(names)
	for i, alpha := range alphas {
		var funcs, held, liveHeld int
		var calls, flagged, liveFlagged float64
		for _, name := range names {
			n := float64(hists[name].N())
			if n < 10/alpha {
				continue
			}
			out, lv := float64(final[name][i]), float64(live[name][i])
			funcs++
			calls += n
			flagged += out
			liveFlagged += lv
			if out/n <= alpha {
				held++
			}
			if lv/n <= alpha {
				liveHeld++
			}
			if out > 0 || lv > 0 {
				t.Logf("alpha %g: %.40s: %.0f calls, %.0f outside the final range (%.2g), %.0f flagged live (%.2g)", alpha, name, n, out, out/n, lv, lv/n)
			}
		}
		t.Logf("alpha %g: %d functions with >= %.0f calls: final labels at or below alpha on %d (%.2g of %.0f calls flagged), live on %d (%.2g)",
			alpha, funcs, 10/alpha, held, flagged/max(calls, 1), calls, liveHeld, liveFlagged/max(calls, 1))
		if funcs == 0 {
			t.Errorf("alpha %g: no function with %.0f calls to measure", alpha, 10/alpha)
		} else if float64(held) < 0.9*float64(funcs) {
			t.Errorf("alpha %g: the final labels stay at or below alpha on %d of %d functions, want 90%%", alpha, held, funcs)
		}
	}
}
