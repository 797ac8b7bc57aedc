package adnode

import (
	"github.com/kipimo-hpc/kipimo/internal/ad"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports the counts of a set of detectors as Prometheus metrics
// named kipimo_ad_*. Ranks get their own "rank" label up to RankLabels
// detectors; the others are summed under rank="other". Safe for concurrent
// use.
type Collector struct {
	mu         sync.Mutex
	detectors  []*ad.Detector
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
func (c *Collector) Add(d *ad.Detector) {
	c.mu.Lock()
	c.detectors = append(c.detectors, d)
	c.mu.Unlock()
}

// Stats returns a snapshot of every registered detector's counts.
func (c *Collector) Stats() []ad.Stats {
	c.mu.Lock()
	ds := append([]*ad.Detector(nil), c.detectors...)
	c.mu.Unlock()
	out := make([]ad.Stats, len(ds))
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
		if d.Rank() == rank {
			n += d.Taken()
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
		fn(d.Rank(), d.Taken())
	}
}

// Total is the sum of every registered detector's counts.
func (c *Collector) Total() ad.Stats {
	var t ad.Stats
	for _, s := range c.Stats() {
		t.Add(s)
	}
	return t
}

type metricDef struct {
	name, help string
	gauge      bool
	get        func(*ad.Stats) uint64
}

var metricDefs = []metricDef{
	{"kipimo_ad_frames_total", "Frames processed.", false, func(s *ad.Stats) uint64 { return s.Frames }},
	{"kipimo_ad_bad_frames_total", "Frames rejected as malformed or misrouted.", false, func(s *ad.Stats) uint64 { return s.BadFrames }},
	{"kipimo_ad_source_dropped_frames_total", "Frames the rank's event source dropped before they reached NATS.", false, func(s *ad.Stats) uint64 { return s.SourceDroppedFrames }},
	{"kipimo_ad_unnamed_frames_total", "Frames dropped because their events used function or counter ids whose names never arrived (held beyond --max-held-frames, or at the end).", false, func(s *ad.Stats) uint64 { return s.UnnamedFrames }},
	{"kipimo_ad_lost_at_gap_total", "Executions open when a gap in the rank's io_steps was found: closed without a runtime and kept out of the models.", false, func(s *ad.Stats) uint64 { return s.LostAtGap }},
	{"kipimo_ad_summarised_calls_total", "Calls the rank's event library summarised per io_step instead of streaming them (in the profiles, never scored).", false, func(s *ad.Stats) uint64 { return s.SummarisedCalls }},
	{"kipimo_ad_source_dropped_calls_total", "Calls the rank's event library dropped whole because its ring was full.", false, func(s *ad.Stats) uint64 { return s.SourceDroppedCalls }},
	{"kipimo_ad_source_dropped_events_total", "Comm and counter events the rank's event library dropped because its ring was full.", false, func(s *ad.Stats) uint64 { return s.SourceDroppedEvents }},
	{"kipimo_ad_dropped_frames_total", "Frames dropped before the detector read them: it was slower than its input (--pending-frames, --pending-bytes).", false, func(s *ad.Stats) uint64 { return s.DroppedFrames }},
	{"kipimo_ad_stale_frames_total", "Frames dropped because their io_step was not after the last one processed (duplicates, or overtaken by later frames).", false, func(s *ad.Stats) uint64 { return s.StaleFrames }},
	{"kipimo_ad_missing_steps_total", "io_steps that never reached the detector (gaps in the rank's sequence of frames).", false, func(s *ad.Stats) uint64 { return s.MissingSteps }},
	{"kipimo_ad_events_total", "Events (function, counter, comm) processed.", false, func(s *ad.Stats) uint64 { return s.Events }},
	{"kipimo_ad_executions_total", "Executions completed.", false, func(s *ad.Stats) uint64 { return s.Executions }},
	{"kipimo_ad_anomalies_total", "Executions labelled anomalous.", false, func(s *ad.Stats) uint64 { return s.Anomalies }},
	{"kipimo_ad_unmatched_exits_total", "Exits with no open entry of their function.", false, func(s *ad.Stats) uint64 { return s.UnmatchedExits }},
	{"kipimo_ad_repaired_entries_total", "Entries closed by a repair (mismatched exit or end of stream).", false, func(s *ad.Stats) uint64 { return s.RepairedOpen + s.OpenAtEnd }},
	{"kipimo_ad_records_total", "Provenance records produced.", false, func(s *ad.Stats) uint64 { return s.Records }},
	{"kipimo_ad_dropped_records_total", "Provenance records the sink did not accept.", false, func(s *ad.Stats) uint64 { return s.DroppedRecords }},
	{"kipimo_ad_syncs_total", "Pserver syncs answered.", false, func(s *ad.Stats) uint64 { return s.Syncs }},
	{"kipimo_ad_sync_failures_total", "Pserver sync attempts that failed.", false, func(s *ad.Stats) uint64 { return s.SyncFailures }},
	{"kipimo_ad_sync_lag_steps", "Steps whose deltas the pserver has not answered yet.", true, func(s *ad.Stats) uint64 { return s.Lag }},
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
	ds := append([]*ad.Detector(nil), c.detectors...)
	c.mu.Unlock()
	var other ad.Stats
	hasOther := false
	emit := func(label string, s *ad.Stats) {
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
