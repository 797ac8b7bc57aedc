package ad

import (
	"math"
	"sort"
	"strconv"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/stats"
)

// callStacks is the detector's first stage: it turns one rank's function,
// counter and comm events into executions, per thread, with call stacks
// that persist across io_steps, call-path nodes (for the profiles and the
// per-call-path models), the counter and comm events attached to each
// execution, and the CPU launches GPU kernels point back to. Every
// completed execution goes to done, in completion order. It also keeps the
// names of functions and counters the frames declare, and the per-thread
// profiles. Not safe for concurrent use: the detector's goroutine owns it.
type callStacks struct {
	cfg   *Config
	stats *counters
	done  func(t *thread, e *execRec) // the next stage
	xstep uint16                      // the frame being built's io_step, as execRec.xstep

	threads []*thread // in order of first appearance
	byTid   []*thread // tid < len(byTid)
	tidMap  map[uint32]*thread

	funcNames []string
	funcKnown []bool // funcKnown[fid]: a frame has named fid (even "")
	ctrNames  map[uint32]string
	corrCID   int64
	// srcCtr are the counter ids the event library reserved (names in
	// sourcecounters.go), which follow from ctrNames
	srcCtr map[uint32]sourceCounter

	// call-path nodes; node 0 is the empty path
	nodes   []pathNode
	pathTab pathTable

	launches    map[uint64]launch
	launchOrder []uint64
	launchHead  int

	counterStep map[string]*stats.Moments // this step's counter values by name
}

func newCallStacks(cfg *Config, st *counters, done func(*thread, *execRec)) *callStacks {
	return &callStacks{
		cfg: cfg, stats: st, done: done,
		tidMap:      map[uint32]*thread{},
		ctrNames:    map[uint32]string{},
		corrCID:     -1,
		nodes:       []pathNode{{}},
		launches:    map[uint64]launch{},
		counterStep: map[string]*stats.Moments{},
	}
}

// names records the function and counter names a frame declares (checked
// by checkNames first: a repeated entry names its id as before).
func (cs *callStacks) names(f *frame.Frame) {
	for _, n := range f.Funcs {
		for len(cs.funcNames) <= int(n.ID) {
			cs.funcNames = append(cs.funcNames, "")
			cs.funcKnown = append(cs.funcKnown, false)
		}
		cs.funcNames[n.ID] = n.Name
		cs.funcKnown[n.ID] = true
	}
	for _, n := range f.Counters {
		cs.nameCounter(n.ID, n.Name)
	}
}

// known reports whether thread tid has been seen.
func (cs *callStacks) known(tid uint32) bool {
	return cs.lookup(tid) != nil
}

// lookup returns thread tid, or nil when it has not been seen.
func (cs *callStacks) lookup(tid uint32) *thread {
	if tid < uint32(len(cs.byTid)) {
		if t := cs.byTid[tid]; t != nil {
			return t
		}
	}
	return cs.tidMap[tid]
}

type pathNode struct {
	parent uint32
	fid    uint32
	depth  uint16
	suffix uint32 // node of the path without its first frame, +1; 0 unknown
}

type launch struct {
	tid   uint32
	seq   uint64
	step  uint32
	idx   uint32
	fid   uint32
	entry uint64
	stack []launchFrame // innermost first
}

type launchFrame struct {
	fid       uint32
	step, idx uint32
	entry     uint64
}

func (cs *callStacks) thread(tid uint32) *thread {
	if tid < uint32(len(cs.byTid)) {
		if t := cs.byTid[tid]; t != nil {
			return t
		}
	} else if t := cs.tidMap[tid]; t != nil {
		return t
	}
	t := newThread(tid)
	cs.threads = append(cs.threads, t)
	if tid < 4096 {
		for uint32(len(cs.byTid)) <= tid {
			cs.byTid = append(cs.byTid, nil)
		}
		cs.byTid[tid] = t
	} else {
		cs.tidMap[tid] = t
	}
	return t
}

// funcName is fid's name. Frames whose events use an unnamed id wait for
// the name (Detector.held), so the "fid_N" fallback is a last resort: with
// a Barrier, where nothing is held, and for executions that did not come
// from this detector's frames.
func (cs *callStacks) funcName(fid uint32) string {
	if int(fid) < len(cs.funcNames) && cs.funcNames[fid] != "" {
		return cs.funcNames[fid]
	}
	return "fid_" + strconv.FormatUint(uint64(fid), 10)
}

