package workload

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/replay"
	"github.com/kipimo-hpc/kipimo/internal/replay/steps"
)

// execKey identifies one execution.
type evalKey struct {
	rank, tid uint32
	entry     uint64
	fn        string
}

// execTally measures executions in frames with its own stack per thread:
// exclusive time = (exit - entry) - the inclusive times of the children.
// It is the tests' independent reading of both the traces (through
// replay.Open) and the generated frames.
type execTally struct {
	names  map[uint32]map[uint32]string // rank -> fid -> name
	stacks map[[2]uint32][]openCall
	excl   map[string][]uint64
	count  map[uint32]map[string]int // rank -> name -> executions
	byKey  map[evalKey]uint64
	keep   bool // fill byKey
	events int
}

type openCall struct {
	name  string
	entry uint64
	child uint64
}

func newTally(keep bool) *execTally {
	return &execTally{names: map[uint32]map[uint32]string{}, stacks: map[[2]uint32][]openCall{},
		excl: map[string][]uint64{}, count: map[uint32]map[string]int{}, byKey: map[evalKey]uint64{}, keep: keep}
}

func (x *execTally) add(f *frame.Frame) {
	x.events += f.NumEvents()
	nm := x.names[f.Rank]
	if nm == nil {
		nm = map[uint32]string{}
		x.names[f.Rank] = nm
		x.count[f.Rank] = map[string]int{}
	}
	for _, n := range f.Funcs {
		nm[n.ID] = n.Name
	}
	for _, e := range f.Events {
		k := [2]uint32{f.Rank, e.Tid}
		st := x.stacks[k]
		if e.Kind == frame.Entry {
			x.stacks[k] = append(st, openCall{name: nm[e.FID], entry: e.TS})
			continue
		}
		if len(st) == 0 || st[len(st)-1].name != nm[e.FID] {
			continue
		}
		c := st[len(st)-1]
		st = st[:len(st)-1]
		incl := e.TS - c.entry
		ex := incl - c.child
		if len(st) > 0 {
			st[len(st)-1].child += incl
		}
		x.stacks[k] = st
		x.excl[c.name] = append(x.excl[c.name], ex)
		x.count[f.Rank][c.name]++
		if x.keep {
			x.byKey[evalKey{f.Rank, e.Tid, c.entry, c.name}] = ex
		}
	}
}

// tallyTrace reads a trace through replay.Open.
func tallyTrace(t *testing.T, app TraceApp) *execTally {
	t.Helper()
	src, err := replay.Open(app.Format, app.Files, steps.Config{})
	if err != nil {
		t.Fatal(err)
	}
	x := newTally(false)
	if _, err := src.Frames(context.Background(), func(f *frame.Frame) error { x.add(f); return nil }); err != nil {
		t.Fatal(err)
	}
	return x
}

// tallyRun generates every rank of w and returns the tally, the truth and
// the frames' binary encoding.
func tallyRun(t *testing.T, w *Workload, keep bool) (*execTally, []Truth, []byte) {
	t.Helper()
	x := newTally(keep)
	var truth []Truth
	var enc []byte
	var f frame.Frame
	for r := range w.Config().Ranks {
		g := w.Rank(uint32(r))
		last := map[[2]uint32]uint64{} // (section, tid) -> last timestamp
		for {
			tr, err := g.Next(&f)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			truth = append(truth, tr...)
			checkFrame(t, &f, last)
			x.add(&f)
			enc = frame.AppendBinary(enc, &f)
		}
	}
	return x, truth, enc
}

