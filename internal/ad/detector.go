package ad

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// maxFID bounds function and counter ids so that per-id tables stay small;
// events with larger ids are rejected and counted.
const maxFID = 1 << 22

// maxThreads bounds the threads of one rank; a frame that would exceed it is
// rejected.
const maxThreads = 1 << 16

// maxRepairDepth is how far down the stack an exit looks for its entry.
const maxRepairDepth = 64

// maxStepJump bounds how far past the last io_step a rank's next frame may
// be (a gap of a million steps is days of a run); a frame beyond it is
// refused as malformed.
const maxStepJump = 1 << 20

// maxLaunches bounds the table of CPU launches awaiting their GPU kernels.
const maxLaunches = 1 << 16

// CorrelationCounter is the counter that links a GPU kernel to its CPU launch.
const CorrelationCounter = "Correlation ID"

// Detector is the anomaly detector of one program rank: a pipeline of
// stages that data flows through one way, once per io_step:
//
//	frame -> callStacks (executions, call stacks, attached events)
//	      -> modelSet (per-key statistics; at the step's end, with the
//	         pserver's global model, detection state and a scorer)
//	      -> label (each completed execution, against its model)
//	      -> recorder (provenance records with call stacks and windows)
//	      -> Sink
//
// Process and Close must be called from one goroutine (the detector's
// owner); Stats and Callstacks may be called from any goroutine at any time.
type Detector struct {
	cfg Config

	stacks *callStacks
	models *modelSet
	rec    *recorder
	sync   *syncState
	base   *baseState // nil without Config.Baseline

	metaSeen map[metaKey]struct{}
	// peers is the current step's time per function and waits (peers.go)
	peers peerAcc

	// the current step, and the last one processed (lastSeen false before
	// the first)
	cur        stepInfo
	lastStep   uint64
	lastSeen   bool
	missing    uint64 // steps missing before the current one
	stepEvents uint64
	stepBad    uint64
	processed  uint64 // frames processed

	// held are copies of the frames waiting for the names of ids their
	// events use, in arrival order (names.go); heldOnce is set once a frame
	// has been held.
	held     []*frame.Frame
	heldOnce bool

	// lent is the frame ProcessLent is running, and giveBack the function
	// that takes it back once the detector no longer reads it (nil when no
	// frame is lent).
	lent     *frame.Frame
	giveBack func(*frame.Frame)

	batch Batch

	stats           counters
	requestProfiles atomic.Bool // set by RequestProfiles
	snap            atomic.Pointer[syncproto.CallstackReply]
	closeMu         sync.Mutex
	closed          bool
}

type metaKey struct {
	tid uint32
	key string
}

// New returns a detector configured by cfg (validated here).
func New(cfg Config) (*Detector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("detector config: %w", err)
	}
	d := &Detector{cfg: cfg, metaSeen: map[metaKey]struct{}{}}
	d.stacks = newCallStacks(&d.cfg, &d.stats, nil)
	d.models = newModelSet(&d.cfg, &d.stats, d.stacks)
	d.stacks.done = func(t *thread, e *execRec) {
		d.models.observe(t, e)
		d.peers.observe(d.stacks, t, e)
	}
	d.rec = &recorder{cfg: &d.cfg, stats: &d.stats, stacks: d.stacks, models: d.models, cur: &d.cur, batch: &d.batch}
	d.sync = newSyncState(&d.cfg, &d.stats, d.models, &d.cur)
	d.base = newBaseState(&d.cfg)
	d.snap.Store(&syncproto.CallstackReply{PID: cfg.PID, Rank: cfg.Rank, Threads: []syncproto.ThreadStack{}})
	return d, nil
}

// Config returns the detector's validated configuration.
func (d *Detector) Config() Config { return d.cfg }

// ErrClosed is returned by Process after Close.
var ErrClosed = errors.New("detector is closed")

// ErrStaleFrame is returned by Process for a frame whose io_step is not
// after the last one processed: a duplicate, or a frame that arrived after
// its successors (whose gap has already closed the stacks it would have
// continued). It is dropped without changing the detector's state and
// counted in Stats.StaleFrames, not as a bad frame.
var ErrStaleFrame = errors.New("io_step already passed")

// pathOverflow is the call-path node of every path met once the table holds
// Config.ProfilePaths nodes, and of every path below such a path, so that
// each node's ancestors are nodes too.
const pathOverflow = ^uint32(0)

// Process consumes one frame: one io_step of this detector's rank. It builds
// the executions, updates the statistics, syncs with the pserver, labels the
// step's completed executions and hands the step's records to the Sink. A
// frame of another rank, with ids out of range, or naming an id differently
// from before (ErrNameConflict) is rejected with an error (and counted)
// without changing the detector's state. A frame whose events use an id
// that has no name yet is held until a later frame names it, and so are the
// frames after it (see names.go); f is copied then, and the caller may
// reuse it as always.
func (d *Detector) Process(ctx context.Context, f *frame.Frame) error {
	return d.ProcessLent(ctx, f, nil)
}

