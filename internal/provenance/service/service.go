// Package service is provdb's engine: a durable JetStream pull consumer on a
// run's provenance subjects that writes each batch to a provenance.Store and
// acknowledges it only once written (so a provdb killed at any moment and
// restarted loses nothing and, the store being idempotent, duplicates
// nothing), and the read-only HTTP query API on a store.
package service

import (
	"context"
	"errors"
	"fmt"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provstream"
)

// Stats are a Service's counters since it started.
type Stats struct {
	Written     map[provenance.Kind]int64 `json:"written"`      // records written, per kind (duplicates included)
	Batches     int64                     `json:"batches"`      // messages written and acknowledged
	Bad         int64                     `json:"bad"`          // messages that could not be decoded, terminated
	WriteErrors int64                     `json:"write_errors"` // failed store writes (redelivered later)
}

// Service consumes a run's provenance stream into a store. Its owner calls
// Start once, then Shutdown once; Stats may be called at any time from any
// goroutine.
type Service struct {
	cfg   Config
	store provenance.Store
	js    jetstream.JetStream
	log   zerolog.Logger

	written     map[provenance.Kind]*atomic.Int64
	batches     atomic.Int64
	bad         atomic.Int64
	writeErrors atomic.Int64

	loggedMu  sync.Mutex
	loggedBad map[provenance.Kind]bool

	cancel context.CancelFunc
	done   chan struct{}
}

// New returns a Service writing to store from js and logging to log; cfg
// (its zero consumer fields filled from DefaultConfig) is validated by
// Start.
func New(cfg Config, store provenance.Store, js jetstream.JetStream, log zerolog.Logger) *Service {
	cfg = cfg.withDefaults()
	s := &Service{cfg: cfg, store: store, js: js, log: log.With().Str("component", "provdb").Str("run", cfg.Run).Logger(), written: map[provenance.Kind]*atomic.Int64{}, loggedBad: map[provenance.Kind]bool{}}
	for _, k := range provenance.Kinds {
		s.written[k] = new(atomic.Int64)
	}
	return s
}

// Start ensures the stream and the durable consumer exist and starts
// consuming in a goroutine owned by the Service. ctx bounds the set-up and
// the consumer's life: cancelling it stops consumption abruptly (nothing
// unwritten is acknowledged).
func (s *Service) Start(ctx context.Context) error {
	if err := s.cfg.Validate(); err != nil {
		return err
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
		MaxAckPending: 4 * s.cfg.Fetch,
	})
	if err != nil {
		return fmt.Errorf("create provdb consumer %s on %s: %w", s.cfg.Durable, natsx.ProvStream(s.cfg.Run), err)
	}
	ctx, s.cancel = context.WithCancel(ctx)
	s.done = make(chan struct{})
	go pprof.Do(ctx, pprof.Labels("component", "provdb", "run", s.cfg.Run), func(ctx context.Context) {
		defer close(s.done)
		s.loop(ctx, cons)
	})
	s.log.Info().Str("stream", natsx.ProvStream(s.cfg.Run)).Str("durable", s.cfg.Durable).Msg("consuming provenance")
	return nil
}

// Shutdown stops consuming after the batch being written (if any) is written
// and acknowledged and the fetch under way has ended (within FetchWait;
// what it still brings is handed back for redelivery), or when ctx ends,
// whichever comes first.
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
	st := Stats{Written: map[provenance.Kind]int64{}, Batches: s.batches.Load(), Bad: s.bad.Load(), WriteErrors: s.writeErrors.Load()}
	for k, v := range s.written {
		st.Written[k] = v.Load()
	}
	return st
}

func (s *Service) loop(ctx context.Context, cons jetstream.Consumer) {
	fetchErrors := 0
	for ctx.Err() == nil {
		// The pull ends when the server says it expired, not when a
		// client-side deadline passes: a message the server sends just
		// before its expiry must still reach drain (which writes it, or
		// hands it back when stopping) rather than be dropped with the
		// subscription and wait for AckWait to pass. Stopping therefore
		// waits for the pull under way, at most FetchWait.
		mb, err := cons.Fetch(s.cfg.Fetch, jetstream.FetchMaxWait(s.cfg.FetchWait))
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if fetchErrors++; fetchErrors == 1 || fetchErrors%60 == 0 {
				s.log.Warn().Err(err).Int("fetch_errors", fetchErrors).Msg("fetch provenance batches")
			}
			sleep(ctx, time.Second)
			continue
		}
		s.drain(ctx, mb.Messages())
		if err := mb.Error(); err != nil && ctx.Err() == nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, nats.ErrTimeout) {
			if fetchErrors++; fetchErrors == 1 || fetchErrors%60 == 0 {
				s.log.Warn().Err(err).Int("fetch_errors", fetchErrors).Msg("fetch provenance batches")
			}
		}
	}
}

