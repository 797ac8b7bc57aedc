package workload

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/frame"
)

// execRec is one execution rebuilt from a generated stream.
type execRec struct {
	rank, tid, fid  uint32
	entry, exit     uint64
	entryStep       uint64 // frame holding the entry
	exitStep        uint64 // frame holding the exit
	excl            uint64
	depth           int
	childInclusive  uint64
	corr            []uint64 // Correlation ID values seen inside (own time)
	counters, comms int
}

// runData is everything a test needs about a generated run.
type runData struct {
	w        *Workload
	frames   [][]frame.Frame // [rank][step], deep copies
	execs    []execRec
	truth    []Truth
	maxDepth int
	events   int
}

// threadEvent is a function, counter or comm event of one thread, for
// replaying a thread's stream in timestamp order.
type threadEvent struct {
	ts    uint64
	order int // at equal ts: entries (0), then counters and comms (1), then exits (2)
	step  uint64
	fe    *frame.FuncEvent
	ce    *frame.CounterEvent
	cm    *frame.CommEvent
}

// generate runs cfg and checks, as it rebuilds every execution, that each
// thread's stream is a well-formed call tree: exits match the open entry,
// nothing is left open, no function is on its own stack twice, timestamps
// never go back, events lie inside their frame's window, and every counter
// and message happens inside an open execution.
func generate(t testing.TB, cfg Config) *runData {
	t.Helper()
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	d := &runData{w: w}
	for r := range cfg.Ranks {
		g := w.Rank(uint32(r))
		var rankFrames []frame.Frame
		for {
			var f frame.Frame
			tr, err := g.Next(&f)
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			d.truth = append(d.truth, tr...)
			d.events += f.NumEvents()
			rankFrames = append(rankFrames, f)
		}
		if len(rankFrames) != cfg.Steps {
			t.Fatalf("rank %d: %d frames, want %d", r, len(rankFrames), cfg.Steps)
		}
		d.frames = append(d.frames, rankFrames)
		d.rebuild(t, uint32(r), rankFrames)
	}
	return d
}