// intern returns the call-path node of fid called from node parent, keeping
// at most CallPathDepth frames.
func (cs *callStacks) intern(parent, fid uint32) uint32 {
	if parent == pathOverflow {
		return pathOverflow
	}
	for int(cs.nodes[parent].depth)+1 > cs.cfg.CallPathDepth {
		if parent = cs.suffix(parent); parent == pathOverflow {
			return pathOverflow
		}
	}
	k := uint64(parent)<<32 | uint64(fid)
	if n, ok := cs.pathTab.get(k); ok {
		return n
	}
	// A top-level call always gets its node (there are no more of them than
	// functions): an overflowed call is always below another, so a
	// function's top-level calls are its flat timer less its paths and its
	// overflow (provenance.ThreadProfile.Overflow).
	if len(cs.nodes) > cs.cfg.ProfilePaths && parent != 0 {
		cs.stats.pathOverflows.Add(1)
		return pathOverflow
	}
	n := uint32(len(cs.nodes))
	cs.nodes = append(cs.nodes, pathNode{parent: parent, fid: fid, depth: cs.nodes[parent].depth + 1})
	cs.pathTab.put(k, n)
	return n
}

func (cs *callStacks) suffix(n uint32) uint32 {
	nd := cs.nodes[n]
	if nd.depth <= 1 {
		return 0
	}
	if nd.suffix != 0 {
		return nd.suffix - 1
	}
	s := cs.intern(cs.suffix(nd.parent), nd.fid)
	if s != pathOverflow {
		cs.nodes[n].suffix = s + 1
	}
	return s
}

// modelPathName is "a => b => f" for the last ModelPathDepth frames of
// execution e of thread t, read from its open callers.
func (cs *callStacks) modelPathName(t *thread, e *execRec) string {
	fids := []uint32{e.fid}
	for p := e; len(fids) < cs.cfg.ModelPathDepth && p.parent != 0; {
		if p = t.rec(p.parent - 1); p == nil {
			break
		}
		fids = append(fids, p.fid)
	}
	var b []byte
	for i := len(fids) - 1; i >= 0; i-- {
		b = append(b, cs.funcName(fids[i])...)
		if i > 0 {
			b = append(b, " => "...)
		}
	}
	return string(b)
}

// pathName is "a => b => f" for node n.
func (cs *callStacks) pathName(n uint32) string {
	var fids []uint32
	for ; n != 0; n = cs.nodes[n].parent {
		fids = append(fids, cs.nodes[n].fid)
	}
	var b []byte
	for i := len(fids) - 1; i >= 0; i-- {
		b = append(b, cs.funcName(fids[i])...)
		if i > 0 {
			b = append(b, " => "...)
		}
	}
	return string(b)
}

// build runs the call-stack builder over the frame's events.
func (cs *callStacks) build(f *frame.Frame) { cs.buildFrame(f, false) }

