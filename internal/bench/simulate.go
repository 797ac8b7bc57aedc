package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/spf13/pflag"

	"github.com/kipimo-hpc/kipimo/internal/ad"
	"github.com/kipimo-hpc/kipimo/internal/adnode"
	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provdb"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provstream"
	"github.com/kipimo-hpc/kipimo/internal/pserver"
	"github.com/kipimo-hpc/kipimo/internal/replay"
	"github.com/kipimo-hpc/kipimo/internal/replay/publish"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

// SimConfig configures Simulate: a deployment of Kipimo simulated in this
// process, each part on a NATS connection of its own.
type SimConfig struct {
	// Out is a scratch directory (the NATS store and the SQLite file).
	Out string
	// Ranks is the number of simulated ranks (default 16,384), served by
	// Ranks/RanksPerNode ad processes of RanksPerNode ranks each (default
	// 64; the last node takes the remainder).
	Ranks, RanksPerNode int
	// Shards is the number of pserver instances, one per shard (default 4).
	Shards int
	// ProvDBs is the number of provdb services on the one durable consumer
	// and the one SQLite store (default 2).
	ProvDBs int
	// Steps is the number of io_steps (waves; default 5), EventsPerStep
	// the synthetic workload's events per rank per step (default 100, the
	// workload's least).
	Steps, EventsPerStep int
	// StepPeriod is the least time from one wave's start to the next's;
	// 0 starts a wave as soon as the previous one is processed.
	StepPeriod time.Duration
	// Free runs each node's detectors as the ad daemon does, each at its
	// own pace, a node's merged sync waiting NodeSyncLinger (default
	// 250ms) for ranks that have not sent theirs; a rank with nothing for
	// a shard in a step then sends nothing to it, and one whose previous
	// request is unanswered adds its deltas to its next. By default each
	// node's detectors move in lockstep (adnode.ServeConfig.Lockstep, as kipimo
	// run's): every rank sends to every shard every step, even empty, as
	// ranks with many events per step do, so that a node's writes are
	// exactly one per shard per step; the node then also reads the models
	// back with one request per shard per step.
	Free           bool
	NodeSyncLinger time.Duration
	// WaveTimeout bounds one wave (default 10 minutes).
	WaveTimeout time.Duration
	// Log receives progress lines.
	Log io.Writer
}

// SimComponent is what one kind of part did: the NATS traffic of its
// connections (as the server counts it: In is what the part sent to the
// server, Out what the server delivered to it), per second of the run's
// active time, and its memory.
type SimComponent struct {
	Name      string `json:"name"`
	Instances int    `json:"instances"`
	// Carries says what the messages in each direction are.
	Carries  string `json:"carries"`
	InMsgs   uint64 `json:"in_msgs"`
	OutMsgs  uint64 `json:"out_msgs"`
	InBytes  uint64 `json:"in_bytes"`
	OutBytes uint64 `json:"out_bytes"`
	// The same per second of active time (detection and drain).
	InMsgsPerSec   float64 `json:"in_msgs_per_s"`
	OutMsgsPerSec  float64 `json:"out_msgs_per_s"`
	InBytesPerSec  float64 `json:"in_bytes_per_s"`
	OutBytesPerSec float64 `json:"out_bytes_per_s"`
	// MaxInstanceOutMsgsPerSec is the busiest instance's delivered rate.
	MaxInstanceOutMsgsPerSec float64 `json:"max_instance_out_msgs_per_s"`
	// StartHeapMiB is the growth of the Go heap (live, after a collection)
	// while the part started; LiveHeapMiB the live heap allocated by the
	// part's code at the end of the last wave (heap profile, by allocating
	// stack).
	StartHeapMiB float64 `json:"start_heap_mib"`
	LiveHeapMiB  float64 `json:"live_heap_mib"`
	// CPUSeconds is the CPU time of the part's goroutines from the first
	// frame to provdb's catching up, from a CPU profile whose samples
	// carry the part's label (inherited by the goroutines it starts, its
	// NATS connections' included); "other" is what no part's label covers:
	// the garbage collector's workers, the runtime, timers.
	CPUSeconds float64 `json:"cpu_seconds"`
}

// SimStep is one wave: every rank's frame of an io_step.
type SimStep struct {
	Step int `json:"io_step"`
	// Seconds is from the wave's first frame published to every detector
	// having processed it and its syncs answered.
	Seconds float64 `json:"seconds"`
	// Writes are the merged (node) sync requests each shard applied during
	// the wave; RankParts the ranks' requests in them, over all shards.
	Writes    []uint64 `json:"node_writes_per_shard"`
	RankParts uint64   `json:"rank_parts"`
	// Requests are all the requests each shard handled during the wave:
	// writes, reads and resent ones.
	Requests []uint64 `json:"requests_per_shard"`
	// Settled tells whether every detector had its syncs answered when the
	// wave ended (else some of its writes count in the next wave).
	Settled bool `json:"settled"`
	// ProvPending is the provenance messages not yet acknowledged by
	// provdb when the wave ended.
	ProvPending uint64 `json:"provdb_pending_msgs"`
}

