package ad

import (
	"maps"
	"math"
	"slices"

	"github.com/kipimo-hpc/kipimo/internal/frame"
)

// The call stacks' part of a checkpoint: function and counter names, the
// correlation counter, call-path nodes, GPU launches, and every thread with
// its executions, attached events and profiles (see Checkpoint for the
// encoding's conventions).

// stacks writes the call stacks' names, call-path nodes, launches and
// threads.
func (w *ckWriter) stacks(cs *callStacks) {
	optLen(w, cs.funcNames)
	for i, n := range cs.funcNames {
		w.Str(n)
		w.Bool(i < len(cs.funcKnown) && cs.funcKnown[i])
	}
	ids := slices.Sorted(maps.Keys(cs.ctrNames))
	w.Uvarint(uint64(len(ids)))
	for _, id := range ids {
		w.U32(id)
		w.Str(cs.ctrNames[id])
	}
	w.Varint(cs.corrCID)
	w.Uvarint(uint64(len(cs.nodes)))
	for _, n := range cs.nodes[1:] {
		w.U32(n.parent)
		w.U32(n.fid)
		w.U32(n.suffix)
	}
	w.Uvarint(uint64(len(cs.launchOrder)))
	w.Uvarint(uint64(cs.launchHead))
	for _, cid := range cs.launchOrder {
		l := cs.launches[cid]
		w.Uvarint(cid)
		w.U32(l.tid)
		w.Uvarint(l.seq)
		w.U32(l.step)
		w.U32(l.idx)
		w.U32(l.fid)
		w.Uvarint(l.entry)
		optLen(w, l.stack)
		for _, f := range l.stack {
			w.U32(f.fid)
			w.U32(f.step)
			w.U32(f.idx)
			w.Uvarint(f.entry)
		}
	}
	w.Uvarint(uint64(len(cs.threads)))
	for _, t := range cs.threads {
		w.thread(t)
	}
}

// exec writes execution seq; its parent and the parent's event id are
// differences from its own (small numbers).
func (w *ckWriter) exec(seq uint64, prev *uint64, e *execRec) {
	w.delta(prev, e.entry)
	w.Varint(int64(e.exit - e.entry))
	w.Uvarint(e.childIncl)
	w.Varint(int64(seq - e.parent))
	w.U32(e.step)
	w.U32(e.idx)
	w.Varint(int64(e.step) - int64(e.pstep))
	w.Varint(int64(e.idx) - int64(e.pidx))
	w.U32(e.fid)
	w.U32(e.path)
	w.U32(uint32(e.key))
	w.U32(e.nchild)
	w.F32(e.score)
	w.Byte1(uint8(e.label))
	w.Byte1(e.flags)
}

// timers writes a thread's profile timers, 0 for one never called.
func (w *ckWriter) timers(ts []timerAcc) {
	w.Uvarint(uint64(len(ts)))
	for i := range ts {
		a := &ts[i]
		if *a == (timerAcc{}) && math.Float64bits(a.sqIncl)|math.Float64bits(a.sqExcl) == 0 {
			w.Uvarint(0) // never called
			continue
		}
		w.Uvarint(a.calls + 1)
		w.Uvarint(a.subrs)
		w.Uvarint(a.incl)
		w.Uvarint(a.excl)
		w.F64(a.sqIncl)
		w.F64(a.sqExcl)
	}
}

