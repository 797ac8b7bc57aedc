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

	"github.com/kipimo-hpc/kipimo/internal/binio"
	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/stats"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
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
	// baseline comparison's counts and its evidence in pending records;
	// 7: the models of the sync request in flight as stats.Summary binary
	// forms instead of each histogram behind a presence byte).
	// Restore reads it and every version from minCheckpointVersion on.
	CheckpointVersion = 7
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
	w := &ckWriter{binio.Writer{B: make([]byte, 0, 4096)}}
	w.B = append(w.B, CheckpointMagic...)
	w.Uvarint(CheckpointVersion)
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
	w.B = binary.LittleEndian.AppendUint32(w.B, crc32.Checksum(w.B, castagnoli))
	return w.B, nil
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
	if r.Err == nil && r.Off != len(r.B) {
		r.Fail("%d bytes after the last section", len(r.B)-r.Off)
	}
	if r.Err != nil {
		return nil, r.Err
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

// ckWriter writes a checkpoint: binio's values and the detector's forms.
type ckWriter struct{ binio.Writer }

// optLen writes 0 for a nil list and n+1 otherwise.
func optLen[T any](w *ckWriter, s []T) {
	if s == nil {
		w.Uvarint(0)
	} else {
		w.Uvarint(uint64(len(s)) + 1)
	}
}

// delta writes v as a zigzag difference from *prev (exact modulo 2^64).
func (w *ckWriter) delta(prev *uint64, v uint64) {
	w.Varint(int64(v - *prev))
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
	w.Uvarint(uint64(len(id)))
	for _, kv := range id {
		w.Str(kv[0])
		w.Str(kv[1])
	}
	w.Str(c.Hostname)
}

func (w *ckWriter) detector(d *Detector) {
	w.Uvarint(d.cur.step)
	w.Uvarint(d.cur.tstart)
	w.Uvarint(d.cur.tend)
	w.Uvarint(d.lastStep)
	w.Bool(d.lastSeen)
	w.Uvarint(d.missing)
	w.Uvarint(d.stepEvents)
	w.Uvarint(d.stepBad)
	w.Uvarint(d.processed)
	w.Bool(d.requestProfiles.Load())
	w.Bool(d.heldOnce)
	keys := slices.SortedFunc(maps.Keys(d.metaSeen), func(a, b metaKey) int {
		if a.tid != b.tid {
			return int(a.tid) - int(b.tid)
		}
		return strings.Compare(a.key, b.key)
	})
	w.Uvarint(uint64(len(keys)))
	for _, k := range keys {
		w.U32(k.tid)
		w.Str(k.key)
	}
	c := &d.stats
	cs := counterFields(c)
	w.Uvarint(uint64(len(cs)))
	for _, p := range cs {
		w.Uvarint(p.Load())
	}
	w.Bool(c.ended.Load())
	w.Uvarint(d.sync.lag.Load())
}

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

func (w *ckWriter) moments(m *stats.Moments) { w.B, _ = m.AppendBinary(w.B) }
func (w *ckWriter) hist(h *stats.Histogram)  { w.B, _ = h.AppendBinary(w.B) }
func (w *ckWriter) summ(s *stats.Summary)    { w.B, _ = s.AppendBinary(w.B) }

func (w *ckWriter) models(ms *modelSet) {
	w.Uvarint(uint64(len(ms.list)))
	for _, m := range ms.list {
		w.Str(m.name)
		w.Bool(m.ignored)
		w.summ(&m.accum)
		w.summ(&m.inflight)
		w.summ(&m.global)
		w.Bool(m.inFlight)
		for _, v := range [...]float64{m.natMin, m.natMax, m.natLowThr, m.natThr, m.p99, m.logMean, m.logStd} {
			w.F64(v)
		}
		w.moments(&m.det)
		w.Bool(m.detReady)
		w.scoreState(m.state)
	}
	for _, ks := range [][]int32{ms.fidKey, ms.pathKey} {
		w.Uvarint(uint64(len(ks)))
		for _, k := range ks {
			w.Varint(int64(k))
		}
	}
}

// scoreState writes a model's state of the algorithm: SSTD's σ and
// bounds, the histogram HBOS and COPOD score with, nothing for the tail
// scorer.
func (w *ckWriter) scoreState(st scoreState) {
	switch st := st.(type) {
	case *sstdState:
		w.F64(st.std)
		w.F64(st.lo)
		w.F64(st.hi)
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
	w.Uvarint(uint64(len(d.rec.pending)))
	for _, p := range d.rec.pending {
		ti, ok := idx[p.t]
		if !ok {
			return fmt.Errorf("record of %s waits on a thread the detector does not hold", p.rec.EventID)
		}
		w.Uvarint(uint64(ti))
		w.Uvarint(p.seq)
		w.Uvarint(p.step)
		w.Bool(p.anomaly)
		w.Uvarint(p.pinnedTo)
		w.record(p.rec)
		w.window(&p.ew)
	}
	return nil
}

func (w *ckWriter) frames1(fs []provenance.CallFrame) {
	optLen(w, fs)
	for _, f := range fs {
		w.Uvarint(f.Entry)
		w.Uvarint(f.Exit)
		w.U32(f.FID)
		w.Str(f.Func)
		w.Str(f.EventID)
		w.Bool(f.IsAnomaly)
	}
}

func (w *ckWriter) window(ew *provenance.EventWindow) {
	optLen(w, ew.ExecWindow)
	for _, x := range ew.ExecWindow {
		w.Uvarint(x.Entry)
		w.Uvarint(x.Exit)
		w.U32(x.FID)
		w.Str(x.Func)
		w.Str(x.EventID)
		w.Str(x.ParentEventID)
		w.Bool(x.IsAnomaly)
	}
	optLen(w, ew.CommWindow)
	for _, c := range ew.CommWindow {
		w.Str(c.Type)
		w.U32(c.PID)
		w.U32(c.RID)
		w.U32(c.TID)
		w.U32(c.Src)
		w.U32(c.Tar)
		w.Uvarint(c.Bytes)
		w.U32(c.Tag)
		w.Uvarint(c.Timestamp)
		w.Str(c.ExecdataKey)
	}
}

// record writes every field of a provenance record (checkpoint_test.go's
// TestCheckpointCoversRecordFields fails when the record gains one).
func (w *ckWriter) record(r *provenance.Exec) {
	w.frames1(r.CallStack)
	optLen(w, r.CounterEvents)
	for _, c := range r.CounterEvents {
		w.U32(c.CounterIdx)
		w.Str(c.CounterName)
		w.Uvarint(c.CounterValue)
		w.U32(c.PID)
		w.U32(c.RID)
		w.U32(c.TID)
		w.Uvarint(c.TS)
	}
	w.Uvarint(r.Entry)
	w.Uvarint(r.Exit)
	w.Str(r.EventID)
	w.U32(r.FID)
	w.Str(r.Func)
	fs := r.FuncStats
	for _, v := range [...]float64{fs.Accumulate, fs.Count, fs.Kurtosis, fs.Maximum, fs.Mean, fs.Minimum, fs.Skewness, fs.Stddev} {
		w.F64(v)
	}
	w.Bool(r.IsGPUEvent)
	w.Bool(r.GPULocation != nil)
	if g := r.GPULocation; g != nil {
		w.U32(g.Context)
		w.U32(g.Device)
		w.U32(g.Stream)
		w.U32(g.Thread)
	}
	w.Bool(r.GPUParent != nil)
	if g := r.GPUParent; g != nil {
		w.Str(g.EventID)
		w.U32(g.TID)
		w.frames1(g.CallStack)
	}
	w.U32(r.PID)
	w.U32(r.RID)
	w.U32(r.TID)
	w.Uvarint(r.RuntimeExclusive)
	w.Uvarint(r.RuntimeTotal)
	w.Uvarint(r.IOStep)
	w.Uvarint(r.IOStepTStart)
	w.Uvarint(r.IOStepTEnd)
	w.window(&r.EventWindow)
	w.F64(r.OutlierScore)
	w.F64(r.OutlierSeverity)
	w.Str(r.Hostname)
	w.Str(r.Algorithm)
	w.Bool(r.Explanation != nil)
	if x := r.Explanation; x != nil {
		w.Str(x.Key)
		for _, v := range [...]float64{x.Value, x.NaturalMin, x.NaturalMax, x.LowThreshold, x.Threshold, x.Ratio, x.P99, x.LogSigmas, x.Excess} {
			w.F64(v)
		}
		w.Str(x.Text)
		w.evidence(x.Baseline)
	}
	w.Str(r.FinalLabel)
}

func (w *ckWriter) summary(s *syncproto.StepSummary) {
	w.Uvarint(s.Step)
	w.Uvarint(s.Anomalies)
	w.Uvarint(s.Executions)
	w.Uvarint(s.MinTS)
	w.Uvarint(s.MaxTS)
	w.moments(&s.Scores)
	w.moments(&s.Severity)
	if s.FuncAnomalies == nil {
		w.Uvarint(0)
	} else {
		w.Uvarint(uint64(len(s.FuncAnomalies)) + 1)
		for _, k := range slices.Sorted(maps.Keys(s.FuncAnomalies)) {
			w.Str(k)
			w.Uvarint(s.FuncAnomalies[k])
		}
	}
	w.Uvarint(s.Events)
	w.Uvarint(s.BadFrames)
	w.Uvarint(s.MissingSteps)
	optLen(w, s.Funcs)
	for i := range s.Funcs {
		f := &s.Funcs[i]
		w.Str(f.Func)
		w.Uvarint(f.Count)
		w.moments(&f.Score)
		w.moments(&f.Severity)
		w.Uvarint(f.FirstTS)
		w.Uvarint(f.LastTS)
	}
	w.peer(s.Peer)
}

func (w *ckWriter) request(q *syncproto.SyncRequest) error {
	if q.Node != "" || q.Ranks != nil {
		return fmt.Errorf("sync request %d in flight is a node's request, not the detector's own", q.Seq)
	}
	w.U32(q.PID)
	w.U32(q.Rank)
	w.Uvarint(q.Seq)
	w.Uvarint(q.Step)
	w.Str(q.Algorithm)
	w.Str(q.Hostname)
	w.Bool(q.TailRule != nil)
	if r := q.TailRule; r != nil {
		w.F64(r.Ratio)
		w.Uvarint(r.Recur)
		w.F64(r.RecurFrac)
		w.F64(r.Resolution)
		w.F64(r.Alpha)
	}
	optLen(w, q.Models)
	for i := range q.Models {
		m := &q.Models[i]
		if m.More != nil {
			return fmt.Errorf("sync request %d in flight merges other ranks' deltas", q.Seq)
		}
		w.Str(m.Key)
		s := m.Summary()
		w.summ(&s)
	}
	optLen(w, q.Counters)
	for i := range q.Counters {
		w.Str(q.Counters[i].Name)
		w.moments(&q.Counters[i].Moments)
	}
	optLen(w, q.Steps)
	for i := range q.Steps {
		w.summary(&q.Steps[i])
	}
	return nil
}

func (w *ckWriter) sync(s *syncState) error {
	w.Uvarint(s.incarnation)
	w.Uvarint(uint64(len(s.shards)))
	for _, sh := range s.shards {
		w.Uvarint(sh.seq)
		w.Bool(sh.inflight != nil)
		if sh.inflight != nil {
			if sh.inflight.Incarnation != s.incarnation {
				return fmt.Errorf("sync request %d in flight is of incarnation %x, the detector's is %x", sh.inflight.Seq, sh.inflight.Incarnation, s.incarnation)
			}
			if err := w.request(sh.inflight); err != nil {
				return err
			}
		}
		if sh.inflight == nil {
			w.Uvarint(0) // keys of the last answered request: not state
			continue
		}
		w.Uvarint(uint64(len(sh.keys)))
		for _, k := range sh.keys {
			w.U32(uint32(k))
		}
	}
	optLen(w, s.summaries)
	for i := range s.summaries {
		w.summary(&s.summaries[i])
	}
	names := slices.Sorted(maps.Keys(s.counters))
	w.Uvarint(uint64(len(names)))
	for _, n := range names {
		w.Str(n)
		w.moments(s.counters[n])
	}
	return nil
}

// frames writes frames in frame's binary encoding, each length-prefixed.
func (w *ckWriter) frames(fs []*frame.Frame) {
	w.Uvarint(uint64(len(fs)))
	for _, f := range fs {
		start := len(w.B)
		w.B = append(w.B, 0, 0, 0, 0)
		w.B = frame.AppendBinary(w.B, f)
		binary.LittleEndian.PutUint32(w.B[start:], uint32(len(w.B)-start-4))
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
// checks r.Err once.
// ckReader reads a checkpoint: binio's values (errors wrap
// ErrBadCheckpoint) and the detector's forms.
type ckReader struct {
	binio.Reader
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
	r := &ckReader{Reader: binio.Reader{B: data[:end], Off: len(CheckpointMagic), Wrap: ErrBadCheckpoint}}
	r.version = r.Uvarint()
	if r.Err == nil && (r.version < minCheckpointVersion || r.version > CheckpointVersion) {
		return nil, bad(len(CheckpointMagic), "version %d, this detector reads versions %d to %d", r.version, minCheckpointVersion, CheckpointVersion)
	}
	return r, r.Err
}

// below reads a uvarint that must be less than n.
func (r *ckReader) below(n uint64, what string) uint64 {
	v := r.Uvarint()
	if r.Err == nil && v >= n {
		r.Fail("%s %d out of range (%d)", what, v, n)
		return 0
	}
	return v
}

// optCount reads an optional list's length: nil is -1.
func (r *ckReader) optCount(min int) int {
	n := r.Uvarint()
	if r.Err != nil || n == 0 {
		return -1
	}
	if left := uint64(len(r.B) - r.Off); n-1 > left/uint64(min) {
		r.Fail("list of %d elements of at least %d bytes with %d bytes left", n-1, min, left)
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
	*prev += uint64(r.Varint())
	return *prev
}

func (r *ckReader) identity(c *Config) error {
	want := identity(c)
	if r.version < 3 {
		// version 2 predates the false-alarm rate: its state holds
		// histograms the rate only reads
		want = slices.DeleteFunc(want, func(kv [2]string) bool { return kv[0] == "false-alarm-rate" })
	}
	n := r.Count(2)
	got := make([][2]string, 0, n)
	for range n {
		k := r.Str()
		got = append(got, [2]string{k, r.Str()})
	}
	host := r.Str()
	if r.Err != nil {
		return r.Err
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
	d.cur.step = r.Uvarint()
	d.cur.tstart = r.Uvarint()
	d.cur.tend = r.Uvarint()
	d.lastStep = r.Uvarint()
	d.lastSeen = r.Bool()
	d.missing = r.Uvarint()
	d.stepEvents = r.Uvarint()
	d.stepBad = r.Uvarint()
	d.processed = r.Uvarint()
	d.requestProfiles.Store(r.Bool())
	d.heldOnce = r.Bool()
	n := r.Count(2)
	for range n {
		tid := r.U32()
		d.metaSeen[metaKey{tid, r.Str()}] = struct{}{}
	}
	cs := counterFields(&d.stats)
	// A checkpoint of an earlier version has fewer counts: the newer ones
	// start at zero.
	n = r.Count(1)
	if r.Err == nil && n > len(cs) {
		r.Fail("%d counts, this detector keeps %d", n, len(cs))
	}
	for i, p := range cs {
		if i < n {
			p.Store(r.Uvarint())
		}
	}
	d.stats.ended.Store(r.Bool())
	d.sync.lag.Store(r.Uvarint())
}

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

// decode reads a value in its own binary form (the stats types').
func (r *ckReader) decode(v interface{ DecodeBinary([]byte) (int, error) }) { r.Decode(v.DecodeBinary) }

func (r *ckReader) moments(m *stats.Moments) { r.decode(m) }
func (r *ckReader) hist(h *stats.Histogram)  { r.decode(h) }
func (r *ckReader) tail(h *stats.TailHist)   { r.decode(h) }

// scoreState reads m's state of the algorithm (ckWriter.scoreState), m's
// merged moments read.
func (r *ckReader) scoreState(m *model) {
	switch st := m.state.(type) {
	case *sstdState:
		st.std, st.lo, st.hi = r.F64(), r.F64(), r.F64()
	case *hbosState, *copodState:
		var h stats.Histogram
		r.hist(&h)
		if r.Err == nil {
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
	m.inFlight = r.Bool()
	m.accum.Anomalies = r.Uvarint()
	m.inflight.Anomalies = r.Uvarint()
	for _, s := range []*stats.Summary{&m.accum, &m.inflight, &m.global} {
		r.tail(&s.Tail)
	}
	var lo, hi, std float64
	for _, p := range [...]*float64{&m.natMin, &m.natMax, &m.natLowThr, &m.natThr, &m.p99, &m.logMean, &m.logStd, &lo, &hi, &std} {
		*p = r.F64()
	}
	r.moments(&m.det)
	m.detReady = r.Bool()
	var h stats.Histogram
	r.hist(&h)
	if r.Err != nil {
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
	n := r.Count(64)
	for k := range n {
		if r.Err != nil {
			return
		}
		name := r.Str()
		if _, dup := ms.keyByName[name]; dup && r.Err == nil {
			r.Fail("model %q twice", name)
		}
		m := &model{name: name, shard: syncproto.Shard(name, ms.cfg.Shards), ignored: r.Bool(), state: ms.scorer.newState()}
		if r.version < 4 {
			r.modelV3(m)
		} else {
			r.decode(&m.accum)
			r.decode(&m.inflight)
			r.decode(&m.global)
			m.inFlight = r.Bool()
			for _, p := range [...]*float64{&m.natMin, &m.natMax, &m.natLowThr, &m.natThr, &m.p99, &m.logMean, &m.logStd} {
				*p = r.F64()
			}
			r.moments(&m.det)
			m.detReady = r.Bool()
			r.scoreState(m)
		}
		if r.Err != nil {
			return
		}
		ms.list = append(ms.list, m)
		ms.keyByName[name] = int32(k)
	}
	for _, ks := range []*[]int32{&ms.fidKey, &ms.pathKey} {
		n := r.Count(1)
		if r.Err == nil && n > maxFID {
			r.Fail("%d model keys, more than %d", n, maxFID)
		}
		if r.Err != nil || n == 0 {
			continue
		}
		*ks = make([]int32, n)
		for i := range *ks {
			v := r.Varint()
			if r.Err == nil && (v < -1 || v >= int64(len(ms.list))) {
				r.Fail("model key %d out of range (%d)", v, len(ms.list))
			}
			(*ks)[i] = int32(v)
		}
	}
	if r.Err != nil {
		return
	}
	// executions that know their key must name a model
	for _, t := range ms.stacks.threads {
		check := func(e *execRec) {
			if r.Err == nil && (e.key < 0 || e.key > int32(len(ms.list))) {
				r.Fail("execution of thread %d has model key %d, there are %d models", t.tid, e.key-1, len(ms.list))
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
		fs[i] = provenance.CallFrame{Entry: r.Uvarint(), Exit: r.Uvarint(), FID: r.U32(), Func: r.Str(), EventID: r.Str(), IsAnomaly: r.Bool()}
	}
	return fs
}

func (r *ckReader) window(ew *provenance.EventWindow) {
	ew.ExecWindow = optMake[provenance.WindowExec](r.optCount(7))
	for i := range ew.ExecWindow {
		ew.ExecWindow[i] = provenance.WindowExec{Entry: r.Uvarint(), Exit: r.Uvarint(), FID: r.U32(), Func: r.Str(),
			EventID: r.Str(), ParentEventID: r.Str(), IsAnomaly: r.Bool()}
	}
	ew.CommWindow = optMake[provenance.CommRecord](r.optCount(10))
	for i := range ew.CommWindow {
		ew.CommWindow[i] = provenance.CommRecord{Type: r.Str(), PID: r.U32(), RID: r.U32(), TID: r.U32(), Src: r.U32(), Tar: r.U32(),
			Bytes: r.Uvarint(), Tag: r.U32(), Timestamp: r.Uvarint(), ExecdataKey: r.Str()}
	}
}

func (r *ckReader) record() *provenance.Exec {
	x := &provenance.Exec{}
	x.CallStack = r.callFrames()
	x.CounterEvents = optMake[provenance.CounterEvent](r.optCount(7))
	for i := range x.CounterEvents {
		x.CounterEvents[i] = provenance.CounterEvent{CounterIdx: r.U32(), CounterName: r.Str(), CounterValue: r.Uvarint(),
			PID: r.U32(), RID: r.U32(), TID: r.U32(), TS: r.Uvarint()}
	}
	x.Entry = r.Uvarint()
	x.Exit = r.Uvarint()
	x.EventID = r.Str()
	x.FID = r.U32()
	x.Func = r.Str()
	x.FuncStats = provenance.FuncStats{Accumulate: r.F64(), Count: r.F64(), Kurtosis: r.F64(), Maximum: r.F64(),
		Mean: r.F64(), Minimum: r.F64(), Skewness: r.F64(), Stddev: r.F64()}
	x.IsGPUEvent = r.Bool()
	if r.Bool() {
		x.GPULocation = &provenance.GPULocation{Context: r.U32(), Device: r.U32(), Stream: r.U32(), Thread: r.U32()}
	}
	if r.Bool() {
		x.GPUParent = &provenance.GPUParent{EventID: r.Str(), TID: r.U32()}
		x.GPUParent.CallStack = r.callFrames()
	}
	x.PID = r.U32()
	x.RID = r.U32()
	x.TID = r.U32()
	x.RuntimeExclusive = r.Uvarint()
	x.RuntimeTotal = r.Uvarint()
	x.IOStep = r.Uvarint()
	x.IOStepTStart = r.Uvarint()
	x.IOStepTEnd = r.Uvarint()
	r.window(&x.EventWindow)
	x.OutlierScore = r.F64()
	x.OutlierSeverity = r.F64()
	x.Hostname = r.Str()
	x.Algorithm = r.Str()
	if r.Bool() {
		x.Explanation = &provenance.Explanation{Key: r.Str(), Value: r.F64(), NaturalMin: r.F64(), NaturalMax: r.F64(),
			LowThreshold: r.F64(), Threshold: r.F64(), Ratio: r.F64(), P99: r.F64(), LogSigmas: r.F64(), Excess: r.F64()}
		x.Explanation.Text = r.Str()
		if r.version >= 6 {
			x.Explanation.Baseline = r.evidence()
		}
	}
	x.FinalLabel = r.Str()
	return x
}

func (r *ckReader) pending(d *Detector) {
	n := r.Count(8)
	for range n {
		if r.Err != nil {
			return
		}
		ti := r.below(uint64(len(d.stacks.threads)), "thread index")
		p := &pendingRec{seq: r.Uvarint(), step: r.Uvarint(), anomaly: r.Bool(), pinnedTo: r.Uvarint()}
		p.rec = r.record()
		r.window(&p.ew)
		if r.Err != nil {
			return
		}
		p.t = d.stacks.threads[ti]
		if p.pinnedTo < p.seq || p.pinnedTo-p.seq > uint64(d.cfg.Window) || p.pinnedTo >= p.t.next() {
			r.Fail("record %s pins executions %d..%d (window %d)", p.rec.EventID, p.seq, p.pinnedTo, d.cfg.Window)
			return
		}
		d.rec.pending = append(d.rec.pending, p)
	}
}

func (r *ckReader) summary(s *syncproto.StepSummary) {
	s.Step = r.Uvarint()
	s.Anomalies = r.Uvarint()
	s.Executions = r.Uvarint()
	s.MinTS = r.Uvarint()
	s.MaxTS = r.Uvarint()
	r.moments(&s.Scores)
	r.moments(&s.Severity)
	if n := r.optCount(2); n >= 0 {
		s.FuncAnomalies = make(map[string]uint64, n)
		for range n {
			k := r.Str()
			s.FuncAnomalies[k] = r.Uvarint()
		}
	}
	s.Events = r.Uvarint()
	s.BadFrames = r.Uvarint()
	s.MissingSteps = r.Uvarint()
	s.Funcs = optMake[syncproto.FuncAnomalyMetrics](r.optCount(5))
	for i := range s.Funcs {
		f := &s.Funcs[i]
		f.Func = r.Str()
		f.Count = r.Uvarint()
		r.moments(&f.Score)
		r.moments(&f.Severity)
		f.FirstTS = r.Uvarint()
		f.LastTS = r.Uvarint()
	}
	if r.version >= 6 {
		s.Peer = r.peer()
	}
}

func (r *ckReader) request() *syncproto.SyncRequest {
	q := &syncproto.SyncRequest{PID: r.U32(), Rank: r.U32(), Seq: r.Uvarint(), Step: r.Uvarint(), Algorithm: r.Str(), Hostname: r.Str()}
	if r.Bool() {
		q.TailRule = &stats.TailRule{Ratio: r.F64(), Recur: r.Uvarint(), RecurFrac: r.F64(), Resolution: r.F64()}
		if r.version >= 3 {
			q.TailRule.Alpha = r.F64()
		}
	}
	q.Models = optMake[syncproto.ModelDelta](r.optCount(5))
	for i := range q.Models {
		key := r.Str()
		var s stats.Summary
		if r.version >= 7 {
			r.decode(&s)
		} else {
			r.Decode(s.DecodeOptionalBinary) // each histogram behind a presence byte
		}
		q.Models[i] = syncproto.NewModelDelta(key, &s, true)
	}
	q.Counters = optMake[syncproto.CounterDelta](r.optCount(2))
	for i := range q.Counters {
		q.Counters[i].Name = r.Str()
		r.moments(&q.Counters[i].Moments)
	}
	q.Steps = optMake[syncproto.StepSummary](r.optCount(10))
	for i := range q.Steps {
		r.summary(&q.Steps[i])
	}
	return q
}

func (r *ckReader) sync(s *syncState) {
	s.incarnation = r.Uvarint()
	if r.Err == nil && s.incarnation == 0 {
		r.Fail("sync incarnation 0")
	}
	if n := r.Count(2); r.Err == nil && n != len(s.shards) {
		r.Fail("%d shards, the configuration has %d", n, len(s.shards))
	}
	inShard := make([]int, len(s.models.list))
	for i, sh := range s.shards {
		if r.Err != nil {
			return
		}
		sh.seq = r.Uvarint()
		if r.Bool() {
			sh.inflight = r.request()
			sh.inflight.Incarnation = s.incarnation // written once for the shards
			if r.Err == nil && (sh.inflight.Seq != sh.seq || sh.inflight.PID != s.cfg.PID || sh.inflight.Rank != s.cfg.Rank) {
				r.Fail("request in flight on shard %d is seq %d of rank %d, the shard is at seq %d of rank %d",
					i, sh.inflight.Seq, sh.inflight.Rank, sh.seq, s.cfg.Rank)
			}
		}
		nk := r.Count(1)
		if r.Err == nil && nk > 0 && sh.inflight == nil {
			r.Fail("shard %d has %d keys in flight and no request", i, nk)
		}
		for range nk {
			k := r.below(uint64(len(s.models.list)), "model key")
			if r.Err != nil {
				return
			}
			m := s.models.list[k]
			if m.shard != i || !m.inFlight || inShard[k] != 0 {
				r.Fail("model %q in flight on shard %d is of shard %d (in flight %v)", m.name, i, m.shard, m.inFlight)
				return
			}
			inShard[k] = i + 1
			sh.keys = append(sh.keys, int32(k))
		}
	}
	for k, m := range s.models.list {
		if r.Err == nil && m.inFlight && inShard[k] == 0 {
			r.Fail("model %q is in flight in no request", m.name)
		}
	}
	if n := r.optCount(10); n >= 0 {
		s.summaries = make([]syncproto.StepSummary, n)
		for i := range s.summaries {
			r.summary(&s.summaries[i])
		}
	}
	nc := r.Count(2)
	for range nc {
		name := r.Str()
		m := &stats.Moments{}
		r.moments(m)
		s.counters[name] = m
	}
}

// frames reads frames written by ckWriter.frames.
func (r *ckReader) frames() []*frame.Frame {
	n := r.Count(4 + frame.HeaderSize)
	var fs []*frame.Frame
	for range n {
		b4 := r.Fixed(4)
		if r.Err != nil {
			return nil
		}
		sz := uint64(binary.LittleEndian.Uint32(b4))
		if sz > uint64(len(r.B)-r.Off) {
			r.Fail("held frame of %d bytes with %d left", sz, len(r.B)-r.Off)
			return nil
		}
		b := r.Fixed(int(sz))
		if r.Err != nil {
			return nil
		}
		f := &frame.Frame{}
		if _, err := frame.DecodeBinary(b, f); err != nil {
			r.Off -= len(b)
			r.Fail("held frame: %v", err)
			return nil
		}
		fs = append(fs, f)
	}
	return fs
}
