package ad

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"maps"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/psync"
	"github.com/kipimo-hpc/kipimo/internal/stats"
)

// Checkpoint format. A checkpoint is
//
//	magic "KPCK" | version (uvarint) | body | CRC-32C of everything before it (4 bytes, little endian)
//
// The body is a sequence of sections written in a fixed order: the
// configuration the state depends on (as name=value pairs), the detector's
// step fields and counters, the call stacks (names, call-path nodes, GPU
// launches, threads with their executions, attached events and profiles),
// the models, the records waiting for their window, the pserver protocol
// state (per shard: Seq, the request in flight and its keys; unsent step
// summaries and counters), the frames held for their names and the io_steps
// the executions waiting for a label ran in. The statistics types are in
// their own binary forms (stats: Moments, Histogram, TailHist, Summary).
// Integers are
// uvarints (signed ones zigzag), floats their IEEE 754 bits (8 bytes, 4 for
// float32), strings and lists a uvarint length and their elements; an
// optional list or value has a uvarint 0 for nil and length+1 otherwise.
// Timestamps of a thread's executions are deltas from the previous one.
const (
	// CheckpointMagic starts every checkpoint.
	CheckpointMagic = "KPCK"
	// CheckpointVersion is the format version Checkpoint writes (2: the
	// sync state's incarnation, each thread's first timestamp; 3: the
	// false-alarm rate, in the configuration and in queued requests'
	// rules; 4: each model's statistics as three stats.Summary binary
	// forms, and only its algorithm's state; 5: the io_steps executions
	// waiting for a label ran in; 6: the step summaries' peer data, the
	// baseline comparison's counts and its evidence in pending records).
	// Restore reads it and every version from minCheckpointVersion on.
	CheckpointVersion = 6
	// minCheckpointVersion is the oldest format Restore reads.
	minCheckpointVersion = 2
	// maxCheckpointSize bounds what Restore accepts (1 GiB).
	maxCheckpointSize = 1 << 30
)

// ErrBadCheckpoint is wrapped by Restore's errors about a checkpoint that is
// truncated, corrupted, of another version or inconsistent.
var ErrBadCheckpoint = errors.New("bad checkpoint")

// ErrCheckpointMismatch is wrapped by Restore's error when the restoring
// Config differs from the checkpointed one in a setting the state depends on.
var ErrCheckpointMismatch = errors.New("checkpoint does not match the configuration")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Checkpoint encodes the detector's whole state after the last frame it
// processed: open call stacks and the executions windows can still reach,
// attached counter and comm events, GPU launches, call-path nodes, profiles,
// every model's statistics (global, local, accumulated and in flight) and
// detection state, records waiting for the "after" half of their window,
// the pserver protocol state (its incarnation, each shard's Seq and the
// request in flight, unsent step summaries and counters), the frames held until their names
// arrive (in frame's binary encoding), plus the detector's step fields and
// counts (Stats). Restore turns it back into a detector that
// resumes exactly there: fed the frames that follow, it emits the same
// records, profiles, Stats and sync requests as the detector would have.
//
// Checkpoint must be called by the detector's owner goroutine, between
// Process calls (never during one: the state is only whole at a step
// boundary), and not after Close. It does not change the detector; the
// encoding is independent of map order, so one state gives one byte string.
// A request in flight stays in flight: its sender keeps retrying, and a
// detector restored from the checkpoint resends it with the same Seq (the
// pserver applies a Seq once per rank and shard).
func (d *Detector) Checkpoint() ([]byte, error) {
	if d.closed {
		return nil, ErrClosed
	}
	if len(d.sync.held) > 0 {
		return nil, fmt.Errorf("checkpoint of rank %d: %d step summaries held (ReleaseOutputs first)", d.cfg.Rank, len(d.sync.held))
	}
	for _, m := range d.models.list {
		if m.heldAnoms > 0 {
			return nil, fmt.Errorf("checkpoint of rank %d: anomaly counts of %q held (ReleaseOutputs first)", d.cfg.Rank, m.name)
		}
	}
	if d.batch.Len() != 0 {
		return nil, fmt.Errorf("checkpoint of rank %d: %d records not yet handed to the sink (not at a step boundary)", d.cfg.Rank, d.batch.Len())
	}
	w := &ckWriter{b: make([]byte, 0, 4096)}
	w.b = append(w.b, CheckpointMagic...)
	w.uvarint(CheckpointVersion)
	w.identity(&d.cfg)
	w.detector(d)
	w.stacks(d.stacks)
	w.models(d.models)
	if err := w.pending(d); err != nil {
		return nil, fmt.Errorf("checkpoint of rank %d: %w", d.cfg.Rank, err)
	}
	if err := w.sync(d.sync); err != nil {
		return nil, fmt.Errorf("checkpoint of rank %d: %w", d.cfg.Rank, err)
	}
	w.frames(d.held)
	w.ranSteps(d)
	w.baseline(d)
	w.b = binary.LittleEndian.AppendUint32(w.b, crc32.Checksum(w.b, castagnoli))
	return w.b, nil
}

// Restore returns a detector configured by cfg whose state is the
// checkpoint's (see Checkpoint): the caller owns it as it would own one from
// New, feeds it the frames after the checkpoint's last one (LastStep says
// which) and closes it. Requests that were in flight are resent at once,
// with their Seq, by senders the detector owns (Close stops them).
//
// cfg is validated as by New. Settings the state depends on must equal the
// checkpointed ones, or Restore refuses with ErrCheckpointMismatch naming
// the first that differs: PID, Rank, the algorithm and its parameters
// (Chimbuko, Sigma, Threshold, Bins, Isolation, MaxMass, MinCount,
// SettleCount, SlowOnly, MinRuntime, the tail rule), the keying (Statistic,
// ByCallPath, ModelPathDepth, CallPathDepth, ProfilePaths, Ignore), Window,
// MaxPendingSteps, NormalRate, Shards and whether there is a Syncer. The
// others (Syncer, Barrier, Sink, Logger, the sync timings,
// MaxStepSummaries, ProfileEvery) are the restoring process's; Hostname is
// the checkpoint's (it may have come with the stream's metadata).
//
// A checkpoint that is truncated, corrupted, of another version or
// inconsistent is refused with an error wrapping ErrBadCheckpoint that names
// the byte offset; nothing in it is trusted before it is checked, so a bad
// checkpoint never panics, and Restore allocates in proportion to the
// checkpoint's size (every length is checked against the bytes left).
func Restore(cfg Config, data []byte) (*Detector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("detector config: %w", err)
	}
	r, err := openCheckpoint(data)
	if err != nil {
		return nil, err
	}
	if err := r.identity(&cfg); err != nil {
		return nil, err
	}
	// The state is decoded into a detector without a Syncer, so that a bad
	// checkpoint leaves nothing behind (a node's syncer is joined only once
	// the state is whole).
	syncer := cfg.Syncer
	cfg.Syncer = nil
	d, err := New(cfg)
	if err != nil {
		return nil, err
	}
	tmp := d.sync
	defer tmp.cancel()
	d.cfg.Syncer = syncer // the models and the sync state read it while decoding
	r.detector(d)
	r.stacks(d.stacks)
	r.models(d.models)
	r.pending(d)
	r.sync(tmp)
	d.held = r.frames()
	if r.version >= 5 {
		r.ranSteps(d)
	}
	if r.version >= 6 {
		r.baseline(d)
	}
	if r.err == nil && r.off != len(r.b) {
		r.fail("%d bytes after the last section", len(r.b)-r.off)
	}
	if r.err != nil {
		return nil, r.err
	}
	s := newSyncState(&d.cfg, &d.stats, d.models, &d.cur)
	for i, sh := range s.shards {
		sh.seq, sh.inflight, sh.keys = tmp.shards[i].seq, tmp.shards[i].inflight, tmp.shards[i].keys
	}
	s.summaries, s.counters, s.incarnation = tmp.summaries, tmp.counters, tmp.incarnation
	s.lag.Store(tmp.lag.Load())
	d.sync = s
	d.snapshot()
	for i, sh := range s.shards {
		if sh.inflight != nil {
			s.wg.Add(1)
			go s.sender(i, sh, sh.inflight)
		}
	}
	return d, nil
}

