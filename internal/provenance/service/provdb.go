package service

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"github.com/kipimo-hpc/kipimo/internal/config"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

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

// Main is the provdb command: it parses args, consumes the run's provenance
// stream into the store and serves the query API until ctx ends (SIGINT or
// SIGTERM in cmd/provdb), then shuts down cleanly. Logs go to stderr.
func Main(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("provdb", flag.ContinueOnError)
	fs.SetOutput(stderr)
	natsURL := fs.String("nats", "nats://127.0.0.1:4222", "NATS server URL(s), comma-separated")
	storeSpec := fs.String("store", "./kipimo-prov.db", "provenance store: a SQLite file path or a mongodb:// URI")
	run := fs.String("run", "", "run id whose provenance stream is consumed (required)")
	httpAddr := fs.String("http", "127.0.0.1:8081", "address of the read-only HTTP query API; empty disables it")
	tokenFile := fs.String("token-file", "", "file holding the bearer token the HTTP API requires")
	durable := fs.String("durable", "provdb", "name of the durable JetStream consumer")
	origin := fs.String("allow-origin", "", "Access-Control-Allow-Origin of the HTTP API (e.g. the dashboard's origin)")
	ackWait := fs.Duration("ack-wait", 60*time.Second, "how long JetStream waits for a batch's acknowledgement before redelivering it")
	level := fs.String("log-level", "info", "log level: debug, info, warn, error")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "provdb consumes a Kipimo run's provenance records from NATS JetStream into a store\nand serves read-only queries on it over HTTP.\n\nUsage: provdb --run ID [flags]")
		fs.PrintDefaults()
	}
	config.AddConfigFlagStd(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := config.ApplyStd(fs, os.LookupEnv); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("provdb takes no arguments, got %q", fs.Args())
	}
	lvl, err := zerolog.ParseLevel(*level)
	if err != nil {
		return fmt.Errorf("--log-level %q: %w", *level, err)
	}
	log := zerolog.New(stderr).Level(lvl).With().Timestamp().Logger()
	if *run == "" {
		return errors.New("--run is required: the run id whose provenance to consume")
	}
	if err := natsx.ValidRun(*run); err != nil {
		return fmt.Errorf("--run: %w", err)
	}
	token := ""
	if *tokenFile != "" {
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			return fmt.Errorf("--token-file: %w", err)
		}
		if token = strings.TrimSpace(string(b)); token == "" {
			return fmt.Errorf("--token-file %s is empty", *tokenFile)
		}
	}

	store, err := OpenStore(ctx, *storeSpec, false)
	if err != nil {
		return err
	}
	defer store.Close()
	nc, err := natsx.Connect(ctx, *natsURL, "kipimo-provdb")
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("JetStream: %w", err)
	}
	svc := New(Config{Run: *run, Durable: *durable, AckWait: *ackWait, Logger: &log}, store, js)
	if err := svc.Start(ctx); err != nil {
		return err
	}
	var srv *http.Server
	httpErr := make(chan error, 1)
	if *httpAddr != "" {
		ln, err := net.Listen("tcp", *httpAddr)
		if err != nil {
			_ = svc.Shutdown(context.Background())
			return fmt.Errorf("--http %s: %w", *httpAddr, err)
		}
		srv = &http.Server{
			Handler:           NewHTTPHandler(store, token, WithAllowOrigin(*origin), WithStats(svc.Stats)),
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