// thread writes one thread: its place, metadata, held executions, pins,
// open stack, attached events and profiles.
func (w *ckWriter) thread(t *thread) {
	w.U32(t.tid)
	w.Bool(t.gpu)
	w.Uvarint(t.lastTS)
	w.Bool(t.tsSeen)
	w.Uvarint(t.firstTS)
	w.U32(t.loc.context)
	w.U32(t.loc.device)
	w.U32(t.loc.stream)
	w.Bool(t.loc.set)
	mk := slices.Sorted(maps.Keys(t.meta))
	w.Uvarint(uint64(len(mk)))
	for _, k := range mk {
		w.Str(k)
		w.Str(t.meta[k])
	}
	w.Uvarint(t.base)
	w.Uvarint(uint64(len(t.ring)))
	var prev uint64
	for i := range t.ring {
		w.exec(t.base+uint64(i), &prev, &t.ring[i])
	}
	seqs := slices.Sorted(maps.Keys(t.detached))
	w.Uvarint(uint64(len(seqs)))
	prev = 0
	for _, s := range seqs {
		w.Uvarint(s)
		w.exec(s, &prev, t.detached[s])
	}
	pins := slices.Sorted(maps.Keys(t.pins))
	w.Uvarint(uint64(len(pins)))
	for _, s := range pins {
		w.Uvarint(s)
		w.U32(t.pins[s])
	}
	w.Uvarint(uint64(len(t.stack)))
	for _, s := range t.stack {
		w.Uvarint(s)
	}
	w.Uvarint(uint64(len(t.counters)))
	prev = 0
	for _, c := range t.counters {
		w.Uvarint(c.seq)
		w.U32(c.ev.Tid)
		w.U32(c.ev.CID)
		w.Uvarint(c.ev.Value)
		w.delta(&prev, c.ev.TS)
	}
	w.Uvarint(uint64(len(t.comms)))
	prev = 0
	for _, c := range t.comms {
		w.Uvarint(c.seq)
		w.U32(c.ev.Tid)
		w.Byte1(uint8(c.ev.Kind))
		w.U32(c.ev.Tag)
		w.U32(c.ev.Partner)
		w.Uvarint(c.ev.Bytes)
		w.delta(&prev, c.ev.TS)
	}
	w.timers(t.paths)
	w.timers(t.over)
	cids := slices.Sorted(maps.Keys(t.ctrs))
	w.Uvarint(uint64(len(cids)))
	for _, cid := range cids {
		a := t.ctrs[cid]
		w.U32(cid)
		w.Uvarint(a.n)
		w.F64(a.min)
		w.F64(a.max)
		w.F64(a.sum)
		w.F64(a.sumsq)
	}
	paths := slices.Sorted(maps.Keys(t.summ))
	w.Uvarint(uint64(len(paths)))
	for _, p := range paths {
		w.Str(p)
		w.Uvarint(t.summ[p].calls)
		w.Uvarint(t.summ[p].ns)
	}
}

