package pserver

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/daemon"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// QueueGroup is the NATS queue group of the instances serving one shard.
const QueueGroup = "kipimo-pserver"

// Server is a running parameter server for one shard of one run. Create it with
// New, start it with Start and stop it with Shutdown; its methods are safe for
// concurrent use. The Server owns every goroutine it starts and its
// durability (how its state survives restarts); Shutdown stops them all.
type Server struct {
	cfg  Config
	log  zerolog.Logger
	subj natsx.Subjects

	mu sync.RWMutex // guards st
	st *State

	metrics *metrics
	hub     *hub
	handler http.Handler
	dur     durability // one per Config.Durability mode

	nc   *nats.Conn
	subs []*nats.Subscription
	http *daemon.HTTPServer // nil without Config.HTTPAddr

	changed chan struct{} // coalesced "state changed" signal for the SSE hub
	stop    chan struct{}
	wg      sync.WaitGroup // updateLoop

	startOnce sync.Once
	stopOnce  sync.Once
	finished  atomic.Bool

	// invalid counts the sync requests refused by validation since start,
	// skipped the invalid things found in the persisted state and left out.
	invalid atomic.Uint64
	skipped atomic.Uint64
	badLog  logLimiter // refused requests and skipped log entries
	incLog  logLimiter // new incarnations
}

// New validates cfg (its zero "0: default" fields filled from DefaultConfig)
// and returns a Server that is not yet connected, logging to log.
func New(cfg Config, log zerolog.Logger) (*Server, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{
		cfg:     cfg,
		log:     log.With().Str("component", "pserver").Str("run", cfg.Run).Int("shard", cfg.Shard).Logger(),
		subj:    natsx.Subjects{Run: cfg.Run},
		st:      NewState(cfg.Window),
		changed: make(chan struct{}, 1),
		stop:    make(chan struct{}),
		badLog:  logLimiter{every: 10 * time.Second},
		incLog:  logLimiter{every: time.Second},
	}
	s.metrics = newMetrics(s)
	s.hub = newHub(cfg.SSEBuffer, s.metrics)
	s.handler = s.newHandler()
	s.dur = newDurability(s)
	return s, nil
}

// BucketName is the JetStream key-value bucket holding a run's pserver state.
func BucketName(run string) string { return "KIPIMO_PS_" + run }

// WALStreamName is the JetStream stream holding a run's sync write-ahead log.
func WALStreamName(run string) string { return "KIPIMO_PSWAL_" + run }

// Start starts the durability (the persisted state loaded and, in
// DurabilityWAL, the log replayed), subscribes to the shard's sync subject
// and starts the HTTP listener (when configured). nc stays owned by the
// caller and must outlive the Server.
func (s *Server) Start(ctx context.Context, nc *nats.Conn) error {
	err := errors.New("pserver: already started")
	s.startOnce.Do(func() { err = s.start(ctx, nc) })
	return err
}

func (s *Server) start(ctx context.Context, nc *nats.Conn) error {
	s.nc = nc
	if err := s.dur.start(ctx); err != nil {
		return err
	}
	for range s.cfg.SyncWorkers {
		sub, err := nc.QueueSubscribe(s.subj.Sync(s.cfg.Shard), QueueGroup, s.dur.handle)
		if err != nil {
			s.abort()
			return fmt.Errorf("pserver: subscribe %s: %w", s.subj.Sync(s.cfg.Shard), err)
		}
		_ = sub.SetPendingLimits(-1, 512<<20)
		s.subs = append(s.subs, sub)
	}
	if err := flush(ctx, nc); err != nil {
		s.abort()
		return fmt.Errorf("pserver: flush subscriptions: %w", err)
	}
	if s.cfg.HTTPAddr != "" {
		h, err := daemon.Listen("http", s.cfg.HTTPAddr, s.handler, s.log)
		if err != nil {
			s.abort()
			return fmt.Errorf("pserver: %w", err)
		}
		s.http = h
	}
	s.wg.Add(1)
	go pprof.Do(context.Background(), pprof.Labels("pserver", "updates"), func(context.Context) { s.updateLoop() })
	s.log.Info().Str("subject", s.subj.Sync(s.cfg.Shard)).Str("durability", s.cfg.Durability).Str("http", s.HTTPAddr()).Msg("parameter server started")
	return nil
}

// HTTPAddr is the address the HTTP listener is bound to ("" without one).
func (s *Server) HTTPAddr() string {
	if s.http == nil {
		return ""
	}
	return s.http.Addr()
}

