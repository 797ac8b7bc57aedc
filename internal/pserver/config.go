// Package pserver is Kipimo's parameter server: it merges the detectors'
// per-step model deltas into a global model and answers each sync with it,
// keeps the run's aggregates (anomalies per rank and io_step, per function,
// per rank and function, per counter), persists its state in NATS JetStream so
// a restart loses nothing, and serves a live dashboard (JSON pull endpoints, a
// Server-Sent Events stream, an embedded web page) and Prometheus metrics.
//
// Several instances can share a run: each serves one shard of the model keys
// (psync.Shard), and several instances may serve the same shard (a queue
// group), in which case they apply the same write-ahead log in the same order
// and hold identical state.
package pserver

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/natsx"
)

// DefaultWindow is the number of recent io_steps kept in full per rank.
const DefaultWindow = 1000

// Durability modes.
const (
	// DurabilityWAL appends every sync request to a JetStream stream before it
	// is applied and answered; state is rebuilt from the last snapshot plus the
	// log, so nothing answered is ever lost, even on a crash.
	DurabilityWAL = "wal"
	// DurabilitySnapshot applies and answers at once and snapshots
	// periodically and on shutdown: a clean restart loses nothing, a crash loses
	// what was applied since the last snapshot.
	DurabilitySnapshot = "snapshot"
	// DurabilityNone keeps the state in memory only.
	DurabilityNone = "none"
)

// Config configures a Server. The zero value plus a Run is valid after Validate.
type Config struct {
	Run    string // run id (a NATS subject token)
	Shard  int    // shard this instance serves, in [0, Shards)
	Shards int    // number of shards the model keys are split into; default 1

	Durability       string        // DurabilityWAL (default), DurabilitySnapshot or DurabilityNone
	SnapshotInterval time.Duration // default 5s
	SnapshotEvery    int           // also snapshot after this many applied requests; default 20000
	Window           int           // io_steps kept in full; default DefaultWindow

	HTTPAddr  string // dashboard and /metrics listener; "" starts none (mount Handler elsewhere)
	Token     string // optional bearer token for HTTP
	ProvDBURL string // base URL of the provdb query API, proxied under /provdb/
	// ProvDBList is the provdb path listing anomaly records (filters rank,
	// pid, func, sort, order, limit are appended); default "/api/v1/records" (provdb's query API).
	ProvDBList string
	// ProvDBRecord is the provdb path of one record, with {pid} and
	// {event_id} placeholders; default "/api/v1/records/anomalies/{pid}/{event_id}".
	ProvDBRecord  string
	MaxRankSeries int           // per-rank Prometheus series limit; default 64
	SSEBuffer     int           // per-client SSE queue length; default 16
	UpdateEvery   time.Duration // throttle of SSE updates; default 250ms

	// SyncWorkers is the number of subscriptions of the queue group in this
	// process (parallel decoding in snapshot mode); default 2.
	SyncWorkers int
}

// Validate checks c and fills defaults.
func (c *Config) Validate() error {
	if err := natsx.ValidRun(c.Run); err != nil {
		return fmt.Errorf("pserver config: %w", err)
	}
	if c.Shards == 0 {
		c.Shards = 1
	}
	if c.Shards < 1 {
		return fmt.Errorf("pserver config: shards %d must be at least 1", c.Shards)
	}
	if c.Shard < 0 || c.Shard >= c.Shards {
		return fmt.Errorf("pserver config: shard %d is not in [0, %d)", c.Shard, c.Shards)
	}
	switch c.Durability {
	case "":
		c.Durability = DurabilityWAL
	case DurabilityWAL, DurabilitySnapshot, DurabilityNone:
	default:
		return fmt.Errorf("pserver config: durability %q is not wal, snapshot or none", c.Durability)
	}
	if c.SnapshotInterval <= 0 {
		c.SnapshotInterval = 5 * time.Second
	}
	if c.SnapshotEvery <= 0 {
		c.SnapshotEvery = 20000
	}
	if c.Window <= 0 {
		c.Window = DefaultWindow
	}
	if c.HTTPAddr != "" {
		if _, _, err := net.SplitHostPort(c.HTTPAddr); err != nil {
			return fmt.Errorf("pserver config: http address %q: %w", c.HTTPAddr, err)
		}
	}
	if c.MaxRankSeries < 0 {
		return errors.New("pserver config: max rank series must not be negative")
	}
	if c.MaxRankSeries == 0 {
		c.MaxRankSeries = 64
	}
	if c.ProvDBList == "" {
		c.ProvDBList = "/api/v1/records"
	}
	if c.ProvDBRecord == "" {
		c.ProvDBRecord = "/api/v1/records/anomalies/{pid}/{event_id}"
	}
	if c.SSEBuffer <= 0 {
		c.SSEBuffer = 16
	}
	if c.UpdateEvery <= 0 {
		c.UpdateEvery = 250 * time.Millisecond
	}
	if c.SyncWorkers <= 0 {
		c.SyncWorkers = 2
	}
	return nil
}
