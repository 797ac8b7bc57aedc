package provdb

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
	"github.com/spf13/pflag"

	"github.com/kipimo-hpc/kipimo/internal/daemon"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/mongostore"
	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
)

// Config is provdb's settings: Run (the provdb command) uses all of them, a
// Service (New, embedded as kipimo run does) the consumer's: Run, Durable,
// Fetch, FetchWait, AckWait and RetryDelay. Each field set by a flag of the
// provdb command names it. Fields marked "0: default" take DefaultConfig's
// value in New when left zero; the others mean what their zero value says.
type Config struct {
	NATS string // --nats: NATS server URL(s), comma-separated (Run)
	// NATSAuth (--nats-creds, --nats-user, --nats-ca...) is who provdb is
	// to NATS, and TLS (Run)
	NATSAuth daemon.NATSAuth
	Store    string // --store: a SQLite file path or a mongodb:// URI (Run)
	// Run (--run) is the run id whose stream is consumed. Required.
	Run         string
	HTTPAddr    string // --http: address of the read-only query API; "" serves none (Run)
	TokenFile   string // --token-file: file holding the API's bearer token (Run)
	AllowOrigin string // --allow-origin: Access-Control-Allow-Origin of the API (Run)
	// Durable (--durable) names the durable consumer; "": default. Two
	// provdb processes with the same Durable share the work.
	Durable string
	// Fetch is the number of messages (batches) fetched at once; 0: default.
	Fetch int
	// FetchWait bounds one fetch when the stream is idle, and so how long
	// Shutdown waits for the fetch under way; 0: default.
	FetchWait time.Duration
	// AckWait (--ack-wait) is how long JetStream waits for an
	// acknowledgement before redelivering, and so how long the batches a
	// killed provdb held wait before a restarted one gets them; 0:
	// default. Batches held longer (a slow store write) are kept from
	// redelivery by in-progress acknowledgements every third of it.
	AckWait time.Duration
	// RetryDelay is the redelivery delay of a batch whose write failed;
	// 0: default.
	RetryDelay time.Duration
	// Metrics, when set, is where Start registers the service's Prometheus
	// metrics (kipimo_provdb_*); the caller owns it (Run makes a registry
	// and serves it on the query API's /metrics).
	Metrics prometheus.Registerer
}

// DefaultConfig is the provdb command's defaults (Run is left empty: it is
// required).
func DefaultConfig() Config {
	return Config{
		NATS:       "nats://127.0.0.1:4222",
		Store:      "./kipimo-prov.db",
		HTTPAddr:   "127.0.0.1:8081",
		Durable:    "provdb",
		Fetch:      16,
		FetchWait:  time.Second,
		AckWait:    10 * time.Second,
		RetryDelay: 2 * time.Second,
	}
}

// withDefaults returns c with the zero "0: default" fields set to
// DefaultConfig's values.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Durable == "" {
		c.Durable = d.Durable
	}
	if c.Fetch == 0 {
		c.Fetch = d.Fetch
	}
	if c.FetchWait == 0 {
		c.FetchWait = d.FetchWait
	}
	if c.AckWait == 0 {
		c.AckWait = d.AckWait
	}
	if c.RetryDelay == 0 {
		c.RetryDelay = d.RetryDelay
	}
	return c
}