// Handler is the HTTP handler of the dashboard, JSON API, SSE stream and
// /metrics, for embedding in another server.
func (s *Server) Handler() http.Handler { return s.handler }

func (s *Server) walSeq() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.st.WALSeq
}

// replace swaps in a state loaded from a snapshot (before serving).
func (s *Server) replace(st *State) {
	s.mu.Lock()
	s.st = st
	s.mu.Unlock()
}

// setWALSeq records that the log entry seq was consumed without applying
// anything (an entry that could not be decoded).
func (s *Server) setWALSeq(seq uint64) {
	s.mu.Lock()
	s.st.WALSeq = seq
	s.mu.Unlock()
}

// onSyncDirect applies and answers a request at once (the handler of the
// modes without a log).
func (s *Server) onSyncDirect(m *nats.Msg) {
	t0 := time.Now()
	rep := s.applyRaw(m.Data, 0)
	s.respond(m.Reply, rep, t0)
}

// applyRaw decodes, validates and applies one request and returns its
// answer.
func (s *Server) applyRaw(data []byte, walSeq uint64) *syncproto.SyncReply {
	req, err := decodeRequest(data)
	if err != nil {
		s.metrics.syncRequests.WithLabelValues("bad").Inc()
		if walSeq > 0 {
			s.setWALSeq(walSeq)
		}
		return &syncproto.SyncReply{Error: err.Error()}
	}
	if err := req.Validate(); err != nil {
		s.refuse(req, err)
		return &syncproto.SyncReply{Error: err.Error(), Invalid: true}
	}
	return s.apply(req, walSeq)
}

// refuse counts and logs (at most one line per 10 s) a request refused by
// validation.
func (s *Server) refuse(req *syncproto.SyncRequest, err error) {
	s.metrics.syncRequests.WithLabelValues("invalid").Inc()
	n := s.invalid.Add(1)
	if ok, held := s.badLog.allow(time.Now()); ok {
		s.log.Warn().Err(err).Str("from", requester(req)).Uint64("refused_total", n).Uint64("not_logged", held).
			Msg("refused an invalid sync request (nothing of it applied); the sender is misbehaving or not a detector of this run")
	}
}

// skip counts and logs (rate-limited) an invalid thing found in the
// persisted state and left out: a log entry (source "wal") or part of a
// snapshot ("snapshot").
func (s *Server) skip(source, what string) {
	s.metrics.replaySkipped.WithLabelValues(source).Inc()
	n := s.skipped.Add(1)
	if ok, held := s.badLog.allow(time.Now()); ok {
		s.log.Warn().Str("source", source).Uint64("skipped_total", n).Uint64("not_logged", held).
			Msgf("skipped invalid persisted state: %s", what)
	}
}

