package syncproto

import (
	"errors"
	"fmt"
	"math"

	"github.com/kipimo-hpc/kipimo/internal/stats"
)

// Bounds of one sync request. A request outside them is refused whole: no
// detector sends one, and a parameter server that merged one could no
// longer encode its models (a non-finite value), would lose a rank's later
// requests as duplicates (an absurd Seq) or its dashboard history (an
// absurd io_step).
const (
	// MaxModels bounds the model deltas of one request.
	MaxModels = 1 << 20
	// MaxCounters bounds the counter deltas of one request.
	MaxCounters = 1 << 16
	// MaxRanks bounds the ranks of one node's request, and the further
	// ranks' parts (More) of one delta (a node's syncer puts at most 20,000
	// deltas in one request, at least one per rank).
	MaxRanks = 1 << 16
	// MaxSteps bounds the step summaries of one request, over all its ranks.
	MaxSteps = 1 << 20
	// MaxFuncs bounds the functions of one step summary (Funcs and
	// FuncAnomalies each).
	MaxFuncs = 1 << 20
	// MaxKeyLen bounds the length in bytes of a model key, counter name or
	// function name (a call path "a => b => c" of long C++ names).
	MaxKeyLen = 1 << 16
	// MaxLabelLen bounds the length in bytes of the algorithm, host and node
	// names.
	MaxLabelLen = 1 << 10
	// MaxBins bounds the bins of a histogram (the detector's --bins limit).
	MaxBins = 1 << 16
	// MaxCount bounds a count: a moments' n, a histogram's total, an
	// anomaly, execution or event count (2^53, the largest integer a float64
	// holds exactly).
	MaxCount = 1 << 53
	// MaxValue bounds the magnitude of a statistic's mean, minimum and
	// maximum and of a histogram's edges: far beyond any runtime or counter
	// value, and small enough that merging never overflows.
	MaxValue = 1e30
	// MaxTimestamp bounds a timestamp (it fits an int64).
	MaxTimestamp = math.MaxInt64
	// MaxSeqAdvance is how far beyond the last Seq applied for a rank (and
	// incarnation) a request's Seq may be: 2^32 requests, more than any run
	// sends to one shard even when the parameter server lost its state.
	MaxSeqAdvance = 1 << 32
	// MaxStepAdvance is how far beyond the highest io_step a parameter
	// server has recorded (0 before any) a step summary's io_step may be:
	// 2^24 periods (194 days at the default 1 s period).
	MaxStepAdvance = 1 << 24
)

// ErrInvalid is wrapped by every error Validate returns.
var ErrInvalid = errors.New("invalid sync request")

// Validate checks everything in r that does not depend on what the
// parameter server already holds: sizes within the bounds above, counts
// and statistics finite and consistent (see ValidateMoments), histograms well formed, timestamps and io_steps
// within range, and no rank twice in a node's request. The error wraps
// ErrInvalid and names the first offending field.
//
// Validate does not check Seq and io_steps against the rank's history
// (CheckAdvance does, with the server's state).
func (r *SyncRequest) Validate() error {
	if err := r.validate(); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return nil
}

