package pserver

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/spf13/pflag"

	"github.com/kipimo-hpc/kipimo/internal/ad"
	"github.com/kipimo-hpc/kipimo/internal/baseline"
	"github.com/kipimo-hpc/kipimo/internal/baseline/load"
	"github.com/kipimo-hpc/kipimo/internal/daemon"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
)

// runUsage is what pserver --help prints above its flags.
const runUsage = `Usage: pserver --run ID [flags]

Kipimo parameter server: merges the detectors' models, keeps the run's
aggregates and serves the live dashboard and Prometheus metrics.`

// parseArgs reads the pserver settings from args, then the environment
// (lookup, normally os.LookupEnv) and a --config file, as internal/config
// describes, into a Config and the --log-level value. It returns
// pflag.ErrHelp after printing help on stderr.
func parseArgs(args []string, lookup func(string) (string, bool), stderr io.Writer) (Config, daemon.Process, error) {
	fs := pflag.NewFlagSet("pserver", pflag.ContinueOnError)
	c := DefaultConfig()
	fs.StringVar(&c.NATS, "nats", c.NATS, "NATS server URL(s), comma-separated")
	auth := daemon.AddNATSAuthFlags(fs)
	fs.StringVar(&c.Run, "run", "", "run id (required; letters, digits, '-' and '_')")
	fs.StringVar(&c.HTTPAddr, "http", c.HTTPAddr, "dashboard, JSON API and /metrics listen address (\"\" disables)")
	fs.IntVar(&c.Shard, "shard", c.Shard, "shard of the model keys this instance serves, in [0, shards)")
	fs.IntVar(&c.Shards, "shards", c.Shards, "number of shards the model keys are split into")
	fs.StringVar(&c.ProvDBURL, "provdb-url", "", "base URL of the provdb query API for the dashboard's click-through, e.g. http://127.0.0.1:8081")
	fs.StringVar(&c.TokenFile, "token-file", "", "file holding a bearer token required by every HTTP request (header, or ?token= from a browser)")
	fs.StringVar(&c.ProvDBTokenFile, "provdb-token-file", "", "file holding the bearer token of the provdb query API at --provdb-url (its --token-file), sent by the dashboard's /provdb/ proxy")
	fs.StringVar(&c.Durability, "durability", c.Durability, "wal (log every sync before answering; survives crashes), snapshot (periodic snapshots; survives clean restarts) or none")
	fs.DurationVar(&c.SnapshotInterval, "snapshot-interval", c.SnapshotInterval, "how often the state is snapshotted to the key-value bucket")
	fs.IntVar(&c.SnapshotEvery, "snapshot-every", c.SnapshotEvery, "also snapshot after this many applied sync requests")
	fs.IntVar(&c.Window, "window", c.Window, "io_steps kept in full per rank; older steps are folded into per-rank totals")
	fs.IntVar(&c.MaxRankSeries, "max-rank-series", c.MaxRankSeries, "ranks with their own Prometheus series (the first ones seen)")
	fs.StringVar(&c.BaselineRef, "baseline", "", "the finished run the detectors compare this one with (the REF of their ad --baseline): its run directory or provenance store (SQLite file, mongodb:// URI), http://PROVDB, a TAU profile or taudb:ID; the final natural range of a function with a new slow mode against it ends where the mode starts, so that kipimo query's end-of-run relabelling keeps those anomalies, and the dashboard compares the run with it (docs/diff.md)")
	fs.StringVar(&c.BaselineTokenFile, "baseline-token-file", "", "--baseline http://...: file holding the bearer token of the provdb's HTTP API")
	fs.StringVar(&c.BaselineDSN, "baseline-dsn", "", "--baseline taudb:ID: PostgreSQL URL of the TAUdb (default $KIPIMO_TAUDB_DSN)")
	proc := daemon.AddProcessFlags(fs)
	if err := daemon.ParseFlags(fs, "pserver", runUsage, args, lookup, stderr); err != nil {
		return c, *proc, err
	}
	c.NATSAuth = *auth
	return c, *proc, nil
}

// command is the pserver command: its flags into a Config, then Run.
var command = daemon.Command[Config]{Parse: parseArgs, Run: Run}

// Main is the pserver command (daemon.Command): flags (and KIPIMO_*
// environment, a YAML --config file) into a Config, the logger on stderr,
// Validate, then Run until ctx is cancelled (SIGINT/SIGTERM in
// cmd/pserver). It returns pflag.ErrHelp after printing help.
func Main(ctx context.Context, args []string, stderr io.Writer) error {
	return command.Main(ctx, args, stderr)
}

// loadBaseline reads the baseline cfg.BaselineRef names (nil without one),
// its bounds with the detectors' default natural-range rule until they
// send theirs (referenceFor).
func loadBaseline(ctx context.Context, cfg Config) (*baseline.Reference, error) {
	if cfg.BaselineRef == "" {
		return cfg.Baseline, nil
	}
	dsn := cfg.BaselineDSN
	if dsn == "" {
		dsn = os.Getenv("KIPIMO_TAUDB_DSN")
	}
	def := ad.Config{}
	if err := def.Validate(); err != nil {
		return nil, err
	}
	ref, err := load.Reference(ctx, cfg.BaselineRef, load.Options{Rule: def.TailRule(), TokenFile: cfg.BaselineTokenFile, TaudbDSN: dsn})
	if err != nil {
		return nil, fmt.Errorf("--baseline: %w", err)
	}
	return ref, nil
}

// Run serves one shard of a run as cfg says: it reads the token files,
// connects to NATS, starts a Server (state loaded, log replayed, HTTP
// listening; its metrics on a registry made here and served on /metrics),
// serves until ctx is cancelled, then shuts down cleanly within
// daemon.ShutdownTimeout: requests accepted are applied and answered, a
// final snapshot is written and the end-of-run statistics are published.
func Run(ctx context.Context, cfg Config, log zerolog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	token, err := daemon.Secret("token-file", cfg.TokenFile)
	if err != nil {
		return err
	}
	if token != "" {
		cfg.Token, cfg.TokenFile = token, ""
	}
	ptoken, err := daemon.Secret("provdb-token-file", cfg.ProvDBTokenFile)
	if err != nil {
		return err
	}
	if ptoken != "" {
		cfg.ProvDBToken, cfg.ProvDBTokenFile = ptoken, ""
	}
	if cfg.Baseline, err = loadBaseline(ctx, cfg); err != nil {
		return err
	}
	cfg.BaselineRef, cfg.BaselineTokenFile, cfg.BaselineDSN = "", "", ""
	cfg.Metrics = prometheus.NewRegistry()
	s, err := New(cfg, log)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	authOpts, err := cfg.NATSAuth.Options()
	if err != nil {
		return err
	}
	nc, err := natsx.Connect(cctx, cfg.NATS, "kipimo-pserver", append(authOpts, natsx.Logged(log))...)
	if err != nil {
		return err
	}
	defer nc.Close()
	err = daemon.Serve(ctx, daemon.Funcs{
		// Starting (state loaded, log replayed) is bounded by 30s.
		StartFunc: func(context.Context) error { return s.Start(cctx, nc) },
		ShutdownFunc: func(sctx context.Context) error {
			if err := s.Shutdown(sctx); err != nil {
				return fmt.Errorf("pserver shutdown: %w", err)
			}
			return nil
		},
	})
	return err
}
