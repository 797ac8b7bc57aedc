package adnode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/ad"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
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
	Detector ad.Config
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
func Serve(ctx context.Context, cfg ServeConfig) ([]ad.Stats, error) {
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
	// The control subscription comes first: a detector started by the
	// first frame of a discovered rank already ends on end_of_run.
	ctl, err := subscribeControl(cfg)
	if err != nil {
		return nil, err
	}
	subs := []*nats.Subscription{ctl.sub}
	set := &rankSet{cfg: cfg, endAll: ctl.endAll, drops: &dropLog{every: dropLogEvery}}
	defer func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
		set.unsubscribe()
	}()
	var in rankInput
	if cfg.Discover {
		in, err = discoverRanks(ctx, cfg, set)
	} else {
		in, err = givenRanks(ctx, cfg, set)
	}
	if err != nil {
		return nil, err
	}
	all, err := subscribeAllCallstacks(cfg, set.detectors)
	if err != nil {
		return nil, errors.Join(err, in.stop())
	}
	subs = append(subs, all)
	if err := ready(ctx, cfg); err != nil {
		return nil, errors.Join(err, in.stop())
	}
	done := in.start(ctx, ctl.endAll)
wait:
	for {
		select {
		case <-ctl.snapshot:
			// Each detector's goroutine adds its profiles at its next step.
			set.requestProfiles()
		case <-done:
			break wait
		}
	}
	inErr := in.stop()
	out, err := set.wait()
	cfg.Logger.Info().Int("ranks", len(out)).Msg("detectors stopped")
	return out, errors.Join(err, inErr)
}

// rankInput is where the ranks of a Serve come from: given (their
// detectors made, or restored from checkpoints, before Serve is ready) or
// discovered on the run's frame subjects.
type rankInput interface {
	// start starts serving once every subscription is in place; the
	// channel it returns is closed when the Serve is to end: every given
	// rank's stream has ended, or with discovery end_of_run (endAll) or
	// ctx done.
	start(ctx context.Context, endAll <-chan struct{}) <-chan struct{}
	// stop stops the input (no new frame, no new rank) and returns what
	// failed in it.
	stop() error
}

// rankSet is the detectors of one Serve, each served by serveRank on a
// goroutine of its own. Safe for concurrent use.
type rankSet struct {
	cfg    ServeConfig
	endAll <-chan struct{}
	// drops logs the frames the ranks' inputs dropped.
	drops *dropLog

	mu     sync.Mutex
	list   []*ad.Detector // in the order they were added
	probes []*nats.Subscription
	errs   []error
	wg     sync.WaitGroup
}

// add adds d, of program pid, to the set: its call-stack probe is answered from its
// snapshot (never waiting for processing) and the collector counts it.
func (s *rankSet) add(pid uint32, d *ad.Detector) error {
	subj := natsx.Subjects{Run: s.cfg.Run}
	sub, err := s.cfg.Conn.Subscribe(subj.Callstack(pid, d.Rank()), func(m *nats.Msg) { respondCallstack(m, d) })
	if err != nil {
		return fmt.Errorf("subscribe to the call-stack probe of rank %d: %w", d.Rank(), err)
	}
	s.mu.Lock()
	s.list = append(s.list, d)
	s.probes = append(s.probes, sub)
	s.mu.Unlock()
	if s.cfg.Collector != nil {
		s.cfg.Collector.Add(d)
	}
	return nil
}

// run serves d from src (with durable frames, dur) on a goroutine of its
// own, labelled for CPU profiles, until its stream ends or ctx is done.
func (s *rankSet) run(ctx context.Context, d *ad.Detector, src msgSource, dur *rankDurable) {
	s.wg.Add(1)
	labels := pprof.Labels("component", "ad", "rank", strconv.FormatUint(uint64(d.Rank()), 10))
	go pprof.Do(ctx, labels, func(ctx context.Context) {
		defer s.wg.Done()
		if dur != nil {
			defer close(dur.src.done)
		}
		if err := serveRank(ctx, d, src, s.endAll, s.drops, s.cfg.CloseTimeout, dur); err != nil {
			s.fail(err)
		}
	})
}

