package ad

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/kipimo-hpc/kipimo/internal/binio"
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
// the executions waiting for a label ran in, and the baseline comparison's
// counts. Each section is written and read next to the state it holds:
//
//	configuration              config_checkpoint.go
//	step fields and counters   detector_checkpoint.go
//	call stacks                stacks_checkpoint.go
//	models                     models_checkpoint.go
//	records waiting            records_checkpoint.go (evidence: baseline_checkpoint.go)
//	pserver protocol state     sync_checkpoint.go (peer data: peers_checkpoint.go)
//	held frames                names_checkpoint.go
//	io_steps run in            ranstep.go
//	baseline comparison        baseline_checkpoint.go
//
// This file keeps the framing (magic, version, CRC, the order of the
// sections) and the forms the sections share. The statistics types are in
// their own binary forms (stats: Moments, Histogram, TailHist, Summary).
// Integers are uvarints (signed ones zigzag), floats their IEEE 754 bits (8
// bytes, 4 for float32), strings and lists a uvarint length and their
// elements; an optional list or value has a uvarint 0 for nil and length+1
// otherwise.
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
	// forms instead of each histogram behind a presence byte; 8: the step
	// summaries' counts of the event library's summarised and dropped
	// calls and dropped events).
	// Restore reads it and every version from minCheckpointVersion on.
	CheckpointVersion = 8
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

func (w *ckWriter) moments(m *stats.Moments) { w.B, _ = m.AppendBinary(w.B) }
func (w *ckWriter) hist(h *stats.Histogram)  { w.B, _ = h.AppendBinary(w.B) }
func (w *ckWriter) summ(s *stats.Summary)    { w.B, _ = s.AppendBinary(w.B) }

// ---- reader ----

// ckReader reads a checkpoint: binio's values (errors wrap
// ErrBadCheckpoint) and the detector's forms. The first error sticks: every
// later read returns zero values, so decoding code reads straight through
// and checks r.Err once.
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

// decode reads a value in its own binary form (the stats types').
func (r *ckReader) decode(v interface{ DecodeBinary([]byte) (int, error) }) { r.Decode(v.DecodeBinary) }

func (r *ckReader) moments(m *stats.Moments) { r.decode(m) }
func (r *ckReader) hist(h *stats.Histogram)  { r.decode(h) }
func (r *ckReader) tail(h *stats.TailHist)   { r.decode(h) }
