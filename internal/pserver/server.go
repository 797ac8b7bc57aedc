package pserver

import (
	"context"
	"errors"
	"fmt"
	json "github.com/go-json-experiment/json"
	"net"
	"net/http"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/rs/zerolog"
	"github.com/rs/zerolog/log"

	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/psync"
)

// Headers of a write-ahead-log entry.
const (
	hdrReply  = "Kipimo-Reply"  // inbox of the detector waiting for the answer
	hdrOrigin = "Kipimo-Origin" // instance that received the request and answers it
	hdrT0     = "Kipimo-T0"     // receipt time, unix nanoseconds
	hdrID     = "Kipimo-Id"     // key of the request decoded by the receiving handler
)

// QueueGroup is the NATS queue group of the instances serving one shard.
const QueueGroup = "kipimo-pserver"

// Server is a running parameter server for one shard of one run. Create it with
// New, start it with Start and stop it with Shutdown; its methods are safe for
// concurrent use. The Server owns every goroutine it starts; Shutdown stops
// them all.
type Server struct {
	cfg  Config
	log  zerolog.Logger
	id   string // instance id, unique per process start
	subj natsx.Subjects

	mu sync.RWMutex // guards st
	st *State

	metrics *metrics
	hub     *hub
	handler http.Handler

	nc      *nats.Conn
	js      jetstream.JetStream
	kv      jetstream.KeyValue
	wal     jetstream.Stream
	walSubj string
	cons    jetstream.ConsumeContext
	subs    []*nats.Subscription

	decoded sync.Map      // hdrID -> *psync.SyncRequest decoded by onSyncWAL
	replies chan replyJob // answers for the reply workers (WAL mode)

	sinceSnap atomic.Int64 // requests applied since the last snapshot
	snapKick  chan struct{}
	changed   chan struct{} // coalesced "state changed" signal for the SSE hub
	stop      chan struct{}
	wg        sync.WaitGroup
	httpSrv   *http.Server
	httpLn    net.Listener

	startOnce sync.Once
	stopOnce  sync.Once
	finished  atomic.Bool
}

// New validates cfg and returns a Server that is not yet connected.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{
		cfg:      cfg,
		log:      log.With().Str("component", "pserver").Str("run", cfg.Run).Int("shard", cfg.Shard).Logger(),
		id:       nuid.Next(),
		subj:     natsx.Subjects{Run: cfg.Run},
		st:       NewState(cfg.Window),
		snapKick: make(chan struct{}, 1),
		replies:  make(chan replyJob, 4096),
		changed:  make(chan struct{}, 1),
		stop:     make(chan struct{}),
		walSubj:  fmt.Sprintf("kipimo.%s.pswal.%d", cfg.Run, cfg.Shard),
	}
	s.metrics = newMetrics(s)
	s.hub = newHub(cfg.SSEBuffer, s.metrics)
	s.handler = s.newHandler()
	return s, nil
}

// Config returns the validated configuration.
func (s *Server) Config() Config { return s.cfg }

// BucketName is the JetStream key-value bucket holding a run's pserver state.
func BucketName(run string) string { return "KIPIMO_PS_" + run }

// WALStreamName is the JetStream stream holding a run's sync write-ahead log.
func WALStreamName(run string) string { return "KIPIMO_PSWAL_" + run }

// Start loads the persisted state, replays the write-ahead log, subscribes to
// the shard's sync subject and starts the HTTP listener (when configured). nc
// stays owned by the caller and must outlive the Server.
func (s *Server) Start(ctx context.Context, nc *nats.Conn) error {
	err := errors.New("pserver: already started")
	s.startOnce.Do(func() { err = s.start(ctx, nc) })
	return err
}