// SimResult is what Simulate measured.
type SimResult struct {
	Ranks         int  `json:"ranks"`
	Nodes         int  `json:"nodes"`
	RanksPerNode  int  `json:"ranks_per_node"`
	Shards        int  `json:"shards"`
	ProvDBs       int  `json:"provdbs"`
	Lockstep      bool `json:"lockstep_per_node"`
	Steps         int  `json:"steps"`
	EventsPerStep int  `json:"events_per_step"`

	// Frames, Events and FrameBytes are what the publisher sent.
	Frames     int   `json:"frames"`
	Events     int64 `json:"events"`
	FrameBytes int64 `json:"frame_bytes"`

	// SetupSeconds starts every part; DetectSeconds runs from the first
	// frame to every detector closed (heap sampling excluded);
	// DrainSeconds from there to provdb having stored everything (the
	// provdb lag at the end); WallSeconds is all of it, shutdown included.
	SetupSeconds  float64 `json:"setup_seconds"`
	DetectSeconds float64 `json:"detect_seconds"`
	DrainSeconds  float64 `json:"drain_seconds"`
	// FinishSeconds is the part of DrainSeconds the pservers took to
	// publish their final statistics.
	FinishSeconds float64 `json:"finish_seconds"`
	WallSeconds   float64 `json:"wall_seconds"`
	// HeapSampleSeconds is the time the heap profile took (a collection
	// of the whole heap), excluded from DetectSeconds.
	HeapSampleSeconds float64 `json:"heap_sample_seconds"`
	// CPUSeconds is the CPU profile's total over the same span (0 when
	// another CPU profile was running and none could be taken).
	CPUSeconds float64 `json:"cpu_seconds"`

	StepsMeasured []SimStep `json:"waves"`
	// NodeWrites are the merged requests applied per shard over the run,
	// WritesPerStep their mean per wave over all shards (as counted
	// between waves), against
	// ExpectedWritesPerStep = nodes × shards. RankWrites are requests of a
	// single rank (each detector's last deltas, sent at its close without
	// its node); Duplicates requests the pserver applied nothing of: reads
	// (a lockstep node's pull of the models) and resent requests.
	// CloseNodeWrites are the merged requests sent after the last wave
	// (the detectors' final step at their close, in lockstep).
	NodeWrites            []uint64 `json:"node_writes_per_shard"`
	CloseNodeWrites       uint64   `json:"close_node_writes"`
	WritesPerStep         float64  `json:"writes_per_step"`
	ExpectedWritesPerStep int      `json:"expected_writes_per_step"`
	RankWrites            uint64   `json:"rank_writes"`
	Duplicates            uint64   `json:"duplicate_or_read_requests"`
	// SyncP50Ms and SyncP99Ms are the pserver's latency from a request's
	// arrival to its reply (its log append included), bucket upper bounds
	// of kipimo_ps_sync_latency_seconds over all shards; per shard in
	// ShardP99Ms.
	// A quantile beyond the histogram's last finite bound (2 s) reads as
	// that bound, and SyncBeyond names it ("p50", "p99" or "shard 2 p99").
	// These are over the waves; CloseSyncP50Ms and CloseSyncP99Ms over
	// what the shards answered after the last wave (the detectors'
	// close). WaveSyncs and CloseSyncs are the replies counted in each.
	SyncP50Ms      float64   `json:"sync_p50_ms"`
	SyncP99Ms      float64   `json:"sync_p99_ms"`
	CloseSyncP50Ms float64   `json:"close_sync_p50_ms"`
	CloseSyncP99Ms float64   `json:"close_sync_p99_ms"`
	WaveSyncs      uint64    `json:"wave_syncs"`
	CloseSyncs     uint64    `json:"close_syncs"`
	ShardP99Ms     []float64 `json:"shard_sync_p99_ms"`
	SyncBeyond     []string  `json:"sync_beyond_last_bucket,omitempty"`
	// ShardOutMsgsPerSec are the messages the server delivered to each
	// shard's connection per second of active time (its sync requests and
	// JetStream acks).
	ShardOutMsgsPerSec []float64 `json:"shard_out_msgs_per_s"`
	// Syncs are the requests the nodes sent, by kind, as the nodes saw
	// them: sizes and round trips.
	Syncs []SimSyncs `json:"syncs"`

	// Anomalies, DetectorEvents and Records are the detectors' totals; RecordsPublished
	// what the nodes' sinks published, RecordsDropped what they dropped;
	// RecordsStored what the store holds of the detectors' kinds
	// (anomalies, normal executions, metadata, profiles), StoredAnomalies
	// of anomalies alone; ProvRecordsPerSec the store's rate over the
	// active time; ProvWritten per provdb instance.
	Anomalies         uint64  `json:"anomalies"`
	DetectorEvents    uint64  `json:"detector_events"`
	Records           uint64  `json:"records"`
	RecordsPublished  uint64  `json:"records_published"`
	RecordsDropped    uint64  `json:"records_dropped"`
	RecordsStored     int64   `json:"records_stored"`
	StoredAnomalies   int64   `json:"stored_anomalies"`
	ProvRecordsPerSec float64 `json:"provdb_records_per_s"`
	ProvWritten       []int64 `json:"provdb_written_per_instance"`
	// ProvDrainRecordsPerSec is provdb's rate after the detectors closed,
	// when it had a backlog (its capacity here), StoredByKind the records
	// stored of each kind (func_stats and counter_stats from the pserver
	// included).
	ProvDrainRecordsPerSec float64          `json:"provdb_drain_records_per_s"`
	StoredByKind           map[string]int64 `json:"stored_by_kind"`

	// FramesMissing counts ranks that did not process every frame;
	// RankAnomalyMismatches ranks whose anomaly count at pserver shard 0
	// (from their step summaries) differs from the detector's.
	FramesMissing         int `json:"ranks_missing_frames"`
	RankAnomalyMismatches int `json:"rank_anomaly_mismatches"`

	Components []SimComponent `json:"components"`
	// HeapLiveMiB is the Go heap live after the collection of the heap
	// sample, HeapAttributedMiB the part of it the profile attributes
	// (sampling estimate); PeakRSSMiB the process's peak resident memory.
	HeapLiveMiB float64 `json:"heap_live_mib"`
	// StackMiB is the goroutines' stacks (not in the heap) at the heap
	// sample, Goroutines their number.
	StackMiB          float64 `json:"stack_mib"`
	Goroutines        int     `json:"goroutines"`
	HeapAttributedMiB float64 `json:"heap_attributed_mib"`
	PeakRSSMiB        float64 `json:"peak_rss_process_mib"`
}

// Component names: connections are named after them (a node's connection
// is simAD plus its number), and so are heap attributions.
const (
	simPublisher = "publisher"
	simAD        = "ad"
	simPServer   = "pserver"
	simProvDB    = "provdb"
	simNATS      = "nats-server"
	simClients   = "nats-clients"
	simHarness   = "harness"
	simOther     = "other"
)

// simRun is the run id of the simulation's subjects and streams.
const simRun = "sim"

// simNode is one ad process: its connection and its ad node.
type simNode struct {
	id    int
	nc    *nats.Conn
	node  *adnode.Node
	ranks []uint32
}

