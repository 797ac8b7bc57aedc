package ad

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/psync"
	"github.com/kipimo-hpc/kipimo/internal/stats"
)

// maxFID bounds function and counter ids so that per-id tables stay small;
// events with larger ids are rejected and counted.
const maxFID = 1 << 22

// maxThreads bounds the threads of one rank; a frame that would exceed it is
// rejected.
const maxThreads = 1 << 16

// maxRepairDepth is how far down the stack an exit looks for its entry.
const maxRepairDepth = 64

// maxLaunches bounds the table of CPU launches awaiting their GPU kernels.
const maxLaunches = 1 << 16

// CorrelationCounter is the counter that links a GPU kernel to its CPU launch.
const CorrelationCounter = "Correlation ID"

// Detector is the anomaly detector of one program rank. Process and Close
// must be called from one goroutine (the detector's owner); Stats and
// Callstacks may be called from any goroutine at any time.
type Detector struct {
	cfg   Config
	gated bool // cfg.gated(), read on the hot path
	rule  stats.TailRule
	tmp   stats.TailHist // scratch for prepare

	threads []*thread // in order of first appearance
	byTid   []*thread // tid < len(byTid)
	tidMap  map[uint32]*thread

	funcNames []string
	ctrNames  map[uint32]string
	corrCID   int64
	metaSeen  map[metaKey]struct{}
	ignored   map[string]bool

	// call-path nodes; node 0 is the empty path
	nodes   []pathNode
	pathTab pathTable

	models    []*model
	keyByName map[string]int32
	fidKey    []int32
	pathKey   []int32

	launches    map[uint64]launch
	launchOrder []uint64
	launchHead  int

	counterStep map[string]*stats.Moments // this step's counter values by name

	pending []*pendingRec

	// the current step
	step        uint64
	tstart      uint64
	tend        uint64
	stepEvents  uint64
	stepBad     uint64
	lastStepSet bool
	processed   uint64 // frames processed

	sync *syncState

	batch   Batch
	scratch struct {
		ctr  []attachedCounter
		comm []attachedComm
	}

	stats           counters
	requestProfiles atomic.Bool // set by Serve on a snapshot control message
	snap            atomic.Pointer[psync.CallstackReply]
	closeMu         sync.Mutex
	closed          bool
}

type metaKey struct {
	tid uint32
	key string
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

// model is one key's statistics and detection state.
type model struct {
	name    string
	shard   int
	ignored bool

	step   stats.Moments // this step's values
	values []float64     // this step's values (histogram algorithms)

	accum, inflight, global    stats.Moments
	hAccum, hInflight, hGlobal stats.Histogram
	inFlight                   bool
	accumAnoms, inflightAnoms  uint64

	// the natural range (every algorithm but with Chimbuko's rules)
	tAccum, tInflight, tGlobal stats.TailHist
	natMin, natMax             float64 // the natural range
	natLowThr, natThr          float64 // flagged below and above these
	p99, logMean, logStd       float64 // for explanations

	det       stats.Moments
	lo, hi    float64
	std       float64
	hbos      stats.HBOSScorer
	copod     stats.COPODScorer
	touched   bool
	detReady  bool
	stepAnoms uint64
	best      bestNormal
}

type bestNormal struct {
	t     *thread
	seq   uint64
	score float64
	ok    bool
}

// New returns a detector configured by cfg (validated here).
func New(cfg Config) (*Detector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("detector config: %w", err)
	}
	d := &Detector{
		cfg:         cfg,
		tidMap:      map[uint32]*thread{},
		ctrNames:    map[uint32]string{},
		corrCID:     -1,
		metaSeen:    map[metaKey]struct{}{},
		ignored:     map[string]bool{},
		nodes:       []pathNode{{}},
		keyByName:   map[string]int32{},
		launches:    map[uint64]launch{},
		counterStep: map[string]*stats.Moments{},
	}
	d.gated, d.rule = cfg.gated(), cfg.TailRule()
	for _, n := range cfg.Ignore {
		d.ignored[n] = true
	}
	d.sync = newSyncState(d)
	d.snap.Store(&psync.CallstackReply{PID: cfg.PID, Rank: cfg.Rank, Threads: []psync.ThreadStack{}})
	return d, nil
}

