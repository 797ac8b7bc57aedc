package ad

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
	"github.com/spf13/pflag"

	"github.com/kipimo-hpc/kipimo/internal/config"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
)

// Summary is what Main prints with --json at the end.
type Summary struct {
	Run             string  `json:"run"`
	Ranks           []Stats `json:"ranks"`
	Total           Stats   `json:"total"`
	SinkPublished   uint64  `json:"sink_published"`
	SinkDropped     uint64  `json:"sink_dropped"`
	SinkLagSeconds  float64 `json:"sink_lag_seconds"`
	DurationSeconds float64 `json:"duration_seconds"`
}

// ParseRanks parses a rank list such as "0-3,8,10-11".
func ParseRanks(s string) ([]uint32, error) {
	var out []uint32
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.ParseUint(lo, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("rank list %q: %q is not a rank number", s, lo)
		}
		b := a
		if isRange {
			if b, err = strconv.ParseUint(hi, 10, 32); err != nil {
				return nil, fmt.Errorf("rank list %q: %q is not a rank number", s, hi)
			}
		}
		if b < a {
			return nil, fmt.Errorf("rank list %q: range %s ends before it starts", s, part)
		}
		if b-a >= 1<<16 {
			return nil, fmt.Errorf("rank list %q: range %s has more than 65536 ranks", s, part)
		}
		for r := a; r <= b; r++ {
			out = append(out, uint32(r))
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("rank list %q names no rank", s)
	}
	return out, nil
}

// Main is the ad command: it parses args (flags, KIPIMO_* environment, a
// YAML --config file), connects to NATS and serves the given ranks until
// their streams end or ctx is cancelled (SIGINT/SIGTERM in cmd/ad), flushing
// everything pending. With --json it prints a Summary on stdout. It returns
// pflag.ErrHelp after printing help.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := pflag.NewFlagSet("ad", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, `Usage: ad [flags]

ad is Kipimo's on-node anomaly detector. It serves one rank or all ranks of a
node (one goroutine each): it reads each rank's frames from
kipimo.<run>.frames.<pid>.<rank>, builds call stacks, keeps running models
synced with the parameter server (kipimo.<run>.ps.sync.<shard>), labels
executions and publishes provenance records to the run's JetStream stream. It
answers live call-stack probes on kipimo.<run>.ad.<pid>.<rank>.callstack and
kipimo.<run>.ad.callstack. A rank's stream ends with a message carrying the
header %s (or an empty body), or for all ranks with {"kind":"end_of_run"} on
kipimo.<run>.control; SIGINT/SIGTERM also end it, after a flush. With
--ranks auto, a detector starts for each rank whose frames appear (programs
instrumented with Kipimo's event library publish to their node's server), and
only end_of_run or a signal ends the process.