// Simulate runs a whole deployment in this process, each part as it is
// deployed: one NATS server with JetStream; cfg.Shards pserver instances
// (one shard each, write-ahead log on); cfg.ProvDBs provdb services on one
// durable consumer writing one SQLite store; one ad per node serving its
// ranks (its own connection, node syncer and provenance sink, as the ad
// daemon runs); and a publisher of every rank's synthetic frames, one wave
// per io_step. It measures each part's traffic, memory and rates and
// checks that nothing was lost.
func Simulate(ctx context.Context, cfg SimConfig) (*SimResult, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	s := &simulation{cfg: cfg, log: cfg.Log, heapStart: map[string]float64{}, syncs: &syncMeasures{kinds: map[string]*syncKind{}}}
	defer s.close()
	start := time.Now()
	res, err := s.run(ctx)
	if res != nil {
		res.WallSeconds = time.Since(start).Seconds()
		if kib, ok := peakRSSSelfKiB(); ok {
			res.PeakRSSMiB = float64(kib) / 1024
		}
	}
	return res, err
}

func (c *SimConfig) fill() error {
	if c.Out == "" {
		return errors.New("simulate: no scratch directory")
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.Ranks, 16384)
	def(&c.RanksPerNode, 64)
	def(&c.Shards, 4)
	def(&c.ProvDBs, 2)
	def(&c.Steps, 5)
	def(&c.EventsPerStep, 600)
	if c.NodeSyncLinger == 0 {
		c.NodeSyncLinger = 250 * time.Millisecond
	}
	if c.WaveTimeout == 0 {
		c.WaveTimeout = 10 * time.Minute
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	switch {
	case c.Ranks < 1 || c.Ranks > workload.MaxRanks:
		return fmt.Errorf("simulate: --sim-ranks %d must be in [1, %d]", c.Ranks, workload.MaxRanks)
	case c.RanksPerNode < 2:
		return fmt.Errorf("simulate: --sim-ranks-per-node %d must be at least 2 (one rank per node has no node sync)", c.RanksPerNode)
	case c.Shards < 1 || c.Shards > 64:
		return fmt.Errorf("simulate: --sim-shards %d must be in [1, 64]", c.Shards)
	case c.ProvDBs < 1 || c.ProvDBs > 16:
		return fmt.Errorf("simulate: --sim-provdbs %d must be in [1, 16]", c.ProvDBs)
	case c.Steps < 1 || c.Steps > 1000:
		return fmt.Errorf("simulate: --sim-steps %d must be in [1, 1000]", c.Steps)
	case c.EventsPerStep < workload.MinEventsPerStep || c.EventsPerStep > 1<<20:
		return fmt.Errorf("simulate: --sim-events-per-step %d must be in [%d, %d]", c.EventsPerStep, workload.MinEventsPerStep, 1<<20)
	case c.StepPeriod < 0 || c.NodeSyncLinger < 0 || c.WaveTimeout < 0:
		return errors.New("simulate: negative durations")
	}
	return nil
}

// simulation holds the running parts; close stops them in reverse order.
type simulation struct {
	cfg SimConfig
	log io.Writer

	ns       *server.Server
	url      string
	ctl      *nats.Conn // the harness's own connection
	js       jetstream.JetStream
	pss      []*pserver.Server
	psConns  []*nats.Conn
	store    provenance.Store
	provs    []*provdb.Service
	provConn []*nats.Conn
	nodes    []*simNode
	pub      *nats.Conn

	serveCancel context.CancelFunc
	heapStart   map[string]float64
	syncs       *syncMeasures
	// waveHist are the shards' latency histograms at the end of the last
	// wave; provAtDetectEnd the records provdb had written when the
	// detectors had all closed.
	waveHist        []histogram
	provAtDetectEnd int64
}

func (s *simulation) logf(format string, args ...any) {
	fmt.Fprintf(s.log, "simulate: "+format+"\n", args...)
}

func (s *simulation) run(ctx context.Context) (*SimResult, error) {
	cfg := s.cfg
	nodes := (cfg.Ranks + cfg.RanksPerNode - 1) / cfg.RanksPerNode
	res := &SimResult{Ranks: cfg.Ranks, Nodes: nodes, RanksPerNode: cfg.RanksPerNode, Shards: cfg.Shards,
		ProvDBs: cfg.ProvDBs, Lockstep: !cfg.Free, Steps: cfg.Steps, EventsPerStep: cfg.EventsPerStep, ExpectedWritesPerStep: nodes * cfg.Shards}
	setup := time.Now()
	if err := labelled(ctx, simHarness, s.startNATS); err != nil {
		return nil, err
	}
	if err := labelled(ctx, simPServer, s.startPServers); err != nil {
		return nil, err
	}
	if err := labelled(ctx, simProvDB, s.startProvDBs); err != nil {
		return nil, err
	}
	wl := workload.DefaultConfig()
	wl.Ranks, wl.Steps, wl.EventsPerStep, wl.ThreadsPerRank = cfg.Ranks, cfg.Steps, cfg.EventsPerStep, 1
	if err := labelled(ctx, simAD, func(ctx context.Context) error { return s.startNodes(ctx, nodes) }); err != nil {
		return nil, err
	}
	h0 := liveHeapMiB()
	w, err := workload.New(wl)
	if err != nil {
		return nil, fmt.Errorf("simulate: workload: %w", err)
	}
	if err := labelled(ctx, simPublisher, func(ctx context.Context) (err error) {
		s.pub, err = natsx.Connect(ctx, s.url, simPublisher)
		return err
	}); err != nil {
		return nil, err
	}
	s.heapStart[simPublisher] = liveHeapMiB() - h0
	res.SetupSeconds = time.Since(setup).Seconds()
	s.logf("%d ranks on %d nodes, %d pserver shards, %d provdb: started in %.1f s", cfg.Ranks, nodes, cfg.Shards, cfg.ProvDBs, res.SetupSeconds)

	connz0, err := s.connz()
	if err != nil {
		return nil, err
	}
	// Publish the waves; the source waits between them.
	detectStart := time.Now()
	var heap map[string]float64
	var heapPause time.Duration
	waves := &simWaves{s: s, res: res}
	var beforeStep func(ctx context.Context, step int) error
	src := simSource{w: w, ranks: cfg.Ranks, steps: cfg.Steps, beforeStep: func(ctx context.Context, step int) error {
		return labelled(ctx, simHarness, func(ctx context.Context) error { return beforeStep(ctx, step) })
	}}
	beforeStep = func(ctx context.Context, step int) error {
		if step > 0 {
			if err := waves.end(ctx, step-1); err != nil {
				return err
			}
		}
		if step == cfg.Steps {
			// Every detector is alive and holds its state: sample the heap.
			t := time.Now()
			heap, res.HeapLiveMiB = heapByComponent()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			res.StackMiB, res.Goroutines = float64(ms.StackInuse)/(1<<20), runtime.NumGoroutine()
			heapPause = time.Since(t)
			return nil
		}
		return waves.begin(ctx, step)
	}
	var cpu bytes.Buffer
	profiling := pprof.StartCPUProfile(&cpu) == nil
	var counts publish.Counts
	err = labelled(ctx, simPublisher, func(ctx context.Context) (err error) {
		counts, _, err = publish.Frames(ctx, s.pub, natsx.Subjects{Run: simRun}, src, publish.Pace{EndOfStream: true})
		return err
	})
	if err != nil && profiling {
		pprof.StopCPUProfile()
	}
	if err != nil {
		return res, fmt.Errorf("simulate: publish frames: %w", err)
	}
	res.Frames, res.Events, res.FrameBytes = counts.Frames, int64(counts.Events), counts.Bytes
	stats, err := s.waitNodes(ctx)
	if err != nil {
		return res, err
	}
	res.DetectSeconds = (time.Since(detectStart) - heapPause).Seconds()
	for _, p := range s.provs {
		for _, v := range p.Stats().Written {
			s.provAtDetectEnd += v
		}
	}
	res.HeapSampleSeconds = heapPause.Seconds()
	drainStart := time.Now()
	for _, ps := range s.pss {
		if err := ps.Finish(ctx); err != nil {
			return res, fmt.Errorf("simulate: pserver final statistics: %w", err)
		}
	}
	res.FinishSeconds = time.Since(drainStart).Seconds()
	if err := provstream.WaitConsumed(ctx, s.js, simRun, "provdb"); err != nil {
		return res, fmt.Errorf("simulate: %w", err)
	}
	res.DrainSeconds = time.Since(drainStart).Seconds()
	s.logf("detection %.1f s, provdb drained %.1f s later", res.DetectSeconds, res.DrainSeconds)
	var cpuBy map[string]float64
	if profiling {
		pprof.StopCPUProfile()
		if cpuBy, res.CPUSeconds, err = cpuByLabel(cpu.Bytes(), "component"); err != nil {
			return res, fmt.Errorf("simulate: %w", err)
		}
	}

	connz1, err := s.connz()
	if err != nil {
		return res, err
	}
	if err := s.measure(ctx, res, stats, connz0, connz1, heap, cpuBy); err != nil {
		return res, err
	}
	return res, nil
}

// startNATS starts the server with JetStream, as natsx.StartServer does,
// keeping the server itself for its connection statistics.
func (s *simulation) startNATS(ctx context.Context) error {
	dir := filepath.Join(s.cfg.Out, "nats", "jetstream")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("simulate: NATS store: %w", err)
	}
	h0 := liveHeapMiB()
	ns, err := server.NewServer(&server.Options{
		ServerName: "kipimo-sim", Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		MaxPayload: 8 << 20, JetStream: true, StoreDir: dir,
	})
	if err != nil {
		return fmt.Errorf("simulate: NATS server: %w", err)
	}
	go pprof.Do(context.Background(), pprof.Labels("component", simNATS), func(context.Context) { ns.Start() })
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return errors.New("simulate: NATS server not ready after 10s")
	}
	s.ns, s.url = ns, ns.ClientURL()
	s.ctl, err = natsx.Connect(ctx, s.url, simHarness)
	if err != nil {
		return err
	}
	if s.js, err = jetstream.New(s.ctl); err != nil {
		return fmt.Errorf("simulate: JetStream: %w", err)
	}
	if _, err := provstream.EnsureStream(ctx, s.js, simRun); err != nil {
		return err
	}
	s.heapStart[simNATS] = liveHeapMiB() - h0
	return nil
}

