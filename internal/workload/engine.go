package workload

import (
	"io"
	"math"
	"sort"
	"strconv"

	"github.com/kipimo-hpc/kipimo/internal/frame"
)

// The tree engine generates the realistic profile and trace replays. Each
// rank follows a template: per thread, a list of call trees ("the cycle")
// that the thread executes cycle after cycle. Cycle c of a rank's
// application starts at T0 + c*period; each tree starts at its offset in
// the cycle, or as soon as the thread's previous tree has ended. Every
// execution's exclusive runtime is drawn from its function's distribution
// (a trace replayed with TimesRecorded takes its call path's recorded
// times in order instead), or injected beyond the function's natural
// maximum, and is spread over the node's own-time gaps in the proportions
// the template recorded, so counters and messages keep their place inside
// their execution.

// tnode is one execution of a template call tree.
type tnode struct {
	fid uint32
	// entry is the original entry time (µs; traces only), used to place
	// top-level trees.
	entry uint64
	// gaps are the own-time segments: before the first child, between
	// children, after the last child (len(children)+1 entries, µs). Their
	// sum is the template's exclusive time; a replayed execution's drawn
	// exclusive time is spread over them in the same proportions (evenly
	// when they sum to 0).
	gaps     []uint64
	children []*tnode
	extras   []textra
	// seq, for a node of a trace's template, holds the exclusive times
	// recorded at the node's call path on its thread, in recorded order;
	// the node is the pos-th execution of that path in the cycle (see
	// TimesRecorded).
	seq *recSeq
	pos uint32
}

// recSeq is the exclusive times one call path of one thread recorded, in
// order (µs).
type recSeq struct{ v []uint64 }

// at returns the value of the pos-th execution of the path in a cycle
// whose phase is phase (in [0, 1)): the sequence rotated by the whole
// number of executions nearest below phase times its length.
func (s *recSeq) at(pos uint32, phase float64) uint64 {
	n := uint64(len(s.v))
	shift := min(uint64(phase*float64(n)), n-1)
	return s.v[(uint64(pos)+shift)%n]
}

// textra is a counter sample or a message inside a node's own time.
type textra struct {
	gap int32  // which own-time segment holds it
	off uint64 // µs into that segment, in the template
	// comm is true for a message (Kind, Tag, Partner, Bytes of msg), false
	// for a counter sample (cid, value).
	comm  bool
	cid   uint32
	value uint64
	// perUS adds perUS times the execution's exclusive time to value
	// (hardware counters of the synthetic profile).
	perUS uint64
	msg   frame.CommEvent
	// rel: msg.Partner is an offset from the rank (mod ranks) rather than
	// a rank of the template's application.
	rel bool
}

// ttree is one top-level call tree of a thread's cycle.
type ttree struct {
	off  uint64 // start offset in the cycle, µs
	root *tnode
}

// tthread is one thread of a rank template.
type tthread struct {
	tid   uint32
	trees []ttree
	// root, when not noFunc, is entered at the thread's start and exited at
	// the end of the run, around all cycles (like TAU's main).
	root uint32
}

// trank is the template of one rank of an application.
type trank struct {
	threads []tthread
	meta    []frame.Meta
}

// tapp is one application: its rank templates and cycle period.
type tapp struct {
	name    string
	ranks   []trank
	period  uint64 // cycle period, µs
	perStep uint64 // cycles per io_step
	width   uint64 // io_step width: perStep*period µs
	cycles  uint64 // cycles each rank runs: perStep*steps
	// corrSpan renumbers correlation ids: cycle c adds c*corrSpan.
	corrSpan uint64
	// members are the workload's ranks that run this application, in
	// order; member i follows template i mod len(ranks).
	members []uint32
}

// dist is a function's distribution of normal exclusive runtimes (µs).
type dist interface {
	// draw returns one normal exclusive runtime of an execution on rank
	// entered in io_step step.
	draw(r *splitMix, rank uint32, step uint64) uint64
	// max is the largest value draw can return on any rank and step: the
	// function's natural maximum.
	max() uint64
	// min is the smallest.
	min() uint64
	// meanValue is the expected value (for sizing the cycle period).
	meanValue() float64
}

// tfunc is a function of a tree workload.
type tfunc struct {
	name  string
	group string
	gpu   bool
	d     dist
	// injThr is the per-execution injection threshold (0: never injected).
	injThr uint64
}