// LastStep returns the latest io_step of the frames the detector has taken,
// processed or held for their names, and whether there was one: a detector
// restored from a checkpoint of it resumes with the frame after it (the
// held frames are in the checkpoint). Called by the detector's owner.
func (d *Detector) LastStep() (uint64, bool) {
	step, ok := d.lastStep, d.lastSeen
	for _, f := range d.held {
		if !ok || f.Step > step {
			step, ok = f.Step, true
		}
	}
	return step, ok
}

// ---- writer ----

type ckWriter struct{ b []byte }

func (w *ckWriter) uvarint(v uint64) { w.b = binary.AppendUvarint(w.b, v) }
func (w *ckWriter) varint(v int64)   { w.b = binary.AppendVarint(w.b, v) }
func (w *ckWriter) u32(v uint32)     { w.uvarint(uint64(v)) }
func (w *ckWriter) f64(v float64)    { w.b = binary.LittleEndian.AppendUint64(w.b, math.Float64bits(v)) }
func (w *ckWriter) f32(v float32)    { w.b = binary.LittleEndian.AppendUint32(w.b, math.Float32bits(v)) }
func (w *ckWriter) byte1(v uint8)    { w.b = append(w.b, v) }
func (w *ckWriter) bool(v bool) {
	if v {
		w.b = append(w.b, 1)
	} else {
		w.b = append(w.b, 0)
	}
}
func (w *ckWriter) str(s string) { w.uvarint(uint64(len(s))); w.b = append(w.b, s...) }

// optLen writes 0 for a nil list and n+1 otherwise.
func optLen[T any](w *ckWriter, s []T) {
	if s == nil {
		w.uvarint(0)
	} else {
		w.uvarint(uint64(len(s)) + 1)
	}
}

// delta writes v as a zigzag difference from *prev (exact modulo 2^64).
func (w *ckWriter) delta(prev *uint64, v uint64) {
	w.varint(int64(v - *prev))
	*prev = v
}

// identity is the configuration the state depends on, as name=value pairs.
func identity(c *Config) [][2]string {
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	ign := slices.Clone(c.Ignore)
	sort.Strings(ign)
	return [][2]string{
		{"pid", strconv.FormatUint(uint64(c.PID), 10)},
		{"rank", strconv.FormatUint(uint64(c.Rank), 10)},
		{"algorithm", c.Algorithm},
		{"chimbuko", strconv.FormatBool(c.Chimbuko)},
		{"statistic", c.Statistic},
		{"by-call-path", strconv.FormatBool(c.ByCallPath)},
		{"model-path-depth", strconv.Itoa(c.ModelPathDepth)},
		{"call-path-depth", strconv.Itoa(c.CallPathDepth)},
		{"profile-paths", strconv.Itoa(c.ProfilePaths)},
		{"ignore", strings.Join(ign, "\x00")},
		{"tail-ratio", f(c.TailRatio)},
		{"tail-recur", strconv.FormatUint(c.TailRecur, 10)},
		{"recur-frac", f(c.RecurFrac)},
		{"false-alarm-rate", f(c.FalseAlarmRate)},
		{"resolution", f(c.Resolution)},
		{"settle-count", f(c.SettleCount)},
		{"sigma", f(c.Sigma)},
		{"threshold", f(c.Threshold)},
		{"bins", strconv.Itoa(c.Bins)},
		{"isolation", strconv.Itoa(c.Isolation)},
		{"max-mass", f(c.MaxMass)},
		{"min-count", f(c.MinCount)},
		{"min-runtime", f(c.MinRuntime)},
		{"slow-only", strconv.FormatBool(c.SlowOnly)},
		{"window", strconv.Itoa(c.Window)},
		{"max-pending-steps", strconv.Itoa(c.MaxPendingSteps)},
		{"normal-rate", f(c.NormalRate)},
		{"shards", strconv.Itoa(c.Shards)},
		{"pserver", strconv.FormatBool(c.Syncer != nil)},
	}
}

func (w *ckWriter) identity(c *Config) {
	id := identity(c)
	w.uvarint(uint64(len(id)))
	for _, kv := range id {
		w.str(kv[0])
		w.str(kv[1])
	}
	w.str(c.Hostname)
}

func (w *ckWriter) detector(d *Detector) {
	w.uvarint(d.cur.step)
	w.uvarint(d.cur.tstart)
	w.uvarint(d.cur.tend)
	w.uvarint(d.lastStep)
	w.bool(d.lastSeen)
	w.uvarint(d.missing)
	w.uvarint(d.stepEvents)
	w.uvarint(d.stepBad)
	w.uvarint(d.processed)
	w.bool(d.requestProfiles.Load())
	w.bool(d.heldOnce)
	keys := slices.SortedFunc(maps.Keys(d.metaSeen), func(a, b metaKey) int {
		if a.tid != b.tid {
			return int(a.tid) - int(b.tid)
		}
		return strings.Compare(a.key, b.key)
	})
	w.uvarint(uint64(len(keys)))
	for _, k := range keys {
		w.u32(k.tid)
		w.str(k.key)
	}
	c := &d.stats
	cs := counterFields(c)
	w.uvarint(uint64(len(cs)))
	for _, p := range cs {
		w.uvarint(p.Load())
	}
	w.bool(c.ended.Load())
	w.uvarint(d.sync.lag.Load())
}

func (w *ckWriter) stacks(cs *callStacks) {
	optLen(w, cs.funcNames)
	for i, n := range cs.funcNames {
		w.str(n)
		w.bool(i < len(cs.funcKnown) && cs.funcKnown[i])
	}
	ids := slices.Sorted(maps.Keys(cs.ctrNames))
	w.uvarint(uint64(len(ids)))
	for _, id := range ids {
		w.u32(id)
		w.str(cs.ctrNames[id])
	}
	w.varint(cs.corrCID)
	w.uvarint(uint64(len(cs.nodes)))
	for _, n := range cs.nodes[1:] {
		w.u32(n.parent)
		w.u32(n.fid)
		w.u32(n.suffix)
	}
	w.uvarint(uint64(len(cs.launchOrder)))
	w.uvarint(uint64(cs.launchHead))
	for _, cid := range cs.launchOrder {
		l := cs.launches[cid]
		w.uvarint(cid)
		w.u32(l.tid)
		w.uvarint(l.seq)
		w.u32(l.step)
		w.u32(l.idx)
		w.u32(l.fid)
		w.uvarint(l.entry)
		optLen(w, l.stack)
		for _, f := range l.stack {
			w.u32(f.fid)
			w.u32(f.step)
			w.u32(f.idx)
			w.uvarint(f.entry)
		}
	}
	w.uvarint(uint64(len(cs.threads)))
	for _, t := range cs.threads {
		w.thread(t)
	}
}

// exec writes execution seq; its parent and the parent's event id are
// differences from its own (small numbers).
func (w *ckWriter) exec(seq uint64, prev *uint64, e *execRec) {
	w.delta(prev, e.entry)
	w.varint(int64(e.exit - e.entry))
	w.uvarint(e.childIncl)
	w.varint(int64(seq - e.parent))
	w.u32(e.step)
	w.u32(e.idx)
	w.varint(int64(e.step) - int64(e.pstep))
	w.varint(int64(e.idx) - int64(e.pidx))
	w.u32(e.fid)
	w.u32(e.path)
	w.u32(uint32(e.key))
	w.u32(e.nchild)
	w.f32(e.score)
	w.byte1(uint8(e.label))
	w.byte1(e.flags)
}