// fail records an error of the Serve.
func (s *rankSet) fail(err error) {
	s.mu.Lock()
	s.errs = append(s.errs, err)
	s.mu.Unlock()
}

// detectors returns the detectors added so far.
func (s *rankSet) detectors() []*ad.Detector {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.list)
}

// requestProfiles makes every detector publish its profiles at its next
// step (a snapshot control message).
func (s *rankSet) requestProfiles() {
	for _, d := range s.detectors() {
		d.RequestProfiles()
	}
}

// done returns a channel closed once every goroutine started so far has
// returned.
func (s *rankSet) done() <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(ch)
	}()
	return ch
}

// wait waits for every goroutine, then returns every detector's final
// counts and the errors recorded.
func (s *rankSet) wait() ([]ad.Stats, error) {
	s.wg.Wait()
	if since, total := s.drops.rest(); since > 0 {
		s.cfg.Logger.Warn().Uint64("dropped_frames", since).Uint64("dropped_frames_total", total).
			Msg("frames dropped since the last report: the detectors were slower than their input (--pending-frames, --pending-bytes)")
	}
	ds := s.detectors()
	out := make([]ad.Stats, len(ds))
	for i, d := range ds {
		out[i] = d.Stats()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return out, errors.Join(s.errs...)
}

// unsubscribe ends the detectors' call-stack probes.
func (s *rankSet) unsubscribe() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sub := range s.probes {
		_ = sub.Unsubscribe()
	}
}

// given is the input of given ranks: a subscription per rank, or with
// durable frames the node's consumer.
type given struct {
	cfg   ServeConfig
	set   *rankSet
	ranks []*givenRank
	subs  []*nats.Subscription
	dn    *durableNode
	srcs  map[uint32]*durableSource

	cancelRanks context.CancelFunc
	stopped     chan struct{} // closed when the consumer has returned
	consumeErr  error
	stopConsume context.CancelFunc
}

type givenRank struct {
	d     *ad.Detector
	sub   *nats.Subscription
	dur   *rankDurable
	ckSeq uint64 // stream sequence its checkpoint covers
	hold  *holdSink
}