// MinInjectMax is the smallest natural maximum (µs) of a function that the
// realistic profile and trace replays inject anomalies into: an execution a
// few microseconds longer than a function's largest of 0, 1 or 2 µs is not
// worth a user's attention, so it is not counted as an anomaly either.
const MinInjectMax = 10

// treeRun is a prepared tree workload.
type treeRun struct {
	profile  string
	funcs    []tfunc
	counters []string
	corrCID  uint32 // CorrelationCounter's id, or noFunc
	apps     []*tapp
	rankApp  []int32  // per rank: its application
	rankTmpl []uint32 // per rank: its template in the application
	width    uint64   // the widest application's io_step width
	steps    int
	ranks    int
	pid      uint32
	seed     uint64
	kinds    []Kind
	// recorded replays the template's recorded exclusive times in order
	// (TimesRecorded) instead of drawing them from each function's values.
	recorded bool
}

// finish computes each application's cycles per step (the whole number
// of cycles nearest to eventsPerStep events per rank, at least one), step
// width and cycles, and the injection thresholds.
func (tr *treeRun) finish(eventsPerStep int, rate float64) {
	for fi := range tr.funcs {
		f := &tr.funcs[fi]
		if f.d != nil && f.d.max() >= MinInjectMax {
			f.injThr = threshold(rate)
		}
	}
	for _, a := range tr.apps {
		var events int
		for _, rk := range a.ranks {
			for _, th := range rk.threads {
				for _, t := range th.trees {
					events += countEvents(t.root)
				}
			}
		}
		perCycle := float64(events) / float64(len(a.ranks))
		a.perStep = uint64(max(1, math.Round(float64(eventsPerStep)/max(1, perCycle))))
		a.period = max(1, a.period)
		a.width = a.perStep * a.period
		a.cycles = a.perStep * uint64(tr.steps)
		tr.width = max(tr.width, a.width)
	}
	if rate > 0 {
		tr.kinds = []Kind{BeyondMax}
	}
}

// stepOf is the io_step of time ts on a rank of application a.
func (a *tapp) stepOf(ts uint64, steps int) uint64 {
	if ts < T0 {
		return 0
	}
	return min((ts-T0)/a.width, uint64(steps-1))
}

// treeGen generates one rank of a tree workload.
type treeGen struct {
	tr      *treeRun
	app     *tapp
	rank    uint32
	step    uint64
	threads []*treeThread
	meta    []frame.Meta
	seenF   []bool
	seenC   []bool
	// members of the rank's application and the rank's position there
	member int
}

type treeThread struct {
	g       *treeGen
	tmpl    *tthread
	rng     splitMix
	clock   uint64
	cycle   uint64
	next    int // next tree of the cycle
	started bool
	done    bool
	// phase of cycle phaseCycle (valid when phaseSet), see phaseOf.
	phase      float64
	phaseCycle uint64
	phaseSet   bool
	pending
}

// phaseOf returns the phase of the thread's current cycle: a uniform value
// in [0, 1) drawn from the seed, the rank and the cycle alone, so that all
// threads of a rank shift their recorded times alike in a cycle and every
// rank and cycle shifts them differently.
func (t *treeThread) phaseOf() float64 {
	if !t.phaseSet || t.phaseCycle != t.cycle {
		r := splitMix{mix(t.g.tr.seed, 11, uint64(t.g.rank), t.cycle)}
		t.phase, t.phaseCycle, t.phaseSet = r.float(), t.cycle, true
	}
	return t.phase
}

func (tr *treeRun) rankGen(r uint32) *treeGen {
	a := tr.apps[tr.rankApp[r]]
	tmpl := &a.ranks[tr.rankTmpl[r]]
	g := &treeGen{tr: tr, app: a, rank: r, seenF: make([]bool, len(tr.funcs)), seenC: make([]bool, len(tr.counters))}
	for i, m := range a.members {
		if m == r {
			g.member = i
		}
	}
	for i := range tmpl.threads {
		th := &tmpl.threads[i]
		t := &treeThread{g: g, tmpl: th, clock: T0}
		t.rng.s = mix(tr.seed, 3, uint64(r), uint64(th.tid))
		g.threads = append(g.threads, t)
	}
	g.meta = overrideMeta(tmpl.meta, r, tr.ranks, frame.Meta{Key: "Kipimo Workload", Value: tr.profile + ": " + a.name})
	return g
}