// checkFrame checks what the detector relies on: a valid frame whose
// events lie in [TStart, TEnd), in timestamp order per thread and section
// from frame to frame, with every function and counter named by the time
// it is used.
func checkFrame(t *testing.T, f *frame.Frame, last map[[2]uint32]uint64) {
	t.Helper()
	if err := f.Validate(); err != nil {
		t.Fatalf("rank %d step %d: %v", f.Rank, f.Step, err)
	}
	// Sections 0-2 hold the last timestamps; 7 and 8 mark the functions
	// and counters named so far.
	for _, n := range f.Funcs {
		last[[2]uint32{7, n.ID}] = 1
	}
	for _, n := range f.Counters {
		last[[2]uint32{8, n.ID}] = 1
	}
	check := func(section, tid uint32, ts uint64) {
		k := [2]uint32{section, tid}
		if ts < f.TStart || ts >= f.TEnd {
			t.Fatalf("rank %d step %d: section %d tid %d event at %d outside [%d, %d)", f.Rank, f.Step, section, tid, ts, f.TStart, f.TEnd)
		}
		if ts < last[k] {
			t.Fatalf("rank %d step %d: section %d tid %d goes back from %d to %d", f.Rank, f.Step, section, tid, last[k], ts)
		}
		last[k] = ts
	}
	for _, e := range f.Events {
		check(0, e.Tid, e.TS)
		if last[[2]uint32{7, e.FID}] == 0 {
			t.Fatalf("rank %d step %d: function %d used before it is named", f.Rank, f.Step, e.FID)
		}
	}
	for _, e := range f.CounterEvents {
		check(1, e.Tid, e.TS)
		if last[[2]uint32{8, e.CID}] == 0 {
			t.Fatalf("rank %d step %d: counter %d used before it is named", f.Rank, f.Step, e.CID)
		}
	}
	for _, e := range f.Comms {
		check(2, e.Tid, e.TS)
	}
}

func quantile(sorted []uint64, q float64) uint64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func evalApp(t *testing.T, name string) TraceApp {
	t.Helper()
	for _, a := range EvalApps("testdata/eval") {
		if a.Name == name {
			return a
		}
	}
	t.Fatalf("no evaluation trace %s", name)
	return TraceApp{}
}