// givenRanks makes (or with durable frames restores) the detectors of
// cfg.Ranks and subscribes to their frames.
func givenRanks(ctx context.Context, cfg ServeConfig, set *rankSet) (in *given, err error) {
	subj := natsx.Subjects{Run: cfg.Run}
	seen := map[uint32]bool{}
	for _, r := range cfg.Ranks {
		if seen[r] {
			return nil, fmt.Errorf("serve detectors: rank %d given twice", r)
		}
		seen[r] = true
	}
	g := &given{cfg: cfg, set: set, srcs: map[uint32]*durableSource{}}
	defer func() {
		if err != nil {
			_ = g.stop()
		}
	}()
	if cfg.Durable != nil {
		if g.dn, err = openDurable(ctx, cfg); err != nil {
			return nil, fmt.Errorf("serve detectors: %w", err)
		}
		cfg.Detector.ExactSync = true
		if cfg.Collector != nil {
			cfg.Collector.setDurable(g.dn)
		}
	}
	dn := g.dn
	// With durable frames, the stream sequence the consumer starts at: the
	// first frame some rank's checkpoint does not cover (1, the stream's
	// start, for a rank without one).
	fromSeq := uint64(math.MaxUint64)
	var barrier *ad.Barrier
	if cfg.Lockstep {
		barrier = ad.NewBarrier()
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
		var d *ad.Detector
		var err error
		if ckpt != nil {
			d, err = ad.Restore(dc, ckpt)
			if err == nil {
				dn.restored.Add(1)
				last, _ := d.LastStep()
				dc.Logger.Info().Uint64("io_step", last).Int("bytes", len(ckpt)).Msg("detector restored from its checkpoint")
			}
		} else {
			d, err = ad.New(dc)
		}
		if err != nil {
			return nil, fmt.Errorf("serve detectors: rank %d: %w", r, err)
		}
		if barrier != nil {
			barrier.Join(r)
		}
		g.ranks = append(g.ranks, &givenRank{d: d, ckSeq: ckSeq, hold: hold})
	}
	if dn != nil {
		if err := dn.openConsumer(ctx, cfg, fromSeq); err != nil {
			return nil, fmt.Errorf("serve detectors: %w", err)
		}
	}
	// Frames first: a detector answering its probe is receiving frames.
	for _, rs := range g.ranks {
		if dn != nil {
			src := newDurableSource(cfg.PendingFrames, int64(cfg.PendingBytes), rs.ckSeq)
			g.srcs[rs.d.Rank()] = src
			rs.dur = &rankDurable{node: dn, src: src, hold: rs.hold, pid: cfg.PID, rank: rs.d.Rank()}
			continue
		}
		s, err := cfg.Conn.SubscribeSync(subj.Frames(cfg.PID, rs.d.Rank()))
		if err != nil {
			return nil, fmt.Errorf("subscribe to the frames of rank %d: %w", rs.d.Rank(), err)
		}
		g.subs = append(g.subs, s)
		if err := s.SetPendingLimits(cfg.PendingFrames, cfg.PendingBytes); err != nil {
			return nil, fmt.Errorf("frame subscription limits: %w", err)
		}
		rs.sub = s
	}
	for _, rs := range g.ranks {
		if err := set.add(cfg.PID, rs.d); err != nil {
			return nil, err
		}
	}
	return g, nil
}

// start starts every rank's goroutine, and with durable frames the
// consumer: it stops once every rank's goroutine has returned, and if it
// fails, the ranks stop too (checkpointed, to resume later).
func (g *given) start(ctx context.Context, _ <-chan struct{}) <-chan struct{} {
	cfg := g.cfg
	cfg.Logger.Info().Str("run", cfg.Run).Uint32("pid", cfg.PID).Int("ranks", len(g.ranks)).Str("algorithm", cfg.Detector.Algorithm).Msg("detectors started")
	rankCtx, cancelRanks := context.WithCancel(ctx)
	g.cancelRanks = cancelRanks
	for _, rs := range g.ranks {
		var src msgSource = subSource{rs.sub}
		if rs.dur != nil {
			src = rs.dur.src
		}
		g.set.run(rankCtx, rs.d, src, rs.dur)
	}
	if g.dn != nil {
		cctx, stop := context.WithCancel(ctx)
		g.stopConsume, g.stopped = stop, make(chan struct{})
		go pprof.Do(cctx, pprof.Labels("component", "ad-frames"), func(cctx context.Context) {
			defer close(g.stopped)
			// A pull brings at most PendingBytes (or one largest message).
			pullBytes := max(cfg.PendingBytes, int(cfg.Conn.MaxPayload()))
			if err := g.dn.consume(cctx, cfg.Run, g.srcs, 4*len(g.ranks)+64, pullBytes); err != nil {
				g.consumeErr = err
				cfg.Logger.Error().Err(err).Msg("frame consumer stopped; stopping the detectors")
				cancelRanks()
			}
		})
	}
	return g.set.done()
}