func (w *ckWriter) timers(ts []timerAcc) {
	w.uvarint(uint64(len(ts)))
	for i := range ts {
		a := &ts[i]
		if *a == (timerAcc{}) && math.Float64bits(a.sqIncl)|math.Float64bits(a.sqExcl) == 0 {
			w.uvarint(0) // never called
			continue
		}
		w.uvarint(a.calls + 1)
		w.uvarint(a.subrs)
		w.uvarint(a.incl)
		w.uvarint(a.excl)
		w.f64(a.sqIncl)
		w.f64(a.sqExcl)
	}
}

func (w *ckWriter) thread(t *thread) {
	w.u32(t.tid)
	w.bool(t.gpu)
	w.uvarint(t.lastTS)
	w.bool(t.tsSeen)
	w.uvarint(t.firstTS)
	w.u32(t.loc.context)
	w.u32(t.loc.device)
	w.u32(t.loc.stream)
	w.bool(t.loc.set)
	mk := slices.Sorted(maps.Keys(t.meta))
	w.uvarint(uint64(len(mk)))
	for _, k := range mk {
		w.str(k)
		w.str(t.meta[k])
	}
	w.uvarint(t.base)
	w.uvarint(uint64(len(t.ring)))
	var prev uint64
	for i := range t.ring {
		w.exec(t.base+uint64(i), &prev, &t.ring[i])
	}
	seqs := slices.Sorted(maps.Keys(t.detached))
	w.uvarint(uint64(len(seqs)))
	prev = 0
	for _, s := range seqs {
		w.uvarint(s)
		w.exec(s, &prev, t.detached[s])
	}
	pins := slices.Sorted(maps.Keys(t.pins))
	w.uvarint(uint64(len(pins)))
	for _, s := range pins {
		w.uvarint(s)
		w.u32(t.pins[s])
	}
	w.uvarint(uint64(len(t.stack)))
	for _, s := range t.stack {
		w.uvarint(s)
	}
	w.uvarint(uint64(len(t.counters)))
	prev = 0
	for _, c := range t.counters {
		w.uvarint(c.seq)
		w.u32(c.ev.Tid)
		w.u32(c.ev.CID)
		w.uvarint(c.ev.Value)
		w.delta(&prev, c.ev.TS)
	}
	w.uvarint(uint64(len(t.comms)))
	prev = 0
	for _, c := range t.comms {
		w.uvarint(c.seq)
		w.u32(c.ev.Tid)
		w.byte1(uint8(c.ev.Kind))
		w.u32(c.ev.Tag)
		w.u32(c.ev.Partner)
		w.uvarint(c.ev.Bytes)
		w.delta(&prev, c.ev.TS)
	}
	w.timers(t.paths)
	w.timers(t.over)
	cids := slices.Sorted(maps.Keys(t.ctrs))
	w.uvarint(uint64(len(cids)))
	for _, cid := range cids {
		a := t.ctrs[cid]
		w.u32(cid)
		w.uvarint(a.n)
		w.f64(a.min)
		w.f64(a.max)
		w.f64(a.sum)
		w.f64(a.sumsq)
	}
	paths := slices.Sorted(maps.Keys(t.summ))
	w.uvarint(uint64(len(paths)))
	for _, p := range paths {
		w.str(p)
		w.uvarint(t.summ[p].calls)
		w.uvarint(t.summ[p].ns)
	}
}

func (w *ckWriter) moments(m *stats.Moments) { w.b, _ = m.AppendBinary(w.b) }
func (w *ckWriter) hist(h *stats.Histogram)  { w.b, _ = h.AppendBinary(w.b) }
func (w *ckWriter) tail(h *stats.TailHist)   { w.b, _ = h.AppendBinary(w.b) }
func (w *ckWriter) summ(s *stats.Summary)    { w.b, _ = s.AppendBinary(w.b) }

func (w *ckWriter) models(ms *modelSet) {
	w.uvarint(uint64(len(ms.list)))
	for _, m := range ms.list {
		w.str(m.name)
		w.bool(m.ignored)
		w.summ(&m.accum)
		w.summ(&m.inflight)
		w.summ(&m.global)
		w.bool(m.inFlight)
		for _, v := range [...]float64{m.natMin, m.natMax, m.natLowThr, m.natThr, m.p99, m.logMean, m.logStd} {
			w.f64(v)
		}
		w.moments(&m.det)
		w.bool(m.detReady)
		w.scoreState(m.state)
	}
	for _, ks := range [][]int32{ms.fidKey, ms.pathKey} {
		w.uvarint(uint64(len(ks)))
		for _, k := range ks {
			w.varint(int64(k))
		}
	}
}

// scoreState writes a model's state of the algorithm: SSTD's σ and
// bounds, the histogram HBOS and COPOD score with, nothing for the tail
// scorer.
func (w *ckWriter) scoreState(st scoreState) {
	switch st := st.(type) {
	case *sstdState:
		w.f64(st.std)
		w.f64(st.lo)
		w.f64(st.hi)
	case *hbosState:
		h := st.s.Histogram()
		w.hist(&h)
	case *copodState:
		h := st.s.Histogram()
		w.hist(&h)
	}
}

func (w *ckWriter) pending(d *Detector) error {
	idx := make(map[*thread]int, len(d.stacks.threads))
	for i, t := range d.stacks.threads {
		idx[t] = i
	}
	w.uvarint(uint64(len(d.rec.pending)))
	for _, p := range d.rec.pending {
		ti, ok := idx[p.t]
		if !ok {
			return fmt.Errorf("record of %s waits on a thread the detector does not hold", p.rec.EventID)
		}
		w.uvarint(uint64(ti))
		w.uvarint(p.seq)
		w.uvarint(p.step)
		w.bool(p.anomaly)
		w.uvarint(p.pinnedTo)
		w.record(p.rec)
		w.window(&p.ew)
	}
	return nil
}

func (w *ckWriter) frames1(fs []provenance.CallFrame) {
	optLen(w, fs)
	for _, f := range fs {
		w.uvarint(f.Entry)
		w.uvarint(f.Exit)
		w.u32(f.FID)
		w.str(f.Func)
		w.str(f.EventID)
		w.bool(f.IsAnomaly)
	}
}

func (w *ckWriter) window(ew *provenance.EventWindow) {
	optLen(w, ew.ExecWindow)
	for _, x := range ew.ExecWindow {
		w.uvarint(x.Entry)
		w.uvarint(x.Exit)
		w.u32(x.FID)
		w.str(x.Func)
		w.str(x.EventID)
		w.str(x.ParentEventID)
		w.bool(x.IsAnomaly)
	}
	optLen(w, ew.CommWindow)
	for _, c := range ew.CommWindow {
		w.str(c.Type)
		w.u32(c.PID)
		w.u32(c.RID)
		w.u32(c.TID)
		w.u32(c.Src)
		w.u32(c.Tar)
		w.uvarint(c.Bytes)
		w.u32(c.Tag)
		w.uvarint(c.Timestamp)
		w.str(c.ExecdataKey)
	}
}

