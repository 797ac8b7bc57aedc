package ad

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/stats"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

type execKey struct {
	rank, tid, fid uint32
	entry          uint64
}

// runResult is what a run of the detectors over a workload gives.
type runResult struct {
	truth    map[execKey]workload.Truth
	flagged  []provenance.Exec
	stats    Stats
	specs    []workload.FuncSpec
	execsFID map[uint32]uint64 // executions per function (all ranks)
	// recurring is each function's recurring slow mode in the final
	// global models (stats.TailHist.SlowMode), where it has one.
	recurring map[string]stats.SlowMode
}

// runWorkload runs one detector per rank over wcfg, in lockstep (every rank's
// step s before any rank's step s+1, ranks in order) so that the shared
// in-process pserver double sees the same sequence of syncs on every run.
func runWorkload(t testing.TB, wcfg workload.Config, cfg Config) runResult {
	t.Helper()
	w, err := workload.New(wcfg)
	if err != nil {
		t.Fatal(err)
	}
	ps := newFakePServer()
	res := runResult{truth: map[execKey]workload.Truth{}, specs: w.Functions(), execsFID: map[uint32]uint64{}}
	type rankRun struct {
		d    *Detector
		g    *workload.RankGen
		sink *MemorySink
		done bool
	}
	runs := make([]*rankRun, wcfg.Ranks)
	for r := range runs {
		c := cfg
		c.PID, c.Rank = wcfg.PID, uint32(r)
		c.Syncer = ps
		rr := &rankRun{g: w.Rank(uint32(r)), sink: &MemorySink{}}
		c.Sink = rr.sink
		if rr.d, err = New(c); err != nil {
			t.Fatal(err)
		}
		runs[r] = rr
	}
	var f frame.Frame
	for left := len(runs); left > 0; {
		for _, rr := range runs {
			if rr.done {
				continue
			}
			tr, err := rr.g.Next(&f)
			if errors.Is(err, io.EOF) {
				rr.done = true
				left--
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range tr {
				res.truth[execKey{x.Rank, x.Tid, x.FID, x.Entry}] = x
			}
			if err := rr.d.Process(context.Background(), &f); err != nil {
				t.Fatal(err)
			}
		}
	}
	res.recurring = map[string]stats.SlowMode{}
	if len(runs) > 0 {
		c := runs[0].d.Config()
		rule := c.TailRule()
		ps.mu.Lock()
		for k, m := range ps.models {
			if m.Tail == nil {
				continue
			}
			if mode, ok := m.Tail.SlowMode(rule, stats.DefaultRecurringShare); ok {
				res.recurring[k] = mode
			}
		}
		ps.mu.Unlock()
	}
	for _, rr := range runs {
		if err := rr.d.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		all := rr.sink.All()
		res.flagged = append(res.flagged, all.Anomalies...)
		res.stats.Add(rr.d.Stats())
		for _, p := range all.Profiles {
			for _, tm := range p.Timers {
				if strings.Contains(tm.Name, " => ") {
					continue
				}
				for _, s := range res.specs {
					if s.Name == tm.Name {
						res.execsFID[s.ID] += tm.Calls
					}
				}
			}
		}
	}
	return res
}

// recurringSlowCalls counts the injected calls of the kinds in kinds, in
// functions kept by keep, that were not flagged but lie in their function's
// recurring slow mode.
func recurringSlowCalls(res runResult, keep func(workload.FuncSpec) bool, kinds map[workload.Kind]bool) int {
	flagged := map[execKey]bool{}
	for _, e := range res.flagged {
		flagged[execKey{e.RID, e.TID, e.FID, e.Entry}] = true
	}
	kept := map[uint32]bool{}
	for _, s := range res.specs {
		kept[s.ID] = keep(s)
	}
	n := 0
	for k, x := range res.truth {
		if !kinds[x.Kind] || !kept[x.FID] || flagged[k] {
			continue
		}
		if mode, ok := res.recurring[x.Func]; ok && float64(x.Exclusive) >= mode.Lo && float64(x.Exclusive) <= mode.Hi {
			n++
		}
	}
	return n
}

// confusion scores the flagged executions of the functions selected by keep
// against the truth, per anomaly kind.
type confusion struct {
	tp, fn  map[workload.Kind]int
	fp      int
	flagged int
	execs   uint64
}

func score(res runResult, keep func(workload.FuncSpec) bool) confusion {
	c := confusion{tp: map[workload.Kind]int{}, fn: map[workload.Kind]int{}}
	found := map[execKey]bool{}
	for _, a := range res.flagged {
		if !keep(res.specs[a.FID]) {
			continue
		}
		c.flagged++
		k := execKey{a.RID, a.TID, a.FID, a.Entry}
		if _, ok := res.truth[k]; ok {
			found[k] = true
		} else {
			c.fp++
		}
	}
	for k, tr := range res.truth {
		if !keep(res.specs[tr.FID]) {
			continue
		}
		if found[k] {
			c.tp[tr.Kind]++
		} else {
			c.fn[tr.Kind]++
		}
	}
	for fid, n := range res.execsFID {
		if keep(res.specs[fid]) {
			c.execs += n
		}
	}
	return c
}

func (c confusion) totals() (tp, fn int) {
	for _, v := range c.tp {
		tp += v
	}
	for _, v := range c.fn {
		fn += v
	}
	return
}

func (c confusion) precision() float64 {
	if c.flagged == 0 {
		return 1
	}
	tp, _ := c.totals()
	return float64(tp) / float64(c.flagged)
}

func (c confusion) recall() float64 {
	tp, fn := c.totals()
	if tp+fn == 0 {
		return 1
	}
	return float64(tp) / float64(tp+fn)
}

func (c confusion) table(name string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: executions %d, flagged %d, precision %.4f, recall %.4f\n", name, c.execs, c.flagged, c.precision(), c.recall())
	fmt.Fprintf(&b, "  %-13s %8s %8s %8s\n", "kind", "injected", "TP", "FN")
	kinds := workload.Kinds()
	sort.Slice(kinds, func(i, j int) bool { return kinds[i] < kinds[j] })
	for _, k := range kinds {
		if c.tp[k]+c.fn[k] == 0 {
			continue
		}
		fmt.Fprintf(&b, "  %-13s %8d %8d %8d\n", k, c.tp[k]+c.fn[k], c.tp[k], c.fn[k])
	}
	tp, fn := c.totals()
	fmt.Fprintf(&b, "  %-13s %8d %8d %8d  FP %d  TN %d\n", "all", tp+fn, tp, fn, c.fp, c.execs-uint64(tp+fn+c.fp))
	return b.String()
}

func TestPrecisionRecallOnWorkload(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the synthetic workload")
	}
	wcfg := workload.DefaultConfig()
	wcfg.Ranks = 4
	wcfg.Steps = 30
	wcfg.EventsPerStep = 30000
	wcfg.GPU = true
	unimodal := func(s workload.FuncSpec) bool { return !s.Multimodal() }
	multimodal := func(s workload.FuncSpec) bool { return s.Multimodal() }
	slowKinds := map[workload.Kind]bool{workload.SlowCall: true, workload.SlowRank: true, workload.SlowBurst: true, workload.SlowKernel: true}
	tests := []struct {
		name           string
		cfg            Config
		keep           func(workload.FuncSpec) bool
		slowOnlyRecall bool
		minP, minR     float64 // 0: report only
	}{
		{"sstd", Config{Algorithm: SSTD}, unimodal, true, 0.9, 0.95},
		{"hbos-isolation", Config{Algorithm: HBOS, Isolation: 5}, multimodal, false, 0.8, 0.9},
		{"copod-isolation", Config{Algorithm: COPOD, Isolation: 5, Threshold: 0.5}, multimodal, false, 0.8, 0.9},
		// Chimbuko's semantics, reported for comparison.
		{"hbos-chimbuko", Config{Algorithm: HBOS}, multimodal, false, 0, 0},
		{"copod-chimbuko", Config{Algorithm: COPOD}, multimodal, false, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.SyncWait = 5e9
			res := runWorkload(t, wcfg, cfg)
			c := score(res, tc.keep)
			t.Logf("\n%s", c.table(tc.name))
			t.Logf("detector counts: %+v", res.stats)
			recall := c.recall()
			if tc.slowOnlyRecall {
				var tp, n int
				for k := range slowKinds {
					tp += c.tp[k]
					n += c.tp[k] + c.fn[k]
				}
				if n == 0 {
					t.Fatal("no injected slow calls in unimodal functions")
				}
				// A slow call that is not flagged must be in its function's
				// recurring mode: a stall in more than a few tenths of a
				// percent of the calls is reported once as a finding
				// (docs/detection.md), not call by call.
				reported := recurringSlowCalls(res, tc.keep, slowKinds)
				recall = float64(tp+reported) / float64(n)
				t.Logf("injected slow calls: %d flagged, %d in a reported recurring mode, of %d (recall %.4f)", tp, reported, n, recall)
			}
			if tc.minP == 0 {
				return
			}
			if res.stats.Anomalies == 0 || len(res.truth) == 0 {
				t.Fatal("nothing injected or nothing flagged")
			}
			if c.precision() < tc.minP {
				t.Errorf("precision %.4f < %.2f", c.precision(), tc.minP)
			}
			if recall < tc.minR {
				t.Errorf("recall %.4f < %.2f", recall, tc.minR)
			}
		})
	}
}
