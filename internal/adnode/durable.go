package adnode

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/kipimo-hpc/kipimo/internal/ad"
	"hash/fnv"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kipimo-hpc/kipimo/internal/natsx"
)

// Frame transports a node's detectors can read their frames from.
const (
	// FramesCore reads frames as core NATS messages: nothing is stored, and
	// a detector that is down loses the frames published meanwhile (the
	// gaps are counted as missing steps).
	FramesCore = "core"
	// FramesDurable reads frames from the run's JetStream stream through a
	// durable consumer, checkpointing every rank's state (see Durable).
	FramesDurable = "durable"
	// FramesAuto, ad's default, is FramesDurable where the NATS server the
	// ad connects to offers JetStream (in the frames' domain), else
	// FramesCore with a warning; FramesCore with --ranks auto.
	FramesAuto = "auto"
)

// FrameStreamConfig bounds the run's frame stream. The application is never
// blocked by it: past a bound the oldest frames are dropped, and a detector
// that had not read them counts them as missing steps.
type FrameStreamConfig struct {
	// Memory keeps the frames in the server's memory instead of files.
	Memory bool
	// MaxBytes bounds the stream (default 1 GiB).
	MaxBytes int64
	// MaxAge bounds how long a frame is kept (default 1h).
	MaxAge time.Duration
}

// DefaultFrameStreamConfig is the frame stream's default bounds.
func DefaultFrameStreamConfig() FrameStreamConfig {
	return FrameStreamConfig{MaxBytes: 1 << 30, MaxAge: time.Hour}
}

// EnsureFrameStream creates, or updates to c, the stream natsx.FrameStream(run)
// that holds kipimo.<run>.frames.>: limits retention, the oldest frames
// discarded past a bound. Event sources keep publishing with core NATS
// publishes, which the stream stores. Safe to call from several processes.
func EnsureFrameStream(ctx context.Context, js jetstream.JetStream, run string, c FrameStreamConfig) (jetstream.Stream, error) {
	if err := natsx.ValidRun(run); err != nil {
		return nil, fmt.Errorf("frame stream: %w", err)
	}
	d := DefaultFrameStreamConfig()
	if c.MaxBytes <= 0 {
		c.MaxBytes = d.MaxBytes
	}
	if c.MaxAge <= 0 {
		c.MaxAge = d.MaxAge
	}
	storage := jetstream.FileStorage
	if c.Memory {
		storage = jetstream.MemoryStorage
	}
	cfg := jetstream.StreamConfig{
		Name:        natsx.FrameStream(run),
		Description: "Kipimo frames of run " + run,
		Subjects:    []string{natsx.Subjects{Run: run}.AllFrames()},
		Storage:     storage,
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxBytes:    c.MaxBytes,
		MaxAge:      c.MaxAge,
		MaxMsgSize:  -1,
	}
	s, err := js.CreateOrUpdateStream(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("create frame stream %s: %w", cfg.Name, err)
	}
	return s, nil
}

// Durable makes the frames of a node's detectors survive a restart of the
// ad process: they are read from the run's frame stream through a durable
// consumer of the node's ranks, and every rank's detector writes a
// checkpoint of its whole state (Detector.Checkpoint) to the run's object
// store every CheckpointEvery io_steps, after the records of those steps
// have reached the provenance stream (the sink's Flush), and only then
// acknowledges the frames. A restarted ad with the same ranks restores each
// rank from its checkpoint and takes the frames after it: those it had
// processed after the checkpoint come again and are processed again. Their
// sync requests carry the same Seqs as before (the detectors sync exactly
// once per step, Config.ExactSync), which the pserver applies once; their
// records have the same natural keys, which provdb stores once.
type Durable struct {
	// JS is the JetStream context of the node's connection.
	JS jetstream.JetStream
	// Stream bounds the run's frame stream, created or updated at start.
	Stream FrameStreamConfig
	// CheckpointEvery is how many io_steps a rank's detector processes
	// between checkpoints (default 10); a rank checkpoints sooner when its
	// frames not yet acknowledged hold ServeConfig.PendingBytes of data.
	CheckpointEvery int
	// AckWait is how long the server waits for a frame's acknowledgement
	// before it delivers the frame again (default 10m: frames are
	// acknowledged at checkpoints).
	AckWait time.Duration
}