// record writes every field of a provenance record (checkpoint_test.go's
// TestCheckpointCoversRecordFields fails when the record gains one).
func (w *ckWriter) record(r *provenance.Exec) {
	w.frames1(r.CallStack)
	optLen(w, r.CounterEvents)
	for _, c := range r.CounterEvents {
		w.u32(c.CounterIdx)
		w.str(c.CounterName)
		w.uvarint(c.CounterValue)
		w.u32(c.PID)
		w.u32(c.RID)
		w.u32(c.TID)
		w.uvarint(c.TS)
	}
	w.uvarint(r.Entry)
	w.uvarint(r.Exit)
	w.str(r.EventID)
	w.u32(r.FID)
	w.str(r.Func)
	fs := r.FuncStats
	for _, v := range [...]float64{fs.Accumulate, fs.Count, fs.Kurtosis, fs.Maximum, fs.Mean, fs.Minimum, fs.Skewness, fs.Stddev} {
		w.f64(v)
	}
	w.bool(r.IsGPUEvent)
	w.bool(r.GPULocation != nil)
	if g := r.GPULocation; g != nil {
		w.u32(g.Context)
		w.u32(g.Device)
		w.u32(g.Stream)
		w.u32(g.Thread)
	}
	w.bool(r.GPUParent != nil)
	if g := r.GPUParent; g != nil {
		w.str(g.EventID)
		w.u32(g.TID)
		w.frames1(g.CallStack)
	}
	w.u32(r.PID)
	w.u32(r.RID)
	w.u32(r.TID)
	w.uvarint(r.RuntimeExclusive)
	w.uvarint(r.RuntimeTotal)
	w.uvarint(r.IOStep)
	w.uvarint(r.IOStepTStart)
	w.uvarint(r.IOStepTEnd)
	w.window(&r.EventWindow)
	w.f64(r.OutlierScore)
	w.f64(r.OutlierSeverity)
	w.str(r.Hostname)
	w.str(r.Algorithm)
	w.bool(r.Explanation != nil)
	if x := r.Explanation; x != nil {
		w.str(x.Key)
		for _, v := range [...]float64{x.Value, x.NaturalMin, x.NaturalMax, x.LowThreshold, x.Threshold, x.Ratio, x.P99, x.LogSigmas, x.Excess} {
			w.f64(v)
		}
		w.str(x.Text)
		w.evidence(x.Baseline)
	}
	w.str(r.FinalLabel)
}

func (w *ckWriter) summary(s *psync.StepSummary) {
	w.uvarint(s.Step)
	w.uvarint(s.Anomalies)
	w.uvarint(s.Executions)
	w.uvarint(s.MinTS)
	w.uvarint(s.MaxTS)
	w.moments(&s.Scores)
	w.moments(&s.Severity)
	if s.FuncAnomalies == nil {
		w.uvarint(0)
	} else {
		w.uvarint(uint64(len(s.FuncAnomalies)) + 1)
		for _, k := range slices.Sorted(maps.Keys(s.FuncAnomalies)) {
			w.str(k)
			w.uvarint(s.FuncAnomalies[k])
		}
	}
	w.uvarint(s.Events)
	w.uvarint(s.BadFrames)
	w.uvarint(s.MissingSteps)
	optLen(w, s.Funcs)
	for i := range s.Funcs {
		f := &s.Funcs[i]
		w.str(f.Func)
		w.uvarint(f.Count)
		w.moments(&f.Score)
		w.moments(&f.Severity)
		w.uvarint(f.FirstTS)
		w.uvarint(f.LastTS)
	}
	w.peer(s.Peer)
}

func (w *ckWriter) request(q *psync.SyncRequest) error {
	if q.Node != "" || q.Ranks != nil {
		return fmt.Errorf("sync request %d in flight is a node's request, not the detector's own", q.Seq)
	}
	w.u32(q.PID)
	w.u32(q.Rank)
	w.uvarint(q.Seq)
	w.uvarint(q.Step)
	w.str(q.Algorithm)
	w.str(q.Hostname)
	w.bool(q.TailRule != nil)
	if r := q.TailRule; r != nil {
		w.f64(r.Ratio)
		w.uvarint(r.Recur)
		w.f64(r.RecurFrac)
		w.f64(r.Resolution)
		w.f64(r.Alpha)
	}
	optLen(w, q.Models)
	for i := range q.Models {
		m := &q.Models[i]
		if m.More != nil {
			return fmt.Errorf("sync request %d in flight merges other ranks' deltas", q.Seq)
		}
		w.str(m.Key)
		w.moments(&m.Moments)
		w.bool(m.Histogram != nil)
		if m.Histogram != nil {
			w.hist(m.Histogram)
		}
		w.bool(m.Tail != nil)
		if m.Tail != nil {
			w.tail(m.Tail)
		}
		w.uvarint(m.Anomalies)
	}
	optLen(w, q.Counters)
	for i := range q.Counters {
		w.str(q.Counters[i].Name)
		w.moments(&q.Counters[i].Moments)
	}
	optLen(w, q.Steps)
	for i := range q.Steps {
		w.summary(&q.Steps[i])
	}
	return nil
}

func (w *ckWriter) sync(s *syncState) error {
	w.uvarint(s.incarnation)
	w.uvarint(uint64(len(s.shards)))
	for _, sh := range s.shards {
		w.uvarint(sh.seq)
		w.bool(sh.inflight != nil)
		if sh.inflight != nil {
			if sh.inflight.Incarnation != s.incarnation {
				return fmt.Errorf("sync request %d in flight is of incarnation %x, the detector's is %x", sh.inflight.Seq, sh.inflight.Incarnation, s.incarnation)
			}
			if err := w.request(sh.inflight); err != nil {
				return err
			}
		}
		if sh.inflight == nil {
			w.uvarint(0) // keys of the last answered request: not state
			continue
		}
		w.uvarint(uint64(len(sh.keys)))
		for _, k := range sh.keys {
			w.u32(uint32(k))
		}
	}
	optLen(w, s.summaries)
	for i := range s.summaries {
		w.summary(&s.summaries[i])
	}
	names := slices.Sorted(maps.Keys(s.counters))
	w.uvarint(uint64(len(names)))
	for _, n := range names {
		w.str(n)
		w.moments(s.counters[n])
	}
	return nil
}

// frames writes frames in frame's binary encoding, each length-prefixed.
func (w *ckWriter) frames(fs []*frame.Frame) {
	w.uvarint(uint64(len(fs)))
	for _, f := range fs {
		start := len(w.b)
		w.b = append(w.b, 0, 0, 0, 0)
		w.b = frame.AppendBinary(w.b, f)
		binary.LittleEndian.PutUint32(w.b[start:], uint32(len(w.b)-start-4))
	}
}

// counterFields lists the detector's counts in their checkpoint order (new
// counts go at the end).
func counterFields(c *counters) []*atomic.Uint64 {
	return []*atomic.Uint64{
		&c.frames, &c.badFrames, &c.events, &c.executions, &c.anomalies,
		&c.unmatchedExits, &c.mismatchedExits, &c.repairedOpen,
		&c.openAtEnd, &c.unscored, &c.records, &c.droppedRecords,
		&c.syncs, &c.syncFailures, &c.droppedSummaries,
		&c.modelErrors, &c.evictedLaunches, &c.unmatchedCorrelations,
		&c.sourceDropped, &c.missingSteps, &c.pathOverflows,
		&c.unnamedFrames, &c.lostAtGap, &c.staleFrames, &c.droppedFrames,
		&c.summarisedCalls, &c.sourceDroppedCalls, &c.sourceDroppedEvents,
	}
}

// ---- reader ----

// ckReader decodes a checkpoint body. The first error sticks: every later
// read returns zero values, so decoding code reads straight through and
// checks r.err once.
type ckReader struct {
	b       []byte
	off     int
	err     error
	version uint64 // the checkpoint's format version
}