// partner maps a message partner of the template (a rank of the
// application's trace) to a rank of the workload running the same
// application: the member with the same template in the same copy when
// there is one, else the members taken round robin.
func (g *treeGen) partner(x *textra) uint32 {
	if x.rel {
		return uint32((uint64(g.rank) + uint64(x.msg.Partner)) % uint64(g.tr.ranks))
	}
	a := g.app
	n := len(a.ranks)
	copyIdx := g.member / n
	idx := (int(x.msg.Partner) + copyIdx*n) % len(a.members)
	return a.members[idx]
}

func (g *treeGen) next(f *frame.Frame) ([]Truth, error) {
	tr := g.tr
	if g.step >= uint64(tr.steps) {
		return nil, io.EOF
	}
	f.Reset()
	f.PID, f.Rank, f.Step = tr.pid, g.rank, g.step
	f.TStart = T0 + g.step*g.app.width
	f.TEnd = f.TStart + g.app.width
	last := g.step == uint64(tr.steps-1)
	end := f.TEnd
	if last {
		end = math.MaxUint64
	}
	var truth []Truth
	for _, t := range g.threads {
		for !t.done && (last || (t.clock < end && !t.startsAfter(end))) {
			t.unit()
		}
		truth = t.cut(f, end, truth)
	}
	if g.step == 0 {
		f.Metadata = append(f.Metadata, g.meta...)
	}
	if last {
		for _, e := range f.Events {
			f.TEnd = max(f.TEnd, e.TS+1)
		}
	}
	for _, e := range f.Events {
		if !g.seenF[e.FID] {
			g.seenF[e.FID] = true
			f.Funcs = append(f.Funcs, frame.Name{ID: e.FID, Name: tr.funcs[e.FID].name})
		}
	}
	for _, e := range f.CounterEvents {
		if !g.seenC[e.CID] {
			g.seenC[e.CID] = true
			f.Counters = append(f.Counters, frame.Name{ID: e.CID, Name: tr.counters[e.CID]})
		}
	}
	g.step++
	return truth, nil
}

// startsAfter reports whether the thread's next tree enters at or after
// end, so that none of its events is in the step ending there: it is left
// for the next step instead of being generated now and held, a step's
// worth of events per rank when a cycle is a single tree. (Generating it
// later draws the same values: each thread has its own generator.)
func (t *treeThread) startsAfter(end uint64) bool {
	a := t.g.app
	th := t.tmpl
	if !t.started || t.cycle >= a.cycles || len(th.trees) == 0 {
		return false
	}
	return max(t.clock, T0+t.cycle*a.period+th.trees[t.next].off) >= end
}

// unit generates the thread's next piece of work: the root's entry, the
// next tree of the cycle, or the root's exit once all cycles are done.
func (t *treeThread) unit() {
	a := t.g.app
	th := t.tmpl
	if !t.started {
		t.started = true
		if th.root != noFunc {
			t.ev = append(t.ev, frame.FuncEvent{Tid: th.tid, Kind: frame.Entry, FID: th.root, TS: t.clock})
			t.clock++
		}
	}
	if t.cycle >= a.cycles || len(th.trees) == 0 {
		if th.root != noFunc {
			t.clock++
			t.ev = append(t.ev, frame.FuncEvent{Tid: th.tid, Kind: frame.Exit, FID: th.root, TS: t.clock})
		}
		t.done = true
		return
	}
	tree := &th.trees[t.next]
	t.clock = max(t.clock, T0+t.cycle*a.period+tree.off)
	t.exec(tree.root)
	t.next++
	if t.next == len(th.trees) {
		t.next = 0
		t.cycle++
	}
}

