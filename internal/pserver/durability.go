package pserver

import (
	"context"
	"fmt"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// durability is how a Server's state survives restarts: one implementation
// per Config.Durability mode (memoryDurability, snapshotDurability,
// walDurability), chosen by New.
//
// Ownership: the Server creates its durability in New and owns it; the
// durability owns what it opens (JetStream handles, the key-value bucket,
// the log consumer) and the goroutines it starts, and calls back into its
// Server to apply requests, answer them and read or replace the state. The
// NATS connection stays the Server's.
//
// Lifetime: start once, from Server.Start, before the sync subscriptions
// exist; then handle and applied for every request and snapshot at any
// time; at shutdown settle once the subscriptions are drained, a last
// snapshot, and stop; stop alone when the Server aborts (a crash). stop is
// safe to call without start and more than once.
//
// Concurrency: handle runs on Config.SyncWorkers subscription goroutines at
// once, applied on whichever goroutine applied the request, snapshot on the
// durability's own snapshot loop and on the goroutine calling
// Server.Snapshot or Shutdown: all three must be safe for concurrent use.
// start, settle and stop are called from the one goroutine starting or
// stopping the Server.
type durability interface {
	// start loads the persisted state into the Server (replaying the log
	// where there is one) and starts the durability's goroutines.
	start(ctx context.Context) error
	// handle is the message handler of the shard's sync subject: it
	// applies and answers the request, now or once it is logged.
	handle(m *nats.Msg)
	// applied notes one more request applied (the snapshot modes snapshot
	// after Config.SnapshotEvery of them).
	applied()
	// snapshot persists the current state now.
	snapshot(ctx context.Context) error
	// settle waits, bounded by ctx, until every request accepted so far is
	// applied and answered.
	settle(ctx context.Context) error
	// stop stops consuming and the durability's goroutines, persisting
	// nothing more.
	stop()
}

// newDurability returns s's durability for s.cfg.Durability (validated).
func newDurability(s *Server) durability {
	switch s.cfg.Durability {
	case DurabilityNone:
		return memoryDurability{s}
	case DurabilitySnapshot:
		return newSnapshotDurability(s, false)
	default:
		return newWALDurability(s)
	}
}

// memoryDurability keeps the state in memory only (DurabilityNone):
// requests are applied and answered at once and a restart starts empty.
type memoryDurability struct{ s *Server }

func (d memoryDurability) start(context.Context) error    { return nil }
func (d memoryDurability) handle(m *nats.Msg)             { d.s.onSyncDirect(m) }
func (d memoryDurability) applied()                       {}
func (d memoryDurability) snapshot(context.Context) error { return nil }
func (d memoryDurability) settle(context.Context) error   { return nil }
func (d memoryDurability) stop()                          {}

// snapshotDurability applies and answers requests at once and writes the
// state to the run's key-value bucket every SnapshotInterval, after
// SnapshotEvery applied requests and at shutdown (DurabilitySnapshot): a
// clean restart loses nothing, a crash what was applied since the last
// snapshot. walDurability embeds it for its snapshots.
type snapshotDurability struct {
	s *Server
	// onlyNewer keeps a stored snapshot that covers more of the log (the
	// WAL mode, whose instances of a shard share the snapshot).
	onlyNewer bool
	// afterSave runs after a snapshot covering the log up to seq was
	// written (the WAL mode trims the log); nil: nothing.
	afterSave func(ctx context.Context, seq uint64) error

	js jetstream.JetStream // set by start
	kv jetstream.KeyValue  // set by start; nil before

	since atomic.Int64  // requests applied since the last snapshot
	kick  chan struct{} // asks the snapshot loop for a snapshot now
	quit  chan struct{} // closed by stop
	wg    sync.WaitGroup
	once  sync.Once
}

func newSnapshotDurability(s *Server, onlyNewer bool) *snapshotDurability {
	return &snapshotDurability{s: s, onlyNewer: onlyNewer, kick: make(chan struct{}, 1), quit: make(chan struct{})}
}

// open connects to JetStream with opts, creates the bucket and loads the
// shard's snapshot into the Server.
func (d *snapshotDurability) open(ctx context.Context, opts ...jetstream.JetStreamOpt) error {
	s := d.s
	js, err := jetstream.New(s.nc, opts...)
	if err != nil {
		return fmt.Errorf("pserver: JetStream: %w", err)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      BucketName(s.cfg.Run),
		Description: "Kipimo parameter-server state of run " + s.cfg.Run,
		History:     1,
		Storage:     jetstream.FileStorage,
	})
	if err != nil {
		return fmt.Errorf("pserver: key-value bucket %s: %w", BucketName(s.cfg.Run), err)
	}
	st, err := loadSnapshot(ctx, kv, s.cfg.Shard, s.cfg.Window)
	if err != nil {
		return err
	}
	if st != nil {
		for _, what := range st.sanitize() {
			s.skip("snapshot", what)
		}
		s.replace(st)
		s.log.Info().Uint64("wal_seq", st.WALSeq).Int("models", len(st.Models)).Int("detectors", len(st.LastSeq)).Msg("loaded state snapshot")
	}
	d.js, d.kv = js, kv
	return nil
}

// loop snapshots every SnapshotInterval and when kicked, until stop.
func (d *snapshotDurability) startLoop() {
	d.wg.Add(1)
	go pprof.Do(context.Background(), pprof.Labels("pserver", "snapshots"), func(context.Context) {
		defer d.wg.Done()
		t := time.NewTicker(d.s.cfg.SnapshotInterval)
		defer t.Stop()
		for {
			select {
			case <-d.quit:
				return
			case <-t.C:
			case <-d.kick:
			}
			if d.since.Load() == 0 {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			if err := d.snapshot(ctx); err != nil {
				d.s.log.Warn().Err(err).Msg("state snapshot failed; will retry")
			}
			cancel()
		}
	})
}

func (d *snapshotDurability) start(ctx context.Context) error {
	if err := d.open(ctx); err != nil {
		return err
	}
	d.startLoop()
	return nil
}

func (d *snapshotDurability) handle(m *nats.Msg) { d.s.onSyncDirect(m) }

func (d *snapshotDurability) applied() {
	if d.since.Add(1) >= int64(d.s.cfg.SnapshotEvery) {
		select {
		case d.kick <- struct{}{}:
		default:
		}
	}
}

// snapshot writes the state to the bucket (nothing before start).
func (d *snapshotDurability) snapshot(ctx context.Context) error {
	if d.kv == nil {
		return nil
	}
	s := d.s
	start := time.Now()
	n := d.since.Swap(0)
	data, seq, err := s.encode()
	if err != nil {
		d.since.Add(n)
		return err
	}
	written, err := saveSnapshot(ctx, d.kv, s.cfg.Shard, data, seq, d.onlyNewer)
	if err != nil {
		d.since.Add(n)
		return err
	}
	s.metrics.snapshots.Inc()
	s.metrics.snapshotBytes.Set(float64(len(data)))
	s.metrics.snapshotSeconds.Observe(time.Since(start).Seconds())
	if written && d.afterSave != nil {
		return d.afterSave(ctx, seq)
	}
	return nil
}

func (d *snapshotDurability) settle(context.Context) error { return nil }

func (d *snapshotDurability) stop() {
	d.once.Do(func() {
		close(d.quit)
		d.wg.Wait()
	})
}