// Config returns the detector's validated configuration.
func (d *Detector) Config() Config { return d.cfg }

// ErrClosed is returned by Process after Close.
var ErrClosed = errors.New("detector is closed")

func (d *Detector) thread(tid uint32) *thread {
	if tid < uint32(len(d.byTid)) {
		if t := d.byTid[tid]; t != nil {
			return t
		}
	} else if t := d.tidMap[tid]; t != nil {
		return t
	}
	t := newThread(tid)
	d.threads = append(d.threads, t)
	if tid < 4096 {
		for uint32(len(d.byTid)) <= tid {
			d.byTid = append(d.byTid, nil)
		}
		d.byTid[tid] = t
	} else {
		d.tidMap[tid] = t
	}
	return t
}

func (d *Detector) funcName(fid uint32) string {
	if int(fid) < len(d.funcNames) && d.funcNames[fid] != "" {
		return d.funcNames[fid]
	}
	return "fid_" + strconv.FormatUint(uint64(fid), 10)
}

// pathOverflow is the call-path node of every path met once the table holds
// Config.ProfilePaths nodes, and of every path below such a path, so that
// each node's ancestors are nodes too.
const pathOverflow = ^uint32(0)

// intern returns the call-path node of fid called from node parent, keeping
// at most CallPathDepth frames.
func (d *Detector) intern(parent, fid uint32) uint32 {
	if parent == pathOverflow {
		return pathOverflow
	}
	for int(d.nodes[parent].depth)+1 > d.cfg.CallPathDepth {
		if parent = d.suffix(parent); parent == pathOverflow {
			return pathOverflow
		}
	}
	k := uint64(parent)<<32 | uint64(fid)
	if n, ok := d.pathTab.get(k); ok {
		return n
	}
	if len(d.nodes) > d.cfg.ProfilePaths {
		d.stats.pathOverflows.Add(1)
		return pathOverflow
	}
	n := uint32(len(d.nodes))
	d.nodes = append(d.nodes, pathNode{parent: parent, fid: fid, depth: d.nodes[parent].depth + 1})
	d.pathTab.put(k, n)
	return n
}

func (d *Detector) suffix(n uint32) uint32 {
	nd := d.nodes[n]
	if nd.depth <= 1 {
		return 0
	}
	if nd.suffix != 0 {
		return nd.suffix - 1
	}
	s := d.intern(d.suffix(nd.parent), nd.fid)
	if s != pathOverflow {
		d.nodes[n].suffix = s + 1
	}
	return s
}

// modelPathName is "a => b => f" for the last ModelPathDepth frames of
// execution e of thread t, read from its open callers.
func (d *Detector) modelPathName(t *thread, e *execRec) string {
	fids := []uint32{e.fid}
	for p := e; len(fids) < d.cfg.ModelPathDepth && p.parent != 0; {
		if p = t.rec(p.parent - 1); p == nil {
			break
		}
		fids = append(fids, p.fid)
	}
	var b []byte
	for i := len(fids) - 1; i >= 0; i-- {
		b = append(b, d.funcName(fids[i])...)
		if i > 0 {
			b = append(b, " => "...)
		}
	}
	return string(b)
}

// pathName is "a => b => f" for node n.
func (d *Detector) pathName(n uint32) string {
	var fids []uint32
	for ; n != 0; n = d.nodes[n].parent {
		fids = append(fids, d.nodes[n].fid)
	}
	var b []byte
	for i := len(fids) - 1; i >= 0; i-- {
		b = append(b, d.funcName(fids[i])...)
		if i > 0 {
			b = append(b, " => "...)
		}
	}
	return string(b)
}

// keyOf returns the model key of a completed execution of thread t,
// creating it. It is first asked when the execution completes, while its
// callers are still open.
func (d *Detector) keyOf(t *thread, e *execRec) int32 {
	if e.key != 0 {
		return e.key - 1
	}
	if !d.cfg.ByCallPath && int(e.fid) < len(d.fidKey) {
		if k := d.fidKey[e.fid]; k >= 0 {
			e.key = k + 1
			return k
		}
	}
	k := d.newKey(t, e)
	e.key = k + 1
	return k
}