// exec generates one execution of n and its subtree from the thread's
// clock, and advances the clock to its exit.
func (t *treeThread) exec(n *tnode) {
	g := t.g
	tr := g.tr
	fn := &tr.funcs[n.fid]
	entry := t.clock
	var excl uint64
	if tr.recorded && n.seq != nil {
		excl = n.seq.at(n.pos, t.phaseOf())
	} else {
		excl = fn.d.draw(&t.rng, g.rank, g.app.stepOf(entry, tr.steps))
	}
	var kind Kind
	if fn.injThr != 0 && t.rng.next() < fn.injThr {
		// 1.5 to 3 times the natural maximum, rounded up so that the
		// injected value is never below 1.5 times it.
		lo, hi := Factor(BeyondMax)
		excl = uint64(math.Ceil(float64(fn.d.max()) * (lo + (hi-lo)*t.rng.float())))
		kind = BeyondMax
	}
	tid := t.tmpl.tid
	t.ev = append(t.ev, frame.FuncEvent{Tid: tid, Kind: frame.Entry, FID: n.fid, TS: entry})
	var orig uint64
	for _, x := range n.gaps {
		orig += x
	}
	var acc, placed uint64 // template µs and drawn µs of the gaps so far
	xi := 0
	for i, og := range n.gaps {
		var gap uint64
		acc += og
		switch {
		case i == len(n.gaps)-1:
			gap = excl - placed
		case orig > 0:
			gap = uint64(float64(excl)*float64(acc)/float64(orig)+0.5) - placed
		}
		for ; xi < len(n.extras) && int(n.extras[xi].gap) == i; xi++ {
			x := &n.extras[xi]
			off := x.off
			if og > 0 {
				off = uint64(float64(gap) * float64(x.off) / float64(og))
			}
			off = min(off, gap)
			t.extra(x, t.clock+off, excl)
		}
		placed += gap
		t.clock += gap
		if i < len(n.children) {
			t.exec(n.children[i])
		}
	}
	t.ev = append(t.ev, frame.FuncEvent{Tid: tid, Kind: frame.Exit, FID: n.fid, TS: t.clock})
	if kind != "" {
		t.truth = append(t.truth, Truth{
			PID: tr.pid, Rank: g.rank, Tid: tid, FID: n.fid, Func: fn.name,
			Step: g.app.stepOf(t.clock, tr.steps), Entry: entry, Exit: t.clock, Exclusive: excl, Kind: kind,
		})
	}
}

func (t *treeThread) extra(x *textra, ts, excl uint64) {
	tid := t.tmpl.tid
	if x.comm {
		m := x.msg
		m.Tid, m.TS, m.Partner = tid, ts, t.g.partner(x)
		t.cm = append(t.cm, m)
		return
	}
	v := x.value + x.perUS*excl
	if x.cid == t.g.tr.corrCID {
		v += t.cycle * t.g.app.corrSpan
	}
	t.ce = append(t.ce, frame.CounterEvent{Tid: tid, CID: x.cid, Value: v, TS: ts})
}

// funcSpecs describes a tree workload's functions.
func (tr *treeRun) funcSpecs() []FuncSpec {
	out := make([]FuncSpec, len(tr.funcs))
	for i, f := range tr.funcs {
		s := FuncSpec{ID: uint32(i), Name: f.name, Group: f.group, GPU: f.gpu}
		if f.d != nil {
			s.NaturalMin, s.NaturalMax = float64(f.d.min()), float64(f.d.max())
		}
		if f.injThr != 0 {
			s.Anomaly = BeyondMax
		}
		out[i] = s
	}
	return out
}

// calls counts, per function, the executions in one cycle of rank r's
// template (roots excluded).
func (tr *treeRun) callsPerCycle(r uint32) map[uint32]int {
	out := map[uint32]int{}
	var walk func(n *tnode)
	walk = func(n *tnode) {
		out[n.fid]++
		for _, c := range n.children {
			walk(c)
		}
	}
	tmpl := &tr.apps[tr.rankApp[r]].ranks[tr.rankTmpl[r]]
	for _, th := range tmpl.threads {
		for _, t := range th.trees {
			walk(t.root)
		}
	}
	return out
}

// assignRanks spreads the workload's ranks over the applications round
// robin: rank r runs application r mod len(apps).
func (tr *treeRun) assignRanks() {
	tr.rankApp = make([]int32, tr.ranks)
	tr.rankTmpl = make([]uint32, tr.ranks)
	for r := range tr.ranks {
		a := r % len(tr.apps)
		app := tr.apps[a]
		tr.rankApp[r] = int32(a)
		tr.rankTmpl[r] = uint32(len(app.members) % len(app.ranks))
		app.members = append(app.members, uint32(r))
	}
}

// overrideMeta replaces or adds the metadata keys that name the rank.
func overrideMeta(meta []frame.Meta, rank uint32, ranks int, extra ...frame.Meta) []frame.Meta {
	out := make([]frame.Meta, 0, len(meta)+len(extra)+2)
	for _, m := range meta {
		if m.Key == "MPI Rank" || m.Key == "MPI Size" {
			continue
		}
		out = append(out, m)
	}
	out = append(out,
		frame.Meta{Tid: 0, Key: "MPI Rank", Value: strconv.FormatUint(uint64(rank), 10)},
		frame.Meta{Tid: 0, Key: "MPI Size", Value: strconv.Itoa(ranks)})
	out = append(out, extra...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Tid < out[j].Tid })
	return out
}
