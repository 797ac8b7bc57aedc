package workload

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/replay"
	"github.com/kipimo-hpc/kipimo/internal/replay/steps"
)

const corpusDir = "testdata/corpus"

func corpusApp(t *testing.T, name string) TraceApp {
	t.Helper()
	for _, a := range CorpusApps(corpusDir) {
		if a.Name == name {
			return a
		}
	}
	t.Fatalf("no corpus family %s", name)
	return TraceApp{}
}

// TestCorpusManifest: the MANIFEST names every family of CorpusApps, in
// the same order, with the same path and format, and each line gives a
// source, a commit and a licence; the corpus holds at least 12 traces from
// at least 6 projects.
func TestCorpusManifest(t *testing.T) {
	fh, err := os.Open(filepath.Join(corpusDir, "MANIFEST"))
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	apps := CorpusApps(corpusDir)
	repos := map[string]bool{}
	var lines int
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		cols := strings.Split(line, "\t")
		if len(cols) != 8 {
			t.Fatalf("MANIFEST line %q has %d columns, want 8", line, len(cols))
		}
		for i, c := range cols {
			if strings.TrimSpace(c) == "" {
				t.Errorf("MANIFEST line of %s: column %d is empty", cols[0], i+1)
			}
		}
		if lines >= len(apps) {
			t.Fatalf("MANIFEST names %s, beyond the %d families of CorpusApps", cols[0], len(apps))
		}
		a := apps[lines]
		if a.Name != cols[0] || a.Format != cols[2] || a.Files[0] != filepath.Join(corpusDir, filepath.FromSlash(cols[1])) {
			t.Errorf("MANIFEST line %d is %s (%s, %s); CorpusApps has %s (%s, %s)", lines+1, cols[0], cols[1], cols[2], a.Name, a.Files[0], a.Format)
		}
		if _, err := os.Stat(a.Files[0]); err != nil {
			t.Errorf("family %s: %v", a.Name, err)
		}
		if len(cols[4]) != 40 {
			t.Errorf("family %s: commit %q is not a full commit id", cols[0], cols[4])
		}
		repos[strings.Fields(cols[3])[0]] = true
		lines++
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if lines != len(apps) {
		t.Errorf("MANIFEST has %d families, CorpusApps %d", lines, len(apps))
	}
	if lines < 12 || len(repos) < 6 {
		t.Errorf("%d traces from %d projects, want at least 12 from at least 6", lines, len(repos))
	}
}

