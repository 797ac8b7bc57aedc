package pserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"github.com/rs/zerolog/log"
	"github.com/spf13/pflag"

	"github.com/kipimo-hpc/kipimo/internal/config"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
)

// runOptions are the settings of the pserver command.
type runOptions struct {
	cfg       Config
	natsURL   string
	tokenFile string
	level     string
}

// runUsage is what pserver --help prints above its flags.
const runUsage = `Usage: pserver --run ID [flags]

Kipimo parameter server: merges the detectors' models, keeps the run's
aggregates and serves the live dashboard and Prometheus metrics.`

// parseRunArgs reads the pserver settings from args, then the environment
// (lookup, normally os.LookupEnv) and a --config file, as internal/config
// describes. It returns pflag.ErrHelp after printing help on stderr.
func parseRunArgs(args []string, lookup func(string) (string, bool), stderr io.Writer) (runOptions, error) {
	fs := pflag.NewFlagSet("pserver", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	var o runOptions
	cfg := &o.cfg
	fs.StringVar(&o.natsURL, "nats", "nats://127.0.0.1:4222", "NATS server URL(s), comma-separated")
	fs.StringVar(&cfg.Run, "run", "", "run id (required; letters, digits, '-' and '_')")
	fs.StringVar(&cfg.HTTPAddr, "http", "127.0.0.1:8080", "dashboard, JSON API and /metrics listen address (\"\" disables)")
	fs.IntVar(&cfg.Shard, "shard", 0, "shard of the model keys this instance serves, in [0, shards)")
	fs.IntVar(&cfg.Shards, "shards", 1, "number of shards the model keys are split into")
	fs.StringVar(&cfg.ProvDBURL, "provdb-url", "", "base URL of the provdb query API for the dashboard's click-through, e.g. http://127.0.0.1:8081")
	fs.StringVar(&o.tokenFile, "token-file", "", "file holding a bearer token required by every HTTP request")
	fs.StringVar(&cfg.Durability, "durability", DurabilityWAL, "wal (log every sync before answering; survives crashes), snapshot (periodic snapshots; survives clean restarts) or none")
	fs.DurationVar(&cfg.SnapshotInterval, "snapshot-interval", 5*time.Second, "how often the state is snapshotted to the key-value bucket")
	fs.IntVar(&cfg.SnapshotEvery, "snapshot-every", 20000, "also snapshot after this many applied sync requests")
	fs.IntVar(&cfg.Window, "window", DefaultWindow, "io_steps kept in full per rank; older steps are folded into per-rank totals")
	fs.IntVar(&cfg.MaxRankSeries, "max-rank-series", 64, "ranks with their own Prometheus series (the first ones seen)")
	fs.StringVar(&o.level, "log-level", "info", "log level: debug, info, warn, error")
	config.AddConfigFlag(fs)
	config.SetUsage(fs, stderr, runUsage)
	if err := config.Parse(fs, args, lookup); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q: pserver takes flags only", fs.Args())
	}
	return o, nil
}

// Run is the pserver command: it parses args (flags, KIPIMO_* environment, a
// YAML --config file), connects to NATS, serves until ctx is cancelled
// (SIGINT/SIGTERM in cmd/pserver), then shuts down cleanly: final snapshot
// and end-of-run statistics. It returns pflag.ErrHelp after printing help.
func Run(ctx context.Context, args []string, stderr io.Writer) error {
	o, err := parseRunArgs(args, os.LookupEnv, stderr)
	if err != nil {
		return err
	}
	cfg, natsURL, tokenFile, level := o.cfg, o.natsURL, o.tokenFile, o.level
	lvl, err := zerolog.ParseLevel(level)
	if err != nil {
		return fmt.Errorf("--log-level %q: %w", level, err)
	}
	zerolog.SetGlobalLevel(lvl)
	log.Logger = zerolog.New(stderr).With().Timestamp().Logger()
	if cfg.Run == "" {
		return errors.New("--run is required: give the run id the detectors use")
	}
	if tokenFile != "" {
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			return fmt.Errorf("read --token-file: %w", err)
		}
		cfg.Token = strings.TrimSpace(string(b))
		if cfg.Token == "" {
			return fmt.Errorf("--token-file %s is empty", tokenFile)
		}
	}
	s, err := New(cfg)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	nc, err := natsx.Connect(cctx, natsURL, "kipimo-pserver")
	if err != nil {
		return err
	}
	defer nc.Close()
	if err := s.Start(cctx, nc); err != nil {
		return err
	}
	<-ctx.Done()
	sctx, scancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer scancel()
	if err := s.Shutdown(sctx); err != nil {
		return fmt.Errorf("pserver shutdown: %w", err)
	}
	return nil
}
