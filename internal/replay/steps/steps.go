// Package steps cuts a time-ordered stream of trace events into frames, one per
// (rank, io_step), for the trace readers of package replay.
//
// A reader registers names (functions and counters, per rank), then feeds
// events thread by thread in timestamp order. The Builder keeps the dictionary
// of every rank (each id is sent once, in the first frame that uses it), counts
// completed executions with a call stack per thread, and hands each frame to
// the emit function when its step is complete. A Builder is used by one
// goroutine; the Frame given to emit is reused after emit returns.
package steps

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/frame"
)

// DefaultStep is the io_step duration when none is configured: one second of
// trace time.
const DefaultStep = time.Second

// DefaultMaxGap is the largest number of empty steps a Builder fills in one
// jump; a larger jump in trace time is reported as an error (it usually means
// a corrupt timestamp).
const DefaultMaxGap = 1 << 20

// Keys of the metadata that marks a GPU virtual thread. API is "CUDA", "ROCm",
// "OpenCL" or "SYCL"; the detector reads "<API> Context", "<API> Device" and
// "<API> Stream" (Chimbuko reads the CUDA ones).
const (
	KeyContext = " Context"
	KeyDevice  = " Device"
	KeyStream  = " Stream"
)

// CorrelationCounter is the counter that links a GPU execution to its CPU
// launch: the same value is sampled inside the launch and at the GPU
// execution's entry.
const CorrelationCounter = "Correlation ID"

// Config says how to cut steps.
type Config struct {
	// PID is the program id written into every frame.
	PID uint32
	// Step is the io_step duration in trace time; 0 means DefaultStep.
	// Ignored when Marker is set.
	Step time.Duration
	// Marker, when set, starts a new step at each entry of the function of
	// that name (per rank) instead of cutting at fixed durations.
	Marker string
	// MaxGap is the largest number of steps one rank may jump at once (the
	// empty steps between are emitted); 0 means DefaultMaxGap.
	MaxGap uint64
}

// Validate fills defaults and checks c.
func (c *Config) Validate() error {
	if c.Step == 0 {
		c.Step = DefaultStep
	}
	if c.MaxGap == 0 {
		c.MaxGap = DefaultMaxGap
	}
	if c.Step < time.Microsecond {
		return fmt.Errorf("step %s is shorter than the trace clock's microsecond", c.Step)
	}
	return nil
}

// Stats counts what a Builder produced.
type Stats struct {
	Frames     int `json:"frames"`
	Events     int `json:"events"`
	Executions int `json:"executions"`
	Threads    int `json:"threads"`
	GPUThreads int `json:"gpu_threads"`
	// Unmatched counts exits that closed no open entry on their thread.
	Unmatched int `json:"unmatched,omitempty"`
	// InputEvents counts the events the reader read from the input (trace
	// event objects, trace records, snapshot records), whether or not they
	// became frame events.
	InputEvents int `json:"input_events"`
	// Losses counts what the input held that the frames do not carry as it
	// was (see the Loss kinds).
	Losses Losses `json:"losses,omitempty"`
}

// Add adds o to s.
func (s *Stats) Add(o Stats) {
	s.Frames += o.Frames
	s.Events += o.Events
	s.Executions += o.Executions
	s.Threads += o.Threads
	s.GPUThreads += o.GPUThreads
	s.Unmatched += o.Unmatched
	s.InputEvents += o.InputEvents
	s.Losses = append(Losses(nil), s.Losses...)
	s.Losses.Merge(o.Losses)
}

// idSet is a set of uint32 ids: a bitmap for small ids, a map above.
type idSet struct {
	bits []uint64
	big  map[uint32]struct{}
}

const smallIDs = 1 << 17

func (s *idSet) has(id uint32) bool {
	if id < smallIDs {
		w := id >> 6
		return int(w) < len(s.bits) && s.bits[w]&(1<<(id&63)) != 0
	}
	_, ok := s.big[id]
	return ok
}

func (s *idSet) add(id uint32) {
	if id < smallIDs {
		w := int(id >> 6)
		if w >= len(s.bits) {
			s.bits = append(s.bits, make([]uint64, w+1-len(s.bits))...)
		}
		s.bits[w] |= 1 << (id & 63)
		return
	}
	if s.big == nil {
		s.big = make(map[uint32]struct{})
	}
	s.big[id] = struct{}{}
}