%s
`, EndOfStreamHeader, config.FlagsHeading)
		fs.PrintDefaults()
	}
	natsURL := fs.String("nats", "nats://127.0.0.1:4222", "NATS server URL(s), comma-separated")
	run := fs.String("run", "", "run id (letters, digits, '-' and '_'); required")
	pid := fs.Uint32("pid", 0, "program id of the ranks served")
	ranksFlag := fs.String("ranks", "0", `ranks served by this process, e.g. "0-7" or "0,4,8"; "auto": every rank (of any --pid) that publishes frames on this NATS server`)
	algo := fs.String("algorithm", HBOS, "outlier algorithm: sstd, hbos or copod")
	sigma := fs.Float64("sigma", 6, "SSTD threshold in standard deviations")
	thres := fs.Float64("threshold", 0.99, "HBOS/COPOD threshold, fraction of the score range")
	bins := fs.Int("bins", 200, "HBOS/COPOD histogram bins")
	statistic := fs.String("statistic", Exclusive, "runtime the models are built on: exclusive or inclusive")
	slowOnly := fs.Bool("slow-only", false, "flag only executions slower than the model's mean")
	byPath := fs.Bool("by-call-path", false, "key models by call path instead of by function")
	depth := fs.Int("call-path-depth", 0, "frames kept in the profiles' call paths (0: full paths from the root, as Hatchet needs; a limit cuts frames on the root side, as TAU does)")
	modelDepth := fs.Int("model-path-depth", 2, "frames of the call path that keys a model with --by-call-path")
	profilePaths := fs.Int("profile-paths", 8192, "most call-path nodes kept per rank; executions on further paths count in their function's flat profile only")
	minRuntime := fs.Float64("min-runtime", 0, "never flag executions whose runtime (µs) is below this")
	ignore := fs.StringSlice("ignore", nil, "function names never flagged (repeat or comma-separate)")
	isolation := fs.Int("isolation", 0, "HBOS/COPOD isolation window half-width in bins (0: Chimbuko's rule)")
	maxMass := fs.Float64("max-mass", 0, "isolation window mass below which an execution may be flagged (default 0.001 with --isolation)")
	window := fs.Int("window", 5, "executions before and after an anomaly kept in its exec_window")
	normalRate := fs.Float64("normal-rate", 0, "fraction of normal executions sampled into normalexecs, besides Chimbuko's rule")
	profileEvery := fs.Int("profile-every", 0, "publish per-thread profiles every K steps (0: at the end only)")
	shards := fs.Int("shards", 1, "number of parameter-server shards")
	syncWait := fs.Duration("sync-wait", time.Second, "how long a step waits for a responsive pserver's reply")
	syncTimeout := fs.Duration("sync-timeout", 2*time.Second, "timeout of one sync attempt")
	noPS := fs.Bool("no-pserver", false, "run on local models only")
	queue := fs.Int("queue", 64, "provenance batches queued before --overflow applies")
	overflow := fs.String("overflow", "block", "full provenance queue: block (back-pressure, counted as lag) or drop (counted)")
	pending := fs.Int("pending-frames", 256, "frames buffered per rank before NATS drops them (counted)")
	metricsAddr := fs.String("metrics-addr", "", "serve Prometheus /metrics on this address (e.g. 127.0.0.1:9464)")
	rankLabels := fs.Int("rank-labels", 64, "ranks with their own metric label; the rest are summed as rank=\"other\"")
	jsonOut := fs.Bool("json", false, "print a JSON summary on stdout at the end")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	config.AddConfigFlag(fs)
	if err := config.Parse(fs, args, os.LookupEnv); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q: ad takes only flags", fs.Arg(0))
	}
	lvl, err := zerolog.ParseLevel(*logLevel)
	if err != nil {
		return fmt.Errorf("log level %q: use debug, info, warn or error", *logLevel)
	}
	log := zerolog.New(stderr).Level(lvl).With().Timestamp().Str("component", "ad").Logger()
	if err := natsx.ValidRun(*run); err != nil {
		return fmt.Errorf("--run: %w", err)
	}
	var ranks []uint32
	discover := *ranksFlag == "auto"
	if !discover {
		if ranks, err = ParseRanks(*ranksFlag); err != nil {
			return fmt.Errorf("--ranks: %w", err)
		}
	}
	var ov Overflow
	switch *overflow {
	case "block":
		ov = Block
	case "drop":
		ov = Drop
	default:
		return fmt.Errorf("--overflow %q: use block or drop", *overflow)
	}
	dc := Config{
		Algorithm: *algo, Sigma: *sigma, Threshold: *thres, Bins: *bins, Statistic: *statistic,
		SlowOnly: *slowOnly, ByCallPath: *byPath, CallPathDepth: *depth, MinRuntime: *minRuntime,
		ModelPathDepth: *modelDepth, ProfilePaths: *profilePaths,
		Ignore: *ignore, Isolation: *isolation, MaxMass: *maxMass, Window: *window,
		NormalRate: *normalRate, ProfileEvery: *profileEvery, Shards: *shards,
		SyncWait: *syncWait, SyncTimeout: *syncTimeout,
	}
	if *window == 0 {
		dc.Window = -1 // an explicit 0 means no window
	}
	check := dc
	if err := check.Validate(); err != nil {
		return err
	}
	start := time.Now()
	nc, err := natsx.Connect(ctx, *natsURL, "kipimo-ad-"+*run)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	sink, err := NewNATSSink(js, *run, *queue, ov, log)
	if err != nil {
		return err
	}
	if err := sink.Start(ctx); err != nil {
		return err
	}
	dc.Sink = sink
	if !*noPS {
		dc.Syncer = &NATSSyncer{Conn: nc, Subjects: natsx.Subjects{Run: *run}}
	}
	coll := NewCollector(*rankLabels, sink.Dropped)
	stopMetrics, err := serveMetrics(*metricsAddr, coll, log)
	if err != nil {
		return err
	}
	defer stopMetrics()
	stats, serr := Serve(ctx, ServeConfig{
		Conn: nc, Run: *run, PID: *pid, Ranks: ranks, Discover: discover, Detector: dc,
		PendingFrames: *pending, Collector: coll, Logger: log,
	})
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := sink.Shutdown(sctx); err != nil {
		serr = errors.Join(serr, fmt.Errorf("flush provenance: %w", err))
	}
	sum := Summary{Run: *run, Ranks: stats, SinkPublished: sink.Published(), SinkDropped: sink.Dropped(),
		SinkLagSeconds: sink.Lag().Seconds(), DurationSeconds: time.Since(start).Seconds()}
	for _, s := range stats {
		sum.Total.Add(s)
	}
	log.Info().Uint64("frames", sum.Total.Frames).Uint64("anomalies", sum.Total.Anomalies).
		Uint64("records", sum.SinkPublished).Uint64("dropped", sum.SinkDropped).Msg("done")
	if *jsonOut {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(sum); err != nil {
			return fmt.Errorf("write summary: %w", err)
		}
	}
	return serr
}

// serveMetrics serves /metrics on addr (nothing when addr is empty) and
// returns how to stop it.
func serveMetrics(addr string, coll *Collector, log zerolog.Logger) (func(), error) {
	if addr == "" {
		return func() {}, nil
	}
	reg := prometheus.NewRegistry()
	if err := reg.Register(coll); err != nil {
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Msg("metrics server stopped")
		}
	}()
	log.Info().Str("addr", ln.Addr().String()).Msg("serving /metrics")
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}