// stacks reads what ckWriter.stacks wrote, checking every call path,
// launch and thread against the detector's limits.
func (r *ckReader) stacks(cs *callStacks) {
	if n := r.optCount(1); n >= 0 {
		if n > maxFID {
			r.Fail("%d function names, more than %d", n, maxFID)
			return
		}
		cs.funcNames = make([]string, n)
		cs.funcKnown = make([]bool, n)
		for i := range cs.funcNames {
			cs.funcNames[i] = r.Str()
			cs.funcKnown[i] = r.Bool()
		}
	}
	n := r.Count(2)
	for range n {
		id := r.U32()
		cs.nameCounter(id, r.Str())
	}
	cs.corrCID = r.Varint()
	if r.Err == nil && (cs.corrCID < -1 || cs.corrCID > math.MaxUint32) {
		r.Fail("correlation counter id %d", cs.corrCID)
	}
	nn := r.Uvarint()
	// Top-level calls get their node beyond ProfilePaths, one per function.
	if r.Err == nil && (nn < 1 || nn-1 > uint64(len(r.B)-r.Off)/3 || nn > uint64(cs.cfg.ProfilePaths)+1+maxFID) {
		r.Fail("%d call-path nodes (at most %d, and 3 bytes each)", nn, cs.cfg.ProfilePaths+1+maxFID)
	}
	if r.Err != nil {
		return
	}
	cs.nodes = make([]pathNode, 1, nn)
	for i := uint64(1); i < nn && r.Err == nil; i++ {
		p := uint32(r.below(i, "call-path parent"))
		fid := uint32(r.below(maxFID, "call-path function"))
		suf := r.U32()
		if r.Err == nil && uint64(suf) > nn {
			r.Fail("call-path suffix %d out of range (%d)", suf, nn)
		}
		depth := cs.nodes[p].depth + 1
		if r.Err == nil && int(depth) > cs.cfg.CallPathDepth {
			r.Fail("call path %d is %d frames deep, more than %d", i, depth, cs.cfg.CallPathDepth)
		}
		k := uint64(p)<<32 | uint64(fid)
		if _, dup := cs.pathTab.get(k); dup && r.Err == nil {
			r.Fail("call path %d repeats an earlier one", i)
		}
		if r.Err != nil {
			return
		}
		cs.nodes = append(cs.nodes, pathNode{parent: p, fid: fid, depth: depth, suffix: suf})
		cs.pathTab.put(k, uint32(i))
	}
	for i := 1; i < len(cs.nodes) && r.Err == nil; i++ {
		// a suffix is one frame shorter: following suffixes ends
		if s := cs.nodes[i].suffix; s != 0 && cs.nodes[s-1].depth+1 != cs.nodes[i].depth {
			r.Fail("call path %d has suffix %d of %d frames, not %d", i, s-1, cs.nodes[s-1].depth, cs.nodes[i].depth-1)
		}
	}
	nl := r.Count(8)
	head := r.Uvarint()
	if r.Err == nil && (nl > maxLaunches || (head != 0 && head >= uint64(nl))) {
		r.Fail("%d launches with head %d (at most %d)", nl, head, maxLaunches)
	}
	cs.launchHead = int(head)
	for range nl {
		if r.Err != nil {
			return
		}
		cid := r.Uvarint()
		l := launch{tid: r.U32(), seq: r.Uvarint(), step: r.U32(), idx: r.U32(), fid: r.U32(), entry: r.Uvarint()}
		if m := r.optCount(4); m >= 0 {
			l.stack = make([]launchFrame, m)
			for j := range l.stack {
				l.stack[j] = launchFrame{fid: r.U32(), step: r.U32(), idx: r.U32(), entry: r.Uvarint()}
			}
		}
		if _, dup := cs.launches[cid]; dup && r.Err == nil {
			r.Fail("launch of correlation id %d twice", cid)
		}
		cs.launchOrder = append(cs.launchOrder, cid)
		cs.launches[cid] = l
	}
	nt := r.Count(16)
	if r.Err == nil && nt > maxThreads {
		r.Fail("%d threads, more than %d", nt, maxThreads)
	}
	for range nt {
		if r.Err != nil {
			return
		}
		tid := r.U32()
		if cs.known(tid) {
			r.Fail("thread %d twice", tid)
			return
		}
		r.thread(cs, cs.thread(tid))
	}
}

// exec reads execution seq.
func (r *ckReader) exec(cs *callStacks, seq uint64, prev *uint64, e *execRec) {
	e.entry = r.delta(prev)
	e.exit = e.entry + uint64(r.Varint())
	e.childIncl = r.Uvarint()
	e.parent = seq - uint64(r.Varint())
	if r.Err == nil && e.parent > seq {
		// a parent is entered before its children: chains of parents end
		r.Fail("execution %d has parent %d", seq, e.parent-1)
	}
	e.step = r.U32()
	e.idx = r.U32()
	e.pstep = uint32(int64(e.step) - r.Varint())
	e.pidx = uint32(int64(e.idx) - r.Varint())
	e.fid = uint32(r.below(maxFID, "function id"))
	e.path = r.U32()
	if r.Err == nil && e.path != pathOverflow && int(e.path) >= len(cs.nodes) {
		r.Fail("call-path node %d out of range (%d)", e.path, len(cs.nodes))
	}
	e.key = int32(r.U32())
	e.nchild = r.U32()
	e.score = r.F32()
	e.label = int8(r.Byte1())
	e.flags = r.Byte1()
}