type thread struct {
	seen  bool
	gpu   bool
	last  uint64
	stack []uint32
}

type metaKey struct {
	tid        uint32
	key, value string
}

type rankState struct {
	rank     uint32
	f        frame.Frame
	step     uint64 // step of f
	tStart   uint64
	begun    bool
	funcs    map[uint32]string
	counters map[uint32]string
	sentF    idSet
	sentC    idSet
	threads  []thread
	sparse   map[uint32]*thread // thread ids from denseThreads up
	meta     map[metaKey]struct{}
	marker   uint32
	hasMark  bool
	maxTS    uint64 // latest event time of the rank
	origin   uint64 // start of the rank's step 0
	bound    uint64 // end of the rank's current step (fixed-step mode)
	ownOrig  bool   // origin set by SetRankOrigin
}

// Builder turns events into frames. See the package doc.
type Builder struct {
	cfg      Config
	stepUS   uint64
	emit     func(*frame.Frame) error
	origin   uint64
	hasOrig  bool
	ranks    map[uint32]*rankState
	order    []*rankState
	last     *rankState
	gstep    uint64 // highest step any event reached (fixed mode)
	advanced uint64 // highest step Advance has emitted up to
	custom   bool   // some rank has its own origin
	maxTS    uint64
	stats    Stats
}

// New returns a Builder that calls emit with each complete frame. cfg must
// have been validated.
func New(cfg Config, emit func(*frame.Frame) error) *Builder {
	if cfg.MaxGap == 0 {
		cfg.MaxGap = DefaultMaxGap
	}
	step := uint64(cfg.Step / time.Microsecond)
	if step == 0 {
		step = uint64(DefaultStep / time.Microsecond)
	}
	return &Builder{cfg: cfg, stepUS: step, emit: emit, ranks: make(map[uint32]*rankState)}
}

// SetOrigin fixes the start of step 0. Without it, the first timestamp fed
// is the origin. Events before the origin count in step 0.
func (b *Builder) SetOrigin(ts uint64) {
	b.origin, b.hasOrig = ts, true
}

// SetRankOrigin gives rank its own start of step 0, for ranks whose clock is
// not comparable with the others' (traces from different machines or runs).
// It must be called before the rank's first event.
func (b *Builder) SetRankOrigin(rank uint32, ts uint64) {
	r := b.rank(rank)
	r.origin, r.ownOrig = ts, true
	b.custom = true
}

// Stats returns the counts so far.
func (b *Builder) Stats() Stats {
	st := b.stats
	st.Losses = append(Losses(nil), b.stats.Losses...)
	return st
}

// Lose counts n losses of kind (one of the Loss constants); example
// describes the first one and is only called when it is the first.
func (b *Builder) Lose(kind string, n int, example func() string) {
	if n <= 0 {
		return
	}
	ex := ""
	if b.stats.Losses.Count(kind) == 0 {
		ex = example()
	}
	b.stats.Losses.Add(kind, n, ex)
}

// Read counts n events read from the input (Stats.InputEvents).
func (b *Builder) Read(n int) { b.stats.InputEvents += n }

// CompleteSteps says how many steps of the slowest rank have been emitted.
func (b *Builder) CompleteSteps() uint64 {
	var n uint64
	for i, r := range b.order {
		s := r.step
		if !r.begun {
			s = 0
		}
		if i == 0 || s < n {
			n = s
		}
	}
	return n
}

func (b *Builder) rank(rank uint32) *rankState {
	if r := b.last; r != nil && r.rank == rank {
		return r
	}
	r, ok := b.ranks[rank]
	if !ok {
		r = &rankState{rank: rank, funcs: map[uint32]string{}, counters: map[uint32]string{}, meta: map[metaKey]struct{}{}}
		r.f.PID, r.f.Rank = b.cfg.PID, rank
		b.ranks[rank] = r
		b.order = append(b.order, r)
	}
	b.last = r
	return r
}

