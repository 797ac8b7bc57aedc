// Package adnode is Kipimo's ad node: the detectors of one process (package
// ad) run on NATS. Serve gives each rank's detector its frames (a
// subscription per given rank, ranks discovered on the run's frame
// subjects, or with durable frames a JetStream consumer and a checkpoint of
// every rank), answers the live call-stack probes and the run's control
// messages; NATSSink publishes the records to the run's provenance stream,
// NATSSyncer and the node's merged NodeSyncer reach the pserver, Collector
// exports the detectors' counts to Prometheus, and Node is all of it as a
// component (New, Start, Shutdown) that cmd/ad (Main), kipimo run and
// kipimo bench embed. It uses only the exported API of package ad.
package adnode

import (
	"context"
	"errors"
	"fmt"
	"runtime/pprof"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/ad"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
)

// Config is an ad node's settings: what Serve runs, and how the node
// publishes records and syncs when the detectors' Config leaves it to the
// node.
type Config struct {
	// Serve is what the node serves; its Conn, Logger and Collector are the
	// node's own (set by New). Ready, when set, is called once the
	// detectors listen, before Start returns.
	Serve ServeConfig
	// When Serve.Detector.Sink is nil the node publishes its records
	// through a NATSSink of its own on ProvJS (default: the connection's
	// JetStream), with Queue batches queued (default 64) and Overflow,
	// which Shutdown drains.
	Queue    int
	Overflow Overflow
	ProvJS   jetstream.JetStream
	// When Serve.Detector.Syncer is nil the detectors sync with the
	// pserver through a NATSSyncer on the node's connection, unless
	// NoPServer (local models only).
	NoPServer bool
	// RankLabels is how many ranks get a metric label of their own
	// (NewCollector).
	RankLabels int
}

// Node is the ad node as a component, like the pserver and provdb: New,
// Start, and Shutdown. It serves its ranks (Serve) from Start until ctx is
// cancelled, Shutdown is called, or every rank's stream has ended (Done),
// and reports their counts as Prometheus metrics on the registerer it is
// given.
type Node struct {
	cfg  Config
	sink *NATSSink // the node's own sink, or nil
	coll *Collector

	mu      sync.Mutex
	started bool
	cancel  context.CancelFunc
	done    chan struct{}
	stats   []ad.Stats // what Serve returned, once done is closed
	err     error
}

// New returns an ad node serving cfg's ranks on conn, logging to log. Its
// metrics are registered on reg (none when reg is nil).
func New(cfg Config, conn *nats.Conn, log zerolog.Logger, reg prometheus.Registerer) (*Node, error) {
	if conn == nil {
		return nil, errors.New("ad node: no NATS connection")
	}
	if err := natsx.ValidRun(cfg.Serve.Run); err != nil {
		return nil, fmt.Errorf("ad node: %w", err)
	}
	n := &Node{cfg: cfg, done: make(chan struct{})}
	sc := &n.cfg.Serve
	sc.Conn, sc.Logger = conn, log
	var sinkDrops func() uint64
	if sc.Detector.Sink == nil {
		js := cfg.ProvJS
		if js == nil {
			var err error
			if js, err = jetstream.New(conn); err != nil {
				return nil, fmt.Errorf("ad node: jetstream: %w", err)
			}
		}
		sink, err := NewNATSSink(js, sc.Run, cfg.Queue, cfg.Overflow, log)
		if err != nil {
			return nil, err
		}
		n.sink, sc.Detector.Sink, sinkDrops = sink, sink, sink.Dropped
	}
	if sc.Detector.Syncer == nil && !cfg.NoPServer {
		sc.Detector.Syncer = &NATSSyncer{Conn: conn, Subjects: natsx.Subjects{Run: sc.Run}}
	}
	n.coll = NewCollector(cfg.RankLabels, sinkDrops)
	sc.Collector = n.coll
	if reg != nil {
		if err := reg.Register(n.coll); err != nil {
			return nil, fmt.Errorf("ad node: register metrics: %w", err)
		}
	}
	return n, nil
}

// Start starts the node's sink and serves its ranks on a goroutine of its
// own, labelled for CPU profiles; it returns once the detectors listen.
// Serving stops when ctx is cancelled, on Shutdown, or once every rank's
// stream has ended (Done).
func (n *Node) Start(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.started {
		return errors.New("ad node already started")
	}
	if n.sink != nil {
		if err := n.sink.Start(ctx); err != nil {
			return fmt.Errorf("start record sink: %w", err)
		}
	}
	n.started = true
	sc := n.cfg.Serve
	ready := make(chan struct{})
	sc.Ready = func() {
		close(ready)
		if n.cfg.Serve.Ready != nil {
			n.cfg.Serve.Ready()
		}
	}
	sctx, cancel := context.WithCancel(ctx)
	n.cancel = cancel
	go pprof.Do(sctx, pprof.Labels("component", "ad"), func(ctx context.Context) {
		st, err := Serve(ctx, sc)
		n.stats, n.err = st, err
		close(n.done)
	})
	select {
	case <-ready:
		return nil
	case <-n.done:
		err := fmt.Errorf("start detectors: %w", n.err)
		if n.sink != nil {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			err = errors.Join(err, n.sink.Shutdown(sctx))
		}
		return err
	}
}

// Done is closed once the node has stopped serving: every rank's stream
// ended (or, with discovery, end_of_run came), serving failed, or it was
// stopped.
func (n *Node) Done() <-chan struct{} { return n.done }

// Stats returns the detectors' counts: their final counts once Done is
// closed, a snapshot before.
func (n *Node) Stats() []ad.Stats {
	select {
	case <-n.done:
		return n.stats
	default:
		return n.coll.Stats()
	}
}

// Collector is the node's collector of its detectors' counts.
func (n *Node) Collector() *Collector { return n.coll }

// Sink is the node's own record sink; nil when the detectors' Config gave
// one.
func (n *Node) Sink() *NATSSink { return n.sink }

// Shutdown stops serving, if it has not stopped already (every detector is
// closed, or with durable frames checkpointed, within
// ServeConfig.CloseTimeout), then drains the node's own sink, all within
// ctx. It returns what ended serving, if that was an error, and the
// sink's.
func (n *Node) Shutdown(ctx context.Context) error {
	n.mu.Lock()
	started := n.started
	n.mu.Unlock()
	var errs []error
	if started {
		n.cancel()
		select {
		case <-n.done:
			errs = append(errs, n.err)
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("ad node shutdown: detectors still closing: %w", ctx.Err()))
		}
	}
	if n.sink != nil && started {
		if err := n.sink.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("flush provenance: %w", err))
		}
	}
	return errors.Join(errs...)
}
