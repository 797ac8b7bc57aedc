package workload

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/replay"
	"github.com/kipimo-hpc/kipimo/internal/replay/steps"
)

// TraceApp is one application's trace: the files of one run (a directory
// stands for the trace files in it) and their format, one of
// replay.Formats; "" detects it from the names (DetectFormat).
type TraceApp struct {
	Name   string   `json:"name,omitempty"` // default: the first file's base name
	Files  []string `json:"files"`
	Format string   `json:"format,omitempty"`
}

// TraceConfig describes a replay of real traces (FromTraces).
//
// Each application's trace becomes a template: per trace rank and thread,
// the call trees it recorded, in order, with their start times (idle time
// when no thread of the application is inside any function is shortened to
// MaxIdle). Rank r of the workload runs application r mod len(Apps) and,
// within it, the trace's ranks in turn (the i-th rank running an
// application follows its trace rank i mod its number of trace ranks), so
// 8 ranks over three applications run 3, 3 and 2 copies. Each rank replays
// its template's trees cycle after cycle. With Times TimesRecorded (the
// default) every execution takes the exclusive times its call path
// recorded on its trace rank and thread, in recorded order, rotated by a
// phase per rank and cycle; with TimesDraw it draws its exclusive time
// from its function's recorded exclusive times (all applications and ranks
// together: a function is keyed by its name). Either way the replay keeps
// the trace's structure, messages, counters and per-function
// distributions, and never exceeds a function's recorded maximum (its
// natural maximum). Injected anomalies (kind BeyondMax) are 1.5-3x that
// maximum.
type TraceConfig struct {
	Apps  []TraceApp `json:"apps"`
	PID   uint32     `json:"pid"`
	Ranks int        `json:"ranks"`
	Steps int        `json:"steps"`
	Seed  uint64     `json:"seed"`
	// Rate is the probability that an execution of a function whose
	// natural maximum is at least MinInjectMax µs is injected.
	Rate float64 `json:"rate"`
	// EventsPerStep sets each application's io_step width: the whole
	// number of its cycles nearest to this many events per rank (at least
	// one cycle). Ranks of different applications thus have steps of
	// different widths; each step of a rank holds whole cycles.
	EventsPerStep int `json:"events_per_step"`
	// MaxIdle (µs) is the longest idle time kept between top-level calls
	// when no thread of an application is inside a function.
	MaxIdle uint64 `json:"max_idle_us"`
	// Times is how executions get their exclusive times: TimesRecorded
	// ("" means it too) or TimesDraw.
	Times string `json:"times,omitempty"`
}

// How a replay times its executions (TraceConfig.Times).
const (
	// TimesRecorded replays, per trace rank, thread and call path, the
	// exclusive times the trace recorded there, in their recorded order.
	// Each cycle of a replay rank starts the sequences at a phase drawn
	// from the seed, the rank and the cycle: with phase p, the k-th of
	// the n executions of a path in the cycle takes recorded value
	// (k + floor(p*n)) mod n. Warm-up, phases, bursts and per-rank
	// differences of the trace are kept, shifted in time; every cycle
	// replays each path's recorded values exactly once.
	TimesRecorded = "recorded"
	// TimesDraw draws every execution's exclusive time independently
	// from all the values its function recorded (any rank, thread or
	// call path): the trace's distributions without their order.
	TimesDraw = "draw"
)

// TimesModes lists the values of TraceConfig.Times.
var TimesModes = []string{TimesRecorded, TimesDraw}

// Defaults of TraceConfig.
const (
	// DefaultTraceRate injects 1.5 executions in 10,000 of the functions
	// that can be hit: about 280 anomalies in the 2.3M executions of the
	// evaluation traces (EvalApps) at 8 ranks x 40 steps.
	DefaultTraceRate          = 0.00015
	DefaultTraceRanks         = 8
	DefaultTraceSteps         = 40
	DefaultTraceEventsPerStep = 20000
	DefaultMaxIdle            = 1000
)

