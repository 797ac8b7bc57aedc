// Package syncproto defines the messages a detector and the parameter server
// exchange once per io_step over NATS request/reply, and how a detector routes
// them when several pserver instances share the functions by shard.
//
// The wire form is JSON (schemas/sync.schema.json). A model key is a function
// name, or a call path "a => b => c" when the run keys models by call path; keys
// are strings so that they mean the same on every rank.
package syncproto

import (
	"hash/fnv"

	"github.com/kipimo-hpc/kipimo/internal/stats"
)

// Shard returns the pserver shard, in [0, nshards), that owns a model key:
// FNV-1a 32 of the key modulo nshards. Step summaries always go to shard 0.
func Shard(key string, nshards int) int {
	if nshards <= 1 {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(key))
	return int(h.Sum32() % uint32(nshards))
}

// ModelDelta is what one detector learned about one model key since its last
// acknowledged sync.
type ModelDelta struct {
	Key       string           `json:"key"`
	Moments   stats.Moments    `json:"moments"`
	Histogram *stats.Histogram `json:"histogram,omitempty"` // HBOS and COPOD runs only
	// Tail is the delta's natural-range histogram (absent with Chimbuko's rules).
	Tail      *stats.TailHist `json:"tail,omitempty"`
	Anomalies uint64          `json:"anomalies"` // anomalies of this key in the delta
	// More, in a node's request (SyncRequest.Ranks), holds the moments and
	// histograms of the same key from the node's further ranks, in rank
	// order: the pserver merges them one after the other after Moments and
	// Histogram, exactly as it would merge the ranks' own requests, so the
	// model comes out the same to the bit. Tail and Anomalies are the sums
	// over all the ranks (their merge is exact and order-free).
	More []ModelPart `json:"more,omitempty"`
}

// NewModelDelta returns the delta of model key that s, a detector's
// statistics not sent yet, holds, sharing no memory with s: its HBOS
// histogram only with hist (HBOS and COPOD runs) and only when it counts
// values, its tail only when it counts any.
func NewModelDelta(key string, s *stats.Summary, hist bool) ModelDelta {
	md := ModelDelta{Key: key, Moments: s.Moments, Anomalies: s.Anomalies}
	md.Histogram, md.Tail = histograms(s, hist)
	return md
}

// histograms returns copies of s's histograms for a message: the HBOS one
// only with hist and when it counts values, the tail only when it counts
// any; nil otherwise (absent from the wire form).
func histograms(s *stats.Summary, hist bool) (*stats.Histogram, *stats.TailHist) {
	var h *stats.Histogram
	var t *stats.TailHist
	if hist && !s.Histogram.Empty() {
		c := s.Histogram
		c.Counts = append([]uint64(nil), c.Counts...)
		h = &c
	}
	if !s.Tail.Empty() {
		c := s.Tail.Clone()
		t = &c
	}
	return h, t
}

// Summary returns the statistics d carries of its own rank (not those of
// More) as a stats.Summary, its histograms zero where d carries none. It
// shares d's histograms: a summary to read or to merge from, not to keep.
func (d *ModelDelta) Summary() stats.Summary {
	s := stats.Summary{Moments: d.Moments, Anomalies: d.Anomalies}
	if d.Histogram != nil {
		s.Histogram = *d.Histogram
	}
	if d.Tail != nil {
		s.Tail = *d.Tail
	}
	return s
}

// ModelPart is one further rank's moments and histogram of a key in a
// node's request.
type ModelPart struct {
	Moments   stats.Moments    `json:"moments"`
	Histogram *stats.Histogram `json:"histogram,omitempty"`
}

// Summary returns the statistics p carries as a stats.Summary (no tail and
// no anomaly count: the delta's own carry those of every rank), sharing
// p's histogram.
func (p *ModelPart) Summary() stats.Summary {
	s := stats.Summary{Moments: p.Moments}
	if p.Histogram != nil {
		s.Histogram = *p.Histogram
	}
	return s
}