// TestReplayCallsPerCycle: every rank of a single-application replay runs,
// per function, its trace rank's executions once per cycle.
func TestReplayCallsPerCycle(t *testing.T) {
	for _, tc := range []struct {
		app        string
		traceRanks int
	}{
		{"kanika_phase1", 12},
		{"opencl_course_L5", 1},
		{"pytorch_simple_add", 1},
	} {
		t.Run(tc.app, func(t *testing.T) {
			app := evalApp(t, tc.app)
			trace := tallyTrace(t, app)
			if len(trace.count) != tc.traceRanks {
				t.Fatalf("trace has %d ranks, want %d", len(trace.count), tc.traceRanks)
			}
			cfg := DefaultTraceConfig(app)
			cfg.Ranks, cfg.Steps, cfg.EventsPerStep = tc.traceRanks+1, 3, 1 // one cycle per step; the last rank is a second copy
			w, err := FromTraces(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			got, _, _ := tallyRun(t, w, false)
			traceRanks := make([]uint32, 0, len(trace.count))
			for r := range trace.count {
				traceRanks = append(traceRanks, r)
			}
			slices.Sort(traceRanks)
			for r := range cfg.Ranks {
				if c := w.Cycles(uint32(r)); c != 3 {
					t.Fatalf("rank %d runs %d cycles, want 3 (one per step)", r, c)
				}
				want := trace.count[traceRanks[r%tc.traceRanks]]
				for fn, n := range want {
					if g := got.count[uint32(r)][fn]; g != 3*n {
						t.Errorf("rank %d: %s ran %d times, want 3 x %d", r, fn, g, n)
					}
				}
				if len(got.count[uint32(r)]) != len(want) {
					t.Errorf("rank %d ran %d functions, its trace rank %d", r, len(got.count[uint32(r)]), len(want))
				}
			}
		})
	}
}

// TestReplayDistribution: without injection, a replay's exclusive times
// per function are values the trace recorded, never above its maximum,
// and their quantiles match the trace's: the replay's q-quantile lies
// between the trace's (q-0.02)- and (q+0.02)-quantiles for every function
// replayed at least 2,000 times (the replay resamples the trace's values,
// so with 2,000 draws a quantile's rank is off by 0.011 at most at one
// standard error).
func TestReplayDistribution(t *testing.T) {
	for _, tc := range []struct {
		app           string
		ranks         int
		eventsPerStep int
		compared      int // functions compared by quantile, at least
	}{
		{"kanika_phase1", 12, DefaultTraceEventsPerStep, 5},
		{"opencl_course_L5", 1, 200_000, 2},
		{"pytorch_simple_add", 1, 200_000, 10},
	} {
		t.Run(tc.app, func(t *testing.T) {
			app := evalApp(t, tc.app)
			trace := tallyTrace(t, app)
			cfg := DefaultTraceConfig(app)
			cfg.Ranks, cfg.Steps, cfg.Rate, cfg.EventsPerStep = tc.ranks, 4, 0, tc.eventsPerStep
			w, err := FromTraces(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			got, truth, _ := tallyRun(t, w, false)
			if len(truth) != 0 {
				t.Fatalf("%d anomalies injected at rate 0", len(truth))
			}
			compared := 0
			for fn, tv := range trace.excl {
				slices.Sort(tv)
				gv := got.excl[fn]
				if len(gv) == 0 {
					t.Errorf("%s never replayed", fn)
					continue
				}
				slices.Sort(gv)
				recorded := map[uint64]bool{}
				for _, v := range tv {
					recorded[v] = true
				}
				for _, v := range gv {
					if !recorded[v] {
						t.Errorf("%s: replayed %d µs, a value the trace never recorded", fn, v)
						break
					}
				}
				if gv[len(gv)-1] > tv[len(tv)-1] {
					t.Errorf("%s: replay max %d above the trace's %d", fn, gv[len(gv)-1], tv[len(tv)-1])
				}
				if len(gv) < 2000 {
					continue
				}
				compared++
				for _, q := range []float64{0.1, 0.5, 0.9, 0.99} {
					lo, hi := quantile(tv, max(0, q-0.02)), quantile(tv, min(1, q+0.02))
					if g := quantile(gv, q); g < lo || g > hi {
						t.Errorf("%s: replay p%g = %d µs, trace's p%g..p%g = %d..%d µs", fn, 100*q, g, 100*(q-0.02), 100*(q+0.02), lo, hi)
					}
				}
			}
			if compared < tc.compared {
				t.Errorf("%d functions compared by quantile, want at least %d", compared, tc.compared)
			}
			t.Logf("%d functions, %d replayed 2,000 times or more compared by quantile; %d replayed executions", len(trace.excl), compared, countAll(got))
		})
	}
}

func countAll(x *execTally) int {
	n := 0
	for _, v := range x.excl {
		n += len(v)
	}
	return n
}

// checkTruth checks that the truth is exactly the set of executions beyond
// each function's natural maximum, each 1.5-3x it.
func checkTruth(t *testing.T, got *execTally, truth []Truth, natMax map[string]uint64) {
	t.Helper()
	injected := map[evalKey]Truth{}
	for _, tr := range truth {
		k := evalKey{tr.Rank, tr.Tid, tr.Entry, tr.Func}
		injected[k] = tr
		m, ok := natMax[tr.Func]
		if !ok || m < MinInjectMax {
			t.Fatalf("injected into %s, natural max %d µs", tr.Func, m)
		}
		if float64(tr.Exclusive) < 1.5*float64(m) || float64(tr.Exclusive) > math.Ceil(3*float64(m)) {
			t.Errorf("%s injected at %d µs, natural max %d µs: not 1.5-3x", tr.Func, tr.Exclusive, m)
		}
		ex, ok := got.byKey[k]
		if !ok {
			t.Fatalf("truth %+v is no execution of the frames", tr)
		}
		if ex != tr.Exclusive {
			t.Errorf("truth says %d µs, the frames %d µs for %+v", tr.Exclusive, ex, tr)
		}
		if tr.Kind != BeyondMax {
			t.Errorf("kind %s", tr.Kind)
		}
	}
	beyond := 0
	for k, ex := range got.byKey {
		m, ok := natMax[k.fn]
		if !ok {
			continue
		}
		if ex > m {
			beyond++
			if _, ok := injected[k]; !ok {
				t.Errorf("natural execution of %s at %d µs above its natural max %d µs", k.fn, ex, m)
			}
		}
	}
	if beyond != len(truth) {
		t.Errorf("%d executions beyond their natural max, %d in the truth", beyond, len(truth))
	}
}

func TestReplayInjectedBeyondNaturalMax(t *testing.T) {
	apps := EvalApps("testdata/eval")
	natMax := map[string]uint64{}
	for _, a := range apps {
		for fn, v := range tallyTrace(t, a).excl {
			natMax[fn] = max(natMax[fn], slices.Max(v))
		}
	}
	cfg := DefaultTraceConfig(apps...)
	cfg.Ranks, cfg.Steps, cfg.Rate = 3, 5, 0.01
	w, err := FromTraces(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	got, truth, _ := tallyRun(t, w, true)
	if len(truth) < 100 {
		t.Fatalf("only %d anomalies injected", len(truth))
	}
	checkTruth(t, got, truth, natMax)
	for _, s := range w.Functions() {
		if m, ok := natMax[s.Name]; ok && uint64(s.NaturalMax) != m {
			t.Errorf("%s: NaturalMax %v, the traces' max %d", s.Name, s.NaturalMax, m)
		}
	}
	t.Logf("%d executions, %d injected", len(got.byKey), len(truth))
}

func TestRealisticInjectedBeyondNaturalMax(t *testing.T) {
	for _, gpu := range []bool{false, true} {
		cfg := DefaultConfig()
		cfg.Profile, cfg.Ranks, cfg.Steps, cfg.EventsPerStep, cfg.GPU = ProfileRealistic, 4, 8, 0, gpu
		cfg.Rates.BeyondMax = 0.005
		w, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		natMax := map[string]uint64{}
		for _, s := range w.Functions() {
			if s.NaturalMax > 0 { // the roots span the run and have none
				natMax[s.Name] = uint64(s.NaturalMax)
			}
		}
		got, truth, _ := tallyRun(t, w, true)
		if len(truth) < 100 {
			t.Fatalf("gpu %v: only %d anomalies injected", gpu, len(truth))
		}
		checkTruth(t, got, truth, natMax)
	}
}

func TestEvalDeterministic(t *testing.T) {
	apps := EvalApps("testdata/eval")
	replayOf := func(seed uint64) func() (*Workload, error) {
		return func() (*Workload, error) {
			cfg := DefaultTraceConfig(apps...)
			cfg.Ranks, cfg.Steps, cfg.Seed, cfg.Rate = 4, 3, seed, 0.001
			return FromTraces(context.Background(), cfg)
		}
	}
	realisticOf := func(seed uint64) func() (*Workload, error) {
		return func() (*Workload, error) {
			cfg := DefaultConfig()
			cfg.Profile, cfg.Ranks, cfg.Steps, cfg.EventsPerStep, cfg.Seed, cfg.GPU = ProfileRealistic, 3, 4, 0, seed, true
			return New(cfg)
		}
	}
	for _, tc := range []struct {
		name string
		a, b func() (*Workload, error)
		same bool
	}{
		{"replay same seed", replayOf(7), replayOf(7), true},
		{"replay other seed", replayOf(7), replayOf(8), false},
		{"realistic same seed", realisticOf(7), realisticOf(7), true},
		{"realistic other seed", realisticOf(7), realisticOf(8), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wa, err := tc.a()
			if err != nil {
				t.Fatal(err)
			}
			wb, err := tc.b()
			if err != nil {
				t.Fatal(err)
			}
			_, ta, ea := tallyRun(t, wa, false)
			_, tb, eb := tallyRun(t, wb, false)
			var ba, bb bytes.Buffer
			if err := WriteTruth(&ba, ta); err != nil {
				t.Fatal(err)
			}
			if err := WriteTruth(&bb, tb); err != nil {
				t.Fatal(err)
			}
			same := bytes.Equal(ea, eb) && bytes.Equal(ba.Bytes(), bb.Bytes())
			if same != tc.same {
				t.Errorf("frames and truth identical = %v, want %v", same, tc.same)
			}
		})
	}
}

// TestRealisticShapes checks the realistic profile at its documented size:
// 8 ranks x 40 steps of about 2.6M events, with the shapes it promises.
func TestRealisticShapes(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Profile, cfg.Steps, cfg.EventsPerStep, cfg.Rates.BeyondMax = ProfileRealistic, 40, 0, 0
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	x := newTally(false)
	// Per rank and per step, the exclusive times of some functions.
	type rs struct {
		rank uint32
		fn   string
	}
	perRank := map[rs][]uint64{}
	perStep := map[uint64][]uint64{} // integrate, by step
	var f frame.Frame
	for r := range cfg.Ranks {
		g := w.Rank(uint32(r))
		for {
			_, err := g.Next(&f)
			if errors.Is(err, io.EOF) {
				break
			}
			before := map[string]int{}
			for fn, v := range x.excl {
				before[fn] = len(v)
			}
			x.add(&f)
			for fn, v := range x.excl {
				perRank[rs{uint32(r), fn}] = append(perRank[rs{uint32(r), fn}], v[before[fn]:]...)
				if fn == "integrate" {
					perStep[f.Step] = append(perStep[f.Step], v[before[fn]:]...)
				}
			}
		}
	}
	if x.events < 2_300_000 || x.events > 2_900_000 {
		t.Errorf("%d events in 8 ranks x 40 steps, want about 2.6M", x.events)
	}
	t.Logf("%d events", x.events)
	sorted := func(v []uint64) []uint64 { v = slices.Clone(v); slices.Sort(v); return v }
	mean := func(v []uint64) float64 {
		s := 0.0
		for _, x := range v {
			s += float64(x)
		}
		return s / float64(len(v))
	}

	t.Run("quantised wrappers", func(t *testing.T) {
		for _, fn := range []string{"neighbor_check", "MPI_Type_size", "vec_zero"} {
			levels := map[uint64]int{}
			for _, v := range x.excl[fn] {
				levels[v]++
			}
			for v := range levels {
				if v > 2 {
					t.Errorf("%s took %d µs: wrappers take 0, 1 or 2", fn, v)
				}
			}
			if levels[0] == 0 || levels[1] == 0 {
				t.Errorf("%s levels %v: want at least 0 and 1 µs", fn, levels)
			}
		}
	})
	t.Run("bimodal kernels", func(t *testing.T) {
		for _, tc := range []struct {
			fn  string
			low float64 // weight of the low mode
		}{{"pair_kernel", 0.7}, {"compute_chunk", 0.5}, {"apply_constraints", 0.8}} {
			v := sorted(perRank[rs{0, tc.fn}])
			// The widest gap between consecutive values splits the modes.
			gap, at := uint64(0), 0
			for i := 1; i < len(v); i++ {
				if d := v[i] - v[i-1]; d > gap {
					gap, at = d, i
				}
			}
			frac := float64(at) / float64(len(v))
			if gap < 20 || math.Abs(frac-tc.low) > 0.03 {
				t.Errorf("%s on rank 0: widest gap %d µs with %.3f of the values below, want >= 20 µs and %.2f", tc.fn, gap, frac, tc.low)
			}
		}
	})
	t.Run("log-normal and heavy tails", func(t *testing.T) {
		for _, tc := range []struct {
			fn       string
			minRatio float64 // p99 / p50
		}{{"bonded_kernel", 1.8}, {"MPI_Allreduce", 50}, {"MPI_Waitall", 20}, {"omp_barrier", 10}} {
			v := sorted(perRank[rs{0, tc.fn}])
			p50, p99 := quantile(v, 0.5), quantile(v, 0.99)
			if r := float64(p99) / float64(max(1, p50)); r < tc.minRatio {
				t.Errorf("%s: p99/p50 = %d/%d = %.1f, want >= %g", tc.fn, p99, p50, r, tc.minRatio)
			}
		}
	})
	t.Run("drift", func(t *testing.T) {
		var early, late []uint64
		for s := range uint64(5) {
			early = append(early, perStep[s]...)
			late = append(late, perStep[39-s]...)
		}
		if r := mean(late) / mean(early); r < 1.12 || r > 1.2 {
			t.Errorf("integrate: mean of the last 5 steps / first 5 = %.3f, want about 1.16 (20%% drift over the run)", r)
		}
	})
	t.Run("rank imbalance", func(t *testing.T) {
		lo, hi := math.Inf(1), 0.0
		for r := range uint32(cfg.Ranks) {
			m := mean(perRank[rs{r, "integrate"}])
			lo, hi = min(lo, m), max(hi, m)
		}
		if hi/lo < 1.05 {
			t.Errorf("integrate: slowest rank's mean / fastest's = %.3f, want >= 1.05", hi/lo)
		}
	})
}

func TestDetectFormat(t *testing.T) {
	dir := t.TempDir()
	mk := func(parts ...string) string {
		p := filepath.Join(append([]string{dir}, parts...)...)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name, path, want, err string
	}{
		{"tau directory", filepath.Dir(mk("tau", "tautrace.0.0.0.trc")), replay.FormatTAU, ""},
		{"edf file", mk("x", "events.0.edf"), replay.FormatTAU, ""},
		{"pytorch trace", mk("y", "trace.pt.trace.json.gz"), replay.FormatChrome, ""},
		{"chrome json", mk("y", "Trace.JSON"), replay.FormatChrome, ""},
		{"caliper", mk("z", "run.cali"), replay.FormatCaliper, ""},
		{"frames directory", filepath.Dir(mk("f", "rank-0.frames")), replay.FormatFrames, ""},
		{"otf2 archive", filepath.Dir(mk("o", "traces.otf2")), replay.FormatOTF2, ""},
		{"unknown", mk("u", "notes.txt"), "", "cannot tell its format"},
		{"empty directory", filepath.Dir(mk("e", ".hidden", "x")), "", "cannot tell its format"},
		{"missing", filepath.Join(dir, "nope.json"), "", "nope.json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DetectFormat(tc.path)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("DetectFormat(%s) = %q, %v; want %q", tc.path, got, err, tc.want)
			}
		})
	}
}