// DefaultTraceConfig returns the defaults for apps: 8 ranks, 40 steps, seed
// 1, rate DefaultTraceRate, recorded times.
func DefaultTraceConfig(apps ...TraceApp) TraceConfig {
	return TraceConfig{Apps: apps, Ranks: DefaultTraceRanks, Steps: DefaultTraceSteps, Seed: 1,
		Rate: DefaultTraceRate, EventsPerStep: DefaultTraceEventsPerStep, MaxIdle: DefaultMaxIdle, Times: TimesRecorded}
}

// Validate reports what is wrong with c.
func (c TraceConfig) Validate() error {
	var errs []string
	add := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	if len(c.Apps) == 0 {
		add("no trace to replay")
	}
	for i, a := range c.Apps {
		if len(a.Files) == 0 {
			add("application %d names no file", i+1)
		}
	}
	if c.Ranks < 1 || c.Ranks > MaxRanks {
		add("ranks must be between 1 and %d, got %d", MaxRanks, c.Ranks)
	} else if c.Ranks < len(c.Apps) {
		add("%d ranks for %d applications: each application needs a rank at least", c.Ranks, len(c.Apps))
	}
	if c.Steps < 1 || c.Steps > MaxSteps {
		add("steps must be between 1 and %d, got %d", MaxSteps, c.Steps)
	}
	if !(c.Rate >= 0 && c.Rate <= 1) {
		add("anomaly rate must be in [0, 1], got %v", c.Rate)
	}
	if c.EventsPerStep < 1 || c.EventsPerStep > MaxEventsPerStep {
		add("events per step must be between 1 and %d, got %d", MaxEventsPerStep, c.EventsPerStep)
	}
	if c.Times != "" && !slices.Contains(TimesModes, c.Times) {
		add("times must be one of %s, got %q", strings.Join(TimesModes, ", "), c.Times)
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

// DetectFormat guesses the replay format of a trace from its name, or for a
// directory from the names in it: TAU (.trc, .edf), Chrome/PyTorch (.json,
// .json.gz), Caliper (.cali), Kipimo frames (.frames), OTF2 (.otf2).
func DetectFormat(path string) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("trace %w", err)
	}
	names := []string{filepath.Base(path)}
	if st.IsDir() {
		entries, err := os.ReadDir(path)
		if err != nil {
			return "", fmt.Errorf("trace %s: %w", path, err)
		}
		names = names[:0]
		for _, e := range entries {
			names = append(names, e.Name())
		}
	}
	for _, n := range names {
		n = strings.ToLower(n)
		var f string
		switch {
		case strings.HasSuffix(n, ".trc"), strings.HasSuffix(n, ".edf"):
			f = replay.FormatTAU
		case strings.HasSuffix(n, ".json"), strings.HasSuffix(n, ".json.gz"):
			f = replay.FormatChrome
		case strings.HasSuffix(n, ".cali"):
			f = replay.FormatCaliper
		case strings.HasSuffix(n, ".frames"):
			f = replay.FormatFrames
		case strings.HasSuffix(n, ".otf2"):
			f = replay.FormatOTF2
		default:
			continue
		}
		if !slices.Contains(replay.Formats, f) {
			return "", fmt.Errorf("trace %s: format %s is not one this build reads (%s)", path, f, strings.Join(replay.Formats, ", "))
		}
		return f, nil
	}
	return "", fmt.Errorf("trace %s: cannot tell its format from its name; give it (one of %s)", path, strings.Join(replay.Formats, ", "))
}

// expandFiles lists the files of app: directories stand for their regular,
// non-hidden files, except for the formats whose readers take directories.
func expandFiles(app TraceApp, format string) ([]string, error) {
	if format == replay.FormatTAU || format == replay.FormatFrames || format == replay.FormatOTF2 {
		return app.Files, nil
	}
	var out []string
	for _, p := range app.Files {
		st, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("trace %w", err)
		}
		if !st.IsDir() {
			out = append(out, p)
			continue
		}
		entries, err := os.ReadDir(p)
		if err != nil {
			return nil, fmt.Errorf("trace %s: %w", p, err)
		}
		for _, e := range entries {
			if e.Type().IsRegular() && !strings.HasPrefix(e.Name(), ".") {
				out = append(out, filepath.Join(p, e.Name()))
			}
		}
	}
	sort.Strings(out)
	return out, nil
}

