package ad

import (
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// counters are a detector's counts, written by its goroutine and read by
// anyone.
type counters struct {
	frames, badFrames, events, executions, anomalies atomic.Uint64
	unmatchedExits, mismatchedExits, repairedOpen    atomic.Uint64
	openAtEnd, unscored, records, droppedRecords     atomic.Uint64
	syncs, syncFailures, droppedSummaries            atomic.Uint64
	modelErrors, evictedLaunches                     atomic.Uint64
	unmatchedCorrelations                            atomic.Uint64
	// sourceDropped is the latest count the rank's event source reported
	// of frames it dropped before they reached NATS (SourceDroppedHeader).
	sourceDropped atomic.Uint64
	// missingSteps are io_steps skipped in the rank's sequence of frames
	missingSteps atomic.Uint64
	// pathOverflows are executions whose call path found no room in the
	// call-path table (Config.ProfilePaths).
	pathOverflows atomic.Uint64
	// unnamedFrames are frames dropped while waiting for the names of
	// ids their events use (Config.MaxHeldFrames, or held at Close).
	unnamedFrames atomic.Uint64
	// lostAtGap are executions open when a gap in the rank's io_steps was
	// found, closed as lost (never modelled); staleFrames are frames whose
	// io_step was not after the last one processed, dropped.
	lostAtGap, staleFrames atomic.Uint64
	// droppedFrames are frames dropped before the detector read them: its
	// input queue was full (ServeConfig.PendingFrames, PendingBytes).
	droppedFrames atomic.Uint64
	// what the rank's event library reported it summarised or dropped
	// (sourcecounters.go)
	summarisedCalls, sourceDroppedCalls, sourceDroppedEvents atomic.Uint64
	// ended is set once the rank's stream ended (end-of-stream message).
	ended atomic.Bool
}

// taken is how many frames the detector has taken from its input:
// processed, rejected, dropped as stale or dropped unread.
func (c *counters) taken() uint64 {
	return c.frames.Load() + c.badFrames.Load() + c.staleFrames.Load() + c.droppedFrames.Load()
}

// Stats is a snapshot of a detector's counts.
type Stats struct {
	PID  uint32 `json:"pid"`
	Rank uint32 `json:"rank"`
	// Frames processed and frames rejected.
	Frames    uint64 `json:"frames"`
	BadFrames uint64 `json:"bad_frames"`
	// Events of all kinds (function, counter, comm) in processed frames.
	Events uint64 `json:"events"`
	// Executions completed, and those labelled anomalous.
	Executions uint64 `json:"executions"`
	Anomalies  uint64 `json:"anomalies"`
	// UnmatchedExits are exits with no open entry of their function (dropped,
	// counted); MismatchedExits are exits that closed an entry deeper in the
	// stack, RepairedOpen the entries above it they closed; OpenAtEnd are
	// entries still open at Close, closed there.
	UnmatchedExits  uint64 `json:"unmatched_exits"`
	MismatchedExits uint64 `json:"mismatched_exits"`
	RepairedOpen    uint64 `json:"repaired_open"`
	OpenAtEnd       uint64 `json:"open_at_end"`
	// Unscored executions were labelled normal because their model had fewer
	// than MinCount values.
	Unscored uint64 `json:"unscored"`
	// Records handed to the sink, and records it did not accept.
	Records        uint64 `json:"records"`
	DroppedRecords uint64 `json:"dropped_records"`
	// Syncs answered, sync attempts failed, step summaries dropped while the
	// pserver was unreachable.
	Syncs            uint64 `json:"syncs"`
	SyncFailures     uint64 `json:"sync_failures"`
	DroppedSummaries uint64 `json:"dropped_summaries"`
	// Lag is the number of steps whose deltas the pserver has not answered yet
	// (0 when in sync).
	Lag uint64 `json:"lag_steps"`
	// ModelErrors are histogram merges refused as malformed;
	// EvictedLaunches are CPU launches forgotten before their GPU kernel
	// came; UnmatchedCorrelations are GPU records without a known launch.
	ModelErrors           uint64 `json:"model_errors"`
	EvictedLaunches       uint64 `json:"evicted_launches"`
	UnmatchedCorrelations uint64 `json:"unmatched_correlations"`
	// SourceDroppedFrames are frames the rank's event source (the in-process
	// event library) dropped before they reached NATS: its queue was full
	// or the server was gone.
	SourceDroppedFrames uint64 `json:"source_dropped_frames"`
	// MissingSteps are io_steps that never reached the detector: gaps in the
	// rank's sequence of frames (lost on the way, or dropped by a source
	// that does not say so).
	MissingSteps uint64 `json:"missing_steps"`
	// PathOverflows are executions whose call path found no room in the
	// call-path table (Config.ProfilePaths): they count in their function's
	// flat profile only.
	PathOverflows uint64 `json:"path_overflows"`
	// UnnamedFrames are frames dropped because their events used function
	// or counter ids whose names had not arrived: more than MaxHeldFrames
	// frames waited, or the stream ended first. Their steps are also
	// missing steps downstream.
	UnnamedFrames uint64 `json:"unnamed_frames"`
	// LostAtGap are executions that were open when a gap in the rank's
	// io_steps was found: their exits were lost in the gap, so they were
	// closed without a runtime and kept out of every model, label, profile
	// and record (an entry before a gap is never paired with an exit after
	// it).
	LostAtGap uint64 `json:"lost_at_gap"`
	// StaleFrames are frames dropped because their io_step was not after the
	// last one processed (duplicates, or frames overtaken by later ones).
	StaleFrames uint64 `json:"stale_frames"`
	// DroppedFrames are frames dropped before the detector read them
	// because it was slower than its input (its queue was full in frames or
	// bytes); their steps are also missing steps.
	DroppedFrames uint64 `json:"dropped_frames"`
	// SummarisedCalls are calls the rank's event library summarised per
	// io_step instead of streaming them (functions called faster than its
	// rate): in the profiles, never scored. SourceDroppedCalls are calls
	// it dropped whole, and SourceDroppedEvents comm and counter events it
	// dropped, because its buffers were full.
	SummarisedCalls     uint64 `json:"summarised_calls"`
	SourceDroppedCalls  uint64 `json:"source_dropped_calls"`
	SourceDroppedEvents uint64 `json:"source_dropped_events"`
	// Ended tells whether the rank's stream ended with an end-of-stream
	// message (Add leaves it alone).
	Ended bool `json:"ended"`
}

// Stats returns the detector's counts; safe for concurrent use.
func (d *Detector) Stats() Stats {
	c := &d.stats
	return Stats{
		PID: d.cfg.PID, Rank: d.cfg.Rank,
		Frames: c.frames.Load(), BadFrames: c.badFrames.Load(), Events: c.events.Load(),
		Executions: c.executions.Load(), Anomalies: c.anomalies.Load(),
		UnmatchedExits: c.unmatchedExits.Load(), MismatchedExits: c.mismatchedExits.Load(),
		RepairedOpen: c.repairedOpen.Load(), OpenAtEnd: c.openAtEnd.Load(), Unscored: c.unscored.Load(),
		Records: c.records.Load(), DroppedRecords: c.droppedRecords.Load(),
		Syncs: c.syncs.Load(), SyncFailures: c.syncFailures.Load(), DroppedSummaries: c.droppedSummaries.Load(),
		Lag:         d.sync.lag.Load(),
		ModelErrors: c.modelErrors.Load(), EvictedLaunches: c.evictedLaunches.Load(),
		UnmatchedCorrelations: c.unmatchedCorrelations.Load(),
		SourceDroppedFrames:   c.sourceDropped.Load(),
		MissingSteps:          c.missingSteps.Load(),
		Ended:                 c.ended.Load(),
		PathOverflows:         c.pathOverflows.Load(),
		UnnamedFrames:         c.unnamedFrames.Load(),
		LostAtGap:             c.lostAtGap.Load(),
		StaleFrames:           c.staleFrames.Load(),
		DroppedFrames:         c.droppedFrames.Load(),
		SummarisedCalls:       c.summarisedCalls.Load(),
		SourceDroppedCalls:    c.sourceDroppedCalls.Load(),
		SourceDroppedEvents:   c.sourceDroppedEvents.Load(),
	}
}

// Add sums o into s (for node totals).
func (s *Stats) Add(o Stats) {
	s.Frames += o.Frames
	s.BadFrames += o.BadFrames
	s.Events += o.Events
	s.Executions += o.Executions
	s.Anomalies += o.Anomalies
	s.UnmatchedExits += o.UnmatchedExits
	s.MismatchedExits += o.MismatchedExits
	s.RepairedOpen += o.RepairedOpen
	s.OpenAtEnd += o.OpenAtEnd
	s.Unscored += o.Unscored
	s.Records += o.Records
	s.DroppedRecords += o.DroppedRecords
	s.Syncs += o.Syncs
	s.SyncFailures += o.SyncFailures
	s.DroppedSummaries += o.DroppedSummaries
	s.Lag = max(s.Lag, o.Lag)
	s.ModelErrors += o.ModelErrors
	s.EvictedLaunches += o.EvictedLaunches
	s.UnmatchedCorrelations += o.UnmatchedCorrelations
	s.SourceDroppedFrames += o.SourceDroppedFrames
	s.MissingSteps += o.MissingSteps
	s.PathOverflows += o.PathOverflows
	s.UnnamedFrames += o.UnnamedFrames
	s.LostAtGap += o.LostAtGap
	s.StaleFrames += o.StaleFrames
	s.DroppedFrames += o.DroppedFrames
	s.SummarisedCalls += o.SummarisedCalls
	s.SourceDroppedCalls += o.SourceDroppedCalls
	s.SourceDroppedEvents += o.SourceDroppedEvents
}

// Collector exports the counts of a set of detectors as Prometheus metrics
// named kipimo_ad_*. Ranks get their own "rank" label up to RankLabels
// detectors; the others are summed under rank="other". Safe for concurrent
// use.
type Collector struct {
	mu         sync.Mutex
	detectors  []*Detector
	rankLabels int
	sinkDrops  func() uint64
	node       atomic.Pointer[NodeSyncer]  // the node's syncer, when there is one
	durable    atomic.Pointer[durableNode] // the node's durable frames, when read so
	// refusedRanks are frames of ranks discovery did not start a detector
	// for (ServeConfig.MaxRanks).
	refusedRanks atomic.Uint64
}

// NewCollector returns a collector labelling at most rankLabels ranks
// (default 64). sinkDrops, when not nil, reports records the shared sink
// dropped.
func NewCollector(rankLabels int, sinkDrops func() uint64) *Collector {
	if rankLabels <= 0 {
		rankLabels = 64
	}
	return &Collector{rankLabels: rankLabels, sinkDrops: sinkDrops}
}

// Add registers a detector.
func (c *Collector) Add(d *Detector) {
	c.mu.Lock()
	c.detectors = append(c.detectors, d)
	c.mu.Unlock()
}

// Stats returns a snapshot of every registered detector's counts.
func (c *Collector) Stats() []Stats {
	c.mu.Lock()
	ds := append([]*Detector(nil), c.detectors...)
	c.mu.Unlock()
	out := make([]Stats, len(ds))
	for i, d := range ds {
		out[i] = d.Stats()
	}
	return out
}

// Taken is how many frames the detectors of rank have taken (processed
// or rejected), and whether such a detector is registered. Unlike Stats it
// allocates nothing, so an input that asks it for every frame it holds back
// makes no garbage of the size of the process's ranks.
func (c *Collector) Taken(rank uint32) (uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n uint64
	found := false
	for _, d := range c.detectors {
		if d.cfg.Rank == rank {
			n += d.stats.taken()
			found = true
		}
	}
	return n, found
}

// EachTaken calls fn with each registered detector's rank and the frames it
// has taken, allocating nothing.
func (c *Collector) EachTaken(fn func(rank uint32, taken uint64)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, d := range c.detectors {
		fn(d.cfg.Rank, d.stats.taken())
	}
}

// Total is the sum of every registered detector's counts.
func (c *Collector) Total() Stats {
	var t Stats
	for _, s := range c.Stats() {
		t.Add(s)
	}
	return t
}

type metricDef struct {
	name, help string
	gauge      bool
	get        func(*Stats) uint64
}

var metricDefs = []metricDef{
	{"kipimo_ad_frames_total", "Frames processed.", false, func(s *Stats) uint64 { return s.Frames }},
	{"kipimo_ad_bad_frames_total", "Frames rejected as malformed or misrouted.", false, func(s *Stats) uint64 { return s.BadFrames }},
	{"kipimo_ad_source_dropped_frames_total", "Frames the rank's event source dropped before they reached NATS.", false, func(s *Stats) uint64 { return s.SourceDroppedFrames }},
	{"kipimo_ad_unnamed_frames_total", "Frames dropped because their events used function or counter ids whose names never arrived (held beyond --max-held-frames, or at the end).", false, func(s *Stats) uint64 { return s.UnnamedFrames }},
	{"kipimo_ad_lost_at_gap_total", "Executions open when a gap in the rank's io_steps was found: closed without a runtime and kept out of the models.", false, func(s *Stats) uint64 { return s.LostAtGap }},
	{"kipimo_ad_summarised_calls_total", "Calls the rank's event library summarised per io_step instead of streaming them (in the profiles, never scored).", false, func(s *Stats) uint64 { return s.SummarisedCalls }},
	{"kipimo_ad_source_dropped_calls_total", "Calls the rank's event library dropped whole because its ring was full.", false, func(s *Stats) uint64 { return s.SourceDroppedCalls }},
	{"kipimo_ad_source_dropped_events_total", "Comm and counter events the rank's event library dropped because its ring was full.", false, func(s *Stats) uint64 { return s.SourceDroppedEvents }},
	{"kipimo_ad_dropped_frames_total", "Frames dropped before the detector read them: it was slower than its input (--pending-frames, --pending-bytes).", false, func(s *Stats) uint64 { return s.DroppedFrames }},
	{"kipimo_ad_stale_frames_total", "Frames dropped because their io_step was not after the last one processed (duplicates, or overtaken by later frames).", false, func(s *Stats) uint64 { return s.StaleFrames }},
	{"kipimo_ad_missing_steps_total", "io_steps that never reached the detector (gaps in the rank's sequence of frames).", false, func(s *Stats) uint64 { return s.MissingSteps }},
	{"kipimo_ad_events_total", "Events (function, counter, comm) processed.", false, func(s *Stats) uint64 { return s.Events }},
	{"kipimo_ad_executions_total", "Executions completed.", false, func(s *Stats) uint64 { return s.Executions }},
	{"kipimo_ad_anomalies_total", "Executions labelled anomalous.", false, func(s *Stats) uint64 { return s.Anomalies }},
	{"kipimo_ad_unmatched_exits_total", "Exits with no open entry of their function.", false, func(s *Stats) uint64 { return s.UnmatchedExits }},
	{"kipimo_ad_repaired_entries_total", "Entries closed by a repair (mismatched exit or end of stream).", false, func(s *Stats) uint64 { return s.RepairedOpen + s.OpenAtEnd }},
	{"kipimo_ad_records_total", "Provenance records produced.", false, func(s *Stats) uint64 { return s.Records }},
	{"kipimo_ad_dropped_records_total", "Provenance records the sink did not accept.", false, func(s *Stats) uint64 { return s.DroppedRecords }},
	{"kipimo_ad_syncs_total", "Pserver syncs answered.", false, func(s *Stats) uint64 { return s.Syncs }},
	{"kipimo_ad_sync_failures_total", "Pserver sync attempts that failed.", false, func(s *Stats) uint64 { return s.SyncFailures }},
	{"kipimo_ad_sync_lag_steps", "Steps whose deltas the pserver has not answered yet.", true, func(s *Stats) uint64 { return s.Lag }},
}

func (c *Collector) desc(m metricDef) *prometheus.Desc {
	return prometheus.NewDesc(m.name, m.help, []string{"rank"}, nil)
}

var sinkDropDesc = prometheus.NewDesc("kipimo_ad_sink_dropped_records_total", "Provenance records dropped by the publishing queue.", nil, nil)

var refusedRanksDesc = prometheus.NewDesc("kipimo_ad_refused_rank_frames_total", "Frames of new ranks dropped because this ad already serves --max-ranks discovered ranks.", nil, nil)

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range metricDefs {
		ch <- c.desc(m)
	}
	ch <- sinkDropDesc
	ch <- refusedRanksDesc
	ch <- nodeSyncsDesc
	ch <- nodeSyncRanksDesc
	ch <- nodeSyncRetriesDesc
	for _, d := range []*prometheus.Desc{checkpointsDesc, checkpointBytesDesc, restoredDesc, replayedDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	ds := append([]*Detector(nil), c.detectors...)
	c.mu.Unlock()
	var other Stats
	hasOther := false
	emit := func(label string, s *Stats) {
		for _, m := range metricDefs {
			t := prometheus.CounterValue
			if m.gauge {
				t = prometheus.GaugeValue
			}
			ch <- prometheus.MustNewConstMetric(c.desc(m), t, float64(m.get(s)), label)
		}
	}
	for i, d := range ds {
		s := d.Stats()
		if i < c.rankLabels {
			emit(strconv.FormatUint(uint64(s.Rank), 10), &s)
			continue
		}
		other.Add(s)
		hasOther = true
	}
	if hasOther {
		emit("other", &other)
	}
	if c.sinkDrops != nil {
		ch <- prometheus.MustNewConstMetric(sinkDropDesc, prometheus.CounterValue, float64(c.sinkDrops()))
	}
	ch <- prometheus.MustNewConstMetric(refusedRanksDesc, prometheus.CounterValue, float64(c.refusedRanks.Load()))
	if ns := c.node.Load(); ns != nil {
		req, ranks := ns.Syncs()
		ch <- prometheus.MustNewConstMetric(nodeSyncsDesc, prometheus.CounterValue, float64(req))
		ch <- prometheus.MustNewConstMetric(nodeSyncRanksDesc, prometheus.CounterValue, float64(ranks))
		ch <- prometheus.MustNewConstMetric(nodeSyncRetriesDesc, prometheus.CounterValue, float64(ns.Retries()))
	}
	if dn := c.durable.Load(); dn != nil {
		dn.collect(ch)
	}
}
