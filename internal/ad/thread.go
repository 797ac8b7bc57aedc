package ad

import (
	"sort"
	"strconv"
	"strings"

	"github.com/kipimo-hpc/kipimo/internal/frame"
)

// Labels of an execution.
const (
	labelNone    int8 = 0 // open, or completed and not yet labelled
	labelNormal  int8 = 1
	labelAnomaly int8 = -1
	// labelLost is an execution whose exit was lost in a gap of the rank's
	// io_steps: it was closed when the gap was found, with no runtime, and
	// is never scored, modelled, profiled or recorded.
	labelLost int8 = 2
)

// Execution flags.
const (
	flagDone     uint8 = 1 << iota // exited
	flagRepaired                   // closed by a repair, not by its own exit
	flagLost                       // open at a gap in the io_steps: its exit is unknown
	flagWarmup                     // one of the first calls of its function on its thread
)

// execRec is one execution. Records live in their thread's ring, in entry
// order; seq numbers a thread's executions from 0.
type execRec struct {
	entry     uint64
	exit      uint64
	childIncl uint64 // sum of the children's inclusive times
	parent    uint64 // seq+1 of the parent; 0 at the root
	step      uint32 // io_step of the entry (event id)
	idx       uint32 // index of the entry in its frame's events (event id)
	pstep     uint32 // the parent's event id (valid when parent != 0)
	pidx      uint32
	fid       uint32
	path      uint32 // call-path node (pathOverflow when the table was full)
	key       int32  // model key + 1, once known
	nchild    uint32
	score     float32
	label     int8
	flags     uint8
	// xstep is the io_step the execution exited in, as 1 + the step mod
	// ranMod (0: unknown): the step it ran in, for its record (ranSteps).
	// It takes the struct's padding.
	xstep uint16
}

func (e *execRec) incl() uint64 {
	if e.exit < e.entry {
		return 0
	}
	return e.exit - e.entry
}

func (e *execRec) excl() uint64 {
	in := e.incl()
	if e.childIncl > in {
		return 0
	}
	return in - e.childIncl
}

// attached is a counter or comm event attached to an execution.
type attachedCounter struct {
	seq uint64
	ev  frame.CounterEvent
}

type attachedComm struct {
	seq uint64
	ev  frame.CommEvent
}

// timerAcc accumulates a profile timer (calls > 0 once seen).
type timerAcc struct {
	calls, subrs   uint64
	incl, excl     uint64
	sqIncl, sqExcl float64
}

// summaryAcc accumulates the calls of one call path that the event library
// summarised: leaf calls, so their inclusive and exclusive times are one.
type summaryAcc struct {
	calls, ns uint64
}

// counterAcc accumulates a profile counter.
type counterAcc struct {
	n             uint64
	min, max, sum float64
	sumsq         float64
}

// thread is the call-stack builder of one (pid, rank, tid). Not safe for
// concurrent use: its detector's goroutine owns it.
type thread struct {
	tid    uint32
	gpu    bool
	lastTS uint64 // last function event timestamp
	// firstTS is the first function event timestamp, once tsSeen
	firstTS uint64
	tsSeen  bool
	loc     gpuLoc
	meta    map[string]string

	ring     []execRec
	base     uint64              // seq of ring[0]
	detached map[uint64]*execRec // executions released from the ring while open or pinned
	pins     map[uint64]uint32   // executions pending records still need, with their count
	stack    []uint64            // seqs of open executions, outermost first

	counters []attachedCounter
	comms    []attachedComm

	paths []timerAcc // by call-path node; flat timers are their sums by function
	// over are executions whose call path found no room in the table
	// (Config.ProfilePaths), by function: they count in the flat timers only.
	over []timerAcc
	ctrs map[uint32]*counterAcc
	// summ are the calls the event library summarised on this thread
	// instead of streaming them (see sourceCounter), by call path
	// ("a => b => leaf")
	summ map[string]*summaryAcc

	// per-frame cursors into the frame's counter and comm events of this thread
	ctrIdx, commIdx []int32
	ctrPos, commPos int
	entries         int // the frame's entries on this thread

	// fcalls counts completed calls by function, up to warmupCalls+1
	// (causes.go); fcallsSet once counted from the profile
	fcalls    []uint8
	fcallsSet bool
}

type gpuLoc struct {
	context, device, stream uint32
	set                     bool
}

func newThread(tid uint32) *thread {
	return &thread{tid: tid, detached: map[uint64]*execRec{}, pins: map[uint64]uint32{}, ctrs: map[uint32]*counterAcc{}, summ: map[string]*summaryAcc{}}
}

// pin keeps execution seq in memory until as many unpins.
func (t *thread) pin(seq uint64) { t.pins[seq]++ }

func (t *thread) unpin(seq uint64) {
	if n := t.pins[seq]; n > 1 {
		t.pins[seq] = n - 1
	} else {
		delete(t.pins, seq)
	}
}

// next is the seq the next execution gets.
func (t *thread) next() uint64 { return t.base + uint64(len(t.ring)) }

// rec returns the execution seq, or nil when it has been released.
func (t *thread) rec(seq uint64) *execRec {
	if seq >= t.base {
		if i := seq - t.base; i < uint64(len(t.ring)) {
			return &t.ring[i]
		}
		return nil
	}
	return t.detached[seq]
}

// top is the seq of the innermost open execution, ok false on an empty stack.
func (t *thread) top() (uint64, bool) {
	if len(t.stack) == 0 {
		return 0, false
	}
	return t.stack[len(t.stack)-1], true
}