// durableNode is the durable state of one Serve: the consumer of its ranks'
// frames, the checkpoint store and the counts /metrics reports.
type durableNode struct {
	cfg    Durable
	store  jetstream.ObjectStore
	stream jetstream.Stream
	cons   jetstream.Consumer

	checkpoints     atomic.Uint64
	checkpointBytes atomic.Uint64
	restored        atomic.Uint64
	replayed        atomic.Uint64 // frames already processed before a restart, skipped
}

// checkpointKey names a rank's checkpoint in the run's object store.
func checkpointKey(pid, rank uint32) string {
	return strconv.FormatUint(uint64(pid), 10) + "." + strconv.FormatUint(uint64(rank), 10)
}

// endedKey marks a rank whose stream ended and whose detector closed.
func endedKey(pid, rank uint32) string { return checkpointKey(pid, rank) + ".ended" }

// consumerName names the durable consumer of a node's ranks: the same ranks
// give the same consumer, so a restarted ad resumes it.
func consumerName(pid uint32, ranks []uint32) string {
	h := fnv.New64a()
	for _, r := range ranks {
		h.Write([]byte(strconv.FormatUint(uint64(r), 10) + ","))
	}
	return fmt.Sprintf("ad-%d-%d-%d-%x", pid, ranks[0], len(ranks), h.Sum64())
}

// openDurable creates or opens the frame stream, the checkpoint store and
// the node's consumer.
func openDurable(ctx context.Context, cfg ServeConfig) (*durableNode, error) {
	dc := *cfg.Durable
	if dc.JS == nil {
		return nil, errors.New("durable frames: no JetStream context")
	}
	if dc.CheckpointEvery <= 0 {
		dc.CheckpointEvery = 10
	}
	if dc.AckWait <= 0 {
		dc.AckWait = 10 * time.Minute
	}
	stream, err := EnsureFrameStream(ctx, dc.JS, cfg.Run, dc.Stream)
	if err != nil {
		return nil, err
	}
	store, err := dc.JS.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket:      natsx.CheckpointBucket(cfg.Run),
		Description: "Kipimo detector checkpoints of run " + cfg.Run,
		Storage:     jetstream.FileStorage,
	})
	if err != nil {
		return nil, fmt.Errorf("checkpoint store of run %s: %w", cfg.Run, err)
	}
	return &durableNode{cfg: dc, store: store, stream: stream}, nil
}

// openConsumer (re)creates the node's durable consumer so that it delivers
// the frames of its ranks from stream sequence from on (all of them for
// from at most 1, or no rank to serve). It starts afresh each time: frames
// a killed ad had received but not acknowledged come again at once, not
// after their acknowledgement wait.
func (dn *durableNode) openConsumer(ctx context.Context, cfg ServeConfig, from uint64) error {
	subj := natsx.Subjects{Run: cfg.Run}
	filters := make([]string, len(cfg.Ranks))
	for i, r := range cfg.Ranks {
		filters[i] = subj.Frames(cfg.PID, r)
	}
	name := consumerName(cfg.PID, cfg.Ranks)
	if err := dn.stream.DeleteConsumer(ctx, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("frame consumer %s of run %s: %w", name, cfg.Run, err)
	}
	cc := jetstream.ConsumerConfig{
		Durable:        name,
		Description:    fmt.Sprintf("ad of program %d, %d ranks from %d", cfg.PID, len(cfg.Ranks), cfg.Ranks[0]),
		FilterSubjects: filters,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        dn.cfg.AckWait,
		// Every rank may hold a checkpoint interval of frames, plus what
		// waits in its queue.
		MaxAckPending: len(cfg.Ranks) * (dn.cfg.CheckpointEvery + cfg.PendingFrames + 2),
	}
	if from > 1 && from < math.MaxUint64 {
		cc.DeliverPolicy, cc.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from
	}
	cons, err := dn.stream.CreateOrUpdateConsumer(ctx, cc)
	if err != nil {
		return fmt.Errorf("frame consumer %s of run %s: %w", name, cfg.Run, err)
	}
	dn.cons = cons
	return nil
}

// storedCheckpoint is what the object store keeps of a rank: the stream
// sequence of the last frame the checkpoint covers, the detector's
// checkpoint, and the record batches of the steps it covers that had not
// been published when it was taken (they are published after it is
// stored, and again from it after a restart: provdb stores a record once).
//
// Encoded as the sequence (8 bytes, little endian), the checkpoint's length
// (uvarint) and bytes, then the batches as a JSON array.
type storedCheckpoint struct {
	seq     uint64
	ckpt    []byte
	batches []*ad.Batch
}