// Validate checks c as it will be used, changing nothing; errors name the
// flag (or, for settings without one, the field). NATS and Store are
// checked when set; Run requires them.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	errs = append(errs, daemon.CheckRunAndNATS(c.Run, c.NATS, "the run id whose provenance to consume")...)
	if isMongoURI(c.Store) {
		if _, err := url.Parse(c.Store); err != nil {
			bad("--store: MongoDB URI: %w", err)
		}
	}
	if c.HTTPAddr != "" {
		if _, _, err := net.SplitHostPort(c.HTTPAddr); err != nil {
			bad("--http %q: %w", c.HTTPAddr, err)
		}
	}
	if c.AllowOrigin != "" && c.AllowOrigin != "*" {
		if u, err := url.Parse(c.AllowOrigin); err != nil || u.Scheme == "" || u.Host == "" || (u.Path != "" && u.Path != "/") {
			bad("--allow-origin %q: want an origin such as http://host:8080, or *", c.AllowOrigin)
		}
	}
	if c.Durable == "" {
		bad("--durable is empty: name the durable consumer")
	}
	for _, r := range c.Durable {
		if !(r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			bad("--durable %q may hold only letters, digits, '-' and '_'", c.Durable)
			break
		}
	}
	if c.Fetch < 1 {
		bad("Fetch %d must be at least 1", c.Fetch)
	}
	if c.FetchWait <= 0 {
		bad("FetchWait %v must be positive", c.FetchWait)
	}
	if c.AckWait <= 0 {
		bad("--ack-wait %v must be positive", c.AckWait)
	}
	if c.RetryDelay <= 0 {
		bad("RetryDelay %v must be positive", c.RetryDelay)
	}
	if len(errs) > 0 {
		// The program's name comes once, from its main ("provdb: --run ...").
		return errors.Join(errs...)
	}
	return nil
}

func isMongoURI(spec string) bool {
	return strings.HasPrefix(spec, "mongodb://") || strings.HasPrefix(spec, "mongodb+srv://")
}

// OpenStore opens the store spec names: a mongodb:// (or mongodb+srv://)
// URI, or else the path of a SQLite file. readOnly opens a SQLite store for
// queries only.
func OpenStore(ctx context.Context, spec string, readOnly bool) (provenance.Store, error) {
	if isMongoURI(spec) {
		return mongostore.Open(ctx, spec)
	}
	if readOnly {
		if _, err := os.Stat(spec); err != nil {
			return nil, fmt.Errorf("open provenance store: %w", err)
		}
	}
	return sqlitestore.Open(ctx, spec, sqlitestore.Options{ReadOnly: readOnly})
}

// mainUsage is what provdb --help prints above its flags.
const mainUsage = `Usage: provdb --run ID [flags]

provdb consumes a Kipimo run's provenance records from NATS JetStream into a store
and serves read-only queries on it over HTTP.`

// parseArgs reads the provdb settings from args, then the environment
// (lookup, normally os.LookupEnv) and a --config file, as internal/config
// describes, into a Config and the process settings (--log-level,
// --memory-limit). It returns pflag.ErrHelp after printing help on stderr.
func parseArgs(args []string, lookup func(string) (string, bool), stderr io.Writer) (Config, daemon.Process, error) {
	fs := pflag.NewFlagSet("provdb", pflag.ContinueOnError)
	c := DefaultConfig()
	fs.StringVar(&c.NATS, "nats", c.NATS, "NATS server URL(s), comma-separated")
	auth := daemon.AddNATSAuthFlags(fs)
	fs.StringVar(&c.Store, "store", c.Store, "provenance store: a SQLite file path or a mongodb:// URI")
	fs.StringVar(&c.Run, "run", "", "run id whose provenance stream is consumed (required)")
	fs.StringVar(&c.HTTPAddr, "http", c.HTTPAddr, "address of the read-only HTTP query API; empty disables it")
	fs.StringVar(&c.TokenFile, "token-file", "", "file holding the bearer token the HTTP API requires (Authorization header)")
	fs.StringVar(&c.Durable, "durable", c.Durable, "name of the durable JetStream consumer")
	fs.StringVar(&c.AllowOrigin, "allow-origin", "", "Access-Control-Allow-Origin of the HTTP API (e.g. the dashboard's origin)")
	fs.DurationVar(&c.AckWait, "ack-wait", c.AckWait, "how long JetStream waits for a batch's acknowledgement before redelivering it: the longest a batch held by a killed provdb waits for the restarted one (batches being written are kept from redelivery by in-progress acknowledgements every third of it)")
	proc := daemon.AddProcessFlags(fs)
	if err := daemon.ParseFlags(fs, "provdb", mainUsage, args, lookup, stderr); err != nil {
		return c, *proc, err
	}
	c.NATSAuth = *auth
	return c, *proc, nil
}