// buildFrame is build; counted says that the threads' entries already hold
// the frame's entries per thread (Detector.check counted them), for reserve.
func (cs *callStacks) buildFrame(f *frame.Frame, counted bool) {
	side := len(f.CounterEvents)+len(f.Comms) > 0
	if side {
		for _, t := range cs.threads {
			t.ctrIdx, t.commIdx, t.ctrPos, t.commPos = t.ctrIdx[:0], t.commIdx[:0], 0, 0
		}
		for i := range f.CounterEvents {
			t := cs.thread(f.CounterEvents[i].Tid)
			t.ctrIdx = append(t.ctrIdx, int32(i))
		}
		for i := range f.Comms {
			t := cs.thread(f.Comms[i].Tid)
			t.commIdx = append(t.commIdx, int32(i))
		}
	}
	cs.reserve(f, side, counted)
	step := uint32(f.Step)
	cs.xstep = ranMark(f.Step)
	// Consecutive events are mostly of one thread: look it up on a change.
	var t *thread
	var completed uint64 // counted once per frame, not per execution
	for i := range f.Events {
		ev := &f.Events[i]
		if t == nil || t.tid != ev.Tid {
			t = cs.thread(ev.Tid)
		}
		if !t.tsSeen {
			t.firstTS, t.tsSeen = ev.TS, true
		}
		t.lastTS = ev.TS
		if ev.Kind == frame.Entry {
			if side {
				cs.drain(f, t, ev.TS, false)
			}
			seq := t.next()
			// the new execution is written in place (reserve made room)
			k := len(t.ring)
			if k < cap(t.ring) {
				t.ring = t.ring[:k+1]
			} else {
				t.ring = append(t.ring, execRec{})
			}
			r := &t.ring[k]
			*r = execRec{entry: ev.TS, step: step, idx: uint32(i), fid: ev.FID}
			var parentPath uint32
			if n := len(t.stack); n > 0 {
				ps := t.stack[n-1]
				p := t.rec(ps)
				p.nchild++
				parentPath = p.path
				r.parent = ps + 1
				r.pstep, r.pidx = p.step, p.idx
			}
			r.path = cs.intern(parentPath, ev.FID)
			t.stack = append(t.stack, seq)
			continue
		}
		if side {
			cs.drain(f, t, ev.TS, true)
		}
		n := len(t.stack)
		if n == 0 {
			cs.stats.unmatchedExits.Add(1)
			continue
		}
		top := t.rec(t.stack[n-1])
		if top.fid != ev.FID {
			j := -1
			for k := n - 2; k >= 0 && k >= n-1-maxRepairDepth; k-- {
				if t.rec(t.stack[k]).fid == ev.FID {
					j = k
					break
				}
			}
			if j < 0 {
				// An exit with no open entry anywhere: nothing to close.
				cs.stats.unmatchedExits.Add(1)
				continue
			}
			// Entries above the match never got their exit: close them here.
			for k := n - 1; k > j; k-- {
				cs.complete(t, ev.TS, flagRepaired)
				completed++
				cs.stats.repairedOpen.Add(1)
			}
			cs.stats.mismatchedExits.Add(1)
		}
		cs.complete(t, ev.TS, 0)
		completed++
	}
	if side {
		for _, t := range cs.threads {
			cs.drain(f, t, math.MaxUint64, true)
		}
	}
	cs.stats.executions.Add(completed)
	cs.stats.events.Add(uint64(len(f.Events) + len(f.CounterEvents) + len(f.Comms)))
}

// reserve makes room in each thread's ring and attached events for what f
// adds to them, at once and with an eighth to spare, instead of letting
// append grow them by a quarter or a half at a time: what a rank keeps of a
// step is most of its memory, and in lockstep every rank of the process
// holds a step at the same time. counted says that the threads' entries
// hold f's entries per thread already.
func (cs *callStacks) reserve(f *frame.Frame, side, counted bool) {
	if !counted {
		for _, t := range cs.threads {
			t.entries = 0
		}
		var t *thread
		for i := range f.Events {
			ev := &f.Events[i]
			if ev.Kind != frame.Entry {
				continue
			}
			if t == nil || t.tid != ev.Tid {
				t = cs.thread(ev.Tid)
			}
			t.entries++
		}
	}
	for _, t := range cs.threads {
		t.ring = reserve(t.ring, t.entries)
		if side {
			t.counters = reserve(t.counters, len(t.ctrIdx))
			t.comms = reserve(t.comms, len(t.commIdx))
		}
	}
}

// reserve returns s with room for n more elements: s itself if it has it,
// otherwise a copy with room for n and an eighth of its new length more.
func reserve[T any](s []T, n int) []T {
	if cap(s)-len(s) >= n {
		return s
	}
	want := len(s) + n
	ns := make([]T, len(s), want+want/8)
	copy(ns, s)
	return ns
}

// complete closes the innermost open execution of t at ts and hands it to
// the next stage. The caller counts it in stats.executions.
func (cs *callStacks) complete(t *thread, ts uint64, flags uint8) {
	n := len(t.stack)
	seq := t.stack[n-1]
	t.stack = t.stack[:n-1]
	e := t.rec(seq)
	if ts < e.entry {
		ts = e.entry
	}
	e.exit = ts
	e.flags |= flagDone | flags
	e.xstep = cs.xstep
	if e.parent != 0 {
		if p := t.rec(e.parent - 1); p != nil {
			p.childIncl += e.exit - e.entry
		}
	}
	cs.countCall(t, e)
	t.profileAdd(e)
	cs.done(t, e)
}

// abandon closes every open execution of every thread as lost: the rank's
// io_steps have a gap, so their exits (and whatever they called in the gap)
// will never be seen. A lost execution gets no runtime (its exit is its
// entry) and goes to no later stage: no model, label, profile or record is
// built across a gap. An exit after the gap whose entry came before it then
// finds no open entry and is dropped (Stats.UnmatchedExits). It returns the
// number of executions closed.
func (cs *callStacks) abandon() uint64 {
	var n uint64
	for _, t := range cs.threads {
		for len(t.stack) > 0 {
			k := len(t.stack)
			e := t.rec(t.stack[k-1])
			t.stack = t.stack[:k-1]
			e.exit = e.entry
			e.flags |= flagDone | flagLost
			e.label = labelLost
			n++
		}
	}
	return n
}