// TraceStats says what reading a trace kept and dropped.
type TraceStats struct {
	// Executions paired from entries and exits.
	Executions int `json:"executions"`
	// Unclosed entries (never exited: their completed children are kept
	// as top-level calls), unmatched exits, and counter samples and
	// messages outside every execution were dropped.
	Unclosed      int `json:"unclosed"`
	UnmatchedExit int `json:"unmatched_exits"`
	Outside       int `json:"outside"`
}

// openExec is an execution being paired.
type openExec struct {
	n    *tnode
	mark uint64 // start of the current own-time segment
}

// topTree is a completed top-level call tree with its original times.
type topTree struct {
	root        *tnode
	entry, exit uint64
}

// traceThread pairs one thread's events.
type traceThread struct {
	stack []openExec
	trees []topTree
}

// traceRank is one rank of a trace being read.
type traceRank struct {
	funcs    map[uint32]uint32 // the frame's fid -> the reader's fid
	counters map[uint32]uint32
	threads  map[uint32]*traceThread
	meta     []frame.Meta
}

// traceReader pairs the events of one or more applications into call trees.
type traceReader struct {
	funcIDs  map[string]uint32
	funcName []string
	gpuFunc  []bool
	values   [][]uint64 // exclusive times per function
	cidOf    map[string]uint32
	cidName  []string
	stats    TraceStats
	maxCorr  uint64
}

func (tr *traceReader) fid(name string) uint32 {
	if id, ok := tr.funcIDs[name]; ok {
		return id
	}
	id := uint32(len(tr.funcName))
	tr.funcIDs[name] = id
	tr.funcName = append(tr.funcName, name)
	tr.gpuFunc = append(tr.gpuFunc, false)
	tr.values = append(tr.values, nil)
	return id
}

func (tr *traceReader) cid(name string) uint32 {
	if id, ok := tr.cidOf[name]; ok {
		return id
	}
	id := uint32(len(tr.cidName))
	tr.cidOf[name] = id
	tr.cidName = append(tr.cidName, name)
	return id
}

