// Package pserver is Kipimo's parameter server: it merges the detectors'
// per-step model deltas into a global model and answers each sync with it,
// keeps the run's aggregates (anomalies per rank and io_step, per function,
// per rank and function, per counter), persists its state in NATS JetStream so
// a restart loses nothing, and serves a live dashboard (JSON pull endpoints, a
// Server-Sent Events stream, an embedded web page) and Prometheus metrics.
//
// Several instances can share a run: each serves one shard of the model keys
// (syncproto.Shard), and several instances may serve the same shard (a queue
// group), in which case they apply the same write-ahead log in the same order
// and hold identical state.
package pserver

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kipimo-hpc/kipimo/internal/baseline"
	"github.com/kipimo-hpc/kipimo/internal/daemon"
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

// Config is the parameter server's settings: Run uses all of them, New
// (a Server in a process of its own or embedded, as kipimo run does) all but
// NATS, TokenFile and ProvDBTokenFile. Each field set by a flag of the pserver command names
// it. Fields marked "0: default" take DefaultConfig's value in New when left
// zero; the others mean what their zero value says.
type Config struct {
	NATS string // --nats: NATS server URL(s), comma-separated (Run)
	// NATSAuth (--nats-creds, --nats-user, --nats-ca...) is who the
	// pserver is to NATS, and TLS (Run)
	NATSAuth daemon.NATSAuth
	Run      string // --run: run id (a NATS subject token); required
	Shard    int    // --shard: shard this instance serves, in [0, Shards)
	Shards   int    // --shards: number of shards the model keys are split into; 0: default

	Durability       string        // --durability: DurabilityWAL, DurabilitySnapshot or DurabilityNone; "": default
	SnapshotInterval time.Duration // --snapshot-interval; 0: default
	SnapshotEvery    int           // --snapshot-every: also snapshot after this many applied requests; 0: default
	Window           int           // --window: io_steps kept in full; 0: default

	HTTPAddr string // --http: dashboard and /metrics listener; "" starts none (mount Handler elsewhere)
	// TokenFile (--token-file) names the file holding the bearer token of
	// the HTTP API; Run reads it (daemon.Secret) into Token.
	TokenFile string
	// Token is the bearer token itself (internal/daemon's rule, ?token=
	// allowed); "" serves without one.
	Token     string
	ProvDBURL string // --provdb-url: base URL of the provdb query API, proxied under /provdb/
	// ProvDBTokenFile (--provdb-token-file) names the file holding the
	// bearer token of the provdb query API; Run reads it into ProvDBToken.
	ProvDBTokenFile string
	// ProvDBToken is the bearer token the proxy sends to provdb (the
	// dashboard's own token, or the one a page was opened with, never
	// reaches provdb); "" sends none.
	ProvDBToken string
	// ProvDBList is the provdb path listing anomaly records (filters rank,
	// pid, func, sort, order, limit are appended); "": default (provdb's query API).
	ProvDBList string
	// ProvDBRecord is the provdb path of one record, with {pid} and
	// {event_id} placeholders; "": default.
	ProvDBRecord  string
	MaxRankSeries int // --max-rank-series: per-rank Prometheus series limit; 0: default
	// Metrics is the registry the server registers its Prometheus metrics
	// on (the Go and process collectors included) and serves on /metrics;
	// nil: a registry of its own. The caller owns it (Run makes one).
	Metrics     *prometheus.Registry
	SSEBuffer   int           // per-client SSE queue length; 0: default
	UpdateEvery time.Duration // throttle of SSE updates; 0: default

	// SyncWorkers is the number of subscriptions of the queue group in this
	// process (parallel decoding); 0: default.
	SyncWorkers int

	// Baseline, when set, is the run the detectors compare this one with
	// (ad.Config.Baseline): the final ranges (FinalRanges, the func_stats
	// records) of keys with a new slow mode against it end where the mode
	// starts.
	Baseline *baseline.Reference
	// BaselineRef (--baseline) names that run as ad --baseline does (a run
	// directory, provenance store, http://PROVDB, TAU profile or taudb:ID);
	// Run reads it into Baseline. BaselineTokenFile (--baseline-token-file)
	// holds the bearer token of an http:// baseline's provdb, BaselineDSN
	// (--baseline-dsn, default $KIPIMO_TAUDB_DSN) the TAUdb of a taudb:
	// one.
	BaselineRef, BaselineTokenFile, BaselineDSN string
}

// DefaultConfig is the pserver command's defaults (Run is left empty: it is
// required).
func DefaultConfig() Config {
	return Config{
		NATS:             "nats://127.0.0.1:4222",
		Shards:           1,
		Durability:       DurabilityWAL,
		SnapshotInterval: 5 * time.Second,
		SnapshotEvery:    20000,
		Window:           DefaultWindow,
		HTTPAddr:         "127.0.0.1:8080",
		ProvDBList:       "/api/v1/records",
		ProvDBRecord:     "/api/v1/records/anomalies/{pid}/{event_id}",
		MaxRankSeries:    64,
		SSEBuffer:        16,
		UpdateEvery:      250 * time.Millisecond,
		SyncWorkers:      2,
	}
}