func (r *SyncRequest) validate() error {
	switch {
	case len(r.Algorithm) > MaxLabelLen:
		return fmt.Errorf("algorithm is %d bytes, more than %d", len(r.Algorithm), MaxLabelLen)
	case len(r.Hostname) > MaxLabelLen:
		return fmt.Errorf("hostname is %d bytes, more than %d", len(r.Hostname), MaxLabelLen)
	case len(r.Node) > MaxLabelLen:
		return fmt.Errorf("node is %d bytes, more than %d", len(r.Node), MaxLabelLen)
	case len(r.Models) > MaxModels:
		return fmt.Errorf("%d models, more than %d", len(r.Models), MaxModels)
	case len(r.Counters) > MaxCounters:
		return fmt.Errorf("%d counters, more than %d", len(r.Counters), MaxCounters)
	case len(r.Ranks) > MaxRanks:
		return fmt.Errorf("%d ranks, more than %d", len(r.Ranks), MaxRanks)
	case r.Step > MaxTimestamp:
		return fmt.Errorf("io_step %d is beyond %d", r.Step, uint64(MaxTimestamp))
	}
	if t := r.TailRule; t != nil {
		for _, v := range []float64{t.Ratio, t.RecurFrac, t.Resolution} {
			if !finite(v) || v < 0 {
				return fmt.Errorf("tail rule %+v: ratio, recur_frac and resolution must be finite and not negative", *t)
			}
		}
		if !finite(t.Alpha) || t.Alpha < 0 || t.Alpha >= 0.1 {
			return fmt.Errorf("tail rule %+v: alpha (the false-alarm rate) must be in [0, 0.1)", *t)
		}
	}
	for i := range r.Models {
		if err := validateDelta(&r.Models[i]); err != nil {
			return fmt.Errorf("model %d: %w", i, err)
		}
	}
	for i := range r.Counters {
		c := &r.Counters[i]
		if len(c.Name) > MaxKeyLen {
			return fmt.Errorf("counter %d: name is %d bytes, more than %d", i, len(c.Name), MaxKeyLen)
		}
		if len(c.More) > MaxRanks {
			return fmt.Errorf("counter %q: %d further ranks, more than %d", c.Name, len(c.More), MaxRanks)
		}
		if err := ValidateMoments(&c.Moments); err != nil {
			return fmt.Errorf("counter %q: %w", c.Name, err)
		}
		for j := range c.More {
			if err := ValidateMoments(&c.More[j]); err != nil {
				return fmt.Errorf("counter %q, further rank %d: %w", c.Name, j+1, err)
			}
		}
	}
	steps := len(r.Steps)
	if len(r.Ranks) > 0 {
		seen := make(map[[2]uint32]bool, len(r.Ranks))
		steps = 0
		for i := range r.Ranks {
			p := &r.Ranks[i]
			k := [2]uint32{p.PID, p.Rank}
			if seen[k] {
				return fmt.Errorf("rank %d/%d is twice in the node's request", p.PID, p.Rank)
			}
			seen[k] = true
			steps += len(p.Steps)
			if steps > MaxSteps {
				break
			}
			if err := validateSteps(p.Steps); err != nil {
				return fmt.Errorf("rank %d/%d: %w", p.PID, p.Rank, err)
			}
		}
	} else if steps <= MaxSteps {
		if err := validateSteps(r.Steps); err != nil {
			return err
		}
	}
	if steps > MaxSteps {
		return fmt.Errorf("more than %d step summaries", MaxSteps)
	}
	return nil
}

func validateDelta(d *ModelDelta) error {
	if len(d.Key) > MaxKeyLen {
		return fmt.Errorf("key is %d bytes, more than %d", len(d.Key), MaxKeyLen)
	}
	if len(d.More) > MaxRanks {
		return fmt.Errorf("%q: %d further ranks, more than %d", d.Key, len(d.More), MaxRanks)
	}
	if d.Anomalies > MaxCount {
		return fmt.Errorf("%q: %d anomalies, more than %d", d.Key, d.Anomalies, uint64(MaxCount))
	}
	if err := validatePart(&d.Moments, d.Histogram); err != nil {
		return fmt.Errorf("%q: %w", d.Key, err)
	}
	for j := range d.More {
		if err := validatePart(&d.More[j].Moments, d.More[j].Histogram); err != nil {
			return fmt.Errorf("%q, further rank %d: %w", d.Key, j+1, err)
		}
	}
	if t := d.Tail; t != nil {
		if err := ValidateTail(t); err != nil {
			return fmt.Errorf("%q: %w", d.Key, err)
		}
	}
	return nil
}

func validatePart(m *stats.Moments, h *stats.Histogram) error {
	if err := ValidateMoments(m); err != nil {
		return err
	}
	if h != nil {
		return ValidateHistogram(h)
	}
	return nil
}

func validateSteps(steps []StepSummary) error {
	for i := range steps {
		s := &steps[i]
		if err := validateStep(s); err != nil {
			return fmt.Errorf("step summary of io_step %d: %w", s.Step, err)
		}
	}
	return nil
}