func (d *Detector) newKey(t *thread, e *execRec) int32 {
	if d.cfg.ByCallPath {
		// The key is the execution's last ModelPathDepth frames. A call-path
		// node that holds at least as many frames as that names them once
		// for all its executions.
		cached := e.path != pathOverflow && d.cfg.CallPathDepth >= d.cfg.ModelPathDepth
		if cached && int(e.path) < len(d.pathKey) && d.pathKey[e.path] >= 0 {
			return d.pathKey[e.path]
		}
		k := d.modelFor(d.modelPathName(t, e), e.fid)
		if cached {
			for len(d.pathKey) <= int(e.path) {
				d.pathKey = append(d.pathKey, -1)
			}
			d.pathKey[e.path] = k
		}
		return k
	}
	if int(e.fid) < len(d.fidKey) && d.fidKey[e.fid] >= 0 {
		return d.fidKey[e.fid]
	}
	k := d.modelFor(d.funcName(e.fid), e.fid)
	for len(d.fidKey) <= int(e.fid) {
		d.fidKey = append(d.fidKey, -1)
	}
	d.fidKey[e.fid] = k
	return k
}

func (d *Detector) modelFor(name string, fid uint32) int32 {
	if k, ok := d.keyByName[name]; ok {
		return k
	}
	k := int32(len(d.models))
	d.models = append(d.models, &model{
		name:    name,
		shard:   psync.Shard(name, d.cfg.Shards),
		ignored: d.ignored[d.funcName(fid)],
	})
	d.keyByName[name] = k
	return k
}

// Process consumes one frame: one io_step of this detector's rank. It builds
// the executions, updates the statistics, syncs with the pserver, labels the
// step's completed executions and hands the step's records to the Sink. A
// frame of another rank, or with ids out of range, is rejected with an error
// (and counted) without changing the detector's state.
func (d *Detector) Process(ctx context.Context, f *frame.Frame) error {
	if d.closed {
		return ErrClosed
	}
	if err := d.check(f); err != nil {
		d.stats.badFrames.Add(1)
		d.stepBad++
		return err
	}
	d.step, d.tstart, d.tend = f.Step, f.TStart, f.TEnd
	d.stepEvents = uint64(f.NumEvents())
	for _, n := range f.Funcs {
		for len(d.funcNames) <= int(n.ID) {
			d.funcNames = append(d.funcNames, "")
		}
		d.funcNames[n.ID] = n.Name
	}
	for _, n := range f.Counters {
		d.ctrNames[n.ID] = n.Name
		if n.Name == CorrelationCounter {
			d.corrCID = int64(n.ID)
		}
	}
	for _, m := range f.Metadata {
		t := d.thread(m.Tid)
		t.metaGPU(m.Key, m.Value)
		if m.Key == "Hostname" && m.Value != "" {
			d.cfg.Hostname = m.Value
		}
		k := metaKey{m.Tid, m.Key}
		if _, ok := d.metaSeen[k]; !ok {
			d.metaSeen[k] = struct{}{}
			d.batch.Metadata = append(d.batch.Metadata, provenance.Metadata{
				Descr: m.Key, PID: d.cfg.PID, RID: d.cfg.Rank, TID: m.Tid, Value: m.Value,
			})
		}
	}
	d.build(f)
	d.endStep(ctx, false)
	d.processed++
	d.stats.frames.Add(1) // last: a reader seeing the count sees the step done
	return nil
}