func (s *simulation) startPServers(ctx context.Context) error {
	h0 := liveHeapMiB()
	for i := range s.cfg.Shards {
		nc, err := natsx.Connect(ctx, s.url, fmt.Sprintf("%s-%d", simPServer, i))
		if err != nil {
			return err
		}
		s.psConns = append(s.psConns, nc)
		c := pserver.DefaultConfig()
		c.NATS, c.Run, c.Shard, c.Shards, c.HTTPAddr = "", simRun, i, s.cfg.Shards, ""
		ps, err := pserver.New(c, zerolog.Nop())
		if err != nil {
			return fmt.Errorf("simulate: pserver %d: %w", i, err)
		}
		if err := ps.Start(ctx, nc); err != nil {
			return fmt.Errorf("simulate: start pserver %d: %w", i, err)
		}
		s.pss = append(s.pss, ps)
	}
	s.heapStart[simPServer] = liveHeapMiB() - h0
	return nil
}

func (s *simulation) startProvDBs(ctx context.Context) error {
	h0 := liveHeapMiB()
	store, err := provdb.OpenStore(ctx, filepath.Join(s.cfg.Out, "provenance.db"), false)
	if err != nil {
		return fmt.Errorf("simulate: provenance store: %w", err)
	}
	s.store = store
	for i := range s.cfg.ProvDBs {
		nc, err := natsx.Connect(ctx, s.url, fmt.Sprintf("%s-%d", simProvDB, i))
		if err != nil {
			return err
		}
		s.provConn = append(s.provConn, nc)
		js, err := jetstream.New(nc)
		if err != nil {
			return fmt.Errorf("simulate: provdb %d: JetStream: %w", i, err)
		}
		c := provdb.DefaultConfig()
		c.Run = simRun
		p := provdb.New(c, store, js, zerolog.Nop())
		if err := p.Start(ctx); err != nil {
			return fmt.Errorf("simulate: start provdb %d: %w", i, err)
		}
		s.provs = append(s.provs, p)
	}
	s.heapStart[simProvDB] = liveHeapMiB() - h0
	return nil
}