func openCheckpoint(data []byte) (*ckReader, error) {
	bad := func(off int, format string, args ...any) error {
		return fmt.Errorf("%w: offset %d: %s", ErrBadCheckpoint, off, fmt.Sprintf(format, args...))
	}
	if len(data) > maxCheckpointSize {
		return nil, bad(0, "%d bytes, more than %d", len(data), maxCheckpointSize)
	}
	if len(data) < len(CheckpointMagic)+1+4 {
		return nil, bad(0, "%d bytes, too short for a checkpoint", len(data))
	}
	if string(data[:len(CheckpointMagic)]) != CheckpointMagic {
		return nil, bad(0, "magic %q, not %q", data[:len(CheckpointMagic)], CheckpointMagic)
	}
	end := len(data) - 4
	if got, want := binary.LittleEndian.Uint32(data[end:]), crc32.Checksum(data[:end], castagnoli); got != want {
		return nil, bad(end, "checksum %08x, the content's is %08x (truncated or corrupted)", got, want)
	}
	r := &ckReader{b: data[:end], off: len(CheckpointMagic)}
	r.version = r.uvarint()
	if r.err == nil && (r.version < minCheckpointVersion || r.version > CheckpointVersion) {
		return nil, bad(len(CheckpointMagic), "version %d, this detector reads versions %d to %d", r.version, minCheckpointVersion, CheckpointVersion)
	}
	return r, r.err
}

func (r *ckReader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: offset %d: %s", ErrBadCheckpoint, r.off, fmt.Sprintf(format, args...))
	}
}

func (r *ckReader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b[r.off:])
	if n <= 0 {
		r.fail("bad or truncated integer")
		return 0
	}
	r.off += n
	return v
}

func (r *ckReader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b[r.off:])
	if n <= 0 {
		r.fail("bad or truncated integer")
		return 0
	}
	r.off += n
	return v
}

func (r *ckReader) u32() uint32 {
	v := r.uvarint()
	if v > math.MaxUint32 {
		r.fail("value %d does not fit 32 bits", v)
		return 0
	}
	return uint32(v)
}

// below reads a uvarint that must be less than n.
func (r *ckReader) below(n uint64, what string) uint64 {
	v := r.uvarint()
	if r.err == nil && v >= n {
		r.fail("%s %d out of range (%d)", what, v, n)
		return 0
	}
	return v
}

func (r *ckReader) fixed(n int) []byte {
	if r.err != nil {
		return nil
	}
	if len(r.b)-r.off < n {
		r.fail("truncated: %d bytes wanted, %d left", n, len(r.b)-r.off)
		return nil
	}
	s := r.b[r.off : r.off+n]
	r.off += n
	return s
}

func (r *ckReader) f64() float64 {
	if b := r.fixed(8); b != nil {
		return math.Float64frombits(binary.LittleEndian.Uint64(b))
	}
	return 0
}

func (r *ckReader) f32() float32 {
	if b := r.fixed(4); b != nil {
		return math.Float32frombits(binary.LittleEndian.Uint32(b))
	}
	return 0
}

func (r *ckReader) byte1() uint8 {
	if b := r.fixed(1); b != nil {
		return b[0]
	}
	return 0
}

func (r *ckReader) bool() bool {
	switch v := r.byte1(); v {
	case 0:
		return false
	case 1:
		return true
	default:
		r.fail("boolean byte %d", v)
		return false
	}
}

func (r *ckReader) str() string {
	n := r.count(1)
	return string(r.fixed(n))
}

// count reads a list length whose elements take at least min bytes each, so
// that no length can ask for more than the checkpoint holds.
func (r *ckReader) count(min int) int {
	n := r.uvarint()
	if r.err != nil {
		return 0
	}
	if left := uint64(len(r.b) - r.off); n > left/uint64(min) {
		r.fail("list of %d elements of at least %d bytes with %d bytes left", n, min, left)
		return 0
	}
	return int(n)
}

// optCount reads an optional list's length: nil is -1.
func (r *ckReader) optCount(min int) int {
	n := r.uvarint()
	if r.err != nil || n == 0 {
		return -1
	}
	if left := uint64(len(r.b) - r.off); n-1 > left/uint64(min) {
		r.fail("list of %d elements of at least %d bytes with %d bytes left", n-1, min, left)
		return -1
	}
	return int(n - 1)
}

// optMake returns nil for n < 0 and a slice of length n otherwise.
func optMake[T any](n int) []T {
	if n < 0 {
		return nil
	}
	return make([]T, n)
}

func (r *ckReader) delta(prev *uint64) uint64 {
	*prev += uint64(r.varint())
	return *prev
}

func (r *ckReader) identity(c *Config) error {
	want := identity(c)
	if r.version < 3 {
		// version 2 predates the false-alarm rate: its state holds
		// histograms the rate only reads
		want = slices.DeleteFunc(want, func(kv [2]string) bool { return kv[0] == "false-alarm-rate" })
	}
	n := r.count(2)
	got := make([][2]string, 0, n)
	for range n {
		k := r.str()
		got = append(got, [2]string{k, r.str()})
	}
	host := r.str()
	if r.err != nil {
		return r.err
	}
	for i, kv := range want {
		if i >= len(got) || got[i][0] != kv[0] {
			return fmt.Errorf("%w: offset %d: setting %q missing from the checkpoint", ErrBadCheckpoint, len(CheckpointMagic)+1, kv[0])
		}
		if got[i][1] != kv[1] {
			return fmt.Errorf("%w: the checkpoint was taken with %s %q, the configuration has %q",
				ErrCheckpointMismatch, kv[0], strings.ReplaceAll(got[i][1], "\x00", ","), strings.ReplaceAll(kv[1], "\x00", ","))
		}
	}
	if len(got) != len(want) {
		return fmt.Errorf("%w: offset %d: %d settings, this detector knows %d", ErrBadCheckpoint, len(CheckpointMagic)+1, len(got), len(want))
	}
	c.Hostname = host
	return nil
}

func (r *ckReader) detector(d *Detector) {
	d.cur.step = r.uvarint()
	d.cur.tstart = r.uvarint()
	d.cur.tend = r.uvarint()
	d.lastStep = r.uvarint()
	d.lastSeen = r.bool()
	d.missing = r.uvarint()
	d.stepEvents = r.uvarint()
	d.stepBad = r.uvarint()
	d.processed = r.uvarint()
	d.requestProfiles.Store(r.bool())
	d.heldOnce = r.bool()
	n := r.count(2)
	for range n {
		tid := r.u32()
		d.metaSeen[metaKey{tid, r.str()}] = struct{}{}
	}
	cs := counterFields(&d.stats)
	// A checkpoint of an earlier version has fewer counts: the newer ones
	// start at zero.
	n = r.count(1)
	if r.err == nil && n > len(cs) {
		r.fail("%d counts, this detector keeps %d", n, len(cs))
	}
	for i, p := range cs {
		if i < n {
			p.Store(r.uvarint())
		}
	}
	d.stats.ended.Store(r.bool())
	d.sync.lag.Store(r.uvarint())
}