// stop stops the consumer and unsubscribes from the frames.
func (g *given) stop() error {
	if g.stopConsume != nil {
		g.stopConsume()
		<-g.stopped
	}
	if g.cancelRanks != nil {
		g.cancelRanks()
	}
	for _, s := range g.subs {
		_ = s.Unsubscribe()
	}
	return g.consumeErr
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
func subscribeAllCallstacks(cfg ServeConfig, list func() []*ad.Detector) (*nats.Subscription, error) {
	subject := natsx.Subjects{Run: cfg.Run}.AllCallstacks()
	sub, err := cfg.Conn.Subscribe(subject, func(m *nats.Msg) {
		var req syncproto.CallstackRequest
		if len(m.Data) > 0 && json.Unmarshal(m.Data, &req) != nil {
			return
		}
		for _, d := range list() {
			if req.Rank == nil || *req.Rank == d.Rank() {
				respondCallstack(m, d)
			}
		}
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe to %s: %w", subject, err)
	}
	return sub, nil
}

func respondCallstack(m *nats.Msg, d *ad.Detector) {
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
//
// Frames the input dropped are counted in d and in drops, which logs them
// (at most once per interval for all the ranks that share it).
func serveRank(ctx context.Context, d *ad.Detector, sub msgSource, endAll <-chan struct{}, drops *dropLog, closeTimeout time.Duration, dur *rankDurable) error {
	log := d.Config().Logger
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
			d.DroppedFrames(uint64(n - dropped))
			if due, since, total := drops.add(time.Now(), uint64(n-dropped)); due {
				log.Warn().Uint64("dropped_frames", since).Uint64("dropped_frames_total", total).Dur("interval", drops.every).
					Msg("frames dropped: the detectors are slower than their input (--pending-frames, --pending-bytes); logged at most once per interval, all counted in kipimo_ad_dropped_frames_total")
			}
			dropped = n
		}
		if v := msg.Header.Get(SourceDroppedHeader); v != "" {
			if n, err := strconv.ParseUint(v, 10, 64); err == nil {
				if old := d.SourceDropped(n); n > old {
					if bits.Len64(old) != bits.Len64(n) {
						log.Warn().Uint64("source_dropped_frames", n).Msg("the rank's event source dropped frames")
					}
				}
			}
		}
		if msg.Header.Get(EndOfStreamHeader) != "" || len(msg.Data) == 0 {
			d.EndOfStream()
			break
		}
		f := frames.Get().(*frame.Frame)
		if err := frame.DecodeMessage(msg.Data, f); err != nil {
			frames.Put(f)
			n := d.RejectBadFrame()
			// Logged at the 1st, 2nd, 4th, 8th... so a flood cannot flood
			// the log; every one is counted in the metrics.
			if n&(n-1) == 0 {
				log.Warn().Err(err).Uint64("bad_frames", n).Msg("bad frame rejected")
			}
			continue
		}
		step := f.Step
		if dur != nil && dur.skip(d, step) {
			frames.Put(f)
			continue
		}
		if err := d.ProcessLent(pctx, f, putFrame); err != nil {
			if errors.Is(err, ad.ErrClosed) {
				break
			}
			// Logged at the 1st, 2nd, 4th... of each kind; all counted.
			st := d.Stats()
			n := st.BadFrames
			if errors.Is(err, ad.ErrStaleFrame) {
				n = st.StaleFrames
			}
			if n&(n-1) == 0 {
				log.Warn().Err(err).Uint64("io_step", step).Uint64("count", n).Msg("frame rejected")
			}
		}
		if dur != nil {
			if err := dur.processed(ctx, d); err != nil && ctx.Err() == nil {
				// The frames stay unacknowledged: the next checkpoint
				// covers them.
				log.Warn().Err(err).Msg("checkpoint failed")
			}
		}
	}
	cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
	defer ccancel()
	if dur != nil && ctx.Err() != nil && !d.Stats().Ended {
		err := dur.checkpoint(cctx, d)
		d.Suspend()
		if err != nil {
			return fmt.Errorf("final checkpoint of rank %d: %w", d.Rank(), err)
		}
		return nil
	}
	if err := d.Close(cctx); err != nil {
		return fmt.Errorf("close detector of rank %d: %w", d.Rank(), err)
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