// timers reads what ckWriter.timers wrote: at most limit timers.
func (r *ckReader) timers(limit int, what string) []timerAcc {
	n := r.Count(1)
	if r.Err == nil && n > limit {
		r.Fail("%d %s timers, more than %d", n, what, limit)
	}
	if r.Err != nil || n == 0 {
		return nil
	}
	ts := make([]timerAcc, n)
	for i := range ts {
		a := &ts[i]
		c := r.Uvarint()
		if c == 0 {
			continue
		}
		a.calls = c - 1
		a.subrs = r.Uvarint()
		a.incl = r.Uvarint()
		a.excl = r.Uvarint()
		a.sqIncl = r.F64()
		a.sqExcl = r.F64()
	}
	return ts
}

// thread reads what ckWriter.thread wrote (after its tid) into t.
func (r *ckReader) thread(cs *callStacks, t *thread) {
	t.gpu = r.Bool()
	t.lastTS = r.Uvarint()
	t.tsSeen = r.Bool()
	t.firstTS = r.Uvarint()
	t.loc = gpuLoc{context: r.U32(), device: r.U32(), stream: r.U32(), set: r.Bool()}
	if n := r.Count(2); n > 0 {
		t.meta = make(map[string]string, n)
		for range n {
			k := r.Str()
			t.meta[k] = r.Str()
		}
	}
	t.base = r.Uvarint()
	nr := r.Count(17)
	if r.Err == nil && t.base+uint64(nr) < t.base {
		r.Fail("execution numbers overflow")
	}
	if r.Err != nil {
		return
	}
	t.ring = make([]execRec, nr)
	var prev uint64
	for i := range t.ring {
		r.exec(cs, t.base+uint64(i), &prev, &t.ring[i])
	}
	nd := r.Count(18)
	prev = 0
	for range nd {
		seq := r.Uvarint()
		e := &execRec{}
		r.exec(cs, seq, &prev, e)
		if r.Err == nil && (seq >= t.base || t.detached[seq] != nil) {
			r.Fail("detached execution %d of thread %d is in the ring or twice", seq, t.tid)
		}
		if r.Err != nil {
			return
		}
		t.detached[seq] = e
	}
	np := r.Count(2)
	for range np {
		seq := r.Uvarint()
		t.pins[seq] = r.U32()
	}
	ns := r.Count(1)
	if r.Err == nil && ns > 0 {
		t.stack = make([]uint64, ns)
	}
	for i := range t.stack {
		t.stack[i] = r.Uvarint()
		if r.Err != nil {
			return
		}
		// open executions, outermost first: entered in that order, held,
		// and not exited
		if e := t.rec(t.stack[i]); e == nil || e.flags&flagDone != 0 || (i > 0 && t.stack[i] <= t.stack[i-1]) {
			r.Fail("open execution %d of thread %d is not held, exited or out of order", t.stack[i], t.tid)
			return
		}
	}
	nc := r.Count(5)
	if r.Err == nil && nc > 0 {
		t.counters = make([]attachedCounter, nc)
	}
	prev = 0
	for i := range t.counters {
		c := &t.counters[i]
		c.seq = r.Uvarint()
		c.ev = frame.CounterEvent{Tid: r.U32(), CID: r.U32(), Value: r.Uvarint(), TS: r.delta(&prev)}
	}
	nm := r.Count(7)
	if r.Err == nil && nm > 0 {
		t.comms = make([]attachedComm, nm)
	}
	prev = 0
	for i := range t.comms {
		c := &t.comms[i]
		c.seq = r.Uvarint()
		c.ev = frame.CommEvent{Tid: r.U32(), Kind: frame.CommKind(r.Byte1()), Tag: r.U32(), Partner: r.U32(), Bytes: r.Uvarint(), TS: r.delta(&prev)}
	}
	t.paths = r.timers(len(cs.nodes), "call-path")
	t.over = r.timers(maxFID, "function")
	nk := r.Count(34)
	for range nk {
		cid := r.U32()
		t.ctrs[cid] = &counterAcc{n: r.Uvarint(), min: r.F64(), max: r.F64(), sum: r.F64(), sumsq: r.F64()}
	}
	nsumm := r.Count(3)
	for range nsumm {
		p := r.Str()
		t.summ[p] = &summaryAcc{calls: r.Uvarint(), ns: r.Uvarint()}
	}
}
