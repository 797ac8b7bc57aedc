package pserver

import (
	"fmt"
	"slices"
	"sort"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/stats"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// DetectorID names one detector: a (program, rank) pair.
type DetectorID struct {
	PID  uint32 `json:"pid"`
	Rank uint32 `json:"rank"`
}

// Model is the merged state of one model key: the statistics of every
// delta merged into it (stats.Summary: the HBOS histogram empty unless
// detectors send one, the natural-range histogram empty with Chimbuko's
// rules).
type Model struct {
	Key string
	PID uint32 // program of the first detector that sent the key
	stats.Summary
	Merges uint64 // deltas merged into this key
}

// naturalHist returns the model's natural-range histogram, nil when it
// counts nothing (detectors send none with Chimbuko's rules).
func (m *Model) naturalHist() *stats.TailHist {
	if m.Tail.Empty() {
		return nil
	}
	return &m.Tail
}

// BinsSeen says, per natural-range bin (stats.TailBin) of one model, when
// and where its values came from: what a recurring mode's finding reports.
type BinsSeen map[int]*BinSeen

// MaxSeenRanks bounds the ranks a BinSeen lists: the smallest ones.
const MaxSeenRanks = 64

// BinSeen is where the values of one natural-range bin of a model came
// from: the first io_step a delta carried some (the Step of the request)
// and the ranks that sent them (the smallest MaxSeenRanks). Both are the
// same whatever the order the deltas are merged in. A node's request
// carries its ranks' values merged, so it counts for all its ranks: with
// per-node requests a mode's ranks are those of the nodes that sent it.
type BinSeen struct {
	First uint64
	Ranks []uint32
}

// noteSeen records that ranks sent values of model key in the bins of t
// at io_step step.
func (s *State) noteSeen(key string, t *stats.TailHist, step uint64, ranks []uint32) {
	if s.Seen == nil {
		s.Seen = map[string]BinsSeen{}
	}
	seen := s.Seen[key]
	if seen == nil {
		seen = BinsSeen{}
		s.Seen[key] = seen
	}
	for i, c := range t.Counts {
		if c == 0 {
			continue
		}
		b := seen[t.Lo+i]
		if b == nil {
			b = &BinSeen{First: step}
			seen[t.Lo+i] = b
		}
		b.First = min(b.First, step)
		for _, r := range ranks {
			b.Ranks = addRank(b.Ranks, r)
		}
	}
}

// addRank inserts r into the sorted list rs, keeping the smallest
// MaxSeenRanks.
func addRank(rs []uint32, r uint32) []uint32 {
	i, found := slices.BinarySearch(rs, r)
	if found || i >= MaxSeenRanks {
		return rs
	}
	rs = slices.Insert(rs, i, r)
	if len(rs) > MaxSeenRanks {
		rs = rs[:MaxSeenRanks]
	}
	return rs
}

// State is one shard's global state: the merged models, the last applied Seq
// of every detector, counter statistics and the run aggregates. It is plain
// data owned by one goroutine at a time (the Server guards it with a lock);
// it does no I/O, so tests can apply requests to it directly.
type State struct {
	Models map[string]*Model
	// LastSeq is the last Seq applied from each detector's current
	// incarnation (Incarnation).
	LastSeq map[DetectorID]uint64
	// Incarnation is each detector's current incarnation: that of the last
	// new incarnation it synced with (absent: 0, a detector that sends none).
	Incarnation map[DetectorID]uint64
	// Past holds each detector's earlier incarnations, oldest first, at most
	// maxPastIncarnations, with the last Seq applied from each: a late
	// retry of a restarted detector's previous process is still
	// deduplicated.
	Past     map[DetectorID][]PastIncarnation
	Counters map[string]*stats.Moments
	Agg      *Aggregates
	// TailRule is the last natural-range rule a detector sent (nil before
	// any, and with Chimbuko's rules).
	TailRule *stats.TailRule
	// Seen is where each model's natural-range bins got their values (see
	// BinsSeen); kept apart from Models, which are the same whether ranks
	// sync on their own or through their node, while Seen's ranks are not.
	Seen map[string]BinsSeen

	Applied    uint64 // requests applied
	Duplicates uint64 // requests skipped because their Seq was already applied
	Merges     uint64 // model and counter deltas merged
	WALSeq     uint64 // last write-ahead-log sequence applied (0 without a log)
	// Incarnations counts the new incarnations of known detectors (a
	// detector restarted without its checkpoint).
	Incarnations uint64

	// newIncs lists the detectors whose new incarnation the last Apply
	// took (for the Server to log; not saved).
	newIncs []incarnationChange
}

// PastIncarnation is an earlier incarnation of a detector and the last Seq
// applied from it.
type PastIncarnation struct {
	ID      uint64
	LastSeq uint64
}

// incarnationChange is a detector's switch to a new incarnation: the one
// it had and the last Seq applied from it, and the new one.
type incarnationChange struct {
	DetectorID
	From, To uint64
	LastSeq  uint64
}

// maxPastIncarnations bounds the earlier incarnations kept per detector.
const maxPastIncarnations = 8

// NewState returns an empty state whose aggregates keep the last window steps
// in full.
func NewState(window int) *State {
	return &State{
		Models:      map[string]*Model{},
		LastSeq:     map[DetectorID]uint64{},
		Incarnation: map[DetectorID]uint64{},
		Past:        map[DetectorID][]PastIncarnation{},
		Counters:    map[string]*stats.Moments{},
		Agg:         NewAggregates(window),
	}
}

// lastSeq is the last Seq applied from incarnation inc of detector id (0
// for an incarnation never seen).
func (s *State) lastSeq(id DetectorID, inc uint64) uint64 {
	if s.Incarnation[id] == inc {
		return s.LastSeq[id]
	}
	for _, p := range s.Past[id] {
		if p.ID == inc {
			return p.LastSeq
		}
	}
	return 0
}

// noteSeq records seq as the last Seq applied from incarnation inc of
// detector id. An incarnation neither current nor past becomes the
// current one; the previous one goes to Past, and, when the detector had
// synced before, the change is counted and listed in newIncs.
func (s *State) noteSeq(id DetectorID, inc, seq uint64) {
	cur := s.Incarnation[id]
	if cur == inc {
		s.LastSeq[id] = seq
		return
	}
	past := s.Past[id]
	for i := range past {
		if past[i].ID == inc {
			past[i].LastSeq = seq
			return
		}
	}
	if last, ok := s.LastSeq[id]; ok {
		past = append(past, PastIncarnation{ID: cur, LastSeq: last})
		if n := len(past) - maxPastIncarnations; n > 0 {
			past = append([]PastIncarnation(nil), past[n:]...)
		}
		s.Past[id] = past
		s.Incarnations++
		s.newIncs = append(s.newIncs, incarnationChange{DetectorID: id, From: cur, To: inc, LastSeq: last})
	}
	s.LastSeq[id] = seq
	if inc == 0 {
		delete(s.Incarnation, id)
	} else {
		s.Incarnation[id] = inc
	}
}

// Check reports whether req may follow what the state holds: every rank's
// Seq at most syncproto.MaxSeqAdvance beyond the last applied from its
// incarnation, and every step summary's io_step at most
// syncproto.MaxStepAdvance beyond the highest recorded. The error wraps
// syncproto.ErrInvalid. It does not repeat req.Validate.
func (s *State) Check(req *syncproto.SyncRequest) error {
	if req.Reads() {
		return nil
	}
	parts := rankParts(req)
	for i := range parts {
		p := &parts[i]
		id := DetectorID{p.PID, p.Rank}
		if err := syncproto.CheckAdvance("seq", s.lastSeq(id, p.Incarnation), p.Seq, syncproto.MaxSeqAdvance); err != nil {
			return fmt.Errorf("rank %d/%d incarnation %x: %w", p.PID, p.Rank, p.Incarnation, err)
		}
		for j := range p.Steps {
			if err := syncproto.CheckAdvance("io_step", s.Agg.MaxStep, p.Steps[j].Step, syncproto.MaxStepAdvance); err != nil {
				return fmt.Errorf("rank %d/%d: %w", p.PID, p.Rank, err)
			}
		}
	}
	return nil
}

// Apply merges req into the state unless its Seq is not greater than the last
// Seq applied for its detector and incarnation; it reports whether it did.
// Seq 0 is never applied (detectors number their requests from 1): a request
// with Seq 0 reads the global models of its keys (a detector in lockstep
// pulls them so). A request that Check refuses is not applied (the error
// wraps syncproto.ErrInvalid); the caller validates req (req.Validate) first.
//
// A node's request (req.Ranks) is applied whole or not at all: when any of
// its ranks' Seq was already applied nothing is, and Reply lists those ranks
// as stale.
func (s *State) Apply(req *syncproto.SyncRequest) (bool, error) {
	s.newIncs = s.newIncs[:0]
	if req.Reads() {
		return false, nil // a read: the reply carries the global models
	}
	if err := s.Check(req); err != nil {
		return false, fmt.Errorf("sync request of %s: %w", requester(req), err)
	}
	parts := rankParts(req)
	for i := range parts {
		p := &parts[i]
		if p.Seq != 0 && p.Seq <= s.lastSeq(DetectorID{p.PID, p.Rank}, p.Incarnation) {
			s.Duplicates++
			return false, nil
		}
	}
	if err := checkHistograms(req.Models); err != nil {
		return false, fmt.Errorf("sync request of %s: %w", requester(req), err)
	}
	ranks := make([]uint32, len(parts))
	for i := range parts {
		ranks[i] = parts[i].Rank
	}
	for i := range req.Models {
		d := &req.Models[i]
		m := s.Models[d.Key]
		if m == nil {
			m = &Model{Key: d.Key, PID: req.PID}
			s.Models[d.Key] = m
		}
		if err := mergeParts(m, d); err != nil {
			return false, fmt.Errorf("sync request of %s: key %q: %w", requester(req), d.Key, err)
		}
		if d.Tail != nil {
			s.noteSeen(d.Key, d.Tail, req.Step, ranks)
		}
		m.Merges += uint64(1 + len(d.More))
		s.Merges += uint64(1 + len(d.More))
	}
	for i := range req.Counters {
		c := &req.Counters[i]
		m := s.Counters[c.Name]
		if m == nil {
			m = &stats.Moments{}
			s.Counters[c.Name] = m
		}
		m.Merge(c.Moments)
		for _, x := range c.More {
			m.Merge(x)
		}
		s.Merges += uint64(1 + len(c.More))
	}
	for i := range parts {
		p := &parts[i]
		id := DetectorID{p.PID, p.Rank}
		for j := range p.Steps {
			s.Agg.AddStep(id, &p.Steps[j])
		}
		if p.Seq != 0 {
			s.noteSeq(id, p.Incarnation, p.Seq)
		}
	}
	if req.TailRule != nil {
		r := *req.TailRule
		s.TailRule = &r
	}
	s.Applied++
	return true, nil
}

// rankParts returns the ranks' shares of req: a node's, or the one rank's
// of its own request.
func rankParts(req *syncproto.SyncRequest) []syncproto.RankPart {
	if len(req.Ranks) > 0 {
		return req.Ranks
	}
	return []syncproto.RankPart{{PID: req.PID, Rank: req.Rank, Seq: req.Seq, Incarnation: req.Incarnation, Steps: req.Steps}}
}

// mergeParts merges a delta into m (stats.Summary.Merge), then the
// moments and histograms of its further ranks in order: the order the
// ranks' own requests would be merged in.
func mergeParts(m *Model, d *syncproto.ModelDelta) error {
	if err := m.Merge(d.Summary()); err != nil {
		return err
	}
	for i := range d.More {
		if err := m.Merge(d.More[i].Summary()); err != nil {
			return err
		}
	}
	return nil
}

// requester names the sender of req in errors.
func requester(req *syncproto.SyncRequest) string {
	if len(req.Ranks) > 0 {
		return fmt.Sprintf("node %q (%d ranks)", req.Node, len(req.Ranks))
	}
	return fmt.Sprintf("%d/%d seq %d", req.PID, req.Rank, req.Seq)
}

// Reply builds the answer to req: the global model of every key it carried.
// A node's request that was not applied gets the ranks whose Seq had been
// applied before in Stale.
func (s *State) Reply(req *syncproto.SyncRequest, applied bool) *syncproto.SyncReply {
	rep := &syncproto.SyncReply{
		Applied: applied,
		LastSeq: s.lastSeq(DetectorID{req.PID, req.Rank}, req.Incarnation),
		Models:  make([]syncproto.GlobalModel, 0, len(req.Models)),
	}
	if len(req.Ranks) > 0 {
		rep.LastSeq = 0
		if !applied {
			for _, p := range req.Ranks {
				if p.Seq != 0 && p.Seq <= s.lastSeq(DetectorID{p.PID, p.Rank}, p.Incarnation) {
					rep.Stale = append(rep.Stale, syncproto.RankSeq{PID: p.PID, Rank: p.Rank, Seq: p.Seq, Incarnation: p.Incarnation})
				}
			}
		}
	}
	for i := range req.Models {
		m := s.Models[req.Models[i].Key]
		if m == nil {
			continue
		}
		rep.Models = append(rep.Models, syncproto.NewGlobalModel(m.Key, &m.Summary))
	}
	return rep
}

// ModelKeys returns the model keys in sorted order.
func (s *State) ModelKeys() []string {
	keys := make([]string, 0, len(s.Models))
	for k := range s.Models {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// NaturalRanges returns, for every model key with a natural-range
// histogram, the runtimes below and above which the final model flags an
// execution (read with the last TailRule a detector sent). It is empty when
// detectors send no natural ranges (Chimbuko's rules).
func (s *State) NaturalRanges() map[string]provenance.Range {
	out := map[string]provenance.Range{}
	if s.TailRule == nil {
		return out
	}
	for k, m := range s.Models {
		if !m.Tail.Empty() {
			lo, hi := m.Tail.NaturalRange(*s.TailRule)
			out[k] = provenance.Range{Low: s.TailRule.LowThreshold(lo), High: s.TailRule.Threshold(hi)}
		}
	}
	return out
}

// Recurring is a recurring slow mode of a model key: natural runtimes
// beyond a gap above the body of its runtimes that hold at least
// stats.DefaultRecurringShare of its time (stats.TailHist.SlowMode),
// reported whether or not any of them were flagged.
type Recurring struct {
	Func string `json:"func"`
	provenance.RecurringMode
}

// Recurring returns the recurring slow modes of the model keys, the
// largest share of time first (ties in key order), read with the last
// TailRule a detector sent; none with Chimbuko's rules.
func (s *State) Recurring() []Recurring {
	out := []Recurring{}
	if s.TailRule == nil {
		return out
	}
	for _, k := range s.ModelKeys() {
		m := s.Models[k]
		if m.Tail.Empty() {
			continue
		}
		mode, ok := m.Tail.SlowMode(*s.TailRule, stats.DefaultRecurringShare)
		if !ok {
			continue
		}
		r := Recurring{Func: k, RecurringMode: provenance.RecurringMode{Calls: mode.Calls, CallsFraction: mode.CallsFraction,
			TypicalUs: mode.Typical, LowUs: mode.Lo, HighUs: mode.Hi, TimeShare: mode.TimeShare, Ranks: []uint32{}}}
		first := true
		for b := mode.LoBin; b <= mode.HiBin; b++ {
			seen := s.Seen[k][b]
			if seen == nil {
				continue
			}
			if first || seen.First < r.FirstIOStep {
				r.FirstIOStep, first = seen.First, false
			}
			for _, rk := range seen.Ranks {
				r.Ranks = addRank(r.Ranks, rk)
			}
		}
		out = append(out, r)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].TimeShare > out[j].TimeShare })
	return out
}