func (r *ckReader) stacks(cs *callStacks) {
	if n := r.optCount(1); n >= 0 {
		if n > maxFID {
			r.fail("%d function names, more than %d", n, maxFID)
			return
		}
		cs.funcNames = make([]string, n)
		cs.funcKnown = make([]bool, n)
		for i := range cs.funcNames {
			cs.funcNames[i] = r.str()
			cs.funcKnown[i] = r.bool()
		}
	}
	n := r.count(2)
	for range n {
		id := r.u32()
		cs.nameCounter(id, r.str())
	}
	cs.corrCID = r.varint()
	if r.err == nil && (cs.corrCID < -1 || cs.corrCID > math.MaxUint32) {
		r.fail("correlation counter id %d", cs.corrCID)
	}
	nn := r.uvarint()
	// Top-level calls get their node beyond ProfilePaths, one per function.
	if r.err == nil && (nn < 1 || nn-1 > uint64(len(r.b)-r.off)/3 || nn > uint64(cs.cfg.ProfilePaths)+1+maxFID) {
		r.fail("%d call-path nodes (at most %d, and 3 bytes each)", nn, cs.cfg.ProfilePaths+1+maxFID)
	}
	if r.err != nil {
		return
	}
	cs.nodes = make([]pathNode, 1, nn)
	for i := uint64(1); i < nn && r.err == nil; i++ {
		p := uint32(r.below(i, "call-path parent"))
		fid := uint32(r.below(maxFID, "call-path function"))
		suf := r.u32()
		if r.err == nil && uint64(suf) > nn {
			r.fail("call-path suffix %d out of range (%d)", suf, nn)
		}
		depth := cs.nodes[p].depth + 1
		if r.err == nil && int(depth) > cs.cfg.CallPathDepth {
			r.fail("call path %d is %d frames deep, more than %d", i, depth, cs.cfg.CallPathDepth)
		}
		k := uint64(p)<<32 | uint64(fid)
		if _, dup := cs.pathTab.get(k); dup && r.err == nil {
			r.fail("call path %d repeats an earlier one", i)
		}
		if r.err != nil {
			return
		}
		cs.nodes = append(cs.nodes, pathNode{parent: p, fid: fid, depth: depth, suffix: suf})
		cs.pathTab.put(k, uint32(i))
	}
	for i := 1; i < len(cs.nodes) && r.err == nil; i++ {
		// a suffix is one frame shorter: following suffixes ends
		if s := cs.nodes[i].suffix; s != 0 && cs.nodes[s-1].depth+1 != cs.nodes[i].depth {
			r.fail("call path %d has suffix %d of %d frames, not %d", i, s-1, cs.nodes[s-1].depth, cs.nodes[i].depth-1)
		}
	}
	nl := r.count(8)
	head := r.uvarint()
	if r.err == nil && (nl > maxLaunches || (head != 0 && head >= uint64(nl))) {
		r.fail("%d launches with head %d (at most %d)", nl, head, maxLaunches)
	}
	cs.launchHead = int(head)
	for range nl {
		if r.err != nil {
			return
		}
		cid := r.uvarint()
		l := launch{tid: r.u32(), seq: r.uvarint(), step: r.u32(), idx: r.u32(), fid: r.u32(), entry: r.uvarint()}
		if m := r.optCount(4); m >= 0 {
			l.stack = make([]launchFrame, m)
			for j := range l.stack {
				l.stack[j] = launchFrame{fid: r.u32(), step: r.u32(), idx: r.u32(), entry: r.uvarint()}
			}
		}
		if _, dup := cs.launches[cid]; dup && r.err == nil {
			r.fail("launch of correlation id %d twice", cid)
		}
		cs.launchOrder = append(cs.launchOrder, cid)
		cs.launches[cid] = l
	}
	nt := r.count(16)
	if r.err == nil && nt > maxThreads {
		r.fail("%d threads, more than %d", nt, maxThreads)
	}
	for range nt {
		if r.err != nil {
			return
		}
		tid := r.u32()
		if cs.known(tid) {
			r.fail("thread %d twice", tid)
			return
		}
		r.thread(cs, cs.thread(tid))
	}
}

// exec reads execution seq.
func (r *ckReader) exec(cs *callStacks, seq uint64, prev *uint64, e *execRec) {
	e.entry = r.delta(prev)
	e.exit = e.entry + uint64(r.varint())
	e.childIncl = r.uvarint()
	e.parent = seq - uint64(r.varint())
	if r.err == nil && e.parent > seq {
		// a parent is entered before its children: chains of parents end
		r.fail("execution %d has parent %d", seq, e.parent-1)
	}
	e.step = r.u32()
	e.idx = r.u32()
	e.pstep = uint32(int64(e.step) - r.varint())
	e.pidx = uint32(int64(e.idx) - r.varint())
	e.fid = uint32(r.below(maxFID, "function id"))
	e.path = r.u32()
	if r.err == nil && e.path != pathOverflow && int(e.path) >= len(cs.nodes) {
		r.fail("call-path node %d out of range (%d)", e.path, len(cs.nodes))
	}
	e.key = int32(r.u32())
	e.nchild = r.u32()
	e.score = r.f32()
	e.label = int8(r.byte1())
	e.flags = r.byte1()
}

func (r *ckReader) timers(limit int, what string) []timerAcc {
	n := r.count(1)
	if r.err == nil && n > limit {
		r.fail("%d %s timers, more than %d", n, what, limit)
	}
	if r.err != nil || n == 0 {
		return nil
	}
	ts := make([]timerAcc, n)
	for i := range ts {
		a := &ts[i]
		c := r.uvarint()
		if c == 0 {
			continue
		}
		a.calls = c - 1
		a.subrs = r.uvarint()
		a.incl = r.uvarint()
		a.excl = r.uvarint()
		a.sqIncl = r.f64()
		a.sqExcl = r.f64()
	}
	return ts
}

func (r *ckReader) thread(cs *callStacks, t *thread) {
	t.gpu = r.bool()
	t.lastTS = r.uvarint()
	t.tsSeen = r.bool()
	t.firstTS = r.uvarint()
	t.loc = gpuLoc{context: r.u32(), device: r.u32(), stream: r.u32(), set: r.bool()}
	if n := r.count(2); n > 0 {
		t.meta = make(map[string]string, n)
		for range n {
			k := r.str()
			t.meta[k] = r.str()
		}
	}
	t.base = r.uvarint()
	nr := r.count(17)
	if r.err == nil && t.base+uint64(nr) < t.base {
		r.fail("execution numbers overflow")
	}
	if r.err != nil {
		return
	}
	t.ring = make([]execRec, nr)
	var prev uint64
	for i := range t.ring {
		r.exec(cs, t.base+uint64(i), &prev, &t.ring[i])
	}
	nd := r.count(18)
	prev = 0
	for range nd {
		seq := r.uvarint()
		e := &execRec{}
		r.exec(cs, seq, &prev, e)
		if r.err == nil && (seq >= t.base || t.detached[seq] != nil) {
			r.fail("detached execution %d of thread %d is in the ring or twice", seq, t.tid)
		}
		if r.err != nil {
			return
		}
		t.detached[seq] = e
	}
	np := r.count(2)
	for range np {
		seq := r.uvarint()
		t.pins[seq] = r.u32()
	}
	ns := r.count(1)
	if r.err == nil && ns > 0 {
		t.stack = make([]uint64, ns)
	}
	for i := range t.stack {
		t.stack[i] = r.uvarint()
		if r.err != nil {
			return
		}
		// open executions, outermost first: entered in that order, held,
		// and not exited
		if e := t.rec(t.stack[i]); e == nil || e.flags&flagDone != 0 || (i > 0 && t.stack[i] <= t.stack[i-1]) {
			r.fail("open execution %d of thread %d is not held, exited or out of order", t.stack[i], t.tid)
			return
		}
	}
	nc := r.count(5)
	if r.err == nil && nc > 0 {
		t.counters = make([]attachedCounter, nc)
	}
	prev = 0
	for i := range t.counters {
		c := &t.counters[i]
		c.seq = r.uvarint()
		c.ev = frame.CounterEvent{Tid: r.u32(), CID: r.u32(), Value: r.uvarint(), TS: r.delta(&prev)}
	}
	nm := r.count(7)
	if r.err == nil && nm > 0 {
		t.comms = make([]attachedComm, nm)
	}
	prev = 0
	for i := range t.comms {
		c := &t.comms[i]
		c.seq = r.uvarint()
		c.ev = frame.CommEvent{Tid: r.u32(), Kind: frame.CommKind(r.byte1()), Tag: r.u32(), Partner: r.u32(), Bytes: r.uvarint(), TS: r.delta(&prev)}
	}
	t.paths = r.timers(len(cs.nodes), "call-path")
	t.over = r.timers(maxFID, "function")
	nk := r.count(34)
	for range nk {
		cid := r.u32()
		t.ctrs[cid] = &counterAcc{n: r.uvarint(), min: r.f64(), max: r.f64(), sum: r.f64(), sumsq: r.f64()}
	}
	nsumm := r.count(3)
	for range nsumm {
		p := r.str()
		t.summ[p] = &summaryAcc{calls: r.uvarint(), ns: r.uvarint()}
	}
}