// frame adds one frame's events to rank rk.
func (tr *traceReader) frame(rk *traceRank, f *frame.Frame) {
	for _, n := range f.Funcs {
		rk.funcs[n.ID] = tr.fid(n.Name)
	}
	for _, n := range f.Counters {
		rk.counters[n.ID] = tr.cid(n.Name)
	}
	rk.meta = append(rk.meta, f.Metadata...)
	// Per thread, events of each kind are in timestamp order; a counter or
	// message belongs to the innermost execution open at its time (one at
	// the time of an exit to the exiting execution, one at the time of an
	// entry to the entered one).
	type extraAt struct {
		ts uint64
		x  textra
	}
	extras := map[uint32][]extraAt{}
	for _, c := range f.CounterEvents {
		cid, ok := rk.counters[c.CID]
		if !ok {
			cid = tr.cid(fmt.Sprintf("counter %d", c.CID))
		}
		if tr.cidName[cid] == CorrelationCounter {
			tr.maxCorr = max(tr.maxCorr, c.Value)
		}
		extras[c.Tid] = append(extras[c.Tid], extraAt{c.TS, textra{cid: cid, value: c.Value}})
	}
	for _, m := range f.Comms {
		extras[m.Tid] = append(extras[m.Tid], extraAt{m.TS, textra{comm: true, msg: frame.CommEvent{Kind: m.Kind, Tag: m.Tag, Partner: m.Partner, Bytes: m.Bytes}}})
	}
	for tid := range extras {
		xs := extras[tid]
		sort.SliceStable(xs, func(i, j int) bool { return xs[i].ts < xs[j].ts })
	}
	next := map[uint32]int{}
	thread := func(tid uint32) *traceThread {
		th := rk.threads[tid]
		if th == nil {
			th = &traceThread{}
			rk.threads[tid] = th
		}
		return th
	}
	flush := func(tid uint32, th *traceThread, upTo uint64, inclusive bool) {
		xs := extras[tid]
		i := next[tid]
		for ; i < len(xs) && (xs[i].ts < upTo || (inclusive && xs[i].ts == upTo)); i++ {
			if len(th.stack) == 0 {
				tr.stats.Outside++
				continue
			}
			top := &th.stack[len(th.stack)-1]
			x := xs[i].x
			x.gap = int32(len(top.n.gaps))
			x.off = satSub(xs[i].ts, top.mark)
			top.n.extras = append(top.n.extras, x)
		}
		next[tid] = i
	}
	for _, e := range f.Events {
		th := thread(e.Tid)
		fid, ok := rk.funcs[e.FID]
		if !ok {
			fid = tr.fid(fmt.Sprintf("function %d", e.FID))
		}
		if e.Kind == frame.Entry {
			flush(e.Tid, th, e.TS, false)
			if len(th.stack) > 0 {
				top := &th.stack[len(th.stack)-1]
				top.n.gaps = append(top.n.gaps, satSub(e.TS, top.mark))
			}
			th.stack = append(th.stack, openExec{n: &tnode{fid: fid, entry: e.TS}, mark: e.TS})
			continue
		}
		flush(e.Tid, th, e.TS, true)
		if len(th.stack) == 0 || th.stack[len(th.stack)-1].n.fid != fid {
			tr.stats.UnmatchedExit++
			continue
		}
		top := th.stack[len(th.stack)-1]
		th.stack = th.stack[:len(th.stack)-1]
		n := top.n
		n.gaps = append(n.gaps, satSub(e.TS, top.mark))
		var excl uint64
		for _, g := range n.gaps {
			excl += g
		}
		tr.values[fid] = append(tr.values[fid], excl)
		tr.stats.Executions++
		if len(th.stack) == 0 {
			th.trees = append(th.trees, topTree{root: n, entry: n.entry, exit: max(e.TS, n.entry)})
			continue
		}
		parent := &th.stack[len(th.stack)-1]
		parent.n.children = append(parent.n.children, n)
		parent.mark = e.TS
	}
	for tid, xs := range extras {
		th := thread(tid)
		if next[tid] < len(xs) {
			flush(tid, th, math.MaxUint64, true)
		}
	}
}

func satSub(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}

// close ends a rank's reading: unclosed executions are dropped and their
// completed children kept as top-level calls.
func (tr *traceReader) close(rk *traceRank) {
	for _, th := range rk.threads {
		for _, o := range th.stack {
			tr.stats.Unclosed++
			for _, c := range o.n.children {
				th.trees = append(th.trees, topTree{root: c, entry: c.entry, exit: c.entry + inclusive(c)})
			}
		}
		th.stack = nil
	}
}

func inclusive(n *tnode) uint64 {
	var d uint64
	for _, g := range n.gaps {
		d += g
	}
	for _, c := range n.children {
		d += inclusive(c)
	}
	return d
}

func isGPUMeta(key string) bool {
	k := strings.ToUpper(key)
	return strings.Contains(k, "CUDA") || strings.Contains(k, "GPU") || strings.Contains(k, "OPENCL") || strings.Contains(k, "ROCM")
}

// readApp reads one application's trace into its rank templates.
func (tr *traceReader) readApp(ctx context.Context, app TraceApp, maxIdle uint64) (*tapp, error) {
	format := app.Format
	if format == "" {
		var err error
		if format, err = DetectFormat(app.Files[0]); err != nil {
			return nil, err
		}
	}
	files, err := expandFiles(app, format)
	if err != nil {
		return nil, err
	}
	name := app.Name
	if name == "" {
		name = filepath.Base(app.Files[0])
	}
	src, err := replay.Open(format, files, steps.Config{})
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", name, err)
	}
	return tr.readSource(ctx, name, src, maxIdle)
}

// MaxCyclePeriod is the longest cycle a replay accepts (µs, about 12.7
// days of trace time once idle time is cut).
const MaxCyclePeriod = 1 << 40