// labelled runs fn with the goroutine labelled as component (and the
// further label pairs): goroutines started in fn, such as a NATS
// connection's or subscription's, inherit the labels, so that the CPU
// profile attributes their time to the component.
func labelled(ctx context.Context, component string, fn func(ctx context.Context) error, pairs ...string) error {
	var err error
	pprof.Do(ctx, pprof.Labels(append([]string{"component", component}, pairs...)...), func(ctx context.Context) { err = fn(ctx) })
	return err
}

// detectorDefaults is the ad daemon's detector configuration: its flags'
// defaults.
func detectorDefaults() ad.Config {
	var c ad.Config
	adnode.AddFlags(pflag.NewFlagSet("ad", pflag.ContinueOnError), &c)
	d := adnode.DefaultDaemonConfig().Detector
	c.SyncWait, c.SyncTimeout = d.SyncWait, d.SyncTimeout
	return c
}

func (s *simulation) startNodes(ctx context.Context, nodes int) error {
	h0 := liveHeapMiB()
	sctx, cancel := context.WithCancel(ctx)
	s.serveCancel = cancel
	// Every node's close shares this process's cores with all the others'
	// (deployed, each node has its own): at its close each detector sends
	// its last deltas to every shard on its own and flushes its records,
	// so the bound grows with every rank of the run, 20 ms each (5 ms, as
	// kipimo run allows, was exceeded at 16,384 ranks on a loaded 2-core
	// machine).
	closeTimeout := 10*time.Second + time.Duration(s.cfg.Ranks)*20*time.Millisecond
	for i := range nodes {
		name := fmt.Sprintf("%s-%04d", simAD, i)
		// Each rank's detector takes its frames from a queue that holds
		// one wave's frame at a time here; the client's default of 65,536
		// entries would be 512 KiB per rank (see docs/sizing.md).
		nc, err := natsx.Connect(ctx, s.url, name, nats.SyncQueueLen(256))
		if err != nil {
			return err
		}
		n := &simNode{id: i, nc: nc}
		for r := i * s.cfg.RanksPerNode; r < min(s.cfg.Ranks, (i+1)*s.cfg.RanksPerNode); r++ {
			n.ranks = append(n.ranks, uint32(r))
		}
		dc := detectorDefaults()
		dc.Shards = s.cfg.Shards
		dc.Hostname = name
		dc.Syncer = &syncMeter{next: &adnode.NATSSyncer{Conn: nc, Subjects: natsx.Subjects{Run: simRun}}, m: s.syncs}
		// The node's own sink publishes the records; its goroutines carry
		// the profile label component=ad.
		node, err := adnode.New(adnode.Config{
			Serve: adnode.ServeConfig{
				Run: simRun, Ranks: n.ranks, Detector: dc, Lockstep: !s.cfg.Free,
				NodeSyncLinger: s.cfg.NodeSyncLinger, CloseTimeout: closeTimeout,
			},
			Overflow: adnode.Block,
		}, nc, zerolog.Nop(), nil)
		if err != nil {
			nc.Close()
			return fmt.Errorf("simulate: node %d: %w", i, err)
		}
		// A node joins s.nodes (which close stops) once it serves; until
		// then a failure closes what it opened.
		if err := node.Start(pprof.WithLabels(sctx, pprof.Labels("node", strconv.Itoa(i)))); err != nil {
			nc.Close()
			return fmt.Errorf("simulate: node %d: %w", i, err)
		}
		n.node = node
		s.nodes = append(s.nodes, n)
	}
	s.heapStart[simAD] = liveHeapMiB() - h0
	return nil
}

// waitNodes waits for every node's Serve to return, then for its sink to
// have published everything, and returns every rank's counts.
func (s *simulation) waitNodes(ctx context.Context) ([]ad.Stats, error) {
	var all []ad.Stats
	var errs []error
	for _, n := range s.nodes {
		select {
		case <-n.node.Done():
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		// Stopped: Shutdown returns what ended it, once its sink has
		// published everything.
		if err := n.node.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("node %d: %w", n.id, err))
		}
		all = append(all, n.node.Stats()...)
	}
	if err := errors.Join(errs...); err != nil {
		return all, fmt.Errorf("simulate: detectors: %w", err)
	}
	return all, nil
}

func (s *simulation) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if s.serveCancel != nil {
		s.serveCancel()
	}
	// Every node has stopped before its connection closes.
	for _, n := range s.nodes {
		_ = n.node.Shutdown(ctx)
	}
	for _, ps := range s.pss {
		_ = ps.Shutdown(ctx)
	}
	for _, p := range s.provs {
		_ = p.Shutdown(ctx)
	}
	if s.store != nil {
		_ = s.store.Close()
	}
	for _, n := range s.nodes {
		n.nc.Close()
	}
	for _, nc := range slices.Concat(s.psConns, s.provConn, []*nats.Conn{s.pub, s.ctl}) {
		if nc != nil {
			nc.Close()
		}
	}
	if s.ns != nil {
		s.ns.Shutdown()
		s.ns.WaitForShutdown()
	}
}

// simSource yields every rank's frame of a step before any of the next
// (a wave), calling beforeStep before each step and once after the last.
type simSource struct {
	w            *workload.Workload
	ranks, steps int
	beforeStep   func(ctx context.Context, step int) error
}

func (src simSource) Frames(ctx context.Context, emit func(*frame.Frame) error) (replay.Stats, error) {
	var st replay.Stats
	gens := make([]*workload.RankGen, src.ranks)
	for r := range gens {
		gens[r] = src.w.Rank(uint32(r))
	}
	var f frame.Frame
	for step := range src.steps {
		if err := src.beforeStep(ctx, step); err != nil {
			return st, err
		}
		for _, g := range gens {
			if _, err := g.Next(&f); err != nil {
				return st, fmt.Errorf("rank %d step %d: %w", g.Rank(), step, err)
			}
			st.Frames++
			st.Events += f.NumEvents()
			if err := emit(&f); err != nil {
				return st, err
			}
		}
	}
	return st, src.beforeStep(ctx, src.steps)
}

