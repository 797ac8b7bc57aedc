// Package provdb is provdb's engine: a durable JetStream pull consumer on a
// run's provenance subjects that writes each batch to a provenance.Store and
// acknowledges it only once written (so a provdb killed at any moment and
// restarted loses nothing and, the store being idempotent, duplicates
// nothing), and the read-only HTTP query API on a store.
package provdb

import (
	"context"
	"errors"
	"fmt"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/docblock"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provstream"
)

// Stats are a Service's counters since it started.
type Stats struct {
	Written     map[provenance.Kind]int64 `json:"written"`      // records written, per kind (duplicates included)
	Batches     int64                     `json:"batches"`      // messages written and acknowledged
	Bad         int64                     `json:"bad"`          // messages refused and terminated (the sum of Rejected)
	WriteErrors int64                     `json:"write_errors"` // failed store writes (redelivered later)
	// Rejected counts the refused messages by reason: RejectUndecodable,
	// RejectDocument, RejectColumns, RejectSize.
	Rejected map[string]int64 `json:"rejected"`
}

// Why a message is refused (Stats.Rejected).
const (
	// RejectUndecodable: the message is not a batch of its kind (framing,
	// JSON, a record that fails its Validate, an unknown encoding).
	RejectUndecodable = "undecodable"
	// RejectDocument: a document of the block encoding is not a JSON
	// object that decodes as a valid execution.
	RejectDocument = "document"
	// RejectColumns: a document's fields differ from its indexed columns.
	RejectColumns = "columns"
	// RejectSize: a document, a block or the message decompresses past
	// its bound (docblock.MaxDocLen, MaxWireLen, MaxMessageRawLen).
	RejectSize = "size"
)

// rejectReasons are the reasons, in the order Stats lists them.
var rejectReasons = []string{RejectUndecodable, RejectDocument, RejectColumns, RejectSize}

// rejectReason is why err refused a message.
func rejectReason(err error) string {
	switch {
	case errors.Is(err, docblock.ErrTooLarge):
		return RejectSize
	case errors.Is(err, docblock.ErrColumns):
		return RejectColumns
	case errors.Is(err, docblock.ErrDocument):
		return RejectDocument
	}
	return RejectUndecodable
}

// Service consumes a run's provenance stream into a store. Its owner calls
// Start once, then Shutdown once; Stats may be called at any time from any
// goroutine.
type Service struct {
	cfg   Config
	store provenance.Store
	js    jetstream.JetStream
	log   zerolog.Logger

	counts      map[provenance.Kind]*atomic.Int64 // records written
	batches     atomic.Int64
	bad         atomic.Int64
	writeErrors atomic.Int64
	rejected    map[string]*atomic.Int64

	// badLogs rate-limits the log lines about refused messages, per kind.
	badLogs map[provenance.Kind]*rateLog

	cancel context.CancelFunc
	done   chan struct{}
}

// New returns a Service writing to store from js and logging to log; cfg
// (its zero consumer fields filled from DefaultConfig) is validated by
// Start.
func New(cfg Config, store provenance.Store, js jetstream.JetStream, log zerolog.Logger) *Service {
	cfg = cfg.withDefaults()
	s := &Service{cfg: cfg, store: store, js: js, log: log.With().Str("component", "provdb").Str("run", cfg.Run).Logger(),
		counts: map[provenance.Kind]*atomic.Int64{}, rejected: map[string]*atomic.Int64{}, badLogs: map[provenance.Kind]*rateLog{}}
	for _, k := range provenance.Kinds {
		s.counts[k] = new(atomic.Int64)
		s.badLogs[k] = &rateLog{every: badLogEvery}
	}
	for _, r := range rejectReasons {
		s.rejected[r] = new(atomic.Int64)
	}
	return s
}

// Start ensures the stream and the durable consumer exist and starts
// consuming in goroutines owned by the Service (see pipeline.go). ctx bounds the set-up and
// the consumer's life: cancelling it stops consumption abruptly (nothing
// unwritten is acknowledged).
func (s *Service) Start(ctx context.Context) error {
	if err := s.cfg.Validate(); err != nil {
		return err
	}
	if s.cfg.Metrics != nil {
		if err := s.register(s.cfg.Metrics); err != nil {
			return fmt.Errorf("provdb metrics: %w", err)
		}
	}
	stream, err := provstream.EnsureStream(ctx, s.js, s.cfg.Run)
	if err != nil {
		return err
	}
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       s.cfg.Durable,
		Description:   "provdb: provenance records into the store",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       s.cfg.AckWait,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		FilterSubject: natsx.Subjects{Run: s.cfg.Run}.AllProv(),
		MaxAckPending: pipelineDepth(s.cfg.Fetch),
	})
	if err != nil {
		return fmt.Errorf("create provdb consumer %s on %s: %w", s.cfg.Durable, natsx.ProvStream(s.cfg.Run), err)
	}
	ctx, s.cancel = context.WithCancel(ctx)
	s.done = make(chan struct{})
	go pprof.Do(ctx, pprof.Labels("component", "provdb", "run", s.cfg.Run), func(ctx context.Context) {
		defer close(s.done)
		s.run(ctx, cons)
	})
	s.log.Info().Str("stream", natsx.ProvStream(s.cfg.Run)).Str("durable", s.cfg.Durable).Msg("consuming provenance")
	return nil
}