// check validates f against the detector before anything is changed.
func (d *Detector) check(f *frame.Frame) error {
	if f.PID != d.cfg.PID || f.Rank != d.cfg.Rank {
		return fmt.Errorf("frame of pid %d rank %d given to the detector of pid %d rank %d", f.PID, f.Rank, d.cfg.PID, d.cfg.Rank)
	}
	for i := range f.Events {
		ev := &f.Events[i]
		if ev.Kind > frame.Exit {
			return fmt.Errorf("frame step %d: event %d has kind %d (not entry or exit)", f.Step, i, ev.Kind)
		}
		if ev.FID >= maxFID {
			return fmt.Errorf("frame step %d: event %d has function id %d, more than %d", f.Step, i, ev.FID, maxFID)
		}
	}
	newTids := map[uint32]struct{}{}
	seeTid := func(tid uint32) {
		if tid >= uint32(len(d.byTid)) || d.byTid[tid] == nil {
			if d.tidMap[tid] == nil {
				newTids[tid] = struct{}{}
			}
		}
	}
	for i := range f.Events {
		seeTid(f.Events[i].Tid)
	}
	for i := range f.CounterEvents {
		seeTid(f.CounterEvents[i].Tid)
	}
	for i := range f.Comms {
		seeTid(f.Comms[i].Tid)
	}
	for i := range f.Metadata {
		seeTid(f.Metadata[i].Tid)
	}
	if len(d.threads)+len(newTids) > maxThreads {
		return fmt.Errorf("frame step %d: %d new threads would exceed the limit of %d threads per rank", f.Step, len(newTids), maxThreads)
	}
	for i := range f.Funcs {
		if f.Funcs[i].ID >= maxFID {
			return fmt.Errorf("frame step %d: function name %d has id %d, more than %d", f.Step, i, f.Funcs[i].ID, maxFID)
		}
	}
	for i := range f.Comms {
		if f.Comms[i].Kind > frame.Recv {
			return fmt.Errorf("frame step %d: comm event %d has kind %d (not send or recv)", f.Step, i, f.Comms[i].Kind)
		}
	}
	return nil
}

// build runs the call-stack builder over the frame's events.
func (d *Detector) build(f *frame.Frame) {
	side := len(f.CounterEvents)+len(f.Comms) > 0
	if side {
		for _, t := range d.threads {
			t.ctrIdx, t.commIdx, t.ctrPos, t.commPos = t.ctrIdx[:0], t.commIdx[:0], 0, 0
		}
		for i := range f.CounterEvents {
			t := d.thread(f.CounterEvents[i].Tid)
			t.ctrIdx = append(t.ctrIdx, int32(i))
		}
		for i := range f.Comms {
			t := d.thread(f.Comms[i].Tid)
			t.commIdx = append(t.commIdx, int32(i))
		}
	}
	step := uint32(f.Step)
	for i := range f.Events {
		ev := &f.Events[i]
		t := d.thread(ev.Tid)
		t.lastTS = ev.TS
		if ev.Kind == frame.Entry {
			if side {
				d.drain(f, t, ev.TS, false)
			}
			seq := t.next()
			r := execRec{entry: ev.TS, step: step, idx: uint32(i), fid: ev.FID}
			var parentPath uint32
			if n := len(t.stack); n > 0 {
				ps := t.stack[n-1]
				p := t.rec(ps)
				p.nchild++
				parentPath = p.path
				r.parent = ps + 1
				r.pstep, r.pidx = p.step, p.idx
			}
			r.path = d.intern(parentPath, ev.FID)
			t.ring = append(t.ring, r)
			t.stack = append(t.stack, seq)
			continue
		}
		if side {
			d.drain(f, t, ev.TS, true)
		}
		n := len(t.stack)
		if n == 0 {
			d.stats.unmatchedExits.Add(1)
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
				d.stats.unmatchedExits.Add(1)
				continue
			}
			// Entries above the match never got their exit: close them here.
			for k := n - 1; k > j; k-- {
				d.complete(t, ev.TS, flagRepaired)
				d.stats.repairedOpen.Add(1)
			}
			d.stats.mismatchedExits.Add(1)
		}
		d.complete(t, ev.TS, 0)
	}
	if side {
		for _, t := range d.threads {
			d.drain(f, t, math.MaxUint64, true)
		}
	}
	d.stats.events.Add(uint64(len(f.Events) + len(f.CounterEvents) + len(f.Comms)))
}

// complete closes the innermost open execution of t at ts.
func (d *Detector) complete(t *thread, ts uint64, flags uint8) {
	n := len(t.stack)
	seq := t.stack[n-1]
	t.stack = t.stack[:n-1]
	e := t.rec(seq)
	if ts < e.entry {
		ts = e.entry
	}
	e.exit = ts
	e.flags |= flagDone | flags
	if e.parent != 0 {
		if p := t.rec(e.parent - 1); p != nil {
			p.childIncl += e.exit - e.entry
		}
	}
	t.profileAdd(e)
	m := d.models[d.keyOf(t, e)]
	x := d.value(e)
	m.step.Push(x)
	if d.cfg.Algorithm == HBOS || d.cfg.Algorithm == COPOD {
		m.values = append(m.values, x)
	}
	if d.gated {
		m.tAccum.Add(x)
	}
	m.touched = true
	d.stats.executions.Add(1)
}