// simWaves times the waves and reads the pserver's counters between them.
type simWaves struct {
	s     *simulation
	res   *SimResult
	start time.Time
	prev  []psCounters
}

// psHistograms reads every shard's sync latency histogram.
func (s *simulation) psHistograms() ([]histogram, error) {
	out := make([]histogram, len(s.pss))
	for i := range s.pss {
		body, err := s.psMetrics(i)
		if err != nil {
			return nil, err
		}
		if out[i], err = parseHistogram(bytes.NewReader(body), "kipimo_ps_sync_latency_seconds"); err != nil {
			return nil, fmt.Errorf("simulate: pserver %d: %w", i, err)
		}
	}
	return out, nil
}

// mergeHistograms adds histograms of the same bounds; sub, when given,
// is subtracted bucket by bucket (a later reading minus an earlier one).
func mergeHistograms(hs []histogram, sub []histogram) histogram {
	var m histogram
	for i, h := range hs {
		if m.bounds == nil {
			m = histogram{bounds: h.bounds, counts: make([]float64, len(h.counts))}
		}
		if !slices.Equal(m.bounds, h.bounds) {
			continue
		}
		for j := range h.counts {
			m.counts[j] += h.counts[j]
		}
		m.count += h.count
		if i < len(sub) && slices.Equal(sub[i].bounds, h.bounds) {
			for j := range h.counts {
				m.counts[j] -= sub[i].counts[j]
			}
			m.count -= sub[i].count
		}
	}
	return m
}

// psCounters are one shard's request counters.
type psCounters struct {
	applied, nodes, parts, duplicates float64
}

func (w *simWaves) begin(ctx context.Context, step int) error {
	if p := w.s.cfg.StepPeriod; p > 0 && !w.start.IsZero() {
		if d := time.Until(w.start.Add(p)); d > 0 {
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-t.C:
			}
		}
	}
	if w.prev == nil {
		c, err := w.s.psCounters()
		if err != nil {
			return err
		}
		w.prev = c
	}
	w.start = time.Now()
	return nil
}

// end waits until every detector has processed step's frame and, within
// twice the sync wait after that, has its syncs answered; then it reads
// the shards' counters.
func (w *simWaves) end(ctx context.Context, step int) error {
	s := w.s
	want := uint64(step + 1)
	deadline := time.Now().Add(s.cfg.WaveTimeout)
	var settleBy time.Time
	settled := false
	for {
		taken, lagging := true, false
		for _, n := range s.nodes {
			for _, st := range n.node.Collector().Stats() {
				if st.Frames+st.BadFrames+st.UnnamedFrames < want {
					taken = false
				}
				if st.Lag > 0 {
					lagging = true
				}
			}
		}
		if taken && settleBy.IsZero() {
			settleBy = time.Now().Add(2 * detectorDefaults().SyncWait)
		}
		if taken && (!lagging || time.Now().After(settleBy)) {
			settled = !lagging
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("simulate: wave %d not processed within %s", step, s.cfg.WaveTimeout)
		}
		t := time.NewTimer(10 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
	el := time.Since(w.start)
	cur, err := s.psCounters()
	if err != nil {
		return err
	}
	sw := SimStep{Step: step, Seconds: el.Seconds(), Settled: settled, Writes: make([]uint64, len(cur)), Requests: make([]uint64, len(cur))}
	for i := range cur {
		sw.Writes[i] = uint64(cur[i].nodes - w.prev[i].nodes)
		sw.Requests[i] = uint64(cur[i].applied + cur[i].duplicates - w.prev[i].applied - w.prev[i].duplicates)
		sw.RankParts += uint64(cur[i].parts - w.prev[i].parts)
	}
	if pend, err := s.provPending(ctx); err == nil {
		sw.ProvPending = pend
	}
	w.prev = cur
	w.res.StepsMeasured = append(w.res.StepsMeasured, sw)
	if step == s.cfg.Steps-1 {
		if s.waveHist, err = s.psHistograms(); err != nil {
			return err
		}
	}
	var total uint64
	for _, x := range sw.Writes {
		total += x
	}
	s.logf("wave %d: %.2f s, %d node writes (%d expected), provdb pending %d messages", step, el.Seconds(), total, w.res.ExpectedWritesPerStep, sw.ProvPending)
	return nil
}

// psMetrics returns shard i's Prometheus exposition.
func (s *simulation) psMetrics(i int) ([]byte, error) {
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	rec := httptest.NewRecorder()
	s.pss[i].Handler().ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		return nil, fmt.Errorf("simulate: pserver %d /metrics: status %d", i, rec.Code)
	}
	return rec.Body.Bytes(), nil
}

func (s *simulation) psCounters() ([]psCounters, error) {
	out := make([]psCounters, len(s.pss))
	for i := range s.pss {
		body, err := s.psMetrics(i)
		if err != nil {
			return nil, err
		}
		c := &out[i]
		for series, v := range map[string]*float64{
			`kipimo_ps_sync_requests_total{result="applied"}`:   &c.applied,
			`kipimo_ps_sync_requests_total{result="duplicate"}`: &c.duplicates,
			"kipimo_ps_node_syncs_total":                        &c.nodes,
			"kipimo_ps_rank_syncs_total":                        &c.parts,
		} {
			if *v, err = seriesValue(body, series); err != nil {
				return nil, fmt.Errorf("simulate: pserver %d: %w", i, err)
			}
		}
	}
	return out, nil
}

// seriesValue reads one series (name and labels as exposed) from a
// Prometheus text exposition; a series not exposed reads 0.
func seriesValue(body []byte, series string) (float64, error) {
	for line := range strings.SplitSeq(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return 0, fmt.Errorf("metrics: %s: %w", series, err)
			}
			return f, nil
		}
	}
	return 0, nil
}

// provPending is the provenance messages provdb has not acknowledged.
func (s *simulation) provPending(ctx context.Context) (uint64, error) {
	cons, err := s.js.Consumer(ctx, natsx.ProvStream(simRun), "provdb")
	if err != nil {
		return 0, err
	}
	ci, err := cons.Info(ctx)
	if err != nil {
		return 0, err
	}
	return ci.NumPending + uint64(ci.NumAckPending), nil
}

// connTraffic is one connection's counts, as the server keeps them.
type connTraffic struct {
	inMsgs, outMsgs, inBytes, outBytes uint64
}