// decode reads a value in its own binary form (the stats types').
func (r *ckReader) decode(v interface{ DecodeBinary([]byte) (int, error) }) {
	if r.err != nil {
		return
	}
	n, err := v.DecodeBinary(r.b[r.off:])
	if err != nil {
		r.fail("%v", err)
		return
	}
	r.off += n
}

func (r *ckReader) moments(m *stats.Moments) { r.decode(m) }
func (r *ckReader) hist(h *stats.Histogram)  { r.decode(h) }
func (r *ckReader) tail(h *stats.TailHist)   { r.decode(h) }

// scoreState reads m's state of the algorithm (ckWriter.scoreState), m's
// merged moments read.
func (r *ckReader) scoreState(m *model) {
	switch st := m.state.(type) {
	case *sstdState:
		st.std, st.lo, st.hi = r.f64(), r.f64(), r.f64()
	case *hbosState, *copodState:
		var h stats.Histogram
		r.hist(&h)
		if r.err == nil {
			st.reset(m, h)
		}
	}
}

// modelV3 reads the statistics and detection state of model m as versions
// 2 and 3 wrote them: the three summaries' parts interleaved, and every
// algorithm's state.
func (r *ckReader) modelV3(m *model) {
	for _, s := range []*stats.Summary{&m.accum, &m.inflight, &m.global} {
		r.moments(&s.Moments)
	}
	for _, s := range []*stats.Summary{&m.accum, &m.inflight, &m.global} {
		r.hist(&s.Histogram)
	}
	m.inFlight = r.bool()
	m.accum.Anomalies = r.uvarint()
	m.inflight.Anomalies = r.uvarint()
	for _, s := range []*stats.Summary{&m.accum, &m.inflight, &m.global} {
		r.tail(&s.Tail)
	}
	var lo, hi, std float64
	for _, p := range [...]*float64{&m.natMin, &m.natMax, &m.natLowThr, &m.natThr, &m.p99, &m.logMean, &m.logStd, &lo, &hi, &std} {
		*p = r.f64()
	}
	r.moments(&m.det)
	m.detReady = r.bool()
	var h stats.Histogram
	r.hist(&h)
	if r.err != nil {
		return
	}
	switch st := m.state.(type) {
	case *sstdState:
		st.std, st.lo, st.hi = std, lo, hi
	default:
		st.reset(m, h)
	}
}

func (r *ckReader) models(ms *modelSet) {
	n := r.count(64)
	for k := range n {
		if r.err != nil {
			return
		}
		name := r.str()
		if _, dup := ms.keyByName[name]; dup && r.err == nil {
			r.fail("model %q twice", name)
		}
		m := &model{name: name, shard: psync.Shard(name, ms.cfg.Shards), ignored: r.bool(), state: ms.scorer.newState()}
		if r.version < 4 {
			r.modelV3(m)
		} else {
			r.decode(&m.accum)
			r.decode(&m.inflight)
			r.decode(&m.global)
			m.inFlight = r.bool()
			for _, p := range [...]*float64{&m.natMin, &m.natMax, &m.natLowThr, &m.natThr, &m.p99, &m.logMean, &m.logStd} {
				*p = r.f64()
			}
			r.moments(&m.det)
			m.detReady = r.bool()
			r.scoreState(m)
		}
		if r.err != nil {
			return
		}
		ms.list = append(ms.list, m)
		ms.keyByName[name] = int32(k)
	}
	for _, ks := range []*[]int32{&ms.fidKey, &ms.pathKey} {
		n := r.count(1)
		if r.err == nil && n > maxFID {
			r.fail("%d model keys, more than %d", n, maxFID)
		}
		if r.err != nil || n == 0 {
			continue
		}
		*ks = make([]int32, n)
		for i := range *ks {
			v := r.varint()
			if r.err == nil && (v < -1 || v >= int64(len(ms.list))) {
				r.fail("model key %d out of range (%d)", v, len(ms.list))
			}
			(*ks)[i] = int32(v)
		}
	}
	if r.err != nil {
		return
	}
	// executions that know their key must name a model
	for _, t := range ms.stacks.threads {
		check := func(e *execRec) {
			if r.err == nil && (e.key < 0 || e.key > int32(len(ms.list))) {
				r.fail("execution of thread %d has model key %d, there are %d models", t.tid, e.key-1, len(ms.list))
			}
		}
		for i := range t.ring {
			check(&t.ring[i])
		}
		for _, e := range t.detached {
			check(e)
		}
	}
}

func (r *ckReader) callFrames() []provenance.CallFrame {
	fs := optMake[provenance.CallFrame](r.optCount(6))
	for i := range fs {
		fs[i] = provenance.CallFrame{Entry: r.uvarint(), Exit: r.uvarint(), FID: r.u32(), Func: r.str(), EventID: r.str(), IsAnomaly: r.bool()}
	}
	return fs
}

func (r *ckReader) window(ew *provenance.EventWindow) {
	ew.ExecWindow = optMake[provenance.WindowExec](r.optCount(7))
	for i := range ew.ExecWindow {
		ew.ExecWindow[i] = provenance.WindowExec{Entry: r.uvarint(), Exit: r.uvarint(), FID: r.u32(), Func: r.str(),
			EventID: r.str(), ParentEventID: r.str(), IsAnomaly: r.bool()}
	}
	ew.CommWindow = optMake[provenance.CommRecord](r.optCount(10))
	for i := range ew.CommWindow {
		ew.CommWindow[i] = provenance.CommRecord{Type: r.str(), PID: r.u32(), RID: r.u32(), TID: r.u32(), Src: r.u32(), Tar: r.u32(),
			Bytes: r.uvarint(), Tag: r.u32(), Timestamp: r.uvarint(), ExecdataKey: r.str()}
	}
}