// Shutdown stops consuming after the batches being written (if any) are
// written and acknowledged and the fetch under way has ended (within
// FetchWait; what it still brings, and what was fetched but not yet being
// written, is handed back for redelivery), or when ctx ends, whichever
// comes first.
func (s *Service) Shutdown(ctx context.Context) error {
	if s.cancel == nil {
		return nil
	}
	s.cancel()
	select {
	case <-s.done:
	case <-ctx.Done():
		return fmt.Errorf("provdb shutdown: %w", ctx.Err())
	}
	st := s.Stats()
	s.log.Info().Int64("batches", st.Batches).Int64("bad", st.Bad).Interface("written", st.Written).Msg("provdb stopped")
	return nil
}

// Stats returns the counters.
func (s *Service) Stats() Stats {
	st := Stats{Written: map[provenance.Kind]int64{}, Batches: s.batches.Load(), Bad: s.bad.Load(), WriteErrors: s.writeErrors.Load(),
		Rejected: map[string]int64{}}
	for k, v := range s.counts {
		st.Written[k] = v.Load()
	}
	for r, v := range s.rejected {
		st.Rejected[r] = v.Load()
	}
	return st
}

// loop fetches messages into the pipeline p until ctx ends.
func (s *Service) loop(ctx context.Context, cons jetstream.Consumer, p *pipeline) {
	fetchErrors := 0
	for ctx.Err() == nil {
		// Room for a whole fetch first: what the server delivers goes
		// straight into the pipeline (see pipeline.go).
		if !p.reserve(ctx, s.cfg.Fetch) {
			return
		}
		// The pull ends when the server says it expired, not when a
		// client-side deadline passes: a message the server sends just
		// before its expiry must still reach enqueue (which passes it on,
		// or hands it back when stopping) rather than be dropped with the
		// subscription and wait for AckWait to pass. Stopping therefore
		// waits for the pull under way, at most FetchWait.
		mb, err := cons.Fetch(s.cfg.Fetch, jetstream.FetchMaxWait(s.cfg.FetchWait))
		if err != nil {
			p.unreserve(s.cfg.Fetch)
			if ctx.Err() != nil {
				return
			}
			if fetchErrors++; fetchErrors == 1 || fetchErrors%60 == 0 {
				s.log.Warn().Err(err).Int("fetch_errors", fetchErrors).Msg("fetch provenance batches")
			}
			sleep(ctx, time.Second)
			continue
		}
		used := 0
		for msg := range mb.Messages() {
			if used < s.cfg.Fetch && s.enqueue(ctx, p, msg) {
				used++
			} else if used >= s.cfg.Fetch {
				_ = msg.Nak() // never more than asked for
			}
		}
		p.unreserve(s.cfg.Fetch - used)
		if err := mb.Error(); err != nil && ctx.Err() == nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, nats.ErrTimeout) {
			if fetchErrors++; fetchErrors == 1 || fetchErrors%60 == 0 {
				s.log.Warn().Err(err).Int("fetch_errors", fetchErrors).Msg("fetch provenance batches")
			}
		}
	}
}

// badLogEvery is the least time between two log lines about refused
// messages of one kind.
const badLogEvery = time.Minute

// rateLog lets a line through at most once every every, and counts what it
// holds back.
type rateLog struct {
	mu     sync.Mutex
	every  time.Duration
	last   time.Time
	held   int64
	logged bool
}

// allow reports whether a line may be logged now, and how many were held
// back since the last one.
func (r *rateLog) allow(now time.Time) (bool, int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.logged && now.Sub(r.last) < r.every {
		r.held++
		return false, 0
	}
	held := r.held
	r.logged, r.last, r.held = true, now, 0
	return true, held
}

// refuse counts a refused message of kind and logs why, at most once every
// badLogEvery per kind.
func (s *Service) refuse(kind provenance.Kind, err error) {
	s.bad.Add(1)
	reason := rejectReason(err)
	s.rejected[reason].Add(1)
	if ok, held := s.badLogs[kind].allow(time.Now()); ok {
		s.log.Warn().Err(err).Str("kind", string(kind)).Str("reason", reason).Int64("bad", s.bad.Load()).Int64("not_logged", held).
			Msg("bad provenance batch refused and terminated (logged at most once a minute per kind; Stats counts them all)")
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