// TestCorpusReplays: every family replays, in recorded order, with its
// injected executions beyond their function's natural maximum and nothing
// else there.
func TestCorpusReplays(t *testing.T) {
	for _, app := range CorpusApps(corpusDir) {
		t.Run(app.Name, func(t *testing.T) {
			cfg := DefaultTraceConfig(app)
			cfg.Ranks, cfg.Steps, cfg.EventsPerStep, cfg.Rate = 2, 3, 5000, 0.002
			w, err := FromTraces(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			got, truth, _ := tallyRun(t, w, true)
			if got.events == 0 {
				t.Fatal("no events replayed")
			}
			rec, _, _, _ := replayPaths(t, app, TimesRecorded, 0, 1)
			natMax := map[string]uint64{}
			for k, v := range rec.seqs {
				fn := k.path[strings.LastIndexByte(k.path, 0)+1:]
				natMax[fn] = max(natMax[fn], slices.Max(v))
			}
			checkTruth(t, got, truth, natMax)
		})
	}
}

// pathTally collects, per rank, thread and call path (the names from the
// thread's outermost open call down to the function), the exclusive
// times of the executions in the order they ended.
type pathTally struct {
	names  map[uint32]map[uint32]string
	stacks map[[2]uint32][]openCall
	seqs   map[pathKey][]uint64
}

type pathKey struct {
	rank, tid uint32
	path      string
}

func newPathTally() *pathTally {
	return &pathTally{names: map[uint32]map[uint32]string{}, stacks: map[[2]uint32][]openCall{}, seqs: map[pathKey][]uint64{}}
}

func (x *pathTally) add(f *frame.Frame, rank uint32) {
	nm := x.names[rank]
	if nm == nil {
		nm = map[uint32]string{}
		x.names[rank] = nm
	}
	for _, n := range f.Funcs {
		nm[n.ID] = n.Name
	}
	for _, e := range f.Events {
		k := [2]uint32{rank, e.Tid}
		st := x.stacks[k]
		if e.Kind == frame.Entry {
			x.stacks[k] = append(st, openCall{name: nm[e.FID], entry: e.TS})
			continue
		}
		if len(st) == 0 || st[len(st)-1].name != nm[e.FID] {
			continue
		}
		names := make([]string, len(st))
		for i, c := range st {
			names[i] = c.name
		}
		c := st[len(st)-1]
		st = st[:len(st)-1]
		incl := e.TS - c.entry
		if len(st) > 0 {
			st[len(st)-1].child += incl
		}
		x.stacks[k] = st
		pk := pathKey{rank, e.Tid, strings.Join(names, "\x00")}
		x.seqs[pk] = append(x.seqs[pk], incl-c.child)
	}
}

// shifts returns every s with got[k] == rec[(k+s) mod n] for all k.
func shifts(got, rec []uint64) []int {
	var out []int
	n := len(rec)
	for s := range n {
		ok := true
		for k := range got {
			if got[k] != rec[(k+s)%n] {
				ok = false
				break
			}
		}
		if ok {
			out = append(out, s)
		}
	}
	return out
}

// onePhase reports whether one phase p in [0, 1) gives every path its
// shift: floor(p*n) is among the path's possible shifts.
func onePhase(paths [][]int, ns []int) bool {
	for i, ss := range paths {
		for _, s := range ss {
			// The phases that give path i shift s start at s/n; where
			// the ranges of all paths meet, they start at one of these.
			p := float64(s)/float64(ns[i]) + 1e-12
			ok := true
			for j, ss2 := range paths {
				if !slices.Contains(ss2, min(int(p*float64(ns[j])), ns[j]-1)) {
					ok = false
					break
				}
			}
			if ok {
				return true
			}
		}
	}
	return false
}

// recordedOrder replays app with times mode on as many ranks as the trace
// has (each replay rank runs its trace rank), one cycle per step, and
// returns the trace's sequences per path and the replay's.
func recordedOrder(t *testing.T, app TraceApp, times string, ranks int, cycles int) (rec, got *pathTally, traceRanks int) {
	t.Helper()
	rec, got, traceRanks, unclosed := replayPaths(t, app, times, ranks, cycles)
	if unclosed != 0 {
		t.Fatalf("trace has %d unclosed calls: its call paths differ in the replay", unclosed)
	}
	return rec, got, traceRanks
}

// replayPaths is recordedOrder without the check that the trace's calls
// all close; it returns their number.
func replayPaths(t *testing.T, app TraceApp, times string, ranks int, cycles int) (rec, got *pathTally, traceRanks, unclosed int) {
	t.Helper()
	files, err := expandFiles(app, app.Format)
	if err != nil {
		t.Fatal(err)
	}
	src, err := replay.Open(app.Format, files, steps.Config{})
	if err != nil {
		t.Fatal(err)
	}
	byID := newPathTally()
	if _, err := src.Frames(context.Background(), func(f *frame.Frame) error {
		byID.add(f, f.Rank)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ids := make([]uint32, 0, len(byID.names))
	for r := range byID.names {
		ids = append(ids, r)
	}
	slices.Sort(ids)
	rec = newPathTally()
	for k, v := range byID.seqs {
		k.rank = uint32(slices.Index(ids, k.rank))
		rec.seqs[k] = v
	}
	cfg := DefaultTraceConfig(app)
	cfg.Ranks, cfg.Steps, cfg.EventsPerStep, cfg.Rate, cfg.Times = max(ranks, len(ids)), cycles, 1, 0, times
	w, stats, err := fromTraces(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	got = newPathTally()
	var f frame.Frame
	for r := range cfg.Ranks {
		if c := w.Cycles(uint32(r)); c != uint64(cycles) {
			t.Fatalf("rank %d runs %d cycles, want %d", r, c, cycles)
		}
		g := w.Rank(uint32(r))
		for {
			_, err := g.Next(&f)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			got.add(&f, uint32(r))
		}
	}
	return rec, got, len(ids), stats.Unclosed
}

// TestReplayKeepsRecordedOrder: by default a replay runs, per rank,
// thread and call path, the exclusive times the trace recorded there, in
// their recorded order: every cycle is the recorded sequence rotated, all
// paths of a rank's cycle rotated by one phase, and the phase differs from
// cycle to cycle and from rank to rank.
func TestReplayKeepsRecordedOrder(t *testing.T) {
	for _, name := range []string{"opencl_course_L5", "hecatoncheir", "hta_alexnet", "pipit_ping_pong", "caliper_cxx_example", "fastotf2_mi300", "kanika_phase1"} {
		t.Run(name, func(t *testing.T) {
			const cycles = 3
			app := corpusApp(t, name)
			rec, got, traceRanks := recordedOrder(t, app, TimesRecorded, 0, cycles)
			var checked, ordered int // paths with two values or more, executions there
			for r := range traceRanks {
				for c := range cycles {
					var sets [][]int
					var ns []int
					for k, want := range rec.seqs {
						if k.rank != uint32(r) {
							continue
						}
						seq := got.seqs[pathKey{uint32(r), k.tid, k.path}]
						if len(seq) != cycles*len(want) {
							t.Fatalf("rank %d thread %d path %q: %d executions, want %d cycles x %d", r, k.tid, k.path, len(seq), cycles, len(want))
						}
						chunk := seq[c*len(want) : (c+1)*len(want)]
						ss := shifts(chunk, want)
						if len(ss) == 0 {
							t.Fatalf("rank %d thread %d path %q, cycle %d: %v is not a rotation of the recorded %v", r, k.tid, k.path, c, head(chunk), head(want))
						}
						sets, ns = append(sets, ss), append(ns, len(want))
						if len(ss) < len(want) {
							checked++
							ordered += len(want)
						}
					}
					if !onePhase(sets, ns) {
						t.Errorf("rank %d cycle %d: no single phase rotates all %d paths", r, c, len(sets))
					}
				}
			}
			if checked == 0 {
				t.Fatal("no call path whose order could be checked (every path holds one distinct value)")
			}
			t.Logf("%d path-cycles over %d executions replayed in recorded order", checked, ordered)
		})
	}
}

func head(v []uint64) []uint64 { return v[:min(len(v), 12)] }

// longestVaried returns the path of rank r with the most executions
// among those whose recorded values are not all equal.
func longestVaried(rec *pathTally, r uint32) (pathKey, []uint64) {
	var best pathKey
	var seq []uint64
	for k, v := range rec.seqs {
		if k.rank != r || len(v) <= len(seq) || slices.Min(v) == slices.Max(v) {
			continue
		}
		best, seq = k, v
	}
	return best, seq
}

// TestReplayPhasePerRank: two replay ranks running the same trace rank
// replay the same recorded sequences at different phases.
func TestReplayPhasePerRank(t *testing.T) {
	app := corpusApp(t, "hta_alexnet")
	rec, got, _ := recordedOrder(t, app, TimesRecorded, 3, 2)
	k, want := longestVaried(rec, 0)
	if len(want) < 10 {
		t.Fatalf("longest varied path holds %d values; want a trace with a longer one", len(want))
	}
	var chunks [][]uint64
	for r := range 3 {
		seq := got.seqs[pathKey{uint32(r), k.tid, k.path}]
		if len(seq) != 2*len(want) {
			t.Fatalf("rank %d: %d executions of %q, want 2 x %d", r, len(seq), k.path, len(want))
		}
		for c := range 2 {
			chunk := seq[c*len(want) : (c+1)*len(want)]
			if len(shifts(chunk, want)) == 0 {
				t.Fatalf("rank %d cycle %d is not a rotation of the recorded sequence", r, c)
			}
			chunks = append(chunks, chunk)
		}
	}
	// Three ranks x two cycles: six phases; all alike would mean none.
	same := 0
	for _, c := range chunks[1:] {
		if slices.Equal(c, chunks[0]) {
			same++
		}
	}
	if same == len(chunks)-1 {
		t.Errorf("every rank and cycle replays %q from the same place: no phase shift", k.path)
	}
	r0 := got.seqs[pathKey{0, k.tid, k.path}]
	r1 := got.seqs[pathKey{1, k.tid, k.path}]
	if slices.Equal(r0, r1) {
		t.Errorf("ranks 0 and 1 replay %q identically: the phase does not depend on the rank", k.path)
	}
}

// TestReplayDrawMode: with TimesDraw every execution draws its time from
// its function's recorded values, so the replay keeps the values but not
// their order.
func TestReplayDrawMode(t *testing.T) {
	app := corpusApp(t, "hta_alexnet")
	rec, got, _ := recordedOrder(t, app, TimesDraw, 0, 2)
	values := map[string]map[uint64]bool{}
	for k, v := range rec.seqs {
		fn := k.path[strings.LastIndexByte(k.path, 0)+1:]
		if values[fn] == nil {
			values[fn] = map[uint64]bool{}
		}
		for _, x := range v {
			values[fn][x] = true
		}
	}
	var broken int
	for k, want := range rec.seqs {
		seq := got.seqs[k]
		if len(seq) != 2*len(want) {
			t.Fatalf("thread %d path %q: %d executions, want 2 x %d", k.tid, k.path, len(seq), len(want))
		}
		fn := k.path[strings.LastIndexByte(k.path, 0)+1:]
		for _, x := range seq {
			if !values[fn][x] {
				t.Fatalf("%s replayed %d µs, a value it never recorded", fn, x)
			}
		}
		if len(shifts(seq[:len(want)], want)) == 0 {
			broken++
		}
	}
	if broken == 0 {
		t.Error("every path replayed its recorded order: draw mode should draw each execution independently")
	}
}

// TestTimesValidate: Times takes recorded, draw or "" (recorded).
func TestTimesValidate(t *testing.T) {
	cfg := DefaultTraceConfig(corpusApp(t, "hta_cpu_only"))
	if cfg.Times != TimesRecorded {
		t.Errorf("default times %q, want %q", cfg.Times, TimesRecorded)
	}
	for _, times := range []string{"", TimesRecorded, TimesDraw} {
		cfg.Times = times
		if err := cfg.Validate(); err != nil {
			t.Errorf("times %q: %v", times, err)
		}
	}
	cfg.Times = "shuffled"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "times must be one of") {
		t.Errorf("times %q: error %v", cfg.Times, err)
	}
}