func (c *storedCheckpoint) encode() ([]byte, error) {
	recs, err := json.Marshal(c.batches)
	if err != nil {
		return nil, fmt.Errorf("encode held records: %w", err)
	}
	b := binary.LittleEndian.AppendUint64(make([]byte, 0, 8+binary.MaxVarintLen64+len(c.ckpt)+len(recs)), c.seq)
	b = binary.AppendUvarint(b, uint64(len(c.ckpt)))
	b = append(b, c.ckpt...)
	return append(b, recs...), nil
}

func decodeStoredCheckpoint(b []byte) (*storedCheckpoint, error) {
	if len(b) < 9 {
		return nil, fmt.Errorf("stored checkpoint of %d bytes: %w", len(b), ad.ErrBadCheckpoint)
	}
	c := &storedCheckpoint{seq: binary.LittleEndian.Uint64(b)}
	n, k := binary.Uvarint(b[8:])
	if k <= 0 || n > uint64(len(b)-8-k) {
		return nil, fmt.Errorf("stored checkpoint: length at byte 8: %w", ad.ErrBadCheckpoint)
	}
	off := 8 + k
	c.ckpt = b[off : off+int(n)]
	if err := json.Unmarshal(b[off+int(n):], &c.batches); err != nil {
		return nil, fmt.Errorf("stored checkpoint: held records at byte %d: %v: %w", off+int(n), err, ad.ErrBadCheckpoint)
	}
	return c, nil
}

// load returns rank's stored checkpoint (nil when there is none), and
// whether the rank's detector had closed at the end of its stream.
func (dn *durableNode) load(ctx context.Context, pid, rank uint32) (*storedCheckpoint, bool, error) {
	if _, err := dn.store.GetInfo(ctx, endedKey(pid, rank)); err == nil {
		return nil, true, nil
	} else if !errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, false, fmt.Errorf("checkpoint of rank %d: %w", rank, err)
	}
	b, err := dn.store.GetBytes(ctx, checkpointKey(pid, rank))
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("checkpoint of rank %d: %w", rank, err)
	}
	c, err := decodeStoredCheckpoint(b)
	if err != nil {
		return nil, false, fmt.Errorf("checkpoint of rank %d: %w", rank, err)
	}
	return c, false, nil
}

// holdSink keeps a rank's record batches until its next checkpoint (see
// storedCheckpoint), so that no record leaves before the state that
// labelled it is stored. Used by the rank's goroutine only.
type holdSink struct {
	next ad.Sink
	held []*ad.Batch
}

// Publish implements Sink: it holds b.
func (h *holdSink) Publish(_ context.Context, b *ad.Batch) error {
	h.held = append(h.held, b)
	return nil
}

// Flush implements Sink: it publishes the held batches, then waits for the
// next sink to have published them.
func (h *holdSink) Flush(ctx context.Context) error {
	var errs []error
	for _, b := range h.held {
		if err := h.next.Publish(ctx, b); err != nil {
			errs = append(errs, err)
		}
	}
	clear(h.held)
	h.held = h.held[:0]
	return errors.Join(append(errs, h.next.Flush(ctx))...)
}

// consume delivers the node's frames to the ranks' sources until ctx is
// done or the consumer fails; a rank whose queue is full (in frames or in
// bytes) holds the others back (the frames wait in the stream). The
// consumer's pulls ask for at most batch frames and pullBytes bytes at a
// time.
func (dn *durableNode) consume(ctx context.Context, run string, srcs map[uint32]*durableSource, batch, pullBytes int) error {
	it, err := dn.cons.Messages(jetstream.PullMaxMessagesWithBytesLimit(batch, pullBytes))
	if err != nil {
		return fmt.Errorf("consume frames: %w", err)
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	defer it.Stop()
	prefix := natsx.Subjects{Run: run}.FramesPrefix()
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			return fmt.Errorf("consume frames: %w", err)
		}
		k, err := parseFrameSubject(m.Subject(), prefix)
		src := srcs[k.rank]
		if err != nil || src == nil {
			_ = m.Term() // not one of ours: never again
			continue
		}
		// Wait for room in the rank's queue for the frame's bytes.
		for !src.reserve(len(m.Data())) {
			select {
			case <-src.freed:
				continue
			case <-src.done:
			case <-ctx.Done():
				return nil
			}
			break
		}
		select {
		case src.ch <- m:
		case <-src.done:
			// The rank's detector has stopped: the frame stays
			// unacknowledged, for the next ad to serve the rank.
		case <-ctx.Done():
			return nil
		}
	}
}