// RankPart is one rank's share of a node's request: the rank's own Seq and
// Incarnation for this shard (the pserver dedupes on them as on a rank's own
// request) and the rank's step summaries.
type RankPart struct {
	PID         uint32        `json:"pid"`
	Rank        uint32        `json:"rank"`
	Seq         uint64        `json:"seq"`
	Incarnation uint64        `json:"incarnation,omitempty"`
	Steps       []StepSummary `json:"steps,omitempty"`
}

// RankSeq names one rank's request by its Seq (and Incarnation).
type RankSeq struct {
	PID         uint32 `json:"pid"`
	Rank        uint32 `json:"rank"`
	Seq         uint64 `json:"seq"`
	Incarnation uint64 `json:"incarnation,omitempty"`
}

// CounterDelta is the detector's counter statistics since its last acknowledged sync.
type CounterDelta struct {
	Name    string        `json:"name"`
	Moments stats.Moments `json:"moments"`
	// More, in a node's request, holds the same counter's moments from the
	// node's further ranks, merged in order after Moments.
	More []stats.Moments `json:"more,omitempty"`
}

// StepSummary is one rank's summary of one io_step.
type StepSummary struct {
	Step       uint64        `json:"io_step"`
	Anomalies  uint64        `json:"anomalies"`
	Executions uint64        `json:"executions"`
	MinTS      uint64        `json:"min_ts"`
	MaxTS      uint64        `json:"max_ts"`
	Scores     stats.Moments `json:"scores"` // outlier scores of the step's anomalies
	Severity   stats.Moments `json:"severity"`
	// FuncAnomalies counts the step's anomalies per function name.
	FuncAnomalies map[string]uint64 `json:"func_anomalies,omitempty"`
	// Events is the number of function events the step's frame carried.
	Events uint64 `json:"events,omitempty"`
	// BadFrames counts frames of this rank rejected since the previous summary.
	BadFrames uint64 `json:"bad_frames,omitempty"`
	// MissingSteps counts io_steps missing from the rank's sequence of
	// frames just before this one: frames that never reached the detector.
	MissingSteps uint64 `json:"missing_steps,omitempty"`
	// SummarisedCalls counts calls the rank's event library summarised per
	// io_step instead of streaming them (functions past its summary rate),
	// reported since the previous summary: in the profiles, never scored.
	SummarisedCalls uint64 `json:"summarised_calls,omitempty"`
	// DroppedCalls counts calls the rank's event library dropped whole
	// because its ring was full, reported since the previous summary.
	DroppedCalls uint64 `json:"dropped_calls,omitempty"`
	// DroppedEvents counts comm and counter events the rank's event library
	// dropped because its ring was full, reported since the previous summary.
	DroppedEvents uint64 `json:"dropped_events,omitempty"`
	// Funcs carries per-function anomaly metrics of the step (score and
	// severity statistics); when absent only FuncAnomalies counts are known.
	Funcs []FuncAnomalyMetrics `json:"funcs,omitempty"`
	// Peer is what the rank did in the step, for comparing ranks with their
	// peers and tracing waits to the rank that caused them (see
	// internal/culprit); absent from ranks that report none.
	Peer *PeerStep `json:"peer,omitempty"`
}

// FuncAnomalyMetrics is one function's anomalies in one rank's step.
type FuncAnomalyMetrics struct {
	Func     string        `json:"func"`
	Count    uint64        `json:"count"`
	Score    stats.Moments `json:"score"`
	Severity stats.Moments `json:"severity"`
	FirstTS  uint64        `json:"first_ts,omitempty"` // entry of the first anomaly
	LastTS   uint64        `json:"last_ts,omitempty"`  // exit of the last anomaly
}

