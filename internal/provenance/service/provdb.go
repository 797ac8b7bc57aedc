package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/spf13/pflag"

	"github.com/kipimo-hpc/kipimo/internal/config"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/mongostore"
	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
)

// OpenStore opens the store spec names: a mongodb:// (or mongodb+srv://)
// URI, or else the path of a SQLite file. readOnly opens a SQLite store for
// queries only.
func OpenStore(ctx context.Context, spec string, readOnly bool) (provenance.Store, error) {
	if strings.HasPrefix(spec, "mongodb://") || strings.HasPrefix(spec, "mongodb+srv://") {
		return mongostore.Open(ctx, spec)
	}
	if readOnly {
		if _, err := os.Stat(spec); err != nil {
			return nil, fmt.Errorf("open provenance store: %w", err)
		}
	}
	return sqlitestore.Open(ctx, spec, sqlitestore.Options{ReadOnly: readOnly})
}

// mainOptions are the settings of the provdb command.
type mainOptions struct {
	natsURL   string
	storeSpec string
	run       string
	httpAddr  string
	tokenFile string
	durable   string
	origin    string
	ackWait   time.Duration
	level     string
}

// mainUsage is what provdb --help prints above its flags.
const mainUsage = `Usage: provdb --run ID [flags]

provdb consumes a Kipimo run's provenance records from NATS JetStream into a store
and serves read-only queries on it over HTTP.`

// parseMainArgs reads the provdb settings from args, then the environment
// (lookup, normally os.LookupEnv) and a --config file, as internal/config
// describes. It returns pflag.ErrHelp after printing help on stderr.
func parseMainArgs(args []string, lookup func(string) (string, bool), stderr io.Writer) (mainOptions, error) {
	fs := pflag.NewFlagSet("provdb", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	var o mainOptions
	fs.StringVar(&o.natsURL, "nats", "nats://127.0.0.1:4222", "NATS server URL(s), comma-separated")
	fs.StringVar(&o.storeSpec, "store", "./kipimo-prov.db", "provenance store: a SQLite file path or a mongodb:// URI")
	fs.StringVar(&o.run, "run", "", "run id whose provenance stream is consumed (required)")
	fs.StringVar(&o.httpAddr, "http", "127.0.0.1:8081", "address of the read-only HTTP query API; empty disables it")
	fs.StringVar(&o.tokenFile, "token-file", "", "file holding the bearer token the HTTP API requires")
	fs.StringVar(&o.durable, "durable", "provdb", "name of the durable JetStream consumer")
	fs.StringVar(&o.origin, "allow-origin", "", "Access-Control-Allow-Origin of the HTTP API (e.g. the dashboard's origin)")
	fs.DurationVar(&o.ackWait, "ack-wait", 60*time.Second, "how long JetStream waits for a batch's acknowledgement before redelivering it")
	fs.StringVar(&o.level, "log-level", "info", "log level: debug, info, warn, error")
	config.AddConfigFlag(fs)
	config.SetUsage(fs, stderr, mainUsage)
	if err := config.Parse(fs, args, lookup); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("provdb takes no arguments, got %q", fs.Args())
	}
	return o, nil
}

// Main is the provdb command: it parses args (flags, KIPIMO_* environment, a
// YAML --config file), consumes the run's provenance stream into the store
// and serves the query API until ctx ends (SIGINT or SIGTERM in cmd/provdb),
// then shuts down cleanly. Logs go to stderr. It returns pflag.ErrHelp after
// printing help.
func Main(ctx context.Context, args []string, stderr io.Writer) error {
	o, err := parseMainArgs(args, os.LookupEnv, stderr)
	if err != nil {
		return err
	}
	lvl, err := zerolog.ParseLevel(o.level)
	if err != nil {
		return fmt.Errorf("--log-level %q: %w", o.level, err)
	}
	log := zerolog.New(stderr).Level(lvl).With().Timestamp().Logger()
	if o.run == "" {
		return errors.New("--run is required: the run id whose provenance to consume")
	}
	if err := natsx.ValidRun(o.run); err != nil {
		return fmt.Errorf("--run: %w", err)
	}
	token := ""
	if o.tokenFile != "" {
		b, err := os.ReadFile(o.tokenFile)
		if err != nil {
			return fmt.Errorf("--token-file: %w", err)
		}
		if token = strings.TrimSpace(string(b)); token == "" {
			return fmt.Errorf("--token-file %s is empty", o.tokenFile)
		}
	}

	store, err := OpenStore(ctx, o.storeSpec, false)
	if err != nil {
		return err
	}
	defer store.Close()
	nc, err := natsx.Connect(ctx, o.natsURL, "kipimo-provdb")
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("JetStream: %w", err)
	}
	svc := New(Config{Run: o.run, Durable: o.durable, AckWait: o.ackWait, Logger: &log}, store, js)
	if err := svc.Start(ctx); err != nil {
		return err
	}
	var srv *http.Server
	httpErr := make(chan error, 1)
	if o.httpAddr != "" {
		ln, err := net.Listen("tcp", o.httpAddr)
		if err != nil {
			_ = svc.Shutdown(context.Background())
			return fmt.Errorf("--http %s: %w", o.httpAddr, err)
		}
		srv = &http.Server{
			Handler:           NewHTTPHandler(store, token, WithAllowOrigin(o.origin), WithStats(svc.Stats)),
			ReadHeaderTimeout: 10 * time.Second,
		}
		log.Info().Str("addr", ln.Addr().String()).Bool("token", token != "").Msg("query API listening")
		go func() { httpErr <- srv.Serve(ln) }()
	}
	select {
	case <-ctx.Done():
	case err := <-httpErr:
		log.Error().Err(err).Msg("query API stopped")
	}
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs []error
	if srv != nil {
		errs = append(errs, srv.Shutdown(sctx))
	}
	errs = append(errs, svc.Shutdown(sctx))
	return errors.Join(errs...)
}
