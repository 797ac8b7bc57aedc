package pserver

import (
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// metrics are the Server's Prometheus metrics, in the registry its caller
// gave (Config.Metrics) or one of its own. Every
// name starts with kipimo_. Per-rank series exist for at most MaxRankSeries
// ranks (the first ones seen); nothing is labelled by function.
type metrics struct {
	reg *prometheus.Registry

	syncRequests *prometheus.CounterVec
	syncLatency  prometheus.Histogram
	merges       prometheus.Counter
	events       prometheus.Counter
	executions   prometheus.Counter
	anomalies    prometheus.Counter
	badFrames    prometheus.Counter
	missingSteps prometheus.Counter
	nodeRequests prometheus.Counter
	rankParts    prometheus.Counter
	rankAnom     *prometheus.CounterVec
	rankExec     *prometheus.CounterVec

	walErrors       prometheus.Counter
	replaySkipped   *prometheus.CounterVec
	incarnations    prometheus.Counter
	replyErrors     prometheus.Counter
	snapshots       prometheus.Counter
	snapshotBytes   prometheus.Gauge
	snapshotSeconds prometheus.Histogram

	sseClients prometheus.Gauge
	sseUpdates prometheus.Counter
	sseDropped prometheus.Counter

	rankMu    sync.Mutex
	rankSeen  map[DetectorID]bool
	maxRanks  int
	lastMerge uint64
}

// newMetrics registers the metrics of s on the registry its caller gave
// (Config.Metrics), or on one of its own; gauges read s's state at scrape
// time.
func newMetrics(s *Server) *metrics {
	reg := s.cfg.Metrics
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	pre := prometheus.WrapRegistererWithPrefix("kipimo_", reg)
	pre.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	f := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
		reg.MustRegister(c)
		return c
	}
	m := &metrics{reg: reg, rankSeen: map[DetectorID]bool{}, maxRanks: s.cfg.MaxRankSeries}
	m.syncRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kipimo_ps_sync_requests_total",
		Help: "Sync requests handled, by result: applied, duplicate (Seq already applied), bad (undecodable), invalid (refused by validation: non-finite or inconsistent statistics, sizes, Seq or io_step out of bounds), error.",
	}, []string{"result"})
	m.syncLatency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "kipimo_ps_sync_latency_seconds",
		Help:    "Time from receiving a sync request to publishing its reply (including the durable log append).",
		Buckets: []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .2, .5, 1, 2},
	})
	m.rankAnom = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kipimo_rank_anomalies_total",
		Help: "Anomalies reported by a rank (only the first --max-rank-series ranks have a series).",
	}, []string{"pid", "rank"})
	m.rankExec = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kipimo_rank_executions_total",
		Help: "Executions analysed by a rank (only the first --max-rank-series ranks have a series).",
	}, []string{"pid", "rank"})
	m.replaySkipped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kipimo_ps_replay_skipped_total",
		Help: "Invalid things found in the persisted state and skipped, by source: wal (sync-log entries not applied) or snapshot (models, counters and statistics dropped or reset on load).",
	}, []string{"source"})
	reg.MustRegister(m.syncRequests, m.syncLatency, m.rankAnom, m.rankExec, m.replaySkipped)
	m.incarnations = f("kipimo_ps_incarnations_total", "New incarnations of detectors that had synced before (a detector restarted without its checkpoint): its Seq starts again under the new incarnation.")
	m.merges = f("kipimo_ps_merges_total", "Model and counter deltas merged into the global model.")
	m.events = f("kipimo_events_total", "Function events the detectors processed, as reported in step summaries.")
	m.executions = f("kipimo_executions_total", "Executions the detectors labelled, as reported in step summaries.")
	m.anomalies = f("kipimo_anomalies_total", "Anomalies the detectors found, as reported in step summaries.")
	m.badFrames = f("kipimo_bad_frames_total", "Frames the detectors rejected as malformed, as reported in step summaries.")
	m.missingSteps = f("kipimo_missing_steps_total", "io_steps that never reached a detector (gaps in a rank's sequence of frames), as reported in step summaries.")
	m.nodeRequests = f("kipimo_ps_node_syncs_total", "Applied sync requests that carried the merged deltas of several ranks (one ad process serving a node's ranks sends one per shard per step).")
	m.rankParts = f("kipimo_ps_rank_syncs_total", "Ranks' deltas in applied sync requests: divided by kipimo_ps_sync_requests_total{result=\"applied\"}, the ranks per request.")
	m.walErrors = f("kipimo_ps_wal_errors_total", "Failed appends to, or unreadable entries of, the sync log.")
	m.replyErrors = f("kipimo_ps_reply_errors_total", "Sync replies that could not be published.")
	m.snapshots = f("kipimo_ps_snapshots_total", "State snapshots written to the key-value bucket.")
	m.sseUpdates = f("kipimo_ps_sse_updates_total", "Dashboard updates broadcast to SSE clients.")
	m.sseDropped = f("kipimo_ps_sse_dropped_total", "Dashboard updates dropped because an SSE client was too slow.")
	m.snapshotBytes = prometheus.NewGauge(prometheus.GaugeOpts{Name: "kipimo_ps_snapshot_bytes", Help: "Size of the last state snapshot."})
	m.snapshotSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "kipimo_ps_snapshot_seconds", Help: "Time to encode and store a state snapshot.",
		Buckets: prometheus.ExponentialBuckets(0.001, 4, 8),
	})
	m.sseClients = prometheus.NewGauge(prometheus.GaugeOpts{Name: "kipimo_ps_sse_clients", Help: "Connected SSE clients."})
	reg.MustRegister(m.snapshotBytes, m.snapshotSeconds, m.sseClients)
	gauge := func(name, help string, v func(st *State) float64) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 {
			var x float64
			s.View(func(st *State) { x = v(st) })
			return x
		}))
	}
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "kipimo_frames_total", Help: "Frames (rank, io_step) the detectors reported processing in their step summaries.",
	}, func() float64 {
		var x float64
		s.View(func(st *State) { x = float64(st.Agg.Total().Frames) })
		return x
	}))
	gauge("kipimo_ps_detectors", "Detectors that have synced with this shard.", func(st *State) float64 { return float64(len(st.LastSeq)) })
	gauge("kipimo_ps_models", "Model keys held by this shard.", func(st *State) float64 { return float64(len(st.Models)) })
	gauge("kipimo_ps_io_step", "Highest io_step reported in a step summary.", func(st *State) float64 { return float64(st.Agg.MaxStep) })
	gauge("kipimo_ps_wal_seq", "Last sync-log sequence applied.", func(st *State) float64 { return float64(st.WALSeq) })
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kipimo_ps_shard", Help: "Shard served by this instance.",
		ConstLabels: prometheus.Labels{"shards": strconv.Itoa(s.cfg.Shards)},
	}, func() float64 { return float64(s.cfg.Shard) }))
	return m
}