func clean(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

// FuncName names function id on rank. Re-naming an id keeps the first name.
func (b *Builder) FuncName(rank, id uint32, name string) {
	r := b.rank(rank)
	if _, ok := r.funcs[id]; ok {
		return
	}
	name = clean(name)
	r.funcs[id] = name
	if b.cfg.Marker != "" && name == b.cfg.Marker && !r.hasMark {
		r.marker, r.hasMark = id, true
	}
}

// CounterName names counter id on rank.
func (b *Builder) CounterName(rank, id uint32, name string) {
	r := b.rank(rank)
	if _, ok := r.counters[id]; !ok {
		r.counters[id] = clean(name)
	}
}

// HasFunc reports whether function id is named on rank.
func (b *Builder) HasFunc(rank, id uint32) bool {
	_, ok := b.rank(rank).funcs[id]
	return ok
}

// maxThreads bounds the thread index a reader may use.
const maxThreads = 1 << 20

// denseThreads is how many thread ids a rank keeps in a slice; higher (sparse)
// ids go to a map.
const denseThreads = 1024

func (b *Builder) thread(r *rankState, tid uint32) (*thread, error) {
	var t *thread
	switch {
	case tid < uint32(len(r.threads)):
		t = &r.threads[tid]
	case tid < denseThreads:
		n := min(max(int(tid)+1, 2*len(r.threads)), denseThreads)
		r.threads = append(r.threads, make([]thread, n-len(r.threads))...)
		t = &r.threads[tid]
	case tid >= maxThreads:
		return nil, fmt.Errorf("thread %d on rank %d: thread ids must be below %d", tid, r.rank, maxThreads)
	default:
		if r.sparse == nil {
			r.sparse = map[uint32]*thread{}
		}
		if t = r.sparse[tid]; t == nil {
			t = &thread{}
			r.sparse[tid] = t
		}
	}
	if !t.seen {
		t.seen = true
		b.stats.Threads++
	}
	return t, nil
}

// at moves rank r to the step of ts (emitting the frames before it) and
// returns the timestamp to record (clamped so a thread never goes back).
func (b *Builder) at(r *rankState, t *thread, ts uint64) (uint64, error) {
	if ts < t.last {
		ts = t.last
	}
	t.last = ts
	if ts > r.maxTS {
		r.maxTS = ts
		if ts > b.maxTS {
			b.maxTS = ts
		}
	}
	// Fast path: the event falls in the rank's current step.
	if r.begun && (ts < r.bound || b.cfg.Marker != "") {
		return ts, nil
	}
	if !b.hasOrig {
		b.origin, b.hasOrig = ts, true
	}
	if !r.begun {
		if !r.ownOrig {
			r.origin = b.origin
		}
		r.begun = true
		r.step = 0
		r.tStart = r.origin
		r.f.Step, r.f.TStart = 0, r.origin
		r.bound = r.origin + b.stepUS
	}
	if b.cfg.Marker != "" {
		return ts, nil
	}
	s := b.stepOf(r, ts)
	if s > r.step {
		if err := b.advance(r, s); err != nil {
			return ts, err
		}
	}
	if s > b.gstep {
		b.gstep = s
	}
	return ts, nil
}

func (b *Builder) stepOf(r *rankState, ts uint64) uint64 {
	if ts <= r.origin {
		return 0
	}
	return (ts - r.origin) / b.stepUS
}

// advance emits r's frames up to step s-1 and starts step s.
func (b *Builder) advance(r *rankState, s uint64) error {
	if s-r.step > b.cfg.MaxGap {
		return fmt.Errorf("rank %d: time jumps %d steps ahead (from step %d to %d): corrupt timestamp?", r.rank, s-r.step, r.step, s)
	}
	for r.step < s {
		r.f.TEnd = r.origin + (r.step+1)*b.stepUS
		if err := b.flush(r); err != nil {
			return err
		}
		r.step++
		r.f.Step = r.step
		r.f.TStart = r.origin + r.step*b.stepUS
	}
	r.bound = r.origin + (r.step+1)*b.stepUS
	return nil
}

func (b *Builder) flush(r *rankState) error {
	b.stats.Frames++
	b.stats.Events += r.f.NumEvents()
	if err := b.emit(&r.f); err != nil {
		return err
	}
	step, ts := r.f.Step, r.f.TStart
	r.f.Reset()
	r.f.PID, r.f.Rank, r.f.Step, r.f.TStart = b.cfg.PID, r.rank, step, ts
	return nil
}

// Advance tells the Builder that no event before ts will follow on any rank
// (readers that merge all ranks in time order call it), so every rank's
// frames before the step of ts can be emitted now.
func (b *Builder) Advance(ts uint64) error {
	if b.cfg.Marker != "" || !b.hasOrig {
		return nil
	}
	if !b.custom {
		s := (ts - min(ts, b.origin)) / b.stepUS
		if s <= b.advanced {
			return nil
		}
		b.advanced = s
	}
	for _, r := range b.order {
		if !r.begun {
			continue
		}
		s := b.stepOf(r, ts)
		if s > b.gstep && !r.ownOrig {
			b.gstep = s
		}
		if r.step < s {
			if err := b.advance(r, s); err != nil {
				return err
			}
		}
	}
	return nil
}

func (b *Builder) useFunc(r *rankState, fid uint32) {
	if r.sentF.has(fid) {
		return
	}
	r.sentF.add(fid)
	name, ok := r.funcs[fid]
	if !ok {
		name = fmt.Sprintf("function %d", fid)
		r.funcs[fid] = name
	}
	r.f.Funcs = append(r.f.Funcs, frame.Name{ID: fid, Name: name})
}

func (b *Builder) useCounter(r *rankState, cid uint32) {
	if r.sentC.has(cid) {
		return
	}
	r.sentC.add(cid)
	name, ok := r.counters[cid]
	if !ok {
		name = fmt.Sprintf("counter %d", cid)
		r.counters[cid] = name
	}
	r.f.Counters = append(r.f.Counters, frame.Name{ID: cid, Name: name})
}

// Enter records the entry of function fid on (rank, tid) at ts (µs).
func (b *Builder) Enter(rank, tid, fid uint32, ts uint64) error {
	r := b.rank(rank)
	t, err := b.thread(r, tid)
	if err != nil {
		return err
	}
	if b.cfg.Marker != "" && r.hasMark && fid == r.marker && r.begun {
		if err := b.markerStep(r, ts); err != nil {
			return err
		}
	}
	if ts, err = b.at(r, t, ts); err != nil {
		return err
	}
	if b.cfg.Marker != "" && r.f.TStart > ts {
		r.f.TStart = ts
	}
	b.useFunc(r, fid)
	r.f.Events = append(r.f.Events, frame.FuncEvent{Tid: tid, Kind: frame.Entry, FID: fid, TS: ts})
	t.stack = append(t.stack, fid)
	return nil
}

func (b *Builder) markerStep(r *rankState, ts uint64) error {
	if r.f.NumEvents() == 0 && len(r.f.Funcs) == 0 && len(r.f.Metadata) == 0 && r.step == 0 && len(r.f.Counters) == 0 {
		// Nothing before the first marker: it opens step 0.
		r.f.TStart = ts
		return nil
	}
	r.f.TEnd = max(ts, r.f.TStart)
	if err := b.flush(r); err != nil {
		return err
	}
	r.step++
	r.f.Step, r.f.TStart = r.step, ts
	return nil
}

// Exit records the exit of function fid on (rank, tid) at ts (µs).
func (b *Builder) Exit(rank, tid, fid uint32, ts uint64) error {
	r := b.rank(rank)
	t, err := b.thread(r, tid)
	if err != nil {
		return err
	}
	if ts, err = b.at(r, t, ts); err != nil {
		return err
	}
	b.useFunc(r, fid)
	r.f.Events = append(r.f.Events, frame.FuncEvent{Tid: tid, Kind: frame.Exit, FID: fid, TS: ts})
	n := len(t.stack)
	switch {
	case n > 0 && t.stack[n-1] == fid:
		t.stack = t.stack[:n-1]
		b.stats.Executions++
	default:
		i := n - 1
		for i >= 0 && t.stack[i] != fid {
			i--
		}
		if i >= 0 {
			t.stack = t.stack[:i]
			b.stats.Executions++
		} else {
			b.stats.Unmatched++
			b.Lose(LossEndWithoutBegin, 1, func() string {
				return fmt.Sprintf("exit of %q on rank %d thread %d at %d µs (kept in the frames, unmatched)", r.funcs[fid], rank, tid, ts)
			})
		}
	}
	return nil
}

// Counter records a sample of counter cid on (rank, tid) at ts.
func (b *Builder) Counter(rank, tid, cid uint32, value, ts uint64) error {
	r := b.rank(rank)
	t, err := b.thread(r, tid)
	if err != nil {
		return err
	}
	if ts, err = b.at(r, t, ts); err != nil {
		return err
	}
	b.useCounter(r, cid)
	r.f.CounterEvents = append(r.f.CounterEvents, frame.CounterEvent{Tid: tid, CID: cid, Value: value, TS: ts})
	return nil
}

// Comm records a message sent or received on (rank, tid) at ts.
func (b *Builder) Comm(rank, tid uint32, kind frame.CommKind, tag, partner uint32, bytes, ts uint64) error {
	r := b.rank(rank)
	t, err := b.thread(r, tid)
	if err != nil {
		return err
	}
	if ts, err = b.at(r, t, ts); err != nil {
		return err
	}
	r.f.Comms = append(r.f.Comms, frame.CommEvent{Tid: tid, Kind: kind, Tag: tag, Partner: partner, Bytes: bytes, TS: ts})
	return nil
}

// Meta records a metadata entry of (rank, tid); an identical entry is sent
// only once.
func (b *Builder) Meta(rank, tid uint32, key, value string) {
	r := b.rank(rank)
	k := metaKey{tid, clean(key), clean(value)}
	if _, ok := r.meta[k]; ok {
		return
	}
	r.meta[k] = struct{}{}
	r.f.Metadata = append(r.f.Metadata, frame.Meta{Tid: tid, Key: k.key, Value: k.value})
}

// GPU marks (rank, tid) as a GPU virtual thread of the given API ("CUDA",
// "ROCm", "OpenCL", "SYCL") with its context, device and stream.
func (b *Builder) GPU(rank, tid uint32, api, context, device, stream string) error {
	r := b.rank(rank)
	t, err := b.thread(r, tid)
	if err != nil {
		return err
	}
	if t.gpu {
		return nil
	}
	t.gpu = true
	b.stats.GPUThreads++
	b.Meta(rank, tid, api+KeyContext, context)
	b.Meta(rank, tid, api+KeyDevice, device)
	b.Meta(rank, tid, api+KeyStream, stream)
	return nil
}

// MarkGPU counts (rank, tid) as a GPU thread whose metadata the trace itself
// carries.
func (b *Builder) MarkGPU(rank, tid uint32) error {
	r := b.rank(rank)
	t, err := b.thread(r, tid)
	if err != nil {
		return err
	}
	if !t.gpu {
		t.gpu = true
		b.stats.GPUThreads++
	}
	return nil
}

// IsGPU reports whether (rank, tid) was marked as a GPU thread.
func (b *Builder) IsGPU(rank, tid uint32) bool {
	r := b.rank(rank)
	if int(tid) < len(r.threads) {
		return r.threads[tid].gpu
	}
	t := r.sparse[tid]
	return t != nil && t.gpu
}

// ErrStopped is wrapped by errors from Finish after a reader error.
var ErrStopped = errors.New("trace read stopped")

// Finish emits the last frame of every rank. In fixed-step mode every rank
// gets frames up to the last step any rank reached, so all ranks have the same
// steps.
func (b *Builder) Finish() error {
	b.countOpen()
	last := b.gstep
	for _, r := range b.order {
		if !r.begun {
			continue
		}
		if b.cfg.Marker == "" && r.step < last && !b.custom {
			if err := b.advance(r, last); err != nil {
				return err
			}
		}
		r.f.TEnd = max(b.maxTS, r.f.TStart)
		if b.custom {
			r.f.TEnd = max(r.maxTS, r.f.TStart)
		}
		if b.cfg.Marker == "" {
			r.f.TEnd = min(r.f.TEnd, r.origin+(r.step+1)*b.stepUS)
		}
		if err := b.flush(r); err != nil {
			return err
		}
		r.begun = false
	}
	return nil
}

// countOpen counts the entries still open on every thread as unclosed.
func (b *Builder) countOpen() {
	for _, r := range b.order {
		check := func(tid uint32, t *thread) {
			if n := len(t.stack); n > 0 {
				b.Lose(LossUnclosed, n, func() string {
					return fmt.Sprintf("entry of %q on rank %d thread %d never exited (left open in the frames)", r.funcs[t.stack[n-1]], r.rank, tid)
				})
				t.stack = t.stack[:0]
			}
		}
		for i := range r.threads {
			check(uint32(i), &r.threads[i])
		}
		tids := make([]uint32, 0, len(r.sparse))
		for tid := range r.sparse {
			tids = append(tids, tid)
		}
		slices.Sort(tids)
		for _, tid := range tids {
			check(tid, r.sparse[tid])
		}
	}
}
