package adnode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/ad"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
	"github.com/spf13/pflag"

	"github.com/kipimo-hpc/kipimo/internal/daemon"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
)

// Summary is what Main prints with --json at the end.
type Summary struct {
	Run             string     `json:"run"`
	Ranks           []ad.Stats `json:"ranks"`
	Total           ad.Stats   `json:"total"`
	SinkPublished   uint64     `json:"sink_published"`
	SinkDropped     uint64     `json:"sink_dropped"`
	SinkLagSeconds  float64    `json:"sink_lag_seconds"`
	DurationSeconds float64    `json:"duration_seconds"`
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

// DaemonConfig is the ad command's settings: where it connects, which
// ranks it serves, how it publishes, and the detector options (Detector,
// registered by AddFlags and shared with kipimo run). Each field names its
// flag.
type DaemonConfig struct {
	NATS  string // --nats: NATS server URL(s), comma-separated
	Run   string // --run: run id; required
	PID   uint32 // --pid: program id of the ranks served
	Ranks string // --ranks: a rank list ("0-7", "0,4,8") or "auto"
	// Detector holds the detector options (AddFlags) and --shards,
	// --sync-wait, --sync-timeout; Run adds the sink and the syncer.
	Detector      ad.Config
	NoPServer     bool   // --no-pserver: local models only
	Queue         int    // --queue: provenance batches queued before Overflow applies
	Overflow      string // --overflow: "block" or "drop"
	PendingFrames int    // --pending-frames: frames buffered per rank before NATS drops them
	PendingBytes  string // --pending-bytes: frame data buffered per rank before NATS drops frames ("16MiB")
	MaxRanks      int    // --max-ranks: ranks --ranks auto starts a detector for at most
	PerRankSync   bool   // --per-rank-sync: each rank syncs on its own instead of one merged sync per shard per step
	Frames        string // --frames: "auto", "core" or "durable" (FramesAuto, FramesCore, FramesDurable)
	// --frame-storage, --frame-stream-max-bytes, --frame-stream-max-age:
	// the run's frame stream, with durable frames
	FrameStorage    string
	FrameStream     FrameStreamConfig
	CheckpointEvery int // --checkpoint-every: io_steps between a rank's checkpoints, with durable frames
	// --frames-domain: the JetStream domain of the frame stream and the
	// checkpoints; "" is the one the server answers for (a node's leaf
	// server with JetStream of its own)
	FramesDomain string
	// --prov-domain: the JetStream domain of the provenance stream (the
	// hub's, when the leaf this ad connects to has JetStream of its own)
	ProvDomain string
	// --node-sync-linger: how long the node's merged sync waits for ranks that have not sent yet
	NodeSyncLinger time.Duration
	// --nats-creds, --nats-nkey, --nats-user, --nats-password-file,
	// --nats-ca, --nats-cert, --nats-key: who this ad is to NATS, and TLS
	NATSAuth    daemon.NATSAuth
	MetricsAddr string // --metrics-addr: Prometheus /metrics listener; "" serves none
	RankLabels  int    // --rank-labels: ranks with their own metric label
	// --baseline and its options: read into Detector.Baseline by Run
	Baseline BaselineFlags
}

// DefaultDaemonConfig is the ad command's defaults (Run is left empty: it is
// required; the detector options are AddFlags's).
func DefaultDaemonConfig() DaemonConfig {
	return DaemonConfig{
		NATS:            "nats://127.0.0.1:4222",
		Ranks:           "0",
		Detector:        ad.Config{Shards: 1, SyncWait: time.Second, SyncTimeout: 2 * time.Second},
		Queue:           64,
		Overflow:        "block",
		PendingFrames:   256,
		PendingBytes:    "16MiB",
		MaxRanks:        DefaultMaxRanks,
		NodeSyncLinger:  20 * time.Millisecond,
		Frames:          FramesAuto,
		FrameStorage:    "file",
		FrameStream:     DefaultFrameStreamConfig(),
		CheckpointEvery: 10,
		RankLabels:      64,
	}
}

// Validate checks c, changing nothing; errors name the flag. The detector
// options are checked by the detector's own Config.Validate, on a copy.
func (c DaemonConfig) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if err := natsx.ValidRun(c.Run); err != nil {
		bad("--run: %w", err)
	}
	if _, err := natsx.CheckURL(c.NATS); err != nil {
		bad("--nats: %w", err)
	}
	if c.Ranks != "auto" {
		if _, err := ParseRanks(c.Ranks); err != nil {
			bad("--ranks: %w", err)
		}
	}
	if _, err := parseOverflow(c.Overflow); err != nil {
		bad("%w", err)
	}
	if c.Queue < 1 {
		bad("--queue %d must be at least 1", c.Queue)
	}
	if c.Frames != FramesAuto && c.Frames != FramesCore && c.Frames != FramesDurable {
		bad("--frames %q: want %s, %s or %s", c.Frames, FramesAuto, FramesCore, FramesDurable)
	}
	if c.FrameStorage != "file" && c.FrameStorage != "memory" {
		bad("--frame-storage %q: want file or memory", c.FrameStorage)
	}
	if c.FrameStream.MaxBytes < 1<<20 {
		bad("--frame-stream-max-bytes %d: at least 1 MiB", c.FrameStream.MaxBytes)
	}
	if c.FrameStream.MaxAge < time.Second {
		bad("--frame-stream-max-age %s: at least 1s", c.FrameStream.MaxAge)
	}
	if c.CheckpointEvery < 1 {
		bad("--checkpoint-every %d: at least 1", c.CheckpointEvery)
	}
	if c.FramesDomain != "" && c.Frames == FramesCore {
		bad("--frames-domain is for durable frames (--frames durable or auto)")
	}
	if c.Frames == FramesDurable && c.Ranks == "auto" {
		bad("--frames durable reads the listed ranks' frames through one consumer: it cannot be used with --ranks auto")
	}
	if c.NodeSyncLinger <= 0 || c.NodeSyncLinger > time.Minute {
		bad("--node-sync-linger %s must be positive and at most 1m", c.NodeSyncLinger)
	}
	if c.PendingFrames < 1 {
		bad("--pending-frames %d must be at least 1", c.PendingFrames)
	}
	if n, err := daemon.ParseSize(c.PendingBytes); err != nil {
		bad("--pending-bytes: %w", err)
	} else if n < 1<<16 || n > 1<<31-1 {
		bad("--pending-bytes %s must be between 64KiB and 2GiB", c.PendingBytes)
	}
	if c.MaxRanks < 1 {
		bad("--max-ranks %d must be at least 1", c.MaxRanks)
	}
	if c.MetricsAddr != "" {
		if _, _, err := net.SplitHostPort(c.MetricsAddr); err != nil {
			bad("--metrics-addr %q: %w", c.MetricsAddr, err)
		}
	}
	if c.RankLabels < 0 {
		bad("--rank-labels %d must not be negative", c.RankLabels)
	}
	if c.Detector.Shards < 1 {
		bad("--shards %d must be at least 1", c.Detector.Shards)
	}
	if c.Detector.SyncWait <= 0 {
		bad("--sync-wait %v must be positive", c.Detector.SyncWait)
	}
	if c.Detector.SyncTimeout <= 0 {
		bad("--sync-timeout %v must be positive", c.Detector.SyncTimeout)
	}
	check := c.Detector
	check.Ignore = slices.Clone(check.Ignore)
	if err := check.Validate(); err != nil {
		bad("%w", err)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	return nil
}

func parseOverflow(s string) (Overflow, error) {
	switch s {
	case "block":
		return Block, nil
	case "drop":
		return Drop, nil
	default:
		return Block, fmt.Errorf("--overflow %q: use block or drop", s)
	}
}

// mainUsage is what ad --help prints above its flags.
const mainUsage = `Usage: ad --run ID [flags]

ad is Kipimo's on-node anomaly detector. It serves one rank or all ranks of a
node (one goroutine each): it reads each rank's frames from
kipimo.<run>.frames.<pid>.<rank>, builds call stacks, keeps running models
synced with the parameter server (kipimo.<run>.ps.sync.<shard>), labels
executions and publishes provenance records to the run's JetStream stream. It
answers live call-stack probes on kipimo.<run>.ad.<pid>.<rank>.callstack and
kipimo.<run>.ad.callstack. A rank's stream ends with a message carrying the
header ` + EndOfStreamHeader + ` (or an empty body), or for all ranks with
{"kind":"end_of_run"} on kipimo.<run>.control; SIGINT/SIGTERM also end it,
after a flush. With --ranks auto, a detector starts for each rank whose
frames appear (programs instrumented with Kipimo's event library publish to
their node's server), and only end_of_run or a signal ends the process.`

// parseArgs reads the ad settings from args, then the environment (lookup,
// normally os.LookupEnv) and a --config file, as internal/config describes,
// into a DaemonConfig, the --log-level value and whether --json was given.
// It returns pflag.ErrHelp after printing help on stderr.
func parseArgs(args []string, lookup func(string) (string, bool), stderr io.Writer) (DaemonConfig, daemon.Process, bool, error) {
	fs := pflag.NewFlagSet("ad", pflag.ContinueOnError)
	c := DefaultDaemonConfig()
	fs.StringVar(&c.NATS, "nats", c.NATS, "NATS server URL(s), comma-separated")
	auth := daemon.AddNATSAuthFlags(fs)
	fs.StringVar(&c.Run, "run", "", "run id (letters, digits, '-' and '_'); required")
	fs.Uint32Var(&c.PID, "pid", c.PID, "program id of the ranks served")
	fs.StringVar(&c.Ranks, "ranks", c.Ranks, `ranks served by this process, e.g. "0-7" or "0,4,8"; "auto": every rank (of any --pid) that publishes frames on this NATS server`)
	AddFlags(fs, &c.Detector)
	AddBaselineFlags(fs, &c.Baseline)
	fs.IntVar(&c.Detector.Shards, "shards", c.Detector.Shards, "number of parameter-server shards")
	fs.DurationVar(&c.Detector.SyncWait, "sync-wait", c.Detector.SyncWait, "how long a step waits for a responsive pserver's reply")
	fs.DurationVar(&c.Detector.SyncTimeout, "sync-timeout", c.Detector.SyncTimeout, "timeout of one sync attempt")
	fs.BoolVar(&c.NoPServer, "no-pserver", false, "run on local models only")
	fs.IntVar(&c.Queue, "queue", c.Queue, "provenance batches queued before --overflow applies")
	fs.StringVar(&c.Overflow, "overflow", c.Overflow, "full provenance queue: block (back-pressure, counted as lag) or drop (counted)")
	fs.IntVar(&c.PendingFrames, "pending-frames", c.PendingFrames, "frames buffered per rank before NATS drops them (counted as dropped frames and missing steps)")
	fs.StringVar(&c.PendingBytes, "pending-bytes", c.PendingBytes, "frame data buffered per rank before NATS drops frames (counted as dropped frames and missing steps)")
	fs.IntVar(&c.MaxRanks, "max-ranks", c.MaxRanks, "--ranks auto: ranks this ad starts a detector for at most; frames of further ranks are dropped (counted)")
	fs.BoolVar(&c.PerRankSync, "per-rank-sync", c.PerRankSync, "every rank syncs with the pserver on its own (by default the ranks served here send one merged sync per shard per step)")
	fs.DurationVar(&c.NodeSyncLinger, "node-sync-linger", c.NodeSyncLinger, "how long a merged sync waits for ranks that have not sent theirs yet")
	fs.StringVar(&c.Frames, "frames", c.Frames, "how frames arrive: durable (the run's JetStream frame stream, a durable consumer and a checkpoint of every rank: a restarted ad resumes where it left off and loses nothing; the stream lives where JetStream runs, so give a compute node's leaf server JetStream of its own; the dashboard's counts lag by up to --checkpoint-every steps), core (NATS messages; frames published while this ad is down are lost, and counted as missing steps), or auto: durable when the server offers JetStream (in --frames-domain), else core with a warning; core with --ranks auto")
	fs.StringVar(&c.FrameStorage, "frame-storage", c.FrameStorage, "--frames durable: where the frame stream is kept, file or memory")
	fs.Int64Var(&c.FrameStream.MaxBytes, "frame-stream-max-bytes", c.FrameStream.MaxBytes, "--frames durable: bound of the frame stream; past it the oldest frames are dropped (counted as missing steps by detectors that had not read them)")
	fs.DurationVar(&c.FrameStream.MaxAge, "frame-stream-max-age", c.FrameStream.MaxAge, "--frames durable: frames older than this are dropped from the stream")
	fs.StringVar(&c.FramesDomain, "frames-domain", c.FramesDomain, "--frames durable: JetStream domain that keeps the frame stream and the checkpoints (default: the one of the server this ad connects to; on a compute node, its leaf server's, so that frames stay on the node)")
	fs.StringVar(&c.ProvDomain, "prov-domain", c.ProvDomain, "JetStream domain of the provenance stream provdb reads (default: the one of the server this ad connects to; give the hub's when the node's leaf server has JetStream of its own)")
	fs.IntVar(&c.CheckpointEvery, "checkpoint-every", c.CheckpointEvery, "--frames durable: io_steps between a rank's checkpoints (after a restart, at most this many steps are processed again); a rank checkpoints sooner once the frames it has not acknowledged hold --pending-bytes")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", "", "serve Prometheus /metrics on this address (e.g. 127.0.0.1:9464)")
	fs.IntVar(&c.RankLabels, "rank-labels", c.RankLabels, "ranks with their own metric label; the rest are summed as rank=\"other\"")
	jsonOut := fs.Bool("json", false, "print a JSON summary on stdout at the end")
	proc := daemon.AddProcessFlags(fs)
	if err := daemon.ParseFlags(fs, "ad", mainUsage, args, lookup, stderr); err != nil {
		return c, *proc, false, err
	}
	c.NATSAuth = *auth
	return c, *proc, *jsonOut, nil
}

// jetStreamOffered reports whether js answers (for --frames auto), and
// warns when it does not.
func jetStreamOffered(ctx context.Context, js jetstream.JetStream, log zerolog.Logger) bool {
	actx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if _, err := js.AccountInfo(actx); err != nil {
		log.Warn().Err(err).Msg("--frames auto: no JetStream on the NATS server, so frames are core messages and a restarted ad loses those published while it was down (give the server JetStream, or say --frames core)")
		return false
	}
	return true
}

// mainSettings are the ad command's settings: the daemon's, and --json.
type mainSettings struct {
	DaemonConfig
	json bool
}

// Main is the ad command (daemon.Command): flags (and KIPIMO_* environment,
// a YAML --config file) into a DaemonConfig, the logger on stderr,
// Validate, then Run until the ranks' streams end or ctx is cancelled
// (SIGINT/SIGTERM in cmd/ad). With --json it prints the Summary on stdout.
// It returns pflag.ErrHelp after printing help.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return daemon.Command[mainSettings]{
		Parse: func(args []string, lookup func(string) (string, bool), stderr io.Writer) (mainSettings, daemon.Process, error) {
			c, proc, jsonOut, err := parseArgs(args, lookup, stderr)
			return mainSettings{c, jsonOut}, proc, err
		},
		Run: func(ctx context.Context, s mainSettings, log zerolog.Logger) error {
			sum, err := Run(ctx, s.DaemonConfig, log)
			if s.json && (err == nil || sum.Ranks != nil) {
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				if werr := enc.Encode(sum); werr != nil {
					err = errors.Join(err, fmt.Errorf("write summary: %w", werr))
				}
			}
			return err
		},
	}.Main(ctx, args, stderr)
}