// SyncRequest carries one detector's delta to one pserver shard, or, with
// Ranks, the merged deltas of the detectors of one node (one ad process
// serving several ranks sends one request per shard per step instead of one
// per rank).
//
// Seq numbers a detector's deltas from 1. A detector has at most one request
// outstanding per shard and resends it unchanged until it is answered; a
// pserver applies a request only if Seq is greater than the last Seq it applied
// for (PID, Rank, Incarnation), so a retried request is never counted twice.
//
// Incarnation names the detector's sync state: a random 64-bit number drawn
// when the state is created and kept in its checkpoints, so a detector
// restarted without a checkpoint numbers its requests from 1 again under a
// new incarnation (the pserver accepts them instead of taking them for
// retries), while one resumed from a checkpoint resends its requests under
// the same one (and they are still deduplicated). 0 is a detector that sends
// none (before incarnations): deduplicated on (PID, Rank) alone.
type SyncRequest struct {
	PID         uint32         `json:"pid"`
	Rank        uint32         `json:"rank"`
	Seq         uint64         `json:"seq"`
	Incarnation uint64         `json:"incarnation,omitempty"`
	Step        uint64         `json:"io_step"` // latest step covered by the delta
	Algorithm   string         `json:"algorithm"`
	Models      []ModelDelta   `json:"models,omitempty"`
	Counters    []CounterDelta `json:"counters,omitempty"`
	Steps       []StepSummary  `json:"steps,omitempty"` // shard 0 only; several after an outage
	Hostname    string         `json:"hostname,omitempty"`
	// TailRule is the rule the detector reads natural ranges with; the
	// pserver reports final natural ranges with the last one it received.
	TailRule *stats.TailRule `json:"tail_rule,omitempty"`
	// Node names the ad process that merged the request from its ranks'
	// requests (informative: deduplication is per rank).
	Node string `json:"node,omitempty"`
	// Ranks, when set, makes this a node's request: the ranks whose
	// requests were merged, in rank order, each with its Seq, Incarnation
	// and step summaries. PID, Rank, Seq, Incarnation and Steps of the
	// request itself are then ignored. The pserver applies a node's request
	// whole or not at all: if any rank's Seq was already applied it applies
	// nothing and lists those ranks in SyncReply.Stale, and the node
	// resends the rest.
	Ranks []RankPart `json:"ranks,omitempty"`
}

// Reads reports whether the request only reads the global models of its
// keys (Seq 0: the pserver applies nothing). A node's request reads when
// every rank's Seq is 0.
func (r *SyncRequest) Reads() bool {
	if len(r.Ranks) == 0 {
		return r.Seq == 0
	}
	for i := range r.Ranks {
		if r.Ranks[i].Seq != 0 {
			return false
		}
	}
	return true
}

// GlobalModel is the merged model of one key.
type GlobalModel struct {
	Key       string           `json:"key"`
	Moments   stats.Moments    `json:"moments"`
	Histogram *stats.Histogram `json:"histogram,omitempty"`
	Tail      *stats.TailHist  `json:"tail,omitempty"`
}

// NewGlobalModel returns the global model of key that s, the pserver's
// merged statistics of the key, holds, sharing no memory with s: its
// histograms only when they count values; no anomaly count (the global
// model carries none).
func NewGlobalModel(key string, s *stats.Summary) GlobalModel {
	g := GlobalModel{Key: key, Moments: s.Moments}
	g.Histogram, g.Tail = histograms(s, true)
	return g
}

// Into makes dst, a detector's copy of the global model of g's key, g: the
// moments, and the histograms g carries (those it does not carry stay as
// they were). The global model carries no anomaly count: dst's is 0. dst
// shares g's histograms (a node's syncer hands one reply to every rank):
// it must only read them.
func (g *GlobalModel) Into(dst *stats.Summary) {
	dst.Moments, dst.Anomalies = g.Moments, 0
	if g.Histogram != nil {
		dst.Histogram = *g.Histogram
	}
	if g.Tail != nil {
		dst.Tail = *g.Tail
	}
}

// SyncReply answers a SyncRequest with the global model of every key the
// request carried, after merging it.
type SyncReply struct {
	Applied bool          `json:"applied"`  // false when Seq had already been applied
	LastSeq uint64        `json:"last_seq"` // last Seq applied for this detector
	Models  []GlobalModel `json:"models,omitempty"`
	// Error, when set, says why nothing of the request was applied: it
	// could not be decoded, or it is invalid (see SyncRequest.Validate and
	// the bounds on Seq and io_steps).
	Error string `json:"error,omitempty"`
	// Invalid, with Error, says the request was refused as invalid: sent
	// again unchanged it would be refused again, so the detector drops it.
	Invalid bool `json:"invalid,omitempty"`
	// Stale, answering a node's request, lists the ranks whose Seq had
	// already been applied; nothing of the request was applied.
	Stale []RankSeq `json:"stale,omitempty"`
}