func validateStep(s *StepSummary) error {
	switch {
	case s.Step > MaxTimestamp:
		return fmt.Errorf("io_step beyond %d", uint64(MaxTimestamp))
	case s.MinTS > MaxTimestamp || s.MaxTS > MaxTimestamp:
		return fmt.Errorf("timestamps %d..%d beyond %d", s.MinTS, s.MaxTS, uint64(MaxTimestamp))
	case len(s.Funcs) > MaxFuncs || len(s.FuncAnomalies) > MaxFuncs:
		return fmt.Errorf("%d functions, more than %d", max(len(s.Funcs), len(s.FuncAnomalies)), MaxFuncs)
	}
	for name, n := range map[string]uint64{
		"anomalies": s.Anomalies, "executions": s.Executions, "events": s.Events,
		"bad_frames": s.BadFrames, "missing_steps": s.MissingSteps,
		"summarised_calls": s.SummarisedCalls, "dropped_calls": s.DroppedCalls, "dropped_events": s.DroppedEvents,
	} {
		if n > MaxCount {
			return fmt.Errorf("%s %d, more than %d", name, n, uint64(MaxCount))
		}
	}
	// A step's anomalies are among its labelled executions, and each is
	// one function's.
	if s.Anomalies > s.Executions {
		return fmt.Errorf("%d anomalies among %d executions", s.Anomalies, s.Executions)
	}
	var byFunc uint64
	for _, n := range s.FuncAnomalies {
		byFunc += min(n, MaxCount)
	}
	if byFunc > s.Anomalies {
		return fmt.Errorf("func_anomalies add up to %d, more than the step's %d anomalies", byFunc, s.Anomalies)
	}
	if s.Peer != nil {
		if err := s.Peer.Validate(); err != nil {
			return err
		}
	}
	if err := ValidateMoments(&s.Scores); err != nil {
		return fmt.Errorf("scores: %w", err)
	}
	if err := ValidateMoments(&s.Severity); err != nil {
		return fmt.Errorf("severity: %w", err)
	}
	for name, n := range s.FuncAnomalies {
		if len(name) > MaxKeyLen || n > MaxCount {
			return fmt.Errorf("func_anomalies: %d anomalies of a %d-byte name (bounds %d, %d)", n, len(name), uint64(MaxCount), MaxKeyLen)
		}
	}
	for i := range s.Funcs {
		f := &s.Funcs[i]
		switch {
		case len(f.Func) > MaxKeyLen:
			return fmt.Errorf("funcs %d: name is %d bytes, more than %d", i, len(f.Func), MaxKeyLen)
		case f.Count > MaxCount:
			return fmt.Errorf("funcs %q: %d anomalies, more than %d", f.Func, f.Count, uint64(MaxCount))
		case f.FirstTS > MaxTimestamp || f.LastTS > MaxTimestamp:
			return fmt.Errorf("funcs %q: timestamps %d..%d beyond %d", f.Func, f.FirstTS, f.LastTS, uint64(MaxTimestamp))
		}
		if err := ValidateMoments(&f.Score); err != nil {
			return fmt.Errorf("funcs %q: score: %w", f.Func, err)
		}
		if err := ValidateMoments(&f.Severity); err != nil {
			return fmt.Errorf("funcs %q: severity: %w", f.Func, err)
		}
	}
	return nil
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// inRange reports whether v is finite and |v| <= MaxValue.
func inRange(v float64) bool { return finite(v) && math.Abs(v) <= MaxValue }

// ValidateMoments reports whether m can be a summary of real values: every
// field finite; n a whole number in [0, MaxCount]; with n > 0, mean, min
// and max within ±MaxValue, min <= max, and the central moment sums within
// what n values spread over [min, max] can reach (|m_k| <= 2 n (max-min)^k,
// m2 and m4 not negative), so that merging it can never overflow.
func ValidateMoments(m *stats.Moments) error {
	for _, v := range []float64{m.N, m.Mean, m.M2, m.M3, m.M4, m.Min, m.Max} {
		if !finite(v) {
			return fmt.Errorf("moments %+v are not finite", *m)
		}
	}
	if m.N < 0 || m.N > MaxCount || m.N != math.Trunc(m.N) {
		return fmt.Errorf("moments count n %v is not a whole number in [0, %d]", m.N, uint64(MaxCount))
	}
	if m.N == 0 {
		return nil
	}
	if !inRange(m.Mean) || !inRange(m.Min) || !inRange(m.Max) || m.Min > m.Max {
		return fmt.Errorf("moments mean %v, min %v, max %v: want min <= max, each within ±%g", m.Mean, m.Min, m.Max, MaxValue)
	}
	// The spread, widened by what rounding the mean can add to a
	// value's distance from it.
	r := m.Max - m.Min + 1e-9*max(math.Abs(m.Min), math.Abs(m.Max))
	b2 := 2 * m.N * r * r
	if m.M2 < 0 || m.M2 > b2 {
		return fmt.Errorf("moments m2 %v is outside [0, %v] for %v values in [%v, %v]", m.M2, b2, m.N, m.Min, m.Max)
	}
	if b3 := b2 * r; math.Abs(m.M3) > b3 {
		return fmt.Errorf("moments m3 %v is outside ±%v for %v values in [%v, %v]", m.M3, b3, m.N, m.Min, m.Max)
	}
	if b4 := b2 * r * r; math.Abs(m.M4) > b4 {
		return fmt.Errorf("moments m4 %v is outside ±%v for %v values in [%v, %v]", m.M4, b4, m.N, m.Min, m.Max)
	}
	return nil
}

// ValidateHistogram reports whether h is a well-formed histogram (see
// stats.Histogram.Validate) within the request bounds: at most MaxBins
// bins, edges, min and max within ±MaxValue, at most MaxCount values.
func ValidateHistogram(h *stats.Histogram) error {
	if len(h.Counts) > MaxBins {
		return fmt.Errorf("histogram of %d bins, more than %d", len(h.Counts), MaxBins)
	}
	if err := h.Validate(); err != nil {
		return err
	}
	if len(h.Counts) == 0 {
		return nil
	}
	var n uint64
	for _, c := range h.Counts {
		n += c
		if c > MaxCount || n > MaxCount {
			return fmt.Errorf("histogram counts more than %d values", uint64(MaxCount))
		}
	}
	if !inRange(h.FirstEdge) || !inRange(h.LastEdge()) {
		return fmt.Errorf("histogram edges %v..%v are beyond ±%g", h.FirstEdge, h.LastEdge(), MaxValue)
	}
	if n > 0 && (!inRange(h.Min) || !inRange(h.Max)) {
		return fmt.Errorf("histogram min %v and max %v are beyond ±%g", h.Min, h.Max, MaxValue)
	}
	return nil
}

// ValidateTail reports whether t is a well-formed natural-range histogram
// (see stats.TailHist.Validate) with finite bounds and at most MaxCount
// values.
func ValidateTail(t *stats.TailHist) error {
	if err := t.Validate(); err != nil {
		return err
	}
	var n uint64
	for i, c := range t.Counts {
		n += c
		if c > MaxCount || n > MaxCount {
			return fmt.Errorf("tail histogram counts more than %d values", uint64(MaxCount))
		}
		if !finite(t.Mins[i]) || !finite(t.Maxs[i]) {
			return fmt.Errorf("tail histogram bin %d has bounds [%v, %v]", t.Lo+i, t.Mins[i], t.Maxs[i])
		}
	}
	return nil
}

// CheckAdvance reports whether next may follow last, the highest value a
// parameter server has recorded of a sequence (Seq per rank and
// incarnation, io_step), when it may be at most bound beyond it: an error
// wrapping ErrInvalid, naming what, if not.
func CheckAdvance(what string, last, next, bound uint64) error {
	if next > last && next-last > bound {
		return fmt.Errorf("%w: %s %d is more than %d beyond the last one recorded, %d", ErrInvalid, what, next, bound, last)
	}
	return nil
}