func (d *runData) rebuild(t testing.TB, rank uint32, frames []frame.Frame) {
	t.Helper()
	byTid := map[uint32][]threadEvent{}
	for _, f := range frames {
		if f.Rank != rank || f.PID != d.w.cfg.PID {
			t.Fatalf("frame of rank %d pid %d in the stream of rank %d pid %d", f.Rank, f.PID, rank, d.w.cfg.PID)
		}
		inWindow := func(kind string, ts uint64) {
			if ts < f.TStart || ts >= f.TEnd {
				t.Fatalf("rank %d step %d: %s at %d outside [%d, %d)", rank, f.Step, kind, ts, f.TStart, f.TEnd)
			}
		}
		for i := range f.Events {
			e := &f.Events[i]
			inWindow("function event", e.TS)
			o := 0
			if e.Kind == frame.Exit {
				o = 2
			}
			byTid[e.Tid] = append(byTid[e.Tid], threadEvent{ts: e.TS, order: o, step: f.Step, fe: e})
		}
		for i := range f.CounterEvents {
			e := &f.CounterEvents[i]
			inWindow("counter", e.TS)
			byTid[e.Tid] = append(byTid[e.Tid], threadEvent{ts: e.TS, order: 1, step: f.Step, ce: e})
		}
		for i := range f.Comms {
			e := &f.Comms[i]
			inWindow("comm", e.TS)
			byTid[e.Tid] = append(byTid[e.Tid], threadEvent{ts: e.TS, order: 1, step: f.Step, cm: e})
		}
	}
	tids := make([]uint32, 0, len(byTid))
	for tid := range byTid {
		tids = append(tids, tid)
	}
	slices.Sort(tids)
	for _, tid := range tids {
		evs := byTid[tid]
		// Each kind is in timestamp order per thread in the frames; check
		// that before merging the kinds.
		var lastF, lastC, lastM uint64
		for _, e := range evs {
			p := &lastC
			switch {
			case e.fe != nil:
				p = &lastF
			case e.cm != nil:
				p = &lastM
			}
			if e.ts < *p {
				t.Fatalf("rank %d tid %d: timestamp %d after %d", rank, tid, e.ts, *p)
			}
			*p = e.ts
		}
		slices.SortStableFunc(evs, func(a, b threadEvent) int {
			return cmp.Or(cmp.Compare(a.ts, b.ts), cmp.Compare(a.order, b.order))
		})
		var stack []execRec
		onStack := map[uint32]bool{}
		for _, e := range evs {
			switch {
			case e.fe != nil && e.fe.Kind == frame.Entry:
				if onStack[e.fe.FID] {
					t.Fatalf("rank %d tid %d: recursion into %s at %d", rank, tid, funcTable[e.fe.FID].name, e.ts)
				}
				onStack[e.fe.FID] = true
				stack = append(stack, execRec{rank: rank, tid: tid, fid: e.fe.FID, entry: e.ts, entryStep: e.step, depth: len(stack)})
				d.maxDepth = max(d.maxDepth, len(stack)-1)
			case e.fe != nil:
				if len(stack) == 0 {
					t.Fatalf("rank %d tid %d: exit of %s at %d with an empty stack", rank, tid, funcTable[e.fe.FID].name, e.ts)
				}
				x := stack[len(stack)-1]
				if x.fid != e.fe.FID {
					t.Fatalf("rank %d tid %d: exit of %s at %d while %s is open", rank, tid, funcTable[e.fe.FID].name, e.ts, funcTable[x.fid].name)
				}
				stack = stack[:len(stack)-1]
				delete(onStack, x.fid)
				x.exit, x.exitStep = e.ts, e.step
				x.excl = x.exit - x.entry - x.childInclusive
				if len(stack) > 0 {
					stack[len(stack)-1].childInclusive += x.exit - x.entry
				}
				d.execs = append(d.execs, x)
			default:
				if len(stack) == 0 {
					t.Fatalf("rank %d tid %d: counter or message at %d outside any execution", rank, tid, e.ts)
				}
				top := &stack[len(stack)-1]
				name := funcTable[top.fid].name
				if e.ce != nil {
					top.counters++
					if e.ce.CID == cCorrelation {
						if top.fid != fCudaLaunchKernel && !funcTable[top.fid].gpu {
							t.Fatalf("rank %d tid %d: correlation id inside %s", rank, tid, name)
						}
						top.corr = append(top.corr, e.ce.Value)
					}
				} else {
					top.comms++
					if !strings.HasPrefix(name, "MPI_") {
						t.Fatalf("rank %d tid %d: message inside %s, not an MPI function", rank, tid, name)
					}
					if e.cm.Partner >= uint32(d.w.cfg.Ranks) {
						t.Fatalf("rank %d tid %d: message partner %d is not a rank of %d", rank, tid, e.cm.Partner, d.w.cfg.Ranks)
					}
				}
			}
		}
		if len(stack) != 0 {
			t.Fatalf("rank %d tid %d: %d executions left open, innermost %s", rank, tid, len(stack), funcTable[stack[len(stack)-1].fid].name)
		}
	}
}

// testConfigs are the shapes every structural test runs on.
func testConfigs() []struct {
	name string
	cfg  Config
} {
	small := func(mod func(*Config)) Config {
		c := DefaultConfig()
		c.Ranks, c.Steps, c.EventsPerStep = 3, 6, 8000
		c.Rates = DefaultRates.Scale(5)
		c.Rates.SlowBurst = 0.3
		mod(&c)
		return c
	}
	return []struct {
		name string
		cfg  Config
	}{
		{"cpu", small(func(c *Config) {})},
		{"gpu", small(func(c *Config) { c.GPU = true; c.PID = 3 })},
		{"one rank one thread", small(func(c *Config) { c.Ranks, c.ThreadsPerRank = 1, 1 })},
		{"four threads gpu", small(func(c *Config) { c.ThreadsPerRank, c.GPU, c.Ranks = 4, true, 2 })},
		{"tiny steps", small(func(c *Config) { c.EventsPerStep, c.Steps = 1000, 40 })},
		{"one step", small(func(c *Config) { c.Steps = 1 })},
	}
}

func (d *runData) String() string {
	return fmt.Sprintf("%d events, %d executions, %d anomalies", d.events, len(d.execs), len(d.truth))
}