// durableSource is one rank's frames from the node's consumer, queued in
// ch (bounded in frames by its capacity) and bounded in bytes by maxBytes:
// the consumer waits for room (reserve) rather than drop, since the frames
// wait in the stream. The frames it hands out stay unacknowledged, and in
// memory, until the rank's next checkpoint, which comes after
// CheckpointEvery io_steps or as soon as they hold maxBytes of frame data,
// whichever is first (unackedFull).
type durableSource struct {
	ch      chan jetstream.Msg
	done    chan struct{}   // closed when the rank's goroutine returns
	unacked []jetstream.Msg // owned by the rank's goroutine
	// unackedBytes is the frame data of unacked; owned by the rank's
	// goroutine.
	unackedBytes int64
	lastSeq      uint64 // stream sequence of the last frame taken
	maxBytes     int64
	// freed receives (without blocking the sender) when a frame leaves
	// ch, so that a consumer waiting for room tries again.
	freed chan struct{}

	mu    sync.Mutex
	bytes int64 // data of the frames reserved and not taken yet
}

// newDurableSource returns a rank's source holding at most frames frames
// and maxBytes bytes of frame data (or one frame of any size), whose
// checkpoint covers the stream up to lastSeq.
func newDurableSource(frames int, maxBytes int64, lastSeq uint64) *durableSource {
	return &durableSource{ch: make(chan jetstream.Msg, frames), done: make(chan struct{}), lastSeq: lastSeq,
		maxBytes: maxBytes, freed: make(chan struct{}, 1)}
}

// reserve accounts for n bytes about to be queued, if they fit (or the
// queue holds no data); it reports whether they did.
func (s *durableSource) reserve(n int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bytes > 0 && s.bytes+int64(n) > s.maxBytes {
		return false
	}
	s.bytes += int64(n)
	return true
}

// queuedBytes is the frame data queued and not taken yet.
func (s *durableSource) queuedBytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bytes
}

func (s *durableSource) take(m jetstream.Msg) *nats.Msg {
	s.mu.Lock()
	s.bytes -= int64(len(m.Data()))
	s.mu.Unlock()
	select {
	case s.freed <- struct{}{}:
	default:
	}
	s.unacked = append(s.unacked, m)
	s.unackedBytes += int64(len(m.Data()))
	if md, err := m.Metadata(); err == nil {
		s.lastSeq = md.Sequence.Stream
	}
	return &nats.Msg{Subject: m.Subject(), Data: m.Data(), Header: m.Headers()}
}