// observeRequest counts an applied request; merges is the state's merge total
// after it.
func (m *metrics) observeRequest(req *syncproto.SyncRequest, merges uint64) {
	m.rankMu.Lock()
	if merges > m.lastMerge {
		m.merges.Add(float64(merges - m.lastMerge))
		m.lastMerge = merges
	}
	m.rankMu.Unlock()
	if len(req.Ranks) > 0 {
		m.nodeRequests.Inc()
	}
	parts := rankParts(req)
	m.rankParts.Add(float64(len(parts)))
	for i := range parts {
		m.observeRank(DetectorID{parts[i].PID, parts[i].Rank}, parts[i].Steps)
	}
}

// observeRank counts one rank's step summaries of an applied request.
func (m *metrics) observeRank(id DetectorID, steps []syncproto.StepSummary) {
	m.rankMu.Lock()
	series := m.rankSeen[id]
	if !series && len(m.rankSeen) < m.maxRanks && len(steps) > 0 {
		m.rankSeen[id] = true
		series = true
	}
	m.rankMu.Unlock()
	var anom, exec uint64
	for i := range steps {
		st := &steps[i]
		m.events.Add(float64(st.Events))
		m.executions.Add(float64(st.Executions))
		m.badFrames.Add(float64(st.BadFrames))
		m.missingSteps.Add(float64(st.MissingSteps))
		anom += st.Anomalies
		exec += st.Executions
	}
	m.anomalies.Add(float64(anom))
	if series {
		pid, rank := strconv.FormatUint(uint64(id.PID), 10), strconv.FormatUint(uint64(id.Rank), 10)
		m.rankAnom.WithLabelValues(pid, rank).Add(float64(anom))
		m.rankExec.WithLabelValues(pid, rank).Add(float64(exec))
	}
}