// Run connects to NATS and serves cfg's ranks as a Node (daemon.Serve)
// until their streams end or ctx is cancelled, then flushes the provenance
// records pending, within daemon.ShutdownTimeout. The Summary counts what
// was served, also when serving failed.
func Run(ctx context.Context, cfg DaemonConfig, log zerolog.Logger) (Summary, error) {
	sum := Summary{Run: cfg.Run}
	if err := cfg.Validate(); err != nil {
		return sum, err
	}
	log = log.With().Str("component", "ad").Logger()
	if err := cfg.Baseline.Load(ctx, &cfg.Detector); err != nil {
		return sum, err
	}
	var ranks []uint32
	discover := cfg.Ranks == "auto"
	if !discover {
		ranks, _ = ParseRanks(cfg.Ranks) // checked by Validate
	}
	ov, _ := parseOverflow(cfg.Overflow)
	start := time.Now()
	authOpts, err := cfg.NATSAuth.Options()
	if err != nil {
		return sum, err
	}
	nc, err := natsx.Connect(ctx, cfg.NATS, "kipimo-ad-"+cfg.Run, append(authOpts, natsx.Logged(log))...)
	if err != nil {
		return sum, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return sum, fmt.Errorf("jetstream: %w", err)
	}
	pjs := js
	if cfg.ProvDomain != "" {
		if pjs, err = jetstream.NewWithDomain(nc, cfg.ProvDomain); err != nil {
			return sum, fmt.Errorf("jetstream domain %s: %w", cfg.ProvDomain, err)
		}
	}
	var durable *Durable
	if cfg.Frames != FramesCore && !discover {
		fsc := cfg.FrameStream
		fsc.Memory = cfg.FrameStorage == "memory"
		fjs := js
		if cfg.FramesDomain != "" {
			if fjs, err = jetstream.NewWithDomain(nc, cfg.FramesDomain); err != nil {
				return sum, fmt.Errorf("jetstream domain %s: %w", cfg.FramesDomain, err)
			}
		}
		if cfg.Frames == FramesDurable || jetStreamOffered(ctx, fjs, log) {
			durable = &Durable{JS: fjs, Stream: fsc, CheckpointEvery: cfg.CheckpointEvery}
		}
	}
	if durable != nil {
		log.Info().Str("frames", FramesDurable).Int("checkpoint_every", cfg.CheckpointEvery).Msg("frames read from the run's JetStream stream: a restarted ad resumes where it left off")
	} else {
		log.Info().Str("frames", FramesCore).Msg("frames read as core NATS messages: frames published while this ad is down are lost")
	}
	pendingBytes, _ := daemon.ParseSize(cfg.PendingBytes) // checked by Validate
	reg := prometheus.NewRegistry()                       // served on --metrics-addr, when given
	node, err := New(Config{
		Serve: ServeConfig{
			Run: cfg.Run, PID: cfg.PID, Ranks: ranks, Discover: discover, Detector: cfg.Detector,
			PendingFrames: cfg.PendingFrames, PendingBytes: int(pendingBytes), MaxRanks: cfg.MaxRanks, PerRankSync: cfg.PerRankSync, NodeSyncLinger: cfg.NodeSyncLinger,
			Durable: durable,
		},
		Queue: cfg.Queue, Overflow: ov, ProvJS: pjs, NoPServer: cfg.NoPServer, RankLabels: cfg.RankLabels,
	}, nc, log, reg)
	if err != nil {
		return sum, err
	}
	metrics, err := serveMetrics(cfg.MetricsAddr, reg, log)
	if err != nil {
		return sum, err
	}
	serr := daemon.Serve(ctx, node)
	if metrics != nil {
		sctx, cancel := daemon.ShutdownContext(ctx)
		defer cancel()
		if err := metrics.Shutdown(sctx); err != nil {
			serr = errors.Join(serr, err)
		}
	}
	stats := node.Stats()
	sink := node.Sink()
	sum.Ranks, sum.SinkPublished, sum.SinkDropped = stats, sink.Published(), sink.Dropped()
	sum.SinkLagSeconds, sum.DurationSeconds = sink.Lag().Seconds(), time.Since(start).Seconds()
	for _, s := range stats {
		sum.Total.Add(s)
	}
	log.Info().Uint64("frames", sum.Total.Frames).Uint64("anomalies", sum.Total.Anomalies).
		Uint64("records", sum.SinkPublished).Uint64("dropped", sum.SinkDropped).Msg("done")
	return sum, serr
}

// serveMetrics serves reg on addr's /metrics (nothing, and a nil server,
// when addr is empty).
func serveMetrics(addr string, reg *prometheus.Registry, log zerolog.Logger) (*daemon.HTTPServer, error) {
	if addr == "" {
		return nil, nil
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return daemon.Listen("metrics-addr", addr, mux, log)
}