// ProcessLent is Process for a frame the caller lends from a pool shared by
// many detectors: giveBack is called with f, once, as soon as the detector
// has read all it needs of f, which is before the step's sync (in lockstep
// that sync waits for every rank of the node, so a node's ranks waiting
// for it hold no decoded frame). giveBack is called before ProcessLent
// returns, whatever the outcome; a nil giveBack makes it Process.
func (d *Detector) ProcessLent(ctx context.Context, f *frame.Frame, giveBack func(*frame.Frame)) error {
	if giveBack != nil {
		d.lent, d.giveBack = f, giveBack
		defer d.returnLent(f)
	}
	if d.closed {
		return ErrClosed
	}
	sc, err := d.check(f)
	if err == nil {
		err = d.stacks.checkNames(f)
	}
	if errors.Is(err, ErrStaleFrame) {
		d.stats.staleFrames.Add(1)
		return err
	}
	if err != nil {
		d.stats.badFrames.Add(1)
		d.stepBad++
		return err
	}
	d.admit(ctx, f, sc)
	return nil
}

// process runs one checked frame, whose ids all have names (or, with a
// Barrier, any checked frame), through the pipeline; sc is what its check
// found, the check just before.
func (d *Detector) process(ctx context.Context, f *frame.Frame, sc frameScan) {
	d.missing = 0
	switch {
	case d.lastSeen && f.Step > d.lastStep+1:
		d.missing = f.Step - d.lastStep - 1
	case !d.lastSeen && f.Step > 0:
		// A rank's io_steps count from 0: the first frame seen says the
		// steps before it never reached the detector (dropped from a
		// bounded frame stream, or published before it started).
		d.missing = f.Step
	}
	d.stats.missingSteps.Add(d.missing)
	if d.missing > 0 {
		// Never pair an entry before the gap with an exit after it.
		d.stats.lostAtGap.Add(d.stacks.abandon())
	}
	d.lastStep, d.lastSeen = max(d.lastStep, f.Step), true
	d.cur = stepInfo{step: f.Step, tstart: f.TStart, tend: f.TEnd}
	d.stepEvents = uint64(f.NumEvents())
	for _, m := range f.Metadata {
		t := d.stacks.thread(m.Tid)
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
	d.stacks.buildFrame(f, sc.counted)
	d.returnLent(f)
	d.endStep(ctx, false)
	d.processed++
	d.stats.frames.Add(1) // last: a reader seeing the count sees the step done
}

// returnLent gives f back to the pool it was lent from, if it is the frame
// ProcessLent is running and has not been given back yet.
func (d *Detector) returnLent(f *frame.Frame) {
	if d.lent != f || d.giveBack == nil {
		return
	}
	giveBack := d.giveBack
	d.lent, d.giveBack = nil, nil
	giveBack(f)
}

// frameScan is what check learnt of a frame as it validated it, so that
// the stages after it need not read the frame's events once more.
type frameScan struct {
	// counted: every event's thread was known, and the threads' entries
	// hold the frame's entries per thread (for callStacks.reserve)
	counted bool
	// named: every event's function id had a name before the frame
	named bool
}

// check validates f against the detector before anything but the threads'
// per-frame entry counts is changed, and says what it learnt of f.
func (d *Detector) check(f *frame.Frame) (frameScan, error) {
	if f.PID != d.cfg.PID || f.Rank != d.cfg.Rank {
		return frameScan{}, fmt.Errorf("frame of pid %d rank %d given to the detector of pid %d rank %d", f.PID, f.Rank, d.cfg.PID, d.cfg.Rank)
	}
	if d.lastSeen && f.Step <= d.lastStep {
		return frameScan{}, fmt.Errorf("%w: frame of io_step %d after io_step %d", ErrStaleFrame, f.Step, d.lastStep)
	}
	if d.lastSeen && f.Step-d.lastStep > maxStepJump {
		// Taken, it would make every later frame of the rank stale.
		return frameScan{}, fmt.Errorf("frame of io_step %d after io_step %d: a jump of more than %d steps", f.Step, d.lastStep, maxStepJump)
	}
	var newTids map[uint32]struct{}
	seeTid := func(tid uint32) {
		if !d.stacks.known(tid) {
			if newTids == nil {
				newTids = map[uint32]struct{}{}
			}
			newTids[tid] = struct{}{}
		}
	}
	// The same pass counts each known thread's entries for
	// callStacks.reserve (valid when every event's thread is known).
	// Consecutive events are mostly of one thread: look it up on a change.
	// It also notes whether every function id is named already.
	cs := d.stacks
	for _, t := range cs.threads {
		t.entries = 0
	}
	var t *thread
	lastTid, tidSeen, allKnown, allNamed := uint32(0), false, true, true
	known := cs.funcKnown
	for i := range f.Events {
		ev := &f.Events[i]
		if ev.Kind > frame.Exit {
			return frameScan{}, fmt.Errorf("frame step %d: event %d has kind %d (not entry or exit)", f.Step, i, ev.Kind)
		}
		if ev.FID >= maxFID {
			return frameScan{}, fmt.Errorf("frame step %d: event %d has function id %d, more than %d", f.Step, i, ev.FID, maxFID)
		}
		if int(ev.FID) >= len(known) || !known[ev.FID] {
			allNamed = false
		}
		if !tidSeen || ev.Tid != lastTid {
			lastTid, tidSeen = ev.Tid, true
			if t = cs.lookup(ev.Tid); t == nil {
				allKnown = false
				seeTid(ev.Tid)
			}
		}
		if t != nil && ev.Kind == frame.Entry {
			t.entries++
		}
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
	if len(d.stacks.threads)+len(newTids) > maxThreads {
		return frameScan{}, fmt.Errorf("frame step %d: %d new threads would exceed the limit of %d threads per rank", f.Step, len(newTids), maxThreads)
	}
	for i := range f.Funcs {
		if f.Funcs[i].ID >= maxFID {
			return frameScan{}, fmt.Errorf("frame step %d: function name %d has id %d, more than %d", f.Step, i, f.Funcs[i].ID, maxFID)
		}
	}
	for i := range f.Comms {
		if f.Comms[i].Kind > frame.Recv {
			return frameScan{}, fmt.Errorf("frame step %d: comm event %d has kind %d (not send or recv)", f.Step, i, f.Comms[i].Kind)
		}
	}
	return frameScan{counted: allKnown, named: allNamed}, nil
}

// Close ends the stream: frames still waiting for names are dropped
// (counted in Stats.UnnamedFrames), executions still open are closed at the
// last timestamp seen on their thread (counted in Stats.OpenAtEnd), labelled,
// every pending record is published with the window it has, the final
// profiles are published, and a last sync is attempted within ctx. Close is
// idempotent.
func (d *Detector) Close(ctx context.Context) error {
	d.closeMu.Lock()
	defer d.closeMu.Unlock()
	if d.closed {
		return nil
	}
	d.dropHeld(len(d.held))
	var open uint64
	for _, t := range d.stacks.threads {
		for len(t.stack) > 0 {
			d.stacks.complete(t, t.lastTS, flagRepaired)
			open++
		}
	}
	d.stats.executions.Add(open)
	d.stats.openAtEnd.Add(open)
	d.stepEvents = 0
	d.endStep(ctx, true)
	d.ReleaseOutputs()
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

// ReleaseOutputs lets the step summaries and per-key anomaly counts held
// since the last call (Config.ExactSync) go with the next sync requests.
// With durable frames it is called just before each checkpoint: what a
// detector sends after a checkpoint is then a function of the checkpoint
// and the frames after it, labels included, so a restored detector sends
// the pserver exactly what the lost one did (and the pserver applies each
// Seq once).
func (d *Detector) ReleaseOutputs() {
	for _, m := range d.models.list {
		m.accum.Anomalies += m.heldAnoms
		m.heldAnoms = 0
	}
	for _, sum := range d.sync.held {
		d.sync.queueSummary(sum)
	}
	d.sync.held = nil
}

// Suspend stops the detector's pserver senders and leaves its node's syncer
// without ending its steps or flushing anything: the state stays as its last
// checkpoint left it, for a restarted ad to resume. The detector is closed
// to further use.
func (d *Detector) Suspend() {
	d.closeMu.Lock()
	defer d.closeMu.Unlock()
	if d.closed {
		return
	}
	d.closed = true
	d.sync.cancel()
	d.sync.wg.Wait()
	d.sync.leaveNode()
}

// Rank is the rank the detector serves.
func (d *Detector) Rank() uint32 { return d.cfg.Rank }

// RequestProfiles makes the detector publish its profiles with its next
// step (a snapshot asked for by the run's control channel); safe for
// concurrent use.
func (d *Detector) RequestProfiles() { d.requestProfiles.Store(true) }

// Taken is how many frames the detector has taken from its input:
// processed, rejected, dropped as stale or dropped unread. Safe for
// concurrent use; it allocates nothing.
func (d *Detector) Taken() uint64 { return d.stats.taken() }

// DroppedFrames counts n more frames that the detector's input dropped
// before the detector read them (it was slower than its input: their steps
// are missing steps), and returns the count so far. Safe for concurrent
// use.
func (d *Detector) DroppedFrames(n uint64) uint64 { return d.stats.droppedFrames.Add(n) }

// SourceDropped records n, the count of frames the rank's event source says
// it has dropped so far (SourceDroppedFrames), when it is more than the
// count recorded before, which it returns. Safe for concurrent use.
func (d *Detector) SourceDropped(n uint64) (prev uint64) {
	prev = d.stats.sourceDropped.Load()
	if n > prev {
		d.stats.sourceDropped.Store(n)
	}
	return prev
}

// RejectBadFrame counts a frame the detector's input could not decode as a
// bad frame of the current step, and returns the bad frames counted so far.
// Called from the detector's goroutine, as Process is.
func (d *Detector) RejectBadFrame() uint64 {
	d.stepBad++
	return d.stats.badFrames.Add(1)
}

// EndOfStream records that the rank's stream ended with an end-of-stream
// message (Stats.Ended). Safe for concurrent use.
func (d *Detector) EndOfStream() { d.stats.ended.Store(true) }