// connz returns every client connection's counts by name.
func (s *simulation) connz() (map[string]connTraffic, error) {
	out := map[string]connTraffic{}
	offset := 0
	for {
		cz, err := s.ns.Connz(&server.ConnzOptions{Offset: offset, Limit: 1024})
		if err != nil {
			return nil, fmt.Errorf("simulate: NATS connection statistics: %w", err)
		}
		for _, c := range cz.Conns {
			t := out[c.Name]
			t.inMsgs += uint64(c.InMsgs)
			t.outMsgs += uint64(c.OutMsgs)
			t.inBytes += uint64(c.InBytes)
			t.outBytes += uint64(c.OutBytes)
			out[c.Name] = t
		}
		offset += len(cz.Conns)
		if len(cz.Conns) == 0 || offset >= cz.Total {
			return out, nil
		}
	}
}

// componentOf is the component a connection name belongs to.
func componentOf(conn string) string {
	base, _, _ := strings.Cut(conn, "-")
	switch {
	case conn == simPublisher:
		return simPublisher
	case base == simAD || base == simPServer || base == simProvDB:
		return base
	case conn == simHarness:
		return simHarness
	}
	return simOther
}

// carries says what flows on a component's connections.
var carries = map[string]string{
	simPublisher: "in: frames (one per rank per io_step)",
	simPServer:   "in: sync replies, write-ahead-log appends, snapshots; out: sync requests, JetStream acks",
	simAD:        "in: merged sync requests, per-rank syncs at close, provenance batches (JetStream publishes); out: frames, sync replies, JetStream acks",
	simProvDB:    "in: fetch requests and acks; out: provenance batches",
	simHarness:   "JetStream API calls of the measurement",
}

// measure fills res from the counters of every part.
func (s *simulation) measure(ctx context.Context, res *SimResult, stats []ad.Stats, c0, c1 map[string]connTraffic, heap, cpu map[string]float64) error {
	active := res.DetectSeconds + res.DrainSeconds
	// Detectors.
	want := uint64(s.cfg.Steps)
	for _, st := range stats {
		res.Anomalies += st.Anomalies
		res.DetectorEvents += st.Events
		res.Records += st.Records
		if st.Frames != want {
			res.FramesMissing++
		}
	}
	res.FramesMissing += s.cfg.Ranks - len(stats)
	for _, n := range s.nodes {
		res.RecordsPublished += n.node.Sink().Published()
		res.RecordsDropped += n.node.Sink().Dropped()
	}
	// pserver: requests, latency, per-rank anomalies at shard 0.
	counters, err := s.psCounters()
	if err != nil {
		return err
	}
	final, err := s.psHistograms()
	if err != nil {
		return err
	}
	for i, c := range counters {
		res.NodeWrites = append(res.NodeWrites, uint64(c.nodes))
		res.RankWrites += uint64(c.applied - c.nodes)
		res.Duplicates += uint64(c.duplicates)
		var wave []histogram
		if i < len(s.waveHist) {
			wave = []histogram{s.waveHist[i]}
		}
		res.ShardP99Ms = append(res.ShardP99Ms, res.boundMs(mergeHistograms(wave, nil), 0.99, fmt.Sprintf("shard %d p99", i)))
		if active > 0 {
			name := fmt.Sprintf("%s-%d", simPServer, i)
			res.ShardOutMsgsPerSec = append(res.ShardOutMsgsPerSec, float64(c1[name].outMsgs-c0[name].outMsgs)/active)
		}
	}
	res.Syncs = s.syncs.results()
	waves := mergeHistograms(s.waveHist, nil)
	closing := mergeHistograms(final, s.waveHist)
	res.SyncP50Ms, res.SyncP99Ms = res.boundMs(waves, 0.5, "p50"), res.boundMs(waves, 0.99, "p99")
	res.CloseSyncP50Ms, res.CloseSyncP99Ms = res.boundMs(closing, 0.5, "close p50"), res.boundMs(closing, 0.99, "close p99")
	res.WaveSyncs, res.CloseSyncs = uint64(waves.count), uint64(closing.count)
	var all, inWaves uint64
	for _, w := range res.NodeWrites {
		all += w
	}
	for _, st := range res.StepsMeasured {
		for _, w := range st.Writes {
			inWaves += w
		}
	}
	if len(res.StepsMeasured) > 0 {
		res.WritesPerStep = float64(inWaves) / float64(len(res.StepsMeasured))
	}
	res.CloseNodeWrites = all - inWaves
	byRank := map[pserver.DetectorID]uint64{}
	s.pss[0].View(func(st *pserver.State) {
		for id, t := range st.Agg.Ranks {
			byRank[id] = t.Anomalies
		}
	})
	for _, st := range stats {
		if byRank[pserver.DetectorID{PID: st.PID, Rank: st.Rank}] != st.Anomalies {
			res.RankAnomalyMismatches++
		}
	}
	// provdb.
	res.StoredByKind = map[string]int64{}
	for _, k := range provenance.Kinds {
		n, err := s.store.Count(ctx, provenance.Query{Kind: k, Limit: provenance.NoLimit})
		if err != nil {
			return fmt.Errorf("simulate: count stored %s: %w", k, err)
		}
		res.StoredByKind[string(k)] = n
		if k != provenance.KindAnomalies && k != provenance.KindNormalExecs && k != provenance.KindMetadata && k != provenance.KindProfiles {
			continue
		}
		res.RecordsStored += n
		if k == provenance.KindAnomalies {
			res.StoredAnomalies = n
		}
	}
	var written int64
	for _, p := range s.provs {
		var n int64
		for _, v := range p.Stats().Written {
			n += v
		}
		res.ProvWritten = append(res.ProvWritten, n)
		written += n
	}
	if active > 0 {
		res.ProvRecordsPerSec = float64(written) / active
	}
	if res.DrainSeconds > 0 {
		res.ProvDrainRecordsPerSec = float64(written-s.provAtDetectEnd) / res.DrainSeconds
	}
	// Traffic per component, from the server's per-connection counts.
	comps := map[string]*SimComponent{}
	maxOut := map[string]float64{}
	for name, t1 := range c1 {
		t0 := c0[name]
		comp := componentOf(name)
		c := comps[comp]
		if c == nil {
			c = &SimComponent{Name: comp, Carries: carries[comp]}
			comps[comp] = c
		}
		c.Instances++
		c.InMsgs += t1.inMsgs - t0.inMsgs
		c.OutMsgs += t1.outMsgs - t0.outMsgs
		c.InBytes += t1.inBytes - t0.inBytes
		c.OutBytes += t1.outBytes - t0.outBytes
		if active > 0 {
			maxOut[comp] = max(maxOut[comp], float64(t1.outMsgs-t0.outMsgs)/active)
		}
	}
	// Memory: the heap profile's attribution, and each part's start.
	for name, mib := range heap {
		res.HeapAttributedMiB += mib
		c := comps[name]
		if c == nil {
			c = &SimComponent{Name: name, Carries: "(no connection of its own)"}
			comps[name] = c
		}
		c.LiveHeapMiB += mib
	}
	for name, sec := range cpu {
		if name == "" {
			name = simOther
		}
		c := comps[name]
		if c == nil {
			c = &SimComponent{Name: name, Carries: "(no connection of its own)"}
			comps[name] = c
		}
		c.CPUSeconds += sec
	}
	for name, mib := range s.heapStart {
		c := comps[name]
		if c == nil {
			c = &SimComponent{Name: name, Carries: "(no connection of its own)"}
			comps[name] = c
		}
		c.StartHeapMiB += mib
	}
	for name, c := range comps {
		if active > 0 {
			c.InMsgsPerSec = float64(c.InMsgs) / active
			c.OutMsgsPerSec = float64(c.OutMsgs) / active
			c.InBytesPerSec = float64(c.InBytes) / active
			c.OutBytesPerSec = float64(c.OutBytes) / active
			c.MaxInstanceOutMsgsPerSec = maxOut[name]
		}
		res.Components = append(res.Components, *c)
	}
	order := map[string]int{simPublisher: 0, simAD: 1, simPServer: 2, simProvDB: 3, simNATS: 4, simClients: 5, simHarness: 6, simOther: 7}
	rank := func(n string) int {
		if r, ok := order[n]; ok {
			return r
		}
		return len(order)
	}
	sort.Slice(res.Components, func(i, j int) bool {
		a, b := res.Components[i].Name, res.Components[j].Name
		if rank(a) != rank(b) {
			return rank(a) < rank(b)
		}
		return a < b
	})
	return nil
}