// TestReplayHoldsLittleBetweenSteps: between two steps a rank's generator
// holds only the part of a call tree that runs past the step's end (less
// than a step: no tree that starts after the end is generated ahead), in
// buffers at most four times its size: at thousands of ranks what each rank
// holds between steps is what the whole run holds.
func TestReplayHoldsLittleBetweenSteps(t *testing.T) {
	tc := DefaultTraceConfig(evalApp(t, "kanika_phase1"))
	tc.Ranks, tc.Steps, tc.EventsPerStep = 4, 6, 1000
	w, err := FromTraces(context.Background(), tc)
	if err != nil {
		t.Fatal(err)
	}
	var f frame.Frame
	for r := range uint32(tc.Ranks) {
		g := w.Rank(r)
		for s := 0; s < tc.Steps-1; s++ {
			if _, err := g.Next(&f); err != nil {
				t.Fatal(err)
			}
			held, room := 0, 0
			for _, th := range g.tree.threads {
				held += len(th.ev) + len(th.ce) + len(th.cm)
				room += cap(th.ev) + cap(th.ce) + cap(th.cm)
			}
			step := f.NumEvents()
			if held >= step {
				t.Errorf("rank %d step %d: %d events held for the next step, the step had %d", r, s, held, step)
			}
			if room > max(3*256, 4*held) {
				t.Errorf("rank %d step %d: room for %d events kept to hold %d", r, s, room, held)
			}
		}
	}
}