func (s *Server) start(ctx context.Context, nc *nats.Conn) error {
	s.nc = nc
	if s.cfg.Durability != DurabilityNone {
		js, err := jetstream.New(nc,
			jetstream.WithPublishAsyncMaxPending(8192),
			jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, err error) {
				s.metrics.walErrors.Inc()
				s.decoded.Delete(m.Header.Get(hdrID))
				if r := m.Header.Get(hdrReply); r != "" {
					s.replyError(r, fmt.Errorf("append to sync log: %w", err))
				}
			}))
		if err != nil {
			return fmt.Errorf("pserver: JetStream: %w", err)
		}
		s.js = js
		kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:      BucketName(s.cfg.Run),
			Description: "Kipimo parameter-server state of run " + s.cfg.Run,
			History:     1,
			Storage:     jetstream.FileStorage,
		})
		if err != nil {
			return fmt.Errorf("pserver: key-value bucket %s: %w", BucketName(s.cfg.Run), err)
		}
		s.kv = kv
		st, err := loadSnapshot(ctx, kv, s.cfg.Shard, s.cfg.Window)
		if err != nil {
			return err
		}
		if st != nil {
			s.st = st
			s.log.Info().Uint64("wal_seq", st.WALSeq).Int("models", len(st.Models)).Int("detectors", len(st.LastSeq)).Msg("loaded state snapshot")
		}
	}
	if s.cfg.Durability == DurabilityWAL {
		for range s.cfg.SyncWorkers {
			s.wg.Add(1)
			go pprof.Do(context.Background(), pprof.Labels("pserver", "replies"), func(context.Context) { s.replyWorker() })
		}
		if err := s.startWAL(ctx); err != nil {
			close(s.stop)
			s.wg.Wait()
			return err
		}
	}
	handler := s.onSyncDirect
	if s.cfg.Durability == DurabilityWAL {
		handler = s.onSyncWAL
	}
	for range s.cfg.SyncWorkers {
		sub, err := nc.QueueSubscribe(s.subj.Sync(s.cfg.Shard), QueueGroup, handler)
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
		ln, err := net.Listen("tcp", s.cfg.HTTPAddr)
		if err != nil {
			s.abort()
			return fmt.Errorf("pserver: listen on %s: %w", s.cfg.HTTPAddr, err)
		}
		s.httpLn = ln
		s.httpSrv = &http.Server{Handler: s.handler, ReadHeaderTimeout: 10 * time.Second}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := s.httpSrv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Error().Err(err).Msg("HTTP server stopped")
			}
		}()
	}
	s.wg.Add(2)
	go pprof.Do(context.Background(), pprof.Labels("pserver", "snapshots"), func(context.Context) { s.snapshotLoop() })
	go pprof.Do(context.Background(), pprof.Labels("pserver", "updates"), func(context.Context) { s.updateLoop() })
	s.log.Info().Str("subject", s.subj.Sync(s.cfg.Shard)).Str("durability", s.cfg.Durability).Str("http", s.HTTPAddr()).Msg("parameter server started")
	return nil
}

// HTTPAddr is the address the HTTP listener is bound to ("" without one).
func (s *Server) HTTPAddr() string {
	if s.httpLn == nil {
		return ""
	}
	return s.httpLn.Addr().String()
}

// Handler is the HTTP handler of the dashboard, JSON API, SSE stream and
// /metrics, for embedding in another server.
func (s *Server) Handler() http.Handler { return s.handler }