// boundMs is quantile q of h in ms; one beyond the last finite bound reads
// as that bound and is named in SyncBeyond.
func (res *SimResult) boundMs(h histogram, q float64, name string) float64 {
	v := h.quantile(q)
	if math.IsInf(v, 1) {
		res.SyncBeyond = append(res.SyncBeyond, name)
		for i := len(h.bounds) - 1; i >= 0; i-- {
			if !math.IsInf(h.bounds[i], 1) {
				return h.bounds[i] * 1e3
			}
		}
		return 0
	}
	if math.IsNaN(v) {
		return 0
	}
	return v * 1e3
}

// liveHeapMiB is the Go heap live after a collection.
func liveHeapMiB() float64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.HeapAlloc) / (1 << 20)
}

// heapByComponent collects the garbage, then attributes the live heap to
// components by the stack that allocated each sampled object: the
// innermost frame that belongs to a component decides. Objects allocated
// by the NATS client's own goroutines (reading and queueing messages of
// every connection) count as nats-clients. It returns MiB per component
// (scaled from the samples as pprof scales them) and the live heap.
func heapByComponent() (map[string]float64, float64) {
	live := liveHeapMiB()
	n, _ := runtime.MemProfile(nil, true)
	var recs []runtime.MemProfileRecord
	for {
		recs = make([]runtime.MemProfileRecord, n+64)
		var ok bool
		if n, ok = runtime.MemProfile(recs, true); ok {
			recs = recs[:n]
			break
		}
	}
	rate := float64(runtime.MemProfileRate)
	out := map[string]float64{}
	for i := range recs {
		r := &recs[i]
		inuse := float64(r.AllocBytes - r.FreeBytes)
		if inuse <= 0 || r.AllocObjects == 0 {
			continue
		}
		if rate > 1 {
			// An object of size z is sampled with probability
			// 1-exp(-z/rate): weigh each sample by its inverse.
			avg := float64(r.AllocBytes) / float64(r.AllocObjects)
			inuse /= 1 - math.Exp(-avg/rate)
		}
		out[classifyStack(r.Stack())] += inuse / (1 << 20)
	}
	return out, live
}

// componentPackages maps a function-name prefix to its component, most
// specific first.
var componentPackages = []struct{ prefix, comp string }{
	{"github.com/kipimo-hpc/kipimo/internal/ad.", simAD},
	{"github.com/kipimo-hpc/kipimo/internal/adnode.", simAD},
	{"github.com/kipimo-hpc/kipimo/internal/pserver.", simPServer},
	{"github.com/kipimo-hpc/kipimo/internal/provenance/provdb.", simProvDB},
	{"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore.", simProvDB},
	{"modernc.org/sqlite", simProvDB},
	{"github.com/nats-io/nats-server/", simNATS},
	{"github.com/kipimo-hpc/kipimo/internal/workload.", simPublisher},
	{"github.com/kipimo-hpc/kipimo/internal/replay/publish.", simPublisher},
	{"github.com/kipimo-hpc/kipimo/internal/bench.simSource", simPublisher},
	{"github.com/kipimo-hpc/kipimo/internal/bench.", simHarness},
	{"github.com/nats-io/nats.go", simClients},
}

// classifyStack names the component of an allocation's stack: the first
// frame, from the innermost, that belongs to a component (the NATS client
// only when nothing above it does).
func classifyStack(stk []uintptr) string {
	frames := runtime.CallersFrames(stk)
	client := false
	for {
		f, more := frames.Next()
		for _, p := range componentPackages {
			if strings.HasPrefix(f.Function, p.prefix) {
				if p.comp == simClients {
					client = true
					break
				}
				return p.comp
			}
		}
		if !more {
			break
		}
	}
	if client {
		return simClients
	}
	return simOther
}