func (s *durableSource) nextContext(ctx context.Context) (*nats.Msg, error) {
	select {
	case m := <-s.ch:
		return s.take(m), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (s *durableSource) next(d time.Duration) (*nats.Msg, error) {
	m, err := recvWithin(s.ch, d)
	if err != nil {
		return nil, err
	}
	return s.take(m), nil
}

// pending is what waits for the rank: the frames fetched, and one more,
// since the stream may hold frames the consumer has not delivered yet: a
// rank told to end (end_of_run, a core message that can overtake the frames
// published before it) reads on until no frame comes for a second.
func (s *durableSource) pending() int { return len(s.ch) + 1 }
func (s *durableSource) dropped() int { return 0 }

// ackAll acknowledges every frame handed out so far.
func (s *durableSource) ackAll() {
	for _, m := range s.unacked {
		_ = m.Ack()
	}
	clear(s.unacked)
	s.unacked = s.unacked[:0]
	s.unackedBytes = 0
}

// unackedFull reports whether the frames handed out and not acknowledged
// hold maxBytes of data or more: the rank checkpoints then, however few
// io_steps it has processed, so that what a rank keeps in memory for the
// next checkpoint is bounded in bytes as well as in steps.
func (s *durableSource) unackedFull() bool { return s.unackedBytes >= s.maxBytes }

// rankDurable is what serveRank does for a rank with durable frames.
type rankDurable struct {
	node  *durableNode
	src   *durableSource
	hold  *holdSink // nil without a sink
	pid   uint32
	rank  uint32
	steps int // io_steps processed since the last checkpoint
}

// skip reports whether a frame of io_step step was processed before the
// detector's checkpoint (a frame delivered again after a restart).
func (r *rankDurable) skip(d *ad.Detector, step uint64) bool {
	last, ok := d.LastStep()
	if ok && step <= last {
		r.node.replayed.Add(1)
		return true
	}
	return false
}

// processed counts a processed io_step and checkpoints every
// CheckpointEvery of them, or sooner when the frames not yet acknowledged
// fill the rank's byte bound (PendingBytes).
func (r *rankDurable) processed(ctx context.Context, d *ad.Detector) error {
	r.steps++
	if r.steps < r.node.cfg.CheckpointEvery && !r.src.unackedFull() {
		return nil
	}
	return r.checkpoint(ctx, d)
}

// checkpoint releases the outputs held since the last one, stores the
// detector's checkpoint with the records not yet published, publishes
// them, and then acknowledges the frames it covers.
func (r *rankDurable) checkpoint(ctx context.Context, d *ad.Detector) error {
	r.steps = 0
	d.ReleaseOutputs()
	ck, err := d.Checkpoint()
	if err != nil {
		return err
	}
	sc := storedCheckpoint{seq: r.src.lastSeq, ckpt: ck}
	if r.hold != nil {
		sc.batches = r.hold.held
	}
	data, err := sc.encode()
	if err != nil {
		return fmt.Errorf("checkpoint of rank %d: %w", r.rank, err)
	}
	if _, err := r.node.store.PutBytes(ctx, checkpointKey(r.pid, r.rank), data); err != nil {
		return fmt.Errorf("store checkpoint of rank %d: %w", r.rank, err)
	}
	r.node.checkpoints.Add(1)
	r.node.checkpointBytes.Add(uint64(len(data)))
	if sink := d.Config().Sink; sink != nil {
		if err := sink.Flush(ctx); err != nil {
			return fmt.Errorf("checkpoint of rank %d: publish records: %w", r.rank, err)
		}
	}
	r.src.ackAll()
	return nil
}

// ended marks the rank's stream as ended, its detector closed (records and
// profiles flushed by Close), and acknowledges everything.
func (r *rankDurable) ended(ctx context.Context) error {
	if _, err := r.node.store.PutBytes(ctx, endedKey(r.pid, r.rank), []byte("ended\n")); err != nil {
		return fmt.Errorf("mark rank %d ended: %w", r.rank, err)
	}
	r.src.ackAll()
	return nil
}

var (
	checkpointsDesc     = prometheus.NewDesc("kipimo_ad_checkpoints_total", "ad.Detector checkpoints stored (durable frames).", nil, nil)
	checkpointBytesDesc = prometheus.NewDesc("kipimo_ad_checkpoint_bytes_total", "Bytes of the detector checkpoints stored.", nil, nil)
	restoredDesc        = prometheus.NewDesc("kipimo_ad_restored_ranks_total", "Ranks whose detector was restored from a checkpoint at start.", nil, nil)
	replayedDesc        = prometheus.NewDesc("kipimo_ad_replayed_frames_total", "Frames delivered again after a restart that the checkpoint already covered (skipped).", nil, nil)
)

func (dn *durableNode) collect(ch chan<- prometheus.Metric) {
	for _, x := range []struct {
		d *prometheus.Desc
		v uint64
	}{{checkpointsDesc, dn.checkpoints.Load()}, {checkpointBytesDesc, dn.checkpointBytes.Load()}, {restoredDesc, dn.restored.Load()}, {replayedDesc, dn.replayed.Load()}} {
		ch <- prometheus.MustNewConstMetric(x.d, prometheus.CounterValue, float64(x.v))
	}
}

// setDurable makes the collector report the node's checkpoints.
func (c *Collector) setDurable(dn *durableNode) { c.durable.Store(dn) }

// republish hands batches saved with a checkpoint to sink again.
func republish(ctx context.Context, sink ad.Sink, batches []*ad.Batch) error {
	if sink == nil || len(batches) == 0 {
		return nil
	}
	for _, b := range batches {
		if err := sink.Publish(ctx, b); err != nil {
			return fmt.Errorf("publish the records saved with the checkpoint: %w", err)
		}
	}
	return sink.Flush(ctx)
}