// drain attaches t's counter and comm events up to ts to the execution open
// at their time: for an entry, events at ts belong to the new call (strictly
// before); for an exit, to the exiting call (at or before).
func (cs *callStacks) drain(f *frame.Frame, t *thread, ts uint64, incl bool) {
	for t.ctrPos < len(t.ctrIdx) {
		c := &f.CounterEvents[t.ctrIdx[t.ctrPos]]
		if c.TS > ts || (!incl && c.TS == ts) {
			break
		}
		t.ctrPos++
		if len(cs.srcCtr) > 0 {
			if sc, ok := cs.srcCtr[c.CID]; ok {
				cs.sourceEvent(t, sc, c)
				continue
			}
		}
		// An event outside every execution is attached to none: it counts
		// in the profiles and the step's statistics only.
		seq, ok := t.top()
		if ok {
			t.counters = append(t.counters, attachedCounter{seq: seq, ev: *c})
		}
		t.counterAdd(c.CID, float64(c.Value))
		name := cs.ctrNames[c.CID]
		if name == "" {
			name = "cid_" + strconv.FormatUint(uint64(c.CID), 10)
		}
		cm := cs.counterStep[name]
		if cm == nil {
			cm = &stats.Moments{}
			cs.counterStep[name] = cm
		}
		cm.Push(float64(c.Value))
		if int64(c.CID) == cs.corrCID && ok && !t.gpu {
			cs.addLaunch(t, seq, c.Value)
		}
	}
	for t.commPos < len(t.commIdx) {
		c := &f.Comms[t.commIdx[t.commPos]]
		if c.TS > ts || (!incl && c.TS == ts) {
			break
		}
		t.commPos++
		if seq, ok := t.top(); ok {
			t.comms = append(t.comms, attachedComm{seq: seq, ev: *c})
		}
	}
}

// addLaunch remembers the CPU execution that carries correlation id cid.
func (cs *callStacks) addLaunch(t *thread, seq uint64, cid uint64) {
	e := t.rec(seq)
	l := launch{tid: t.tid, seq: seq, step: e.step, idx: e.idx, fid: e.fid, entry: e.entry}
	for s := seq + 1; s != 0; {
		r := t.rec(s - 1)
		if r == nil {
			break
		}
		l.stack = append(l.stack, launchFrame{fid: r.fid, step: r.step, idx: r.idx, entry: r.entry})
		s = r.parent
	}
	if _, ok := cs.launches[cid]; !ok {
		if len(cs.launchOrder) < maxLaunches {
			cs.launchOrder = append(cs.launchOrder, cid)
		} else {
			old := cs.launchOrder[cs.launchHead]
			delete(cs.launches, old)
			cs.stats.evictedLaunches.Add(1)
			cs.launchOrder[cs.launchHead] = cid
			cs.launchHead = (cs.launchHead + 1) % maxLaunches
		}
	}
	cs.launches[cid] = l
}

// eventID renders "<rank>:<io_step>:<idx>".
func (cs *callStacks) eventID(step, idx uint32) string {
	var b [48]byte
	s := strconv.AppendUint(b[:0], uint64(cs.cfg.Rank), 10)
	s = append(s, ':')
	s = strconv.AppendUint(s, uint64(step), 10)
	s = append(s, ':')
	s = strconv.AppendUint(s, uint64(idx), 10)
	return string(s)
}