// readSource reads an application's frames into its rank templates.
func (tr *traceReader) readSource(ctx context.Context, name string, src replay.Source, maxIdle uint64) (*tapp, error) {
	ranks := map[uint32]*traceRank{}
	tr.maxCorr = 0
	_, err := src.Frames(ctx, func(f *frame.Frame) error {
		rk := ranks[f.Rank]
		if rk == nil {
			rk = &traceRank{funcs: map[uint32]uint32{}, counters: map[uint32]uint32{}, threads: map[uint32]*traceThread{}}
			ranks[f.Rank] = rk
		}
		tr.frame(rk, f)
		return ctx.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", name, err)
	}
	a := &tapp{name: name, corrSpan: tr.maxCorr + 1}
	rankIDs := make([]uint32, 0, len(ranks))
	for r, rk := range ranks {
		tr.close(rk)
		rankIDs = append(rankIDs, r)
	}
	slices.Sort(rankIDs)
	// Idle time when no thread of the application is inside a function is
	// cut to maxIdle; offsets are measured from the first call.
	type span struct{ lo, hi uint64 }
	var spans []span
	for _, rk := range ranks {
		for _, th := range rk.threads {
			for _, t := range th.trees {
				spans = append(spans, span{t.entry, t.exit})
			}
		}
	}
	if len(spans) == 0 {
		return nil, fmt.Errorf("trace %s: no complete function execution to replay", name)
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].lo < spans[j].lo })
	type cut struct{ at, removed uint64 }
	var cuts []cut // idle ends and the idle removed up to them
	start := spans[0].lo
	end := spans[0].hi
	var removed uint64
	for _, s := range spans[1:] {
		if s.lo > end && s.lo-end > maxIdle {
			removed += s.lo - end - maxIdle
			cuts = append(cuts, cut{s.lo, removed})
		}
		end = max(end, s.hi)
	}
	mapT := func(t uint64) uint64 {
		i := sort.Search(len(cuts), func(i int) bool { return cuts[i].at > t })
		var rm uint64
		if i > 0 {
			rm = cuts[i-1].removed
		}
		return t - start - rm
	}
	index := map[uint32]uint32{}
	for i, r := range rankIDs {
		index[r] = uint32(i)
	}
	var last uint64
	for _, r := range rankIDs {
		rk := ranks[r]
		var tm trank
		tids := make([]uint32, 0, len(rk.threads))
		for tid := range rk.threads {
			tids = append(tids, tid)
		}
		slices.Sort(tids)
		gpuTid := map[uint32]bool{}
		for _, m := range rk.meta {
			if isGPUMeta(m.Key) {
				gpuTid[m.Tid] = true
			}
		}
		for _, tid := range tids {
			th := rk.threads[tid]
			if len(th.trees) == 0 {
				continue
			}
			sort.SliceStable(th.trees, func(i, j int) bool { return th.trees[i].entry < th.trees[j].entry })
			recordSequences(th.trees)
			tt := tthread{tid: tid, root: noFunc}
			for _, t := range th.trees {
				tt.trees = append(tt.trees, ttree{off: mapT(t.entry), root: t.root})
				last = max(last, mapT(t.entry)+(t.exit-t.entry))
				if gpuTid[tid] {
					markGPU(t.root, tr.gpuFunc)
				}
				mapPartners(t.root, index, uint32(len(rankIDs)))
			}
			tm.threads = append(tm.threads, tt)
		}
		if len(tm.threads) == 0 {
			continue
		}
		tm.meta = rk.meta
		a.ranks = append(a.ranks, tm)
	}
	if last > MaxCyclePeriod {
		return nil, fmt.Errorf("trace %s: its calls span %d µs after idle time is cut, more than the %d µs a cycle may last", name, last, uint64(MaxCyclePeriod))
	}
	a.period = last + last/20 + 10
	return a, nil
}

