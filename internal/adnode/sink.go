package adnode

import (
	"context"
	"errors"
	"fmt"
	"github.com/kipimo-hpc/kipimo/internal/ad"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provstream"
)

// Overflow says what a full NATSSink queue does.
type Overflow int

const (
	// Drop drops the batch and counts its records (never slows detection).
	Drop Overflow = iota
	// Block waits for room, counting the time waited as lag.
	Block
)

// NATSSink publishes batches to the run's JetStream provenance subjects
// through a bounded queue drained by one goroutine. Start it, publish, then
// Shutdown (which drains the queue). Safe for concurrent use by the detectors
// of a node.
type NATSSink struct {
	js       jetstream.JetStream
	run      string
	overflow Overflow
	queue    chan *ad.Batch
	flushReq chan chan error
	log      zerolog.Logger

	pubs map[pubKey]*provstream.Publisher // owned by the run goroutine
	// unflushed are the publishers whose last flush failed: the only ones
	// holding records, since publish flushes every batch it adds (owned by
	// the run goroutine). A flush request retries them alone, not every
	// rank's publishers: every detector of a node asks for one at its end.
	unflushed map[pubKey]*provstream.Publisher

	dropped   atomic.Uint64
	published atomic.Uint64
	failed    atomic.Uint64
	lagNanos  atomic.Int64

	done     chan struct{}
	startMu  sync.Mutex
	started  bool
	stopOnce sync.Once
	// incarnation tells this sink's batch ids from those of an earlier
	// process of the same ranks: a restarted detector re-publishes the
	// records after its checkpoint in batches cut differently, which must
	// not be taken for the earlier ones (provdb stores a record once by its
	// event id).
	incarnation string
}

type pubKey struct {
	pid, rank uint32
	kind      provenance.Kind
}

// NewNATSSink returns a sink of run's records with a queue of queueLen
// batches (default 64).
func NewNATSSink(js jetstream.JetStream, run string, queueLen int, overflow Overflow, log zerolog.Logger) (*NATSSink, error) {
	if err := natsx.ValidRun(run); err != nil {
		return nil, fmt.Errorf("provenance sink: %w", err)
	}
	if queueLen <= 0 {
		queueLen = 64
	}
	return &NATSSink{js: js, run: run, incarnation: strconv.FormatInt(time.Now().UnixNano(), 36), overflow: overflow, queue: make(chan *ad.Batch, queueLen),
		flushReq: make(chan chan error), log: log, pubs: map[pubKey]*provstream.Publisher{},
		unflushed: map[pubKey]*provstream.Publisher{}, done: make(chan struct{})}, nil
}

// Start starts the publishing goroutine; it stops with Shutdown.
func (s *NATSSink) Start(ctx context.Context) error {
	s.startMu.Lock()
	defer s.startMu.Unlock()
	if s.started {
		return errors.New("provenance sink already started")
	}
	if _, err := provstream.EnsureStream(ctx, s.js, s.run); err != nil {
		return err
	}
	s.started = true
	go s.loop()
	return nil
}

// Publish implements Sink.
func (s *NATSSink) Publish(ctx context.Context, b *ad.Batch) error {
	select {
	case s.queue <- b:
		return nil
	default:
	}
	if s.overflow == Drop {
		s.dropped.Add(uint64(b.Len()))
		return nil
	}
	start := time.Now()
	defer func() { s.lagNanos.Add(int64(time.Since(start))) }()
	select {
	case s.queue <- b:
		return nil
	case <-ctx.Done():
		s.dropped.Add(uint64(b.Len()))
		return nil
	case <-s.done:
		s.dropped.Add(uint64(b.Len()))
		return nil
	}
}

// Flush waits until every batch queued so far is published.
func (s *NATSSink) Flush(ctx context.Context) error {
	ch := make(chan error, 1)
	select {
	case s.flushReq <- ch:
	case <-ctx.Done():
		return fmt.Errorf("flush provenance: %w", ctx.Err())
	case <-s.done:
		return nil
	}
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return fmt.Errorf("flush provenance: %w", ctx.Err())
	}
}

// Shutdown drains the queue (within ctx) and stops the goroutine.
func (s *NATSSink) Shutdown(ctx context.Context) error {
	err := s.Flush(ctx)
	s.stopOnce.Do(func() { close(s.done) })
	return err
}

// Dropped is the number of records dropped because the queue was full (or
// publishing failed).
func (s *NATSSink) Dropped() uint64 { return s.dropped.Load() + s.failed.Load() }

// Published is the number of records published.
func (s *NATSSink) Published() uint64 { return s.published.Load() }

// Lag is the total time publishers waited for room in the queue.
func (s *NATSSink) Lag() time.Duration { return time.Duration(s.lagNanos.Load()) }

// QueueLen is the number of batches waiting.
func (s *NATSSink) QueueLen() int { return len(s.queue) }

func (s *NATSSink) loop() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-s.done
		cancel()
	}()
	for {
		select {
		case b := <-s.queue:
			s.publish(ctx, b)
		case ch := <-s.flushReq:
			for len(s.queue) > 0 {
				s.publish(ctx, <-s.queue)
			}
			var err error
			for k, p := range s.unflushed {
				if e := p.Flush(ctx); e != nil {
					if err == nil {
						err = e
					}
					continue
				}
				delete(s.unflushed, k)
			}
			ch <- err
		case <-s.done:
			return
		}
	}
}

func (s *NATSSink) publish(ctx context.Context, b *ad.Batch) {
	add := func(kind provenance.Kind, n int, rec func(i int) any) {
		if n == 0 {
			return
		}
		k := pubKey{b.PID, b.Rank, kind}
		p := s.pubs[k]
		if p == nil {
			var err error
			p, err = provstream.NewPublisher(s.js, s.run, kind, fmt.Sprintf("ad.%d.%d.%s", b.PID, b.Rank, s.incarnation))
			if err != nil {
				s.failed.Add(uint64(n))
				return
			}
			s.pubs[k] = p
		}
		for i := 0; i < n; i++ {
			if err := p.Add(ctx, rec(i)); err != nil {
				s.failed.Add(1)
				s.log.Warn().Err(err).Str("kind", string(kind)).Msg("provenance record not published")
				continue
			}
			s.published.Add(1)
		}
		if err := p.Flush(ctx); err != nil {
			s.unflushed[k] = p
			s.log.Warn().Err(err).Str("kind", string(kind)).Msg("provenance batch not published; will retry with the next batch")
		} else {
			delete(s.unflushed, k)
		}
	}
	add(provenance.KindAnomalies, len(b.Anomalies), func(i int) any { return &b.Anomalies[i] })
	add(provenance.KindNormalExecs, len(b.Normal), func(i int) any { return &b.Normal[i] })
	add(provenance.KindMetadata, len(b.Metadata), func(i int) any { return &b.Metadata[i] })
	add(provenance.KindProfiles, len(b.Profiles), func(i int) any { return &b.Profiles[i] })
}