// profiles returns the per-thread profiles accumulated so far, as of step.
func (cs *callStacks) profiles(step uint64, final bool) []provenance.ThreadProfile {
	out := make([]provenance.ThreadProfile, 0, len(cs.threads))
	for _, t := range cs.threads {
		p := provenance.ThreadProfile{PID: cs.cfg.PID, Rank: cs.cfg.Rank, TID: t.tid, Step: step, Final: final,
			Timers: []provenance.TimerProfile{}, Counters: []provenance.CounterProfile{}}
		// Every execution is counted in exactly one call-path node, or past
		// the table's bound in its function's overflow, so a function's flat
		// timer is the sum of those.
		flat := map[uint32]*timerAcc{}
		var fids []uint32
		addFlat := func(fid uint32, a *timerAcc) {
			if a.calls == 0 {
				return
			}
			f := flat[fid]
			if f == nil {
				f = &timerAcc{}
				flat[fid] = f
				fids = append(fids, fid)
			}
			f.calls += a.calls
			f.subrs += a.subrs
			f.incl += a.incl
			f.excl += a.excl
			f.sqIncl += a.sqIncl
			f.sqExcl += a.sqExcl
		}
		for n := range t.paths {
			addFlat(cs.nodes[n].fid, &t.paths[n])
		}
		for fid := range t.over {
			addFlat(uint32(fid), &t.over[fid])
		}
		sort.Slice(fids, func(i, j int) bool { return fids[i] < fids[j] })
		for _, fid := range fids {
			p.Timers = append(p.Timers, timerProfile(cs.funcName(fid), flat[fid]))
		}
		for n, a := range t.paths {
			if a.calls > 0 && cs.nodes[n].depth > 1 {
				p.Timers = append(p.Timers, timerProfile(cs.pathName(uint32(n)), &a))
			}
		}
		cs.addSummaries(t, &p)
		for fid := range t.over {
			if a := &t.over[fid]; a.calls > 0 {
				p.Overflow = append(p.Overflow, timerProfile(cs.funcName(uint32(fid)), a))
			}
		}
		if t.tsSeen {
			p.FirstTS, p.LastTS = t.firstTS, t.lastTS
		}
		for cid, a := range t.ctrs {
			name := cs.ctrNames[cid]
			if name == "" {
				name = "cid_" + strconv.FormatUint(uint64(cid), 10)
			}
			p.Counters = append(p.Counters, provenance.CounterProfile{Name: name, Count: a.n, Min: a.min, Max: a.max, Mean: a.sum / float64(a.n), SumSqr: a.sumsq})
		}
		sort.Slice(p.Counters, func(i, j int) bool { return p.Counters[i].Name < p.Counters[j].Name })
		if len(t.meta) > 0 {
			p.Metadata = map[string]string{}
			for k, v := range t.meta {
				p.Metadata[k] = v
			}
		}
		out = appendParts(out, p)
	}
	return out
}

// profilePartBytes bounds the encoded size of one part of a thread profile,
// well under the largest provenance message.
const profilePartBytes = 256 << 10

// appendParts appends p to out, split into parts of at most about
// profilePartBytes encoded each when it is larger (see
// provenance.ThreadProfile): a thread with many thousands of call paths
// still has its profile published. Timers and overflow entries are shared
// out in order; part 0 keeps the counters and the metadata.
func appendParts(out []provenance.ThreadProfile, p provenance.ThreadProfile) []provenance.ThreadProfile {
	// An encoded timer is its name and some 200 bytes of numbers and keys.
	const perTimer = 200
	size := 0
	for i := range p.Timers {
		size += len(p.Timers[i].Name) + perTimer
	}
	for i := range p.Overflow {
		size += len(p.Overflow[i].Name) + perTimer
	}
	if size <= profilePartBytes {
		return append(out, p)
	}
	first := len(out)
	timers, over := p.Timers, p.Overflow
	// take removes from *list the entries that fit in the room left.
	take := func(list *[]provenance.TimerProfile, room *int, empty bool) []provenance.TimerProfile {
		n := 0
		for n < len(*list) && ((empty && n == 0) || len((*list)[n].Name)+perTimer <= *room) {
			*room -= len((*list)[n].Name) + perTimer
			n++
		}
		got := (*list)[:n:n]
		*list = (*list)[n:]
		return got
	}
	for len(timers)+len(over) > 0 {
		q := p
		if len(out) > first {
			q.Counters, q.Metadata = []provenance.CounterProfile{}, nil
		}
		room := profilePartBytes
		q.Timers = take(&timers, &room, true)
		q.Overflow = take(&over, &room, len(q.Timers) == 0)
		if len(q.Overflow) == 0 {
			q.Overflow = nil
		}
		q.Part = len(out) - first
		out = append(out, q)
	}
	for i := first; i < len(out); i++ {
		out[i].Parts = len(out) - first
	}
	return out
}

func timerProfile(name string, a *timerAcc) provenance.TimerProfile {
	return provenance.TimerProfile{Name: name, Group: "TAU_DEFAULT", Calls: a.calls, Subrs: a.subrs,
		Inclusive: float64(a.incl), Exclusive: float64(a.excl), SumSqInclusive: a.sqIncl, SumSqExclusive: a.sqExcl}
}