// drain handles the messages of one fetch as they arrive, writing the
// messages that are already there together: one store write per kind for up
// to Fetch messages, so that a transaction's cost is shared.
func (s *Service) drain(ctx context.Context, msgs <-chan jetstream.Msg) {
	var pend []pending
	for {
		var msg jetstream.Msg
		var ok bool
		if len(pend) == 0 {
			msg, ok = <-msgs
		} else {
			select {
			case msg, ok = <-msgs:
			default:
				s.flush(pend)
				pend = pend[:0]
				continue
			}
		}
		if !ok {
			break
		}
		if ctx.Err() != nil {
			// Stopping: hand the rest back for immediate redelivery.
			_ = msg.Nak()
			continue
		}
		if p, ok := s.decode(msg); ok {
			pend = append(pend, p)
		}
		if len(pend) >= s.cfg.Fetch {
			s.flush(pend)
			pend = pend[:0]
		}
	}
	s.flush(pend)
}

type pending struct {
	msg   jetstream.Msg
	batch provenance.Batch
}

// decode decodes msg, terminating it if it is bad.
func (s *Service) decode(msg jetstream.Msg) (pending, bool) {
	subj := msg.Subject()
	kind := provenance.Kind(subj[strings.LastIndexByte(subj, '.')+1:])
	b, err := provenance.DecodeBatch(kind, msg.Data())
	if err != nil {
		s.bad.Add(1)
		s.logBad(kind, err)
		_ = msg.TermWithReason("undecodable provenance batch")
		return pending{}, false
	}
	return pending{msg: msg, batch: b}, true
}

// flush writes the pending batches, one write per kind, and acknowledges
// each message once its kind's write succeeded (or asks for redelivery).
func (s *Service) flush(pend []pending) {
	for _, kind := range provenance.Kinds {
		var merged provenance.Batch
		var msgs []jetstream.Msg
		for _, p := range pend {
			if p.batch.Kind != kind {
				continue
			}
			msgs = append(msgs, p.msg)
			if merged.Kind == "" {
				merged = p.batch
				continue
			}
			merged.Execs = append(merged.Execs, p.batch.Execs...)
			merged.Metadata = append(merged.Metadata, p.batch.Metadata...)
			merged.FuncStats = append(merged.FuncStats, p.batch.FuncStats...)
			merged.CounterStats = append(merged.CounterStats, p.batch.CounterStats...)
			merged.Profiles = append(merged.Profiles, p.batch.Profiles...)
		}
		if len(msgs) == 0 {
			continue
		}
		// Not cancelled with the service's context, so that a write under
		// way when Shutdown is called completes and is acknowledged; bounded
		// so that a stuck store cannot hold Shutdown for ever. A write
		// slower than AckWait only causes a redelivery the store ignores.
		wctx, cancel := context.WithTimeout(context.Background(), max(s.cfg.AckWait, 30*time.Second))
		err := s.store.Write(wctx, merged)
		cancel()
		if err != nil {
			if n := s.writeErrors.Add(1); n == 1 || n%100 == 0 {
				s.log.Error().Err(err).Int64("write_errors", n).Msg("store write failed; the batches will be redelivered")
			}
			for _, m := range msgs {
				_ = m.NakWithDelay(s.cfg.RetryDelay)
			}
			continue
		}
		for _, m := range msgs {
			// An acknowledgement lost here only means the batch comes
			// again and is written again, which the store ignores.
			_ = m.Ack()
		}
		s.batches.Add(int64(len(msgs)))
		s.written[kind].Add(int64(merged.Len()))
	}
}

// logBad logs the first bad message of each kind; the rest are counted.
func (s *Service) logBad(kind provenance.Kind, err error) {
	s.loggedMu.Lock()
	first := !s.loggedBad[kind]
	s.loggedBad[kind] = true
	s.loggedMu.Unlock()
	if first {
		s.log.Warn().Err(err).Str("kind", string(kind)).Msg("bad provenance batch terminated (further ones of this kind are only counted)")
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
