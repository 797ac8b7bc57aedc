package adnode

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/ad"

	"github.com/nats-io/nats.go"

	"github.com/kipimo-hpc/kipimo/internal/natsx"
)

// msgSource is where a rank's detector takes its messages from: its own
// subscription (fixed ranks) or a queue fed by the run-wide subscription
// (discovered ranks).
type msgSource interface {
	nextContext(ctx context.Context) (*nats.Msg, error)
	next(timeout time.Duration) (*nats.Msg, error)
	// pending is how many messages wait; dropped how many were dropped
	// because the detector was behind.
	pending() int
	dropped() int
}

type subSource struct{ s *nats.Subscription }

func (s subSource) nextContext(ctx context.Context) (*nats.Msg, error) {
	return s.s.NextMsgWithContext(ctx)
}
func (s subSource) next(d time.Duration) (*nats.Msg, error) { return s.s.NextMsg(d) }
func (s subSource) pending() int                            { n, _, _ := s.s.Pending(); return n }
func (s subSource) dropped() int                            { n, _ := s.s.Dropped(); return n }

// queueSource is a queue of one rank's messages bounded in number (the
// channel's capacity) and in bytes (maxBytes of message data); the run-wide
// subscription's handler pushes without waiting and counts what did not fit.
type queueSource struct {
	ch       chan *nats.Msg
	maxBytes int64
	mu       sync.Mutex
	bytes    int64 // data of the messages in ch
	drops    int64
}

func (q *queueSource) push(m *nats.Msg) {
	n := int64(len(m.Data))
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.bytes > 0 && q.bytes+n > q.maxBytes {
		q.drops++
		return
	}
	select {
	case q.ch <- m:
		q.bytes += n
	default:
		q.drops++
	}
}

// took accounts for m, received from ch.
func (q *queueSource) took(m *nats.Msg, err error) (*nats.Msg, error) {
	if err == nil {
		q.mu.Lock()
		q.bytes -= int64(len(m.Data))
		q.mu.Unlock()
	}
	return m, err
}

func (q *queueSource) nextContext(ctx context.Context) (*nats.Msg, error) {
	select {
	case m := <-q.ch:
		return q.took(m, nil)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (q *queueSource) next(d time.Duration) (*nats.Msg, error) {
	return q.took(recvWithin(q.ch, d))
}

// recvWithin receives from ch, or fails with nats.ErrTimeout after d.
func recvWithin[T any](ch <-chan T, d time.Duration) (T, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case m := <-ch:
		return m, nil
	case <-t.C:
		var zero T
		return zero, nats.ErrTimeout
	}
}

func (q *queueSource) pending() int { return len(q.ch) }

func (q *queueSource) dropped() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return int(q.drops)
}

type rankKey struct{ pid, rank uint32 }

// parseFrameSubject reads the program id and rank of a frame subject
// kipimo.<run>.frames.<pid>.<rank>.
func parseFrameSubject(subject, prefix string) (rankKey, error) {
	rest, ok := strings.CutPrefix(subject, prefix)
	if !ok {
		return rankKey{}, fmt.Errorf("subject %q is not a frame subject", subject)
	}
	p, r, ok := strings.Cut(rest, ".")
	pid, err1 := strconv.ParseUint(p, 10, 32)
	rank, err2 := strconv.ParseUint(r, 10, 32)
	if !ok || err1 != nil || err2 != nil {
		return rankKey{}, fmt.Errorf("subject %q: want kipimo.<run>.frames.<pid>.<rank>", subject)
	}
	return rankKey{uint32(pid), uint32(rank)}, nil
}

// discoverer is the input of discovered ranks: one subscription to every
// frame subject of the run, a detector started per (program, rank) on its
// first message, its frames queued for it.
type discoverer struct {
	cfg    ServeConfig
	set    *rankSet
	prefix string
	frames *nats.Subscription

	mu      sync.Mutex
	ctx     context.Context // the Serve's, once started
	queues  map[rankKey]*queueSource
	badSubj uint64
	refused *dropLog // frames of ranks beyond cfg.MaxRanks
	stopped bool
}