// command is the provdb command: its flags into a Config, then Run.
var command = daemon.Command[Config]{Parse: parseArgs, Run: Run}

// Main is the provdb command (daemon.Command): flags (and KIPIMO_*
// environment, a YAML --config file) into a Config, the logger on stderr,
// Validate, then Run until ctx ends (SIGINT or SIGTERM in cmd/provdb). It
// returns pflag.ErrHelp after printing help.
func Main(ctx context.Context, args []string, stderr io.Writer) error {
	return command.Main(ctx, args, stderr)
}

// Run consumes cfg.Run's provenance stream into the store and serves the
// query API (and the service's Prometheus metrics on its /metrics) until
// ctx ends, then shuts down cleanly within daemon.ShutdownTimeout: the
// query API stops and the batch being written is written and acknowledged.
// An HTTP listener that fails also ends it.
func Run(ctx context.Context, cfg Config, log zerolog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if cfg.NATS == "" || cfg.Store == "" {
		return errors.New("provdb: --nats and --store are required")
	}
	token, err := daemon.Secret("token-file", cfg.TokenFile)
	if err != nil {
		return err
	}
	store, err := OpenStore(ctx, cfg.Store, false)
	if err != nil {
		return err
	}
	defer store.Close()
	authOpts, err := cfg.NATSAuth.Options()
	if err != nil {
		return err
	}
	nc, err := natsx.Connect(ctx, cfg.NATS, "kipimo-provdb", append(authOpts, natsx.Logged(log))...)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("JetStream: %w", err)
	}
	reg := prometheus.NewRegistry()
	cfg.Metrics = reg
	d := &provdbDaemon{svc: New(cfg, store, js, log), addr: cfg.HTTPAddr}
	if cfg.HTTPAddr != "" {
		d.log = log.With().Str("component", "provdb-api").Bool("token", token != "").Logger()
		api := NewHTTPHandler(store, token, WithAllowOrigin(cfg.AllowOrigin), WithStats(d.svc.Stats), WithLogger(d.log))
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", daemon.Bearer(token, daemon.HeaderOnly, promhttp.HandlerFor(reg, promhttp.HandlerOpts{})))
		mux.Handle("/", api)
		d.handler = mux
	}
	return daemon.Serve(ctx, d)
}

// provdbDaemon is provdb's work as one daemon.Component: the consumer and,
// when it has an address, the query API, whose failure also ends it.
type provdbDaemon struct {
	svc     *Service
	addr    string
	handler http.Handler
	log     zerolog.Logger
	api     *daemon.HTTPServer
}

// Start starts the consumer, then the query API.
func (d *provdbDaemon) Start(ctx context.Context) error {
	if err := d.svc.Start(ctx); err != nil {
		return err
	}
	if d.addr == "" {
		return nil
	}
	api, err := daemon.Listen("http", d.addr, d.handler, d.log)
	if err != nil {
		_ = d.svc.Shutdown(context.WithoutCancel(ctx))
		return err
	}
	d.api = api
	return nil
}

// Done is closed when the query API's listener has stopped (never without
// one).
func (d *provdbDaemon) Done() <-chan struct{} {
	if d.api == nil {
		return nil
	}
	return d.api.Done()
}

// Shutdown stops the query API, then the consumer.
func (d *provdbDaemon) Shutdown(ctx context.Context) error {
	var errs []error
	if d.api != nil {
		if err := d.api.Err(); err != nil {
			errs = append(errs, fmt.Errorf("query API: %w", err))
		}
		errs = append(errs, d.api.Shutdown(ctx))
	}
	errs = append(errs, d.svc.Shutdown(ctx))
	return errors.Join(errs...)
}