func (d *Detector) value(e *execRec) float64 {
	if d.cfg.Statistic == Inclusive {
		return float64(e.incl())
	}
	return float64(e.excl())
}

// drain attaches t's counter and comm events up to ts to the execution open
// at their time: for an entry, events at ts belong to the new call (strictly
// before); for an exit, to the exiting call (at or before).
func (d *Detector) drain(f *frame.Frame, t *thread, ts uint64, incl bool) {
	for t.ctrPos < len(t.ctrIdx) {
		c := &f.CounterEvents[t.ctrIdx[t.ctrPos]]
		if c.TS > ts || (!incl && c.TS == ts) {
			break
		}
		t.ctrPos++
		seq, ok := t.top()
		if !ok {
			seq = math.MaxUint64
		}
		t.counters = append(t.counters, attachedCounter{seq: seq, ev: *c})
		t.counterAdd(c.CID, float64(c.Value))
		name := d.ctrNames[c.CID]
		if name == "" {
			name = "cid_" + strconv.FormatUint(uint64(c.CID), 10)
		}
		cm := d.counterStep[name]
		if cm == nil {
			cm = &stats.Moments{}
			d.counterStep[name] = cm
		}
		cm.Push(float64(c.Value))
		if int64(c.CID) == d.corrCID && ok && !t.gpu {
			d.addLaunch(t, seq, c.Value)
		}
	}
	for t.commPos < len(t.commIdx) {
		c := &f.Comms[t.commIdx[t.commPos]]
		if c.TS > ts || (!incl && c.TS == ts) {
			break
		}
		t.commPos++
		seq, ok := t.top()
		if !ok {
			seq = math.MaxUint64
		}
		t.comms = append(t.comms, attachedComm{seq: seq, ev: *c})
	}
}

// addLaunch remembers the CPU execution that carries correlation id cid.
func (d *Detector) addLaunch(t *thread, seq uint64, cid uint64) {
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
	if _, ok := d.launches[cid]; !ok {
		if len(d.launchOrder) < maxLaunches {
			d.launchOrder = append(d.launchOrder, cid)
		} else {
			old := d.launchOrder[d.launchHead]
			delete(d.launches, old)
			d.stats.evictedLaunches.Add(1)
			d.launchOrder[d.launchHead] = cid
			d.launchHead = (d.launchHead + 1) % maxLaunches
		}
	}
	d.launches[cid] = l
}

// eventID renders "<rank>:<io_step>:<idx>".
func (d *Detector) eventID(step, idx uint32) string {
	var b [48]byte
	s := strconv.AppendUint(b[:0], uint64(d.cfg.Rank), 10)
	s = append(s, ':')
	s = strconv.AppendUint(s, uint64(step), 10)
	s = append(s, ':')
	s = strconv.AppendUint(s, uint64(idx), 10)
	return string(s)
}

// Close ends the stream: executions still open are closed at the last
// timestamp seen on their thread (counted in Stats.OpenAtEnd), labelled,
// every pending record is published with the window it has, the final
// profiles are published, and a last sync is attempted within ctx. Close is
// idempotent.
func (d *Detector) Close(ctx context.Context) error {
	d.closeMu.Lock()
	defer d.closeMu.Unlock()
	if d.closed {
		return nil
	}
	var open uint64
	for _, t := range d.threads {
		for len(t.stack) > 0 {
			d.complete(t, t.lastTS, flagRepaired)
			open++
		}
	}
	d.stats.openAtEnd.Add(open)
	d.stepEvents = 0
	d.endStep(ctx, true)
	if d.cfg.Barrier != nil {
		d.cfg.Barrier.Leave(d.cfg.Rank)
	}
	d.closed = true
	err := d.sync.close(ctx)
	if d.cfg.Sink != nil {
		if ferr := d.cfg.Sink.Flush(ctx); ferr != nil && err == nil {
			err = ferr
		}
	}
	return err
}