// discoverRanks subscribes to every frame subject of the run; ranks start
// once start is called.
func discoverRanks(ctx context.Context, cfg ServeConfig, set *rankSet) (*discoverer, error) {
	subj := natsx.Subjects{Run: cfg.Run}
	r := &discoverer{cfg: cfg, set: set, prefix: subj.FramesPrefix(), ctx: ctx, queues: map[rankKey]*queueSource{},
		refused: &dropLog{every: dropLogEvery}}
	frames, err := cfg.Conn.Subscribe(subj.AllFrames(), r.receive)
	if err != nil {
		return nil, fmt.Errorf("subscribe to %s: %w", subj.AllFrames(), err)
	}
	r.frames = frames
	// The run-wide subscription must not be the bottleneck: each rank's
	// queue bounds what waits for it.
	if err := frames.SetPendingLimits(-1, -1); err != nil {
		_ = frames.Unsubscribe()
		return nil, fmt.Errorf("frame subscription limits: %w", err)
	}
	return r, nil
}

// receive queues a frame message for its rank, starting the rank's
// detector on its first one.
func (r *discoverer) receive(m *nats.Msg) {
	cfg := r.cfg
	k, err := parseFrameSubject(m.Subject, r.prefix)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return
	}
	if err != nil {
		r.badSubj++
		if r.badSubj&(r.badSubj-1) == 0 {
			cfg.Logger.Warn().Err(err).Uint64("bad_subjects", r.badSubj).Msg("message on a malformed frame subject ignored")
		}
		return
	}
	q, known := r.queues[k]
	if !known && len(r.queues) >= cfg.MaxRanks {
		if due, since, total := r.refused.add(time.Now(), 1); due {
			cfg.Logger.Warn().Uint32("pid", k.pid).Uint32("rank", k.rank).Int("max_ranks", cfg.MaxRanks).
				Uint64("refused_frames", since).Uint64("refused_frames_total", total).Dur("interval", r.refused.every).
				Msg("frames of new ranks dropped: this ad already serves --max-ranks ranks; logged at most once per interval, all counted in kipimo_ad_refused_rank_frames_total")
		}
		if cfg.Collector != nil {
			cfg.Collector.refusedRanks.Add(1)
		}
		return
	}
	if !known {
		if q, err = r.startRank(k); err != nil {
			r.set.fail(err)
		}
		r.queues[k] = q // nil when it failed: not retried for every message
	}
	if q != nil {
		q.push(m)
	}
}

// startRank starts the detector of a discovered rank; r.mu is held.
func (r *discoverer) startRank(k rankKey) (*queueSource, error) {
	cfg := r.cfg
	dc := cfg.Detector
	dc.PID, dc.Rank = k.pid, k.rank
	dc.Logger = cfg.Logger.With().Uint32("pid", k.pid).Uint32("rank", k.rank).Logger()
	d, err := ad.New(dc)
	if err != nil {
		return nil, fmt.Errorf("rank %d of program %d: %w", k.rank, k.pid, err)
	}
	q := &queueSource{ch: make(chan *nats.Msg, cfg.PendingFrames), maxBytes: int64(cfg.PendingBytes)}
	if err := r.set.add(k.pid, d); err != nil {
		return nil, err
	}
	r.set.run(r.ctx, d, q, nil)
	cfg.Logger.Info().Uint32("pid", k.pid).Uint32("rank", k.rank).Msg("rank discovered: detector started")
	return q, nil
}

// start returns a channel closed on end_of_run or when ctx is done: more
// ranks may come until then, whatever the streams of the known ones do.
func (r *discoverer) start(ctx context.Context, endAll <-chan struct{}) <-chan struct{} {
	r.cfg.Logger.Info().Str("run", r.cfg.Run).Str("algorithm", r.cfg.Detector.Algorithm).Msg("detectors waiting for ranks")
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-endAll:
		case <-ctx.Done():
		}
	}()
	return done
}

// stop unsubscribes from the frames: no new rank from here on, and the
// known ones finish what they hold.
func (r *discoverer) stop() error {
	if err := r.frames.Unsubscribe(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		r.cfg.Logger.Warn().Err(err).Msg("unsubscribe from frames")
	}
	r.mu.Lock()
	r.stopped = true
	r.mu.Unlock()
	if since, total := r.refused.rest(); since > 0 {
		r.cfg.Logger.Warn().Int("max_ranks", r.cfg.MaxRanks).Uint64("refused_frames", since).Uint64("refused_frames_total", total).
			Msg("frames of new ranks dropped since the last report: this ad served --max-ranks ranks")
	}
	return nil
}