// withDefaults returns c with the fields marked "0: default" that are zero
// set to DefaultConfig's values.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	fill := func(v *int, def int) {
		if *v == 0 {
			*v = def
		}
	}
	fillDur := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	fillStr := func(v *string, def string) {
		if *v == "" {
			*v = def
		}
	}
	fill(&c.Shards, d.Shards)
	fillStr(&c.Durability, d.Durability)
	fillDur(&c.SnapshotInterval, d.SnapshotInterval)
	fill(&c.SnapshotEvery, d.SnapshotEvery)
	fill(&c.Window, d.Window)
	fillStr(&c.ProvDBList, d.ProvDBList)
	fillStr(&c.ProvDBRecord, d.ProvDBRecord)
	fill(&c.MaxRankSeries, d.MaxRankSeries)
	fill(&c.SSEBuffer, d.SSEBuffer)
	fillDur(&c.UpdateEvery, d.UpdateEvery)
	fill(&c.SyncWorkers, d.SyncWorkers)
	return c
}

// Validate checks c as it will be used, changing nothing; errors name the
// flag (or, for settings without one, the field). NATS is checked only when
// set: New does not use it.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	errs = append(errs, daemon.CheckRunAndNATS(c.Run, c.NATS, "give the run id the detectors use")...)
	if c.Shards < 1 {
		bad("--shards %d must be at least 1", c.Shards)
	} else if c.Shard < 0 || c.Shard >= c.Shards {
		bad("--shard %d is not in [0, %d) (--shards %d)", c.Shard, c.Shards, c.Shards)
	}
	switch c.Durability {
	case DurabilityWAL, DurabilitySnapshot, DurabilityNone:
	default:
		bad("--durability %q is not wal, snapshot or none", c.Durability)
	}
	if c.SnapshotInterval <= 0 {
		bad("--snapshot-interval %v must be positive", c.SnapshotInterval)
	}
	if c.SnapshotEvery < 1 {
		bad("--snapshot-every %d must be at least 1", c.SnapshotEvery)
	}
	if c.Window < 1 {
		bad("--window %d must be at least 1", c.Window)
	}
	if c.HTTPAddr != "" {
		if _, _, err := net.SplitHostPort(c.HTTPAddr); err != nil {
			bad("--http %q: %w", c.HTTPAddr, err)
		}
	}
	if c.TokenFile != "" && c.Token != "" {
		bad("--token-file %s and a Token are both set: give one", c.TokenFile)
	}
	if c.ProvDBTokenFile != "" && c.ProvDBToken != "" {
		bad("--provdb-token-file %s and a ProvDBToken are both set: give one", c.ProvDBTokenFile)
	}
	if (c.ProvDBTokenFile != "" || c.ProvDBToken != "") && c.ProvDBURL == "" {
		bad("--provdb-token-file is set without --provdb-url: give the provdb query API's URL too")
	}
	if c.ProvDBURL != "" {
		if u, err := url.Parse(c.ProvDBURL); err != nil {
			bad("--provdb-url %q: %w", c.ProvDBURL, err)
		} else if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("--provdb-url %q: want http://host:port or https://host:port", c.ProvDBURL)
		}
	}
	if !strings.HasPrefix(c.ProvDBList, "/") {
		bad("ProvDBList %q must be a path starting with /", c.ProvDBList)
	}
	if !strings.HasPrefix(c.ProvDBRecord, "/") || !strings.Contains(c.ProvDBRecord, "{pid}") || !strings.Contains(c.ProvDBRecord, "{event_id}") {
		bad("ProvDBRecord %q must be a path starting with / holding {pid} and {event_id}", c.ProvDBRecord)
	}
	if c.BaselineRef != "" && c.Baseline != nil {
		bad("--baseline %s and a Baseline are both set: give one", c.BaselineRef)
	}
	if c.BaselineRef == "" && (c.BaselineTokenFile != "" || c.BaselineDSN != "") {
		bad("--baseline-token-file or --baseline-dsn is set without --baseline: name the baseline run too")
	}
	if c.MaxRankSeries < 0 {
		bad("--max-rank-series %d must not be negative", c.MaxRankSeries)
	}
	if c.SSEBuffer < 1 {
		bad("SSEBuffer %d must be at least 1", c.SSEBuffer)
	}
	if c.UpdateEvery <= 0 {
		bad("UpdateEvery %v must be positive", c.UpdateEvery)
	}
	if c.SyncWorkers < 1 {
		bad("SyncWorkers %d must be at least 1", c.SyncWorkers)
	}
	if len(errs) > 0 {
		// The program's name comes once, from its main ("pserver: --run ...").
		return errors.Join(errs...)
	}
	return nil
}