// recordSequences gives every node of a thread's trees (in entry order)
// the sequence of exclusive times recorded at its call path on the thread
// and its position there.
func recordSequences(trees []topTree) {
	// A call path is known by its parent path's index and its function.
	type step struct {
		parent int32
		fid    uint32
	}
	index := map[step]int32{}
	var seqs []*recSeq
	var walk func(n *tnode, parent int32)
	walk = func(n *tnode, parent int32) {
		k := step{parent, n.fid}
		id, ok := index[k]
		if !ok {
			id = int32(len(seqs))
			index[k] = id
			seqs = append(seqs, &recSeq{})
		}
		s := seqs[id]
		var excl uint64
		for _, g := range n.gaps {
			excl += g
		}
		n.seq, n.pos = s, uint32(len(s.v))
		s.v = append(s.v, excl)
		for _, c := range n.children {
			walk(c, id)
		}
	}
	for _, t := range trees {
		walk(t.root, -1)
	}
}

func markGPU(n *tnode, gpu []bool) {
	gpu[n.fid] = true
	for _, c := range n.children {
		markGPU(c, gpu)
	}
}

// mapPartners turns message partners (trace ranks) into template indexes.
func mapPartners(n *tnode, index map[uint32]uint32, nranks uint32) {
	for i := range n.extras {
		x := &n.extras[i]
		if !x.comm {
			continue
		}
		if j, ok := index[x.msg.Partner]; ok {
			x.msg.Partner = j
		} else {
			x.msg.Partner %= nranks
		}
	}
	for _, c := range n.children {
		mapPartners(c, index, nranks)
	}
}

// renumber gives functions and counters ids in name order, so that the
// ids do not depend on the order the readers delivered frames in.
func (tr *traceReader) renumber(run *treeRun) {
	fperm := make([]uint32, len(tr.funcName))
	order := make([]uint32, len(tr.funcName))
	for i := range order {
		order[i] = uint32(i)
	}
	sort.Slice(order, func(i, j int) bool { return tr.funcName[order[i]] < tr.funcName[order[j]] })
	for newID, old := range order {
		fperm[old] = uint32(newID)
	}
	cperm := make([]uint32, len(tr.cidName))
	corder := make([]uint32, len(tr.cidName))
	for i := range corder {
		corder[i] = uint32(i)
	}
	sort.Slice(corder, func(i, j int) bool { return tr.cidName[corder[i]] < tr.cidName[corder[j]] })
	for newID, old := range corder {
		cperm[old] = uint32(newID)
	}
	run.funcs = make([]tfunc, len(order))
	for newID, old := range order {
		f := tfunc{name: tr.funcName[old], group: groupOf(tr.funcName[old]), gpu: tr.gpuFunc[old]}
		if len(tr.values[old]) > 0 {
			f.d = newEmpirical(tr.values[old])
		}
		run.funcs[newID] = f
	}
	run.counters = make([]string, len(corder))
	run.corrCID = noFunc
	for newID, old := range corder {
		run.counters[newID] = tr.cidName[old]
		if tr.cidName[old] == CorrelationCounter {
			run.corrCID = uint32(newID)
		}
	}
	seen := map[*tnode]bool{}
	var walk func(n *tnode)
	walk = func(n *tnode) {
		if seen[n] {
			return
		}
		seen[n] = true
		n.fid = fperm[n.fid]
		for i := range n.extras {
			if !n.extras[i].comm {
				n.extras[i].cid = cperm[n.extras[i].cid]
			}
		}
		for _, c := range n.children {
			walk(c)
		}
	}
	for _, a := range run.apps {
		for _, rk := range a.ranks {
			for _, th := range rk.threads {
				for _, t := range th.trees {
					walk(t.root)
				}
			}
		}
	}
}

// groupOf guesses a TAU group from a function's name.
func groupOf(name string) string {
	switch {
	case strings.HasPrefix(name, "MPI_"):
		return "MPI"
	case strings.HasPrefix(name, "cuda"), strings.HasPrefix(name, "hip"), strings.HasPrefix(name, "cl"):
		return "GPU"
	}
	return "TAU_DEFAULT"
}

