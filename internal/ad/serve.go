package ad

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"runtime/pprof"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/psync"
)

// EndOfStreamHeader, set (to any value) on a message of a rank's frame
// subject, ends that rank's stream: its detector closes (flushing its
// records and final profiles) and stops. A message with an empty body means
// the same.
const EndOfStreamHeader = "Kipimo-End-Of-Stream"

// SourceDroppedHeader, on a message of a rank's frame subject, carries the
// number of frames the rank's event source has dropped so far (the
// in-process event library drops frames rather than hold the application
// back). Detectors report the latest value as SourceDroppedFrames.
const SourceDroppedHeader = "Kipimo-Source-Dropped"

// ControlMessage is a run-wide message on natsx.Subjects.Control().
type ControlMessage struct {
	// Kind is "end_of_run" (every detector closes as at the end of its
	// stream) or "snapshot" (every detector publishes its profiles now).
	Kind string `json:"kind"`
}

// Control message kinds.
const (
	ControlEndOfRun = "end_of_run"
	ControlSnapshot = "snapshot"
)

// DefaultPendingBytes is ServeConfig.PendingBytes's default: the frame
// data buffered per rank before frames are dropped.
const DefaultPendingBytes = 16 << 20

// DefaultMaxRanks is ServeConfig.MaxRanks's default: the ranks one ad
// discovers at most.
const DefaultMaxRanks = 4096

// ServeConfig configures Serve: the detectors of one node.
type ServeConfig struct {
	Conn  *nats.Conn
	Run   string
	PID   uint32
	Ranks []uint32
	// Discover, with no Ranks, serves every rank that publishes on the run's
	// frame subjects, of any program id: a rank's detector starts with its
	// first message. Serve then returns on an end_of_run control message or
	// when ctx is done, never because streams ended (more ranks may come).
	Discover bool
	// Detector is the configuration of every detector (PID and Rank are set
	// per rank; Sink and Syncer are shared).
	Detector Config
	// PendingFrames and PendingBytes bound the frames buffered per rank, in
	// number (default 256) and in bytes (default DefaultPendingBytes); more
	// are dropped and counted (Stats.DroppedFrames; their steps are then
	// missing steps).
	PendingFrames int
	PendingBytes  int
	// MaxRanks bounds the ranks Discover starts a detector for (default
	// DefaultMaxRanks): frames of further ranks are dropped and counted.
	MaxRanks int
	// CloseTimeout bounds the final flush after the stream ends or ctx is
	// cancelled (default 10s).
	CloseTimeout time.Duration
	// Collector, when set, gets every detector.
	Collector *Collector
	// Lockstep lines the detectors up at every step boundary (see
	// Barrier), so that detection on files is reproducible. Not with
	// Discover.
	Lockstep bool
	// PerRankSync makes every detector sync with the pserver on its own.
	// By default the detectors of the node share a NodeSyncer that merges
	// their requests into one per shard per step.
	PerRankSync bool
	// NodeSyncLinger is how long a node's sync batch waits for ranks that
	// have not sent yet (default 20ms; in lockstep a batch waits for all).
	NodeSyncLinger time.Duration
	// Durable, when set, reads the frames from the run's JetStream stream
	// and checkpoints every rank (see Durable). Not with Discover or
	// Lockstep.
	Durable *Durable
	// Ready, when set, is called once every subscription is in place.
	Ready  func()
	Logger zerolog.Logger
}