// check validates req against the current state (syncproto.SyncRequest.Validate,
// then State.Check), as apply will.
func (s *Server) check(req *syncproto.SyncRequest) error {
	if err := req.Validate(); err != nil {
		return err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if err := s.st.Check(req); err != nil {
		return fmt.Errorf("sync request of %s: %w", requester(req), err)
	}
	return nil
}

// apply merges a decoded request (walSeq is its log sequence, 0 without a
// log) and returns its answer.
func (s *Server) apply(req *syncproto.SyncRequest, walSeq uint64) *syncproto.SyncReply {
	s.mu.Lock()
	applied, err := s.st.Apply(req)
	rep := s.st.Reply(req, applied)
	if walSeq > 0 {
		s.st.WALSeq = walSeq
	}
	merges := s.st.Merges
	var incs []incarnationChange
	if len(s.st.newIncs) > 0 {
		incs = append(incs, s.st.newIncs...)
	}
	s.mu.Unlock()
	for _, c := range incs {
		s.metrics.incarnations.Inc()
		if ok, held := s.incLog.allow(time.Now()); ok {
			s.log.Info().Uint32("pid", c.PID).Uint32("rank", c.Rank).Str("from", strconv.FormatUint(c.From, 16)).
				Str("to", strconv.FormatUint(c.To, 16)).Uint64("last_seq", c.LastSeq).Uint64("not_logged", held).
				Msg("detector restarted: a new incarnation syncs from seq 1 (what the previous one sent stays merged)")
		}
	}
	if err != nil {
		rep.Error = err.Error()
		if errors.Is(err, syncproto.ErrInvalid) {
			rep.Invalid = true
			s.refuse(req, err)
		} else {
			s.metrics.syncRequests.WithLabelValues("error").Inc()
		}
		return rep
	}
	if !applied {
		s.metrics.syncRequests.WithLabelValues("duplicate").Inc()
		return rep
	}
	s.metrics.syncRequests.WithLabelValues("applied").Inc()
	s.metrics.observeRequest(req, merges)
	s.dur.applied()
	if len(req.Steps) > 0 {
		select {
		case s.changed <- struct{}{}:
		default:
		}
	}
	return rep
}

func (s *Server) respond(reply string, rep *syncproto.SyncReply, t0 time.Time) {
	if reply == "" {
		return
	}
	data, err := syncproto.MarshalReply(rep)
	if err != nil {
		data = []byte(`{"error":"encode sync reply"}`)
	}
	if err := s.nc.Publish(reply, data); err != nil {
		s.metrics.replyErrors.Inc()
		return
	}
	if !t0.IsZero() {
		s.metrics.syncLatency.Observe(time.Since(t0).Seconds())
	}
}

func (s *Server) replyError(reply string, err error) {
	if reply == "" {
		return
	}
	data, _ := syncproto.MarshalReply(&syncproto.SyncReply{Error: err.Error()})
	_ = s.nc.Publish(reply, data)
}

// Snapshot persists the current state now, as the durability mode does
// (nothing in DurabilityNone).
func (s *Server) Snapshot(ctx context.Context) error { return s.dur.snapshot(ctx) }

// encode serialises the state under its read lock.
func (s *Server) encode() ([]byte, uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return encodeState(s.st)
}

func (s *Server) closeSubs() {
	for _, sub := range s.subs {
		_ = sub.Unsubscribe()
	}
	s.subs = nil
}

// Shutdown stops taking requests, applies what was accepted, writes a final
// snapshot, publishes the end-of-run statistics (Finish, unless already done)
// and stops every goroutine and the HTTP listener.
func (s *Server) Shutdown(ctx context.Context) error {
	var errs []error
	s.stopOnce.Do(func() {
		for _, sub := range s.subs {
			if err := sub.Drain(); err != nil {
				errs = append(errs, fmt.Errorf("drain sync subscription: %w", err))
			}
		}
		for _, sub := range s.subs {
			for sub.IsValid() && ctx.Err() == nil {
				time.Sleep(2 * time.Millisecond)
			}
		}
		if s.nc != nil {
			_ = flush(ctx, s.nc)
			if err := s.dur.settle(ctx); err != nil {
				errs = append(errs, err)
			}
		}
		if err := s.Snapshot(ctx); err != nil {
			errs = append(errs, fmt.Errorf("final snapshot: %w", err))
		}
		if s.nc != nil && !s.finished.Load() {
			if err := s.Finish(ctx); err != nil {
				errs = append(errs, err)
			}
		}
		s.dur.stop()
		close(s.stop)
		s.hub.close()
		if s.http != nil {
			if err := s.http.Shutdown(ctx); err != nil {
				errs = append(errs, err)
			}
		}
		s.wg.Wait()
		s.log.Info().Msg("parameter server stopped")
	})
	return errors.Join(errs...)
}

// abort stops the server as a crash would: no final snapshot, no Finish.
// Tests use it to check recovery.
func (s *Server) abort() {
	s.stopOnce.Do(func() {
		s.closeSubs()
		s.dur.stop()
		close(s.stop)
		s.hub.close()
		if s.http != nil {
			s.http.Close()
		}
		s.wg.Wait()
	})
}

// View runs f with the state locked for reading. f must not keep references
// into the state after it returns.
func (s *Server) View(f func(st *State)) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	f(s.st)
}

// flush waits for the server to have processed what nc sent, bounded by ctx
// or, without a deadline, ten seconds.
func flush(ctx context.Context, nc *nats.Conn) error {
	if _, ok := ctx.Deadline(); ok {
		return nc.FlushWithContext(ctx)
	}
	return nc.FlushTimeout(10 * time.Second)
}

// decodeRequest decodes a sync request (JSON, schemas/sync.schema.json).
func decodeRequest(data []byte) (*syncproto.SyncRequest, error) {
	req, err := syncproto.UnmarshalRequest(data)
	if err != nil {
		return nil, fmt.Errorf("decode sync request: %w", err)
	}
	return req, nil
}
