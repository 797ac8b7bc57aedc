package ad

import (
	"context"
	"errors"
	"fmt"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

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

// discovered is a rank found on the frame subjects, with its detector.
type discovered struct {
	d   *Detector
	q   *queueSource
	sub *nats.Subscription // its call-stack probe
}

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

// serveDiscovered is Serve for cfg.Discover: one subscription to every frame
// subject of the run, a detector started per (program, rank) on its first
// message.
func serveDiscovered(ctx context.Context, cfg ServeConfig) ([]Stats, error) {
	subj := natsx.Subjects{Run: cfg.Run}
	prefix := subj.FramesPrefix()
	// The control subscription comes first: a detector started by the
	// first frame already ends on end_of_run.
	ctl, err := subscribeControl(cfg)
	if err != nil {
		return nil, err
	}
	defer func() { _ = ctl.sub.Unsubscribe() }()
	endAll, snapshot := ctl.endAll, ctl.snapshot
	var (
		mu      sync.Mutex
		ranks   = map[rankKey]*discovered{}
		order   []*discovered
		errs    []error
		wg      sync.WaitGroup
		badSubj uint64
		refused uint64 // frames of ranks beyond cfg.MaxRanks
		stopped bool
	)
	start := func(k rankKey) (*discovered, error) {
		dc := cfg.Detector
		dc.PID, dc.Rank = k.pid, k.rank
		dc.Logger = cfg.Logger.With().Uint32("pid", k.pid).Uint32("rank", k.rank).Logger()
		d, err := New(dc)
		if err != nil {
			return nil, fmt.Errorf("rank %d of program %d: %w", k.rank, k.pid, err)
		}
		r := &discovered{d: d, q: &queueSource{ch: make(chan *nats.Msg, cfg.PendingFrames), maxBytes: int64(cfg.PendingBytes)}}
		if r.sub, err = cfg.Conn.Subscribe(subj.Callstack(k.pid, k.rank), func(m *nats.Msg) { respondCallstack(m, d) }); err != nil {
			return nil, fmt.Errorf("subscribe to the call-stack probe of rank %d: %w", k.rank, err)
		}
		if cfg.Collector != nil {
			cfg.Collector.Add(d)
		}
		wg.Add(1)
		labels := pprof.Labels("component", "ad", "rank", strconv.FormatUint(uint64(k.rank), 10))
		go pprof.Do(ctx, labels, func(ctx context.Context) {
			defer wg.Done()
			if err := serveRank(ctx, d, r.q, endAll, cfg.CloseTimeout, nil); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
		cfg.Logger.Info().Uint32("pid", k.pid).Uint32("rank", k.rank).Msg("rank discovered: detector started")
		return r, nil
	}
	frames, err := cfg.Conn.Subscribe(subj.AllFrames(), func(m *nats.Msg) {
		k, err := parseFrameSubject(m.Subject, prefix)
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		if err != nil {
			badSubj++
			if badSubj&(badSubj-1) == 0 {
				cfg.Logger.Warn().Err(err).Uint64("bad_subjects", badSubj).Msg("message on a malformed frame subject ignored")
			}
			return
		}
		r := ranks[k]
		if r == nil && len(ranks) >= cfg.MaxRanks {
			refused++
			if refused&(refused-1) == 0 {
				cfg.Logger.Warn().Uint32("pid", k.pid).Uint32("rank", k.rank).Int("max_ranks", cfg.MaxRanks).Uint64("refused_frames", refused).
					Msg("frame of a new rank dropped: this ad already serves --max-ranks ranks")
			}
			if cfg.Collector != nil {
				cfg.Collector.refusedRanks.Add(1)
			}
			return
		}
		if r == nil {
			if r, err = start(k); err != nil {
				errs = append(errs, err)
				ranks[k] = &discovered{} // not retried for every message
				return
			}
			ranks[k] = r
			order = append(order, r)
		}
		if r.q != nil {
			r.q.push(m)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe to %s: %w", subj.AllFrames(), err)
	}
	// The run-wide subscription must not be the bottleneck: each rank's
	// queue bounds what waits for it.
	if err := frames.SetPendingLimits(-1, -1); err != nil {
		return nil, fmt.Errorf("frame subscription limits: %w", err)
	}
	subs := []*nats.Subscription{frames}
	defer func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}()
	all, err := subscribeAllCallstacks(cfg, func() []*Detector {
		mu.Lock()
		defer mu.Unlock()
		out := make([]*Detector, len(order))
		for i, r := range order {
			out[i] = r.d
		}
		return out
	})
	if err != nil {
		return nil, err
	}
	subs = append(subs, all)
	if err := ready(ctx, cfg); err != nil {
		return nil, err
	}
	cfg.Logger.Info().Str("run", cfg.Run).Str("algorithm", cfg.Detector.Algorithm).Msg("detectors waiting for ranks")
wait:
	for {
		select {
		case <-snapshot:
			mu.Lock()
			for _, r := range order {
				r.d.requestProfiles.Store(true)
			}
			mu.Unlock()
		case <-endAll:
			break wait
		case <-ctx.Done():
			break wait
		}
	}
	// No new rank from here on; the known ones finish what they hold.
	if err := frames.Unsubscribe(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		cfg.Logger.Warn().Err(err).Msg("unsubscribe from frames")
	}
	mu.Lock()
	stopped = true
	list := append([]*discovered(nil), order...)
	mu.Unlock()
	wg.Wait()
	out := make([]Stats, len(list))
	for i, r := range list {
		out[i] = r.d.Stats()
		_ = r.sub.Unsubscribe()
	}
	cfg.Logger.Info().Int("ranks", len(list)).Msg("detectors stopped")
	mu.Lock()
	defer mu.Unlock()
	return out, errors.Join(errs...)
}