// Serve runs one detector per rank, each in its own goroutine, fed by the
// rank's frame subject, and answers the live call-stack probes. It returns
// when every rank's stream has ended (EndOfStreamHeader, or an end_of_run
// control message) or ctx is cancelled; either way every detector is closed
// (records and profiles flushed within CloseTimeout). It returns the
// detectors' final counts.
func Serve(ctx context.Context, cfg ServeConfig) ([]Stats, error) {
	if cfg.Conn == nil {
		return nil, errors.New("serve detectors: no NATS connection")
	}
	if err := natsx.ValidRun(cfg.Run); err != nil {
		return nil, fmt.Errorf("serve detectors: %w", err)
	}
	if len(cfg.Ranks) == 0 && !cfg.Discover {
		return nil, errors.New("serve detectors: no ranks given")
	}
	if len(cfg.Ranks) > 0 && cfg.Discover {
		return nil, errors.New("serve detectors: ranks given and discovery asked for")
	}
	if cfg.Lockstep && cfg.Discover {
		return nil, errors.New("serve detectors: lockstep needs the ranks known from the start (not discovery)")
	}
	if cfg.Durable != nil && (cfg.Discover || cfg.Lockstep) {
		return nil, errors.New("serve detectors: durable frames need the ranks given (not discovery) and no lockstep")
	}
	if cfg.PendingFrames <= 0 {
		cfg.PendingFrames = 256
	}
	if cfg.PendingBytes <= 0 {
		cfg.PendingBytes = DefaultPendingBytes
	}
	if cfg.MaxRanks <= 0 {
		cfg.MaxRanks = DefaultMaxRanks
	}
	if cfg.CloseTimeout <= 0 {
		cfg.CloseTimeout = 10 * time.Second
	}
	if cfg.NodeSyncLinger <= 0 {
		cfg.NodeSyncLinger = 20 * time.Millisecond
	}
	if cfg.Detector.Syncer != nil && !cfg.PerRankSync && (cfg.Discover || len(cfg.Ranks) > 1) {
		linger := cfg.NodeSyncLinger
		if cfg.Lockstep {
			linger = 0
		}
		ns := NewNodeSyncer(cfg.Detector.Syncer, nodeName(), linger, cfg.Detector.SyncTimeout)
		defer ns.Close()
		cfg.Detector.Syncer = ns
		if cfg.Collector != nil {
			cfg.Collector.SetNode(ns)
		}
	}
	if cfg.Discover {
		return serveDiscovered(ctx, cfg)
	}
	subj := natsx.Subjects{Run: cfg.Run}
	type rankState struct {
		d     *Detector
		sub   *nats.Subscription
		dur   *rankDurable
		ckSeq uint64 // stream sequence its checkpoint covers
		hold  *holdSink
	}
	seen := map[uint32]bool{}
	for _, r := range cfg.Ranks {
		if seen[r] {
			return nil, fmt.Errorf("serve detectors: rank %d given twice", r)
		}
		seen[r] = true
	}
	var dn *durableNode
	if cfg.Durable != nil {
		var err error
		if dn, err = openDurable(ctx, cfg); err != nil {
			return nil, fmt.Errorf("serve detectors: %w", err)
		}
		cfg.Detector.ExactSync = true
		if cfg.Collector != nil {
			cfg.Collector.setDurable(dn)
		}
	}
	ranks := make([]*rankState, 0, len(cfg.Ranks))
	// With durable frames, the stream sequence the consumer starts at: the
	// first frame some rank's checkpoint does not cover (1, the stream's
	// start, for a rank without one).
	fromSeq := uint64(math.MaxUint64)
	var barrier *Barrier
	if cfg.Lockstep {
		barrier = NewBarrier()
	}
	for _, r := range cfg.Ranks {
		dc := cfg.Detector
		dc.PID, dc.Rank = cfg.PID, r
		dc.Logger = cfg.Logger.With().Uint32("rank", r).Logger()
		dc.Barrier = barrier
		var ckpt []byte
		var ckSeq uint64
		var hold *holdSink
		if dn != nil && dc.Sink != nil {
			hold = &holdSink{next: dc.Sink}
			dc.Sink = hold
		}
		if dn != nil {
			sc, ended, err := dn.load(ctx, cfg.PID, r)
			if err != nil {
				return nil, fmt.Errorf("serve detectors: %w", err)
			}
			if ended {
				cfg.Logger.Info().Uint32("rank", r).Msg("rank's stream ended before: not served again")
				continue
			}
			if sc != nil {
				ckpt, ckSeq = sc.ckpt, sc.seq
				// Records the lost process may not have published.
				if err := republish(ctx, cfg.Detector.Sink, sc.batches); err != nil {
					return nil, fmt.Errorf("serve detectors: rank %d: %w", r, err)
				}
			}
			fromSeq = min(fromSeq, ckSeq+1) // ckSeq is 0 without a checkpoint
		}
		var d *Detector
		var err error
		if ckpt != nil {
			d, err = Restore(dc, ckpt)
			if err == nil {
				dn.restored.Add(1)
				last, _ := d.LastStep()
				dc.Logger.Info().Uint64("io_step", last).Int("bytes", len(ckpt)).Msg("detector restored from its checkpoint")
			}
		} else {
			d, err = New(dc)
		}
		if err != nil {
			return nil, fmt.Errorf("serve detectors: rank %d: %w", r, err)
		}
		if barrier != nil {
			barrier.Join(r)
		}
		if cfg.Collector != nil {
			cfg.Collector.Add(d)
		}
		ranks = append(ranks, &rankState{d: d, ckSeq: ckSeq, hold: hold})
	}
	var subs []*nats.Subscription
	defer func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}()
	if dn != nil {
		if err := dn.openConsumer(ctx, cfg, fromSeq); err != nil {
			return nil, fmt.Errorf("serve detectors: %w", err)
		}
	}
	// Frames first: a detector answering its probe is receiving frames.
	srcs := map[uint32]*durableSource{}
	for _, rs := range ranks {
		if dn != nil {
			src := &durableSource{ch: make(chan jetstream.Msg, cfg.PendingFrames), done: make(chan struct{}), lastSeq: rs.ckSeq}
			srcs[rs.d.cfg.Rank] = src
			rs.dur = &rankDurable{node: dn, src: src, hold: rs.hold, pid: cfg.PID, rank: rs.d.cfg.Rank}
			continue
		}
		s, err := cfg.Conn.SubscribeSync(subj.Frames(cfg.PID, rs.d.cfg.Rank))
		if err != nil {
			return nil, fmt.Errorf("subscribe to the frames of rank %d: %w", rs.d.cfg.Rank, err)
		}
		if err := s.SetPendingLimits(cfg.PendingFrames, cfg.PendingBytes); err != nil {
			return nil, fmt.Errorf("frame subscription limits: %w", err)
		}
		rs.sub = s
		subs = append(subs, s)
	}
	// Live call-stack probes: served from each detector's snapshot, never
	// waiting for processing.
	for _, rs := range ranks {
		d := rs.d
		s, err := cfg.Conn.Subscribe(subj.Callstack(cfg.PID, d.cfg.Rank), func(m *nats.Msg) {
			respondCallstack(m, d)
		})
		if err != nil {
			return nil, fmt.Errorf("subscribe to the call-stack probe of rank %d: %w", d.cfg.Rank, err)
		}
		subs = append(subs, s)
	}
	detectors := make([]*Detector, len(ranks))
	for i, rs := range ranks {
		detectors[i] = rs.d
	}
	all, err := subscribeAllCallstacks(cfg, func() []*Detector { return detectors })
	if err != nil {
		return nil, err
	}
	subs = append(subs, all)
	ctl, err := subscribeControl(cfg)
	if err != nil {
		return nil, err
	}
	subs = append(subs, ctl.sub)
	endAll, snapshot := ctl.endAll, ctl.snapshot
	if err := ready(ctx, cfg); err != nil {
		return nil, err
	}
	cfg.Logger.Info().Str("run", cfg.Run).Uint32("pid", cfg.PID).Int("ranks", len(ranks)).Str("algorithm", cfg.Detector.Algorithm).Msg("detectors started")

	var wg sync.WaitGroup
	errs := make([]error, len(ranks))
	rankCtx, cancelRanks := context.WithCancel(ctx)
	defer cancelRanks()
	for i, rs := range ranks {
		wg.Add(1)
		labels := pprof.Labels("component", "ad", "rank", strconv.FormatUint(uint64(rs.d.cfg.Rank), 10))
		go pprof.Do(rankCtx, labels, func(ctx context.Context) {
			defer wg.Done()
			var src msgSource = subSource{rs.sub}
			if rs.dur != nil {
				src = rs.dur.src
				defer close(rs.dur.src.done)
			}
			errs[i] = serveRank(ctx, rs.d, src, endAll, cfg.CloseTimeout, rs.dur)
		})
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	var consumeErr error
	stopConsumer := func() {}
	if dn != nil {
		// The consumer stops once every rank's goroutine has returned; if
		// it fails, the ranks stop too (checkpointed, to resume later).
		cctx, stop := context.WithCancel(ctx)
		consumed := make(chan struct{})
		go pprof.Do(cctx, pprof.Labels("component", "ad-frames"), func(cctx context.Context) {
			defer close(consumed)
			if err := dn.consume(cctx, cfg.Run, srcs, 4*len(ranks)+64); err != nil {
				consumeErr = err
				cfg.Logger.Error().Err(err).Msg("frame consumer stopped; stopping the detectors")
				cancelRanks()
			}
		})
		stopConsumer = func() {
			stop()
			<-consumed
		}
	}
wait:
	for {
		select {
		case <-snapshot:
			// Each detector's goroutine adds its profiles at its next step.
			for _, rs := range ranks {
				rs.d.requestProfiles.Store(true)
			}
		case <-done:
			break wait
		}
	}
	stopConsumer()
	out := make([]Stats, len(ranks))
	for i, rs := range ranks {
		out[i] = rs.d.Stats()
	}
	cfg.Logger.Info().Int("ranks", len(ranks)).Msg("detectors stopped")
	return out, errors.Join(append(errs, consumeErr)...)
}