func (r *ckReader) record() *provenance.Exec {
	x := &provenance.Exec{}
	x.CallStack = r.callFrames()
	x.CounterEvents = optMake[provenance.CounterEvent](r.optCount(7))
	for i := range x.CounterEvents {
		x.CounterEvents[i] = provenance.CounterEvent{CounterIdx: r.u32(), CounterName: r.str(), CounterValue: r.uvarint(),
			PID: r.u32(), RID: r.u32(), TID: r.u32(), TS: r.uvarint()}
	}
	x.Entry = r.uvarint()
	x.Exit = r.uvarint()
	x.EventID = r.str()
	x.FID = r.u32()
	x.Func = r.str()
	x.FuncStats = provenance.FuncStats{Accumulate: r.f64(), Count: r.f64(), Kurtosis: r.f64(), Maximum: r.f64(),
		Mean: r.f64(), Minimum: r.f64(), Skewness: r.f64(), Stddev: r.f64()}
	x.IsGPUEvent = r.bool()
	if r.bool() {
		x.GPULocation = &provenance.GPULocation{Context: r.u32(), Device: r.u32(), Stream: r.u32(), Thread: r.u32()}
	}
	if r.bool() {
		x.GPUParent = &provenance.GPUParent{EventID: r.str(), TID: r.u32()}
		x.GPUParent.CallStack = r.callFrames()
	}
	x.PID = r.u32()
	x.RID = r.u32()
	x.TID = r.u32()
	x.RuntimeExclusive = r.uvarint()
	x.RuntimeTotal = r.uvarint()
	x.IOStep = r.uvarint()
	x.IOStepTStart = r.uvarint()
	x.IOStepTEnd = r.uvarint()
	r.window(&x.EventWindow)
	x.OutlierScore = r.f64()
	x.OutlierSeverity = r.f64()
	x.Hostname = r.str()
	x.Algorithm = r.str()
	if r.bool() {
		x.Explanation = &provenance.Explanation{Key: r.str(), Value: r.f64(), NaturalMin: r.f64(), NaturalMax: r.f64(),
			LowThreshold: r.f64(), Threshold: r.f64(), Ratio: r.f64(), P99: r.f64(), LogSigmas: r.f64(), Excess: r.f64()}
		x.Explanation.Text = r.str()
		if r.version >= 6 {
			x.Explanation.Baseline = r.evidence()
		}
	}
	x.FinalLabel = r.str()
	return x
}

func (r *ckReader) pending(d *Detector) {
	n := r.count(8)
	for range n {
		if r.err != nil {
			return
		}
		ti := r.below(uint64(len(d.stacks.threads)), "thread index")
		p := &pendingRec{seq: r.uvarint(), step: r.uvarint(), anomaly: r.bool(), pinnedTo: r.uvarint()}
		p.rec = r.record()
		r.window(&p.ew)
		if r.err != nil {
			return
		}
		p.t = d.stacks.threads[ti]
		if p.pinnedTo < p.seq || p.pinnedTo-p.seq > uint64(d.cfg.Window) || p.pinnedTo >= p.t.next() {
			r.fail("record %s pins executions %d..%d (window %d)", p.rec.EventID, p.seq, p.pinnedTo, d.cfg.Window)
			return
		}
		d.rec.pending = append(d.rec.pending, p)
	}
}

func (r *ckReader) summary(s *psync.StepSummary) {
	s.Step = r.uvarint()
	s.Anomalies = r.uvarint()
	s.Executions = r.uvarint()
	s.MinTS = r.uvarint()
	s.MaxTS = r.uvarint()
	r.moments(&s.Scores)
	r.moments(&s.Severity)
	if n := r.optCount(2); n >= 0 {
		s.FuncAnomalies = make(map[string]uint64, n)
		for range n {
			k := r.str()
			s.FuncAnomalies[k] = r.uvarint()
		}
	}
	s.Events = r.uvarint()
	s.BadFrames = r.uvarint()
	s.MissingSteps = r.uvarint()
	s.Funcs = optMake[psync.FuncAnomalyMetrics](r.optCount(5))
	for i := range s.Funcs {
		f := &s.Funcs[i]
		f.Func = r.str()
		f.Count = r.uvarint()
		r.moments(&f.Score)
		r.moments(&f.Severity)
		f.FirstTS = r.uvarint()
		f.LastTS = r.uvarint()
	}
	if r.version >= 6 {
		s.Peer = r.peer()
	}
}

func (r *ckReader) request() *psync.SyncRequest {
	q := &psync.SyncRequest{PID: r.u32(), Rank: r.u32(), Seq: r.uvarint(), Step: r.uvarint(), Algorithm: r.str(), Hostname: r.str()}
	if r.bool() {
		q.TailRule = &stats.TailRule{Ratio: r.f64(), Recur: r.uvarint(), RecurFrac: r.f64(), Resolution: r.f64()}
		if r.version >= 3 {
			q.TailRule.Alpha = r.f64()
		}
	}
	q.Models = optMake[psync.ModelDelta](r.optCount(5))
	for i := range q.Models {
		m := &q.Models[i]
		m.Key = r.str()
		r.moments(&m.Moments)
		if r.bool() {
			m.Histogram = &stats.Histogram{}
			r.hist(m.Histogram)
		}
		if r.bool() {
			m.Tail = &stats.TailHist{}
			r.tail(m.Tail)
		}
		m.Anomalies = r.uvarint()
	}
	q.Counters = optMake[psync.CounterDelta](r.optCount(2))
	for i := range q.Counters {
		q.Counters[i].Name = r.str()
		r.moments(&q.Counters[i].Moments)
	}
	q.Steps = optMake[psync.StepSummary](r.optCount(10))
	for i := range q.Steps {
		r.summary(&q.Steps[i])
	}
	return q
}

func (r *ckReader) sync(s *syncState) {
	s.incarnation = r.uvarint()
	if r.err == nil && s.incarnation == 0 {
		r.fail("sync incarnation 0")
	}
	if n := r.count(2); r.err == nil && n != len(s.shards) {
		r.fail("%d shards, the configuration has %d", n, len(s.shards))
	}
	inShard := make([]int, len(s.models.list))
	for i, sh := range s.shards {
		if r.err != nil {
			return
		}
		sh.seq = r.uvarint()
		if r.bool() {
			sh.inflight = r.request()
			sh.inflight.Incarnation = s.incarnation // written once for the shards
			if r.err == nil && (sh.inflight.Seq != sh.seq || sh.inflight.PID != s.cfg.PID || sh.inflight.Rank != s.cfg.Rank) {
				r.fail("request in flight on shard %d is seq %d of rank %d, the shard is at seq %d of rank %d",
					i, sh.inflight.Seq, sh.inflight.Rank, sh.seq, s.cfg.Rank)
			}
		}
		nk := r.count(1)
		if r.err == nil && nk > 0 && sh.inflight == nil {
			r.fail("shard %d has %d keys in flight and no request", i, nk)
		}
		for range nk {
			k := r.below(uint64(len(s.models.list)), "model key")
			if r.err != nil {
				return
			}
			m := s.models.list[k]
			if m.shard != i || !m.inFlight || inShard[k] != 0 {
				r.fail("model %q in flight on shard %d is of shard %d (in flight %v)", m.name, i, m.shard, m.inFlight)
				return
			}
			inShard[k] = i + 1
			sh.keys = append(sh.keys, int32(k))
		}
	}
	for k, m := range s.models.list {
		if r.err == nil && m.inFlight && inShard[k] == 0 {
			r.fail("model %q is in flight in no request", m.name)
		}
	}
	if n := r.optCount(10); n >= 0 {
		s.summaries = make([]psync.StepSummary, n)
		for i := range s.summaries {
			r.summary(&s.summaries[i])
		}
	}
	nc := r.count(2)
	for range nc {
		name := r.str()
		m := &stats.Moments{}
		r.moments(m)
		s.counters[name] = m
	}
}

// frames reads frames written by ckWriter.frames.
func (r *ckReader) frames() []*frame.Frame {
	n := r.count(4 + frame.HeaderSize)
	var fs []*frame.Frame
	for range n {
		b4 := r.fixed(4)
		if r.err != nil {
			return nil
		}
		sz := uint64(binary.LittleEndian.Uint32(b4))
		if sz > uint64(len(r.b)-r.off) {
			r.fail("held frame of %d bytes with %d left", sz, len(r.b)-r.off)
			return nil
		}
		b := r.fixed(int(sz))
		if r.err != nil {
			return nil
		}
		f := &frame.Frame{}
		if _, err := frame.DecodeBinary(b, f); err != nil {
			r.off -= len(b)
			r.fail("held frame: %v", err)
			return nil
		}
		fs = append(fs, f)
	}
	return fs
}