// metaGPU records a metadata entry, marking the thread as a GPU stream when
// the key names a GPU context, device or stream (CUDA, ROCm/HIP, SYCL,
// OpenCL, Level Zero).
func (t *thread) metaGPU(key, value string) {
	if t.meta == nil {
		t.meta = map[string]string{}
	}
	t.meta[key] = value
	k := strings.ToLower(key)
	var vendor bool
	for _, p := range []string{"cuda ", "rocm ", "hip ", "sycl ", "opencl ", "level zero ", "gpu "} {
		if strings.HasPrefix(k, p) {
			vendor = true
			break
		}
	}
	if !vendor {
		return
	}
	v, err := strconv.ParseUint(strings.TrimSpace(value), 10, 32)
	if err != nil {
		v = 0
	}
	switch {
	case strings.HasSuffix(k, " context"):
		t.loc.context, t.loc.set, t.gpu = uint32(v), true, true
	case strings.HasSuffix(k, " device"):
		t.loc.device, t.loc.set, t.gpu = uint32(v), true, true
	case strings.HasSuffix(k, " stream") || strings.HasSuffix(k, " queue"):
		t.loc.stream, t.loc.set, t.gpu = uint32(v), true, true
	}
}

// profileAdd accumulates a completed execution into the thread's profile.
func (t *thread) profileAdd(e *execRec) {
	in, ex := e.incl(), e.excl()
	var p *timerAcc
	if e.path == pathOverflow {
		if int(e.fid) >= len(t.over) {
			t.over = growTimers(t.over, int(e.fid)+1)
		}
		p = &t.over[e.fid]
	} else {
		if int(e.path) >= len(t.paths) {
			t.paths = growTimers(t.paths, int(e.path)+1)
		}
		p = &t.paths[e.path]
	}
	p.calls++
	p.subrs += uint64(e.nchild)
	p.incl += in
	p.excl += ex
	fi, fe := float64(in), float64(ex)
	p.sqIncl += fi * fi
	p.sqExcl += fe * fe
}

func growTimers(s []timerAcc, n int) []timerAcc {
	if n <= cap(s) {
		return s[:n]
	}
	ns := make([]timerAcc, n, max(n, 2*cap(s)))
	copy(ns, s)
	return ns
}

// counterAdd accumulates a counter sample into the profile.
func (t *thread) counterAdd(cid uint32, v float64) {
	a := t.ctrs[cid]
	if a == nil {
		a = &counterAcc{min: v, max: v}
		t.ctrs[cid] = a
	}
	a.n++
	a.sum += v
	a.sumsq += v * v
	a.min = min(a.min, v)
	a.max = max(a.max, v)
}

// countersOf returns the counter events attached to execution seq.
func (t *thread) countersOf(seq uint64, e *execRec, dst []attachedCounter) []attachedCounter {
	i := sort.Search(len(t.counters), func(i int) bool { return t.counters[i].ev.TS >= e.entry })
	for ; i < len(t.counters); i++ {
		c := &t.counters[i]
		if e.flags&flagDone != 0 && c.ev.TS > e.exit {
			break
		}
		if c.seq == seq {
			dst = append(dst, *c)
		}
	}
	return dst
}

// commsOf returns the comm events attached to execution seq.
func (t *thread) commsOf(seq uint64, e *execRec, dst []attachedComm) []attachedComm {
	i := sort.Search(len(t.comms), func(i int) bool { return t.comms[i].ev.TS >= e.entry })
	for ; i < len(t.comms); i++ {
		c := &t.comms[i]
		if e.flags&flagDone != 0 && c.ev.TS > e.exit {
			break
		}
		if c.seq == seq {
			dst = append(dst, *c)
		}
	}
	return dst
}

// release drops executions with seq < keep from the ring. Open or pinned ones
// (at most Window+1 per pending record) move to the detached map; completed detached ones that are neither open nor
// pinned are dropped. Attached events of dropped executions go too.
func (t *thread) release(keep uint64) {
	if keep > t.next() {
		keep = t.next()
	}
	for seq, e := range t.detached {
		if e.flags&flagDone != 0 && t.pins[seq] == 0 {
			delete(t.detached, seq)
		}
	}
	if keep > t.base {
		// Only open executions (on the stack) and pinned ones survive: move
		// them out of the part of the ring that goes.
		for _, seq := range t.stack {
			if seq >= t.base && seq < keep {
				c := t.ring[seq-t.base]
				t.detached[seq] = &c
			}
		}
		for seq := range t.pins {
			if seq >= t.base && seq < keep && t.detached[seq] == nil {
				c := t.ring[seq-t.base]
				t.detached[seq] = &c
			}
		}
		n := keep - t.base
		m := copy(t.ring, t.ring[n:])
		t.ring = t.ring[:m]
		t.base = keep
	}
	// Events of executions still in the ring or detached stay, any other
	// goes.
	keepEv := func(seq uint64) bool { return (seq >= t.base && seq < t.next()) || t.detached[seq] != nil }
	w := 0
	for _, c := range t.counters {
		if keepEv(c.seq) {
			t.counters[w] = c
			w++
		}
	}
	t.counters = t.counters[:w]
	w = 0
	for _, c := range t.comms {
		if keepEv(c.seq) {
			t.comms[w] = c
			w++
		}
	}
	t.comms = t.comms[:w]
}