// control is the run's control subscription: endAll closes on end_of_run,
// snapshot receives on each snapshot request.
type control struct {
	sub      *nats.Subscription
	endAll   chan struct{}
	snapshot chan struct{}
}

// subscribeControl subscribes to the run's control messages.
func subscribeControl(cfg ServeConfig) (*control, error) {
	subj := natsx.Subjects{Run: cfg.Run}
	c := &control{endAll: make(chan struct{}), snapshot: make(chan struct{}, 1)}
	var endOnce sync.Once
	sub, err := cfg.Conn.Subscribe(subj.Control(), func(m *nats.Msg) {
		var msg ControlMessage
		if json.Unmarshal(m.Data, &msg) != nil {
			return
		}
		switch msg.Kind {
		case ControlEndOfRun:
			endOnce.Do(func() { close(c.endAll) })
		case ControlSnapshot:
			select {
			case c.snapshot <- struct{}{}:
			default:
			}
		}
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe to %s: %w", subj.Control(), err)
	}
	c.sub = sub
	return c, nil
}

// ready waits until the server has every subscription made so far, then
// calls cfg.Ready.
func ready(ctx context.Context, cfg ServeConfig) error {
	fctx, fcancel := context.WithTimeout(ctx, 10*time.Second)
	err := cfg.Conn.FlushWithContext(fctx)
	fcancel()
	if err != nil {
		return fmt.Errorf("subscribe to frames: %w", err)
	}
	if cfg.Ready != nil {
		cfg.Ready()
	}
	return nil
}

// subscribeAllCallstacks answers the run-wide call-stack probe with the
// call stacks of the detectors list returns (all, or the rank asked for).
// list is called on the subscription's goroutine, once per probe.
func subscribeAllCallstacks(cfg ServeConfig, list func() []*Detector) (*nats.Subscription, error) {
	subject := natsx.Subjects{Run: cfg.Run}.AllCallstacks()
	sub, err := cfg.Conn.Subscribe(subject, func(m *nats.Msg) {
		var req psync.CallstackRequest
		if len(m.Data) > 0 && json.Unmarshal(m.Data, &req) != nil {
			return
		}
		for _, d := range list() {
			if req.Rank == nil || *req.Rank == d.cfg.Rank {
				respondCallstack(m, d)
			}
		}
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe to %s: %w", subject, err)
	}
	return sub, nil
}

func respondCallstack(m *nats.Msg, d *Detector) {
	if m.Reply == "" {
		return
	}
	b, err := json.Marshal(d.Callstacks())
	if err != nil {
		return
	}
	_ = m.Respond(b)
}

// serveRank feeds one detector until its stream ends or ctx is done, then
// closes it. After an end_of_run control message the frames already queued
// are processed first.
//
// With durable frames (dur not nil) frames the detector's checkpoint
// already covers are skipped, a checkpoint is taken every
// Durable.CheckpointEvery steps, and when ctx is cancelled before the
// stream ends the detector is checkpointed and left open (not closed): a
// restarted ad resumes it.
func serveRank(ctx context.Context, d *Detector, sub msgSource, endAll <-chan struct{}, closeTimeout time.Duration, dur *rankDurable) error {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-endAll:
		case <-rctx.Done():
		}
		cancel()
	}()
	// With durable frames a step under way when ctx is cancelled still
	// gets its pserver answer (within closeTimeout), so that it is labelled
	// as it would have been without the stop.
	pctx := ctx
	if dur != nil {
		var pcancel context.CancelFunc
		pctx, pcancel = context.WithCancel(context.WithoutCancel(ctx))
		defer pcancel()
		returned := make(chan struct{})
		stop := context.AfterFunc(ctx, func() {
			t := time.NewTimer(closeTimeout)
			defer t.Stop()
			select {
			case <-t.C:
				pcancel()
			case <-returned:
			}
		})
		defer func() {
			stop()
			close(returned)
		}()
	}
	dropped := 0
	for {
		msg, err := sub.nextContext(rctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			if sub.pending() == 0 {
				break
			}
			if msg, err = sub.next(time.Second); err != nil {
				break
			}
		}
		if n := sub.dropped(); n > dropped {
			total := d.stats.droppedFrames.Add(uint64(n - dropped))
			if bits.Len64(total-uint64(n-dropped)) != bits.Len64(total) {
				d.cfg.Logger.Warn().Uint64("dropped_frames", total).
					Msg("frames dropped: the detector is slower than its input (--pending-frames, --pending-bytes)")
			}
			dropped = n
		}
		if v := msg.Header.Get(SourceDroppedHeader); v != "" {
			if n, err := strconv.ParseUint(v, 10, 64); err == nil {
				if old := d.stats.sourceDropped.Load(); n > old {
					d.stats.sourceDropped.Store(n)
					if bits.Len64(old) != bits.Len64(n) {
						d.cfg.Logger.Warn().Uint64("source_dropped_frames", n).Msg("the rank's event source dropped frames")
					}
				}
			}
		}
		if msg.Header.Get(EndOfStreamHeader) != "" || len(msg.Data) == 0 {
			d.stats.ended.Store(true)
			break
		}
		f := frames.Get().(*frame.Frame)
		if err := decodeFrame(msg.Data, f); err != nil {
			frames.Put(f)
			n := d.stats.badFrames.Add(1)
			d.stepBad++
			// Logged at the 1st, 2nd, 4th, 8th... so a flood cannot flood
			// the log; every one is counted in the metrics.
			if n&(n-1) == 0 {
				d.cfg.Logger.Warn().Err(err).Uint64("bad_frames", n).Msg("bad frame rejected")
			}
			continue
		}
		step := f.Step
		if dur != nil && dur.skip(d, step) {
			frames.Put(f)
			continue
		}
		if err := d.ProcessLent(pctx, f, putFrame); err != nil {
			if errors.Is(err, ErrClosed) {
				break
			}
			// Logged at the 1st, 2nd, 4th... of each kind; all counted.
			n := d.stats.badFrames.Load()
			if errors.Is(err, ErrStaleFrame) {
				n = d.stats.staleFrames.Load()
			}
			if n&(n-1) == 0 {
				d.cfg.Logger.Warn().Err(err).Uint64("io_step", step).Uint64("count", n).Msg("frame rejected")
			}
		}
		if dur != nil {
			if err := dur.processed(ctx, d); err != nil && ctx.Err() == nil {
				// The frames stay unacknowledged: the next checkpoint
				// covers them.
				d.cfg.Logger.Warn().Err(err).Msg("checkpoint failed")
			}
		}
	}
	cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
	defer ccancel()
	if dur != nil && ctx.Err() != nil && !d.stats.ended.Load() {
		err := dur.checkpoint(cctx, d)
		d.suspend()
		if err != nil {
			return fmt.Errorf("final checkpoint of rank %d: %w", d.cfg.Rank, err)
		}
		return nil
	}
	if err := d.Close(cctx); err != nil {
		return fmt.Errorf("close detector of rank %d: %w", d.cfg.Rank, err)
	}
	if dur != nil {
		return dur.ended(cctx)
	}
	return nil
}

// frames holds the decoded frames the ranks of a process share: a rank takes
// one to decode a message into and gives it back as soon as its detector has
// read it (Detector.ProcessLent), so that memory holds a decoded frame per
// rank being processed, not one per rank served.
var frames = sync.Pool{New: func() any { return new(frame.Frame) }}

func putFrame(f *frame.Frame) { frames.Put(f) }

// decodeFrame decodes a binary frame, or a JSON one when the body starts with
// '{'.
func decodeFrame(b []byte, f *frame.Frame) error {
	if len(b) > 0 && b[0] == '{' {
		return frame.DecodeJSON(b, f)
	}
	n, err := frame.DecodeBinary(b, f)
	if err != nil {
		return err
	}
	if n != len(b) {
		return fmt.Errorf("frame message has %d bytes after the frame", len(b)-n)
	}
	return nil
}