// startWAL creates the log stream, replays it from the snapshot and keeps
// consuming it.
func (s *Server) startWAL(ctx context.Context) error {
	st, err := s.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        WALStreamName(s.cfg.Run),
		Description: "Kipimo parameter-server sync log of run " + s.cfg.Run,
		Subjects:    []string{"kipimo." + s.cfg.Run + ".pswal.*"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		MaxMsgSize:  -1,
	})
	if err != nil {
		return fmt.Errorf("pserver: sync log stream: %w", err)
	}
	s.wal = st
	var target uint64
	last, err := st.GetLastMsgForSubject(ctx, s.walSubj)
	switch {
	case err == nil:
		target = last.Sequence
	case errors.Is(err, jetstream.ErrMsgNotFound):
	default:
		return fmt.Errorf("pserver: read sync log end: %w", err)
	}
	cc := jetstream.OrderedConsumerConfig{FilterSubjects: []string{s.walSubj}, DeliverPolicy: jetstream.DeliverAllPolicy}
	if from := s.st.WALSeq + 1; from > 1 {
		cc.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		cc.OptStartSeq = from
	}
	cons, err := st.OrderedConsumer(ctx, cc)
	if err != nil {
		return fmt.Errorf("pserver: sync log consumer: %w", err)
	}
	s.cons, err = cons.Consume(s.onWAL, jetstream.PullMaxMessages(1024))
	if err != nil {
		return fmt.Errorf("pserver: consume sync log: %w", err)
	}
	replayed := time.Now()
	for s.walSeq() < target {
		select {
		case <-ctx.Done():
			s.cons.Stop()
			return fmt.Errorf("pserver: replay sync log to %d (at %d): %w", target, s.walSeq(), ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	if target > 0 {
		s.log.Info().Uint64("to", target).Dur("took", time.Since(replayed)).Msg("replayed sync log")
	}
	return nil
}

func (s *Server) walSeq() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.st.WALSeq
}

// onSyncWAL decodes a request and appends it to the log; onWAL applies and
// answers it. The handler never blocks on I/O: the append is asynchronous.
// Decoding happens here, in the parallel subscription goroutines, and the
// decoded request is handed to the apply loop, which only decodes entries
// that other instances appended (or that it replays).
func (s *Server) onSyncWAL(m *nats.Msg) {
	t0 := time.Now()
	req, err := decodeRequest(m.Data)
	if err != nil {
		s.metrics.syncRequests.WithLabelValues("bad").Inc()
		s.respond(m.Reply, &psync.SyncReply{Error: err.Error()}, t0)
		return
	}
	id := nuid.Next()
	s.decoded.Store(id, req)
	h := nats.Header{}
	h.Set(hdrReply, m.Reply)
	h.Set(hdrOrigin, s.id)
	h.Set(hdrID, id)
	h.Set(hdrT0, strconv.FormatInt(t0.UnixNano(), 10))
	if _, err := s.js.PublishMsgAsync(&nats.Msg{Subject: s.walSubj, Data: m.Data, Header: h}); err != nil {
		s.decoded.Delete(id)
		s.metrics.walErrors.Inc()
		s.replyError(m.Reply, fmt.Errorf("append to sync log: %w", err))
	}
}

// onWAL applies one log entry, in log order, and hands the answer to the
// reply workers when this instance received the request.
func (s *Server) onWAL(m jetstream.Msg) {
	md, err := m.Metadata()
	if err != nil {
		s.metrics.walErrors.Inc()
		return
	}
	hdr := m.Headers()
	mine := hdr.Get(hdrOrigin) == s.id
	var req *psync.SyncRequest
	if mine {
		if v, ok := s.decoded.LoadAndDelete(hdr.Get(hdrID)); ok {
			req = v.(*psync.SyncRequest)
		}
	}
	var rep *psync.SyncReply
	if req == nil {
		if req, err = decodeRequest(m.Data()); err != nil {
			s.metrics.walErrors.Inc()
			s.mu.Lock()
			s.st.WALSeq = md.Sequence.Stream
			s.mu.Unlock()
			rep = &psync.SyncReply{Error: err.Error()}
		}
	}
	if rep == nil {
		rep = s.apply(req, md.Sequence.Stream)
	}
	if !mine {
		return
	}
	var t0 time.Time
	if v, err := strconv.ParseInt(hdr.Get(hdrT0), 10, 64); err == nil {
		t0 = time.Unix(0, v)
	}
	select {
	case s.replies <- replyJob{hdr.Get(hdrReply), rep, t0}:
	case <-s.stop:
	}
}

type replyJob struct {
	to  string
	rep *psync.SyncReply
	t0  time.Time
}

// replyWorker encodes and publishes answers for the apply loop.
func (s *Server) replyWorker() {
	defer s.wg.Done()
	for {
		select {
		case j := <-s.replies:
			s.respond(j.to, j.rep, j.t0)
		case <-s.stop:
			for {
				select {
				case j := <-s.replies:
					s.respond(j.to, j.rep, j.t0)
				default:
					return
				}
			}
		}
	}
}

// onSyncDirect applies and answers a request at once (snapshot and none
// durability).
func (s *Server) onSyncDirect(m *nats.Msg) {
	t0 := time.Now()
	rep := s.applyRaw(m.Data, 0)
	s.respond(m.Reply, rep, t0)
}

// applyRaw decodes and applies one request and returns its answer.
func (s *Server) applyRaw(data []byte, walSeq uint64) *psync.SyncReply {
	req, err := decodeRequest(data)
	if err != nil {
		s.metrics.syncRequests.WithLabelValues("bad").Inc()
		if walSeq > 0 {
			s.mu.Lock()
			s.st.WALSeq = walSeq
			s.mu.Unlock()
		}
		return &psync.SyncReply{Error: err.Error()}
	}
	return s.apply(req, walSeq)
}

// apply merges a decoded request (walSeq is its log sequence, 0 without a
// log) and returns its answer.
func (s *Server) apply(req *psync.SyncRequest, walSeq uint64) *psync.SyncReply {
	s.mu.Lock()
	applied, err := s.st.Apply(req)
	rep := s.st.Reply(req, applied)
	if walSeq > 0 {
		s.st.WALSeq = walSeq
	}
	merges := s.st.Merges
	s.mu.Unlock()
	if err != nil {
		rep.Error = err.Error()
		s.metrics.syncRequests.WithLabelValues("error").Inc()
		return rep
	}
	if !applied {
		s.metrics.syncRequests.WithLabelValues("duplicate").Inc()
		return rep
	}
	s.metrics.syncRequests.WithLabelValues("applied").Inc()
	s.metrics.observeRequest(req, merges)
	if s.sinceSnap.Add(1) >= int64(s.cfg.SnapshotEvery) {
		select {
		case s.snapKick <- struct{}{}:
		default:
		}
	}
	if len(req.Steps) > 0 {
		select {
		case s.changed <- struct{}{}:
		default:
		}
	}
	return rep
}

func (s *Server) respond(reply string, rep *psync.SyncReply, t0 time.Time) {
	if reply == "" {
		return
	}
	data, err := json.Marshal(rep)
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
	data, _ := json.Marshal(psync.SyncReply{Error: err.Error()})
	_ = s.nc.Publish(reply, data)
}

// snapshotLoop persists the state every SnapshotInterval and after
// SnapshotEvery applied requests.
func (s *Server) snapshotLoop() {
	defer s.wg.Done()
	if s.kv == nil {
		<-s.stop
		return
	}
	t := time.NewTicker(s.cfg.SnapshotInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		case <-s.snapKick:
		}
		if s.sinceSnap.Load() == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := s.Snapshot(ctx); err != nil {
			s.log.Warn().Err(err).Msg("state snapshot failed; will retry")
		}
		cancel()
	}
}