// FromTraces reads the traces of cfg.Apps and prepares their replay (see
// TraceConfig). The workload it returns is used like New's: Rank(r).Next
// yields frames and truth.
func FromTraces(ctx context.Context, cfg TraceConfig) (*Workload, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("trace replay config: %w", err)
	}
	w, _, err := fromTraces(ctx, cfg)
	return w, err
}

func fromTraces(ctx context.Context, cfg TraceConfig) (*Workload, TraceStats, error) {
	rd := newTraceReader()
	var apps []*tapp
	for _, app := range cfg.Apps {
		a, err := rd.readApp(ctx, app, cfg.MaxIdle)
		if err != nil {
			return nil, rd.stats, err
		}
		apps = append(apps, a)
	}
	w, err := rd.build(cfg, apps)
	return w, rd.stats, err
}

func newTraceReader() *traceReader {
	return &traceReader{funcIDs: map[string]uint32{}, cidOf: map[string]uint32{}}
}

// build makes the workload of the applications read.
func (rd *traceReader) build(cfg TraceConfig, apps []*tapp) (*Workload, error) {
	run := &treeRun{profile: ProfileReplay, steps: cfg.Steps, ranks: cfg.Ranks, pid: cfg.PID, seed: cfg.Seed, apps: apps,
		recorded: cfg.Times != TimesDraw}
	rd.renumber(run)
	run.assignRanks()
	run.finish(cfg.EventsPerStep, cfg.Rate)
	for _, a := range run.apps {
		// T0 + cycles*period must not overflow, with room for overruns.
		if a.cycles > 0 && (a.period > (1<<62)/a.cycles || a.width > (1<<62)/uint64(cfg.Steps)) {
			return nil, fmt.Errorf("trace %s: %d steps of %d cycles of %d µs overflow the clock; give fewer steps or events per step", a.name, cfg.Steps, a.perStep, a.period)
		}
	}
	wc := Config{PID: cfg.PID, Ranks: cfg.Ranks, Steps: cfg.Steps, Seed: cfg.Seed, Profile: ProfileReplay}
	return fromTree(wc, run), nil
}

// Applications returns, per rank, the name of the application it replays
// (trace replays) or of the simulated code.
func (w *Workload) Applications() []string {
	out := make([]string, w.cfg.Ranks)
	for r := range out {
		if w.tree == nil {
			out[r] = "simulated MD code"
			continue
		}
		out[r] = w.tree.apps[w.tree.rankApp[r]].name
	}
	return out
}

// CallsPerCycle counts, per function name, the executions in one cycle of
// rank r's template: a realistic or replayed rank runs
// CallsPerCycle(r)[f] * Cycles(r) executions of f over the run (nil for the
// classic profile).
func (w *Workload) CallsPerCycle(r uint32) map[string]int {
	if w.tree == nil {
		return nil
	}
	out := map[string]int{}
	for fid, n := range w.tree.callsPerCycle(r) {
		out[w.tree.funcs[fid].name] = n
	}
	return out
}

// Cycles is the number of cycles rank r runs (0 for the classic profile).
func (w *Workload) Cycles(r uint32) uint64 {
	if w.tree == nil {
		return 0
	}
	return w.tree.apps[w.tree.rankApp[r]].cycles
}

// EvalApps lists the real traces the evaluation uses, kept under dir (the
// package's testdata/eval): a 12-rank MPI code traced by TAU
// (kanika_phase1), an OpenCL application's host and queue threads traced by
// TAU (opencl_course_L5) and a PyTorch inference run on an A100 traced by
// the PyTorch profiler (pytorch_simple_add).
func EvalApps(dir string) []TraceApp {
	return []TraceApp{
		{Name: "kanika_phase1", Files: []string{filepath.Join(dir, "kanika_phase1")}, Format: replay.FormatTAU},
		{Name: "opencl_course_L5", Files: []string{filepath.Join(dir, "opencl_course_L5")}, Format: replay.FormatTAU},
		{Name: "pytorch_simple_add", Files: []string{filepath.Join(dir, "pytorch_simple_add", "benchmark_result_493459_1694039959_trace.json.gz")}, Format: replay.FormatChrome},
	}
}