// Snapshot writes the current state to the key-value bucket now (and trims
// the log it covers).
func (s *Server) Snapshot(ctx context.Context) error {
	if s.kv == nil {
		return nil
	}
	start := time.Now()
	n := s.sinceSnap.Swap(0)
	s.mu.RLock()
	data, seq, err := encodeState(s.st)
	s.mu.RUnlock()
	if err != nil {
		s.sinceSnap.Add(n)
		return err
	}
	written, err := saveSnapshot(ctx, s.kv, s.cfg.Shard, data, seq, s.cfg.Durability == DurabilityWAL)
	if err != nil {
		s.sinceSnap.Add(n)
		return err
	}
	s.metrics.snapshots.Inc()
	s.metrics.snapshotBytes.Set(float64(len(data)))
	s.metrics.snapshotSeconds.Observe(time.Since(start).Seconds())
	// Trim the log the snapshot covers, keeping a margin for other instances
	// of the shard that may still be applying entries just below it.
	if keep := uint64(s.cfg.SnapshotEvery); written && s.wal != nil && seq > keep {
		if err := s.wal.Purge(ctx, jetstream.WithPurgeSubject(s.walSubj), jetstream.WithPurgeSequence(seq-keep)); err != nil {
			return fmt.Errorf("trim sync log below %d: %w", seq-keep, err)
		}
	}
	return nil
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
		}
		if s.js != nil && s.cons != nil {
			select {
			case <-s.js.PublishAsyncComplete():
			case <-ctx.Done():
				errs = append(errs, fmt.Errorf("wait for sync log appends: %w", ctx.Err()))
			}
			s.waitLogApplied(ctx)
			s.cons.Stop()
		}
		if err := s.Snapshot(ctx); err != nil {
			errs = append(errs, fmt.Errorf("final snapshot: %w", err))
		}
		if s.nc != nil && !s.finished.Load() {
			if err := s.Finish(ctx); err != nil {
				errs = append(errs, err)
			}
		}
		close(s.stop)
		s.hub.close()
		if s.httpSrv != nil {
			if err := s.httpSrv.Shutdown(ctx); err != nil {
				errs = append(errs, fmt.Errorf("stop HTTP server: %w", err))
			}
		}
		s.wg.Wait()
		s.log.Info().Msg("parameter server stopped")
	})
	return errors.Join(errs...)
}

// waitLogApplied waits until every log entry appended so far is applied.
func (s *Server) waitLogApplied(ctx context.Context) {
	last, err := s.wal.GetLastMsgForSubject(ctx, s.walSubj)
	if err != nil {
		return
	}
	for s.walSeq() < last.Sequence && ctx.Err() == nil {
		time.Sleep(2 * time.Millisecond)
	}
}

// abort stops the server as a crash would: no final snapshot, no Finish.
// Tests use it to check recovery.
func (s *Server) abort() {
	s.stopOnce.Do(func() {
		s.closeSubs()
		if s.cons != nil {
			s.cons.Stop()
		}
		close(s.stop)
		s.hub.close()
		if s.httpSrv != nil {
			_ = s.httpSrv.Close()
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
func decodeRequest(data []byte) (*psync.SyncRequest, error) {
	var req psync.SyncRequest
	if err := json.Unmarshal(data, &req); err != nil {
		return nil, fmt.Errorf("decode sync request: %w", err)
	}
	return &req, nil
}
