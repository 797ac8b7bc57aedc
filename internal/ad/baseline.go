package ad

import (
	"fmt"

	"github.com/kipimo-hpc/kipimo/internal/baseline"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// baseState compares the rank's executions with a baseline run
// (Config.Baseline) while the run goes: per model key the baseline has a
// histogram for, it counts the calls labelled so far and those beyond the
// baseline's bound (its natural threshold), and tests with a one-sided
// binomial test whether calls beyond the bound occur more often than
// baseline.Margin times the baseline's rate (baseline.Key.Test, at the
// baseline's Level: corrected for the number of keys). Once a key's test
// is significant, every execution beyond the bound is flagged, inside this
// run's own natural range or not (a recurring mode the baseline did not
// have). Until it is, such an execution waits (at most MaxPendingSteps
// steps, as a young model's do) for the test to decide while the key's
// calls beyond the bound are more frequent so far than the test's null
// rate (otherwise the test is far from deciding, and waiting would only
// hold memory); then, if they are still more frequent than in the
// baseline and it took longer than any call of the baseline, it is flagged
// all the same, its explanation saying the test has not decided: the
// comparison over all ranks at the end of the run
// (pserver.Server.FinalRanges) keeps it when it lies in a new mode, or
// unflags it. Keys the baseline lacks are left to the detector's own rule.
// Not safe for concurrent use: the detector's goroutine owns it.
type baseState struct {
	ref   *baseline.Reference
	level float64
	keys  []baseKey // by model key
}

// baseKey is one model key's comparison.
type baseKey struct {
	resolved bool
	ref      *baseline.Key // nil: the baseline cannot test the key
	calls    uint64        // executions counted so far
	beyond   uint64        // of which beyond ref.Bound
	sig      bool          // the test was significant (it stays so)
}

// baseVerdict is what the baseline says of one execution.
type baseVerdict uint8

const (
	baseNone baseVerdict = iota // leave it to the detector's rule
	baseWait                    // beyond the bound, the test undecided: retry later
	baseFlag                    // beyond the bound, more often than in the baseline
)

// baseCounted marks, in execRec.score, an execution the baseline counted
// that is still waiting for its label (scores are never negative; the label
// overwrites it).
const baseCounted float32 = -1

// newBaseState returns the comparison with cfg.Baseline, or nil without
// one (or a baseline with nothing to test).
func newBaseState(cfg *Config) *baseState {
	if cfg.Baseline == nil {
		return nil
	}
	return &baseState{ref: cfg.Baseline, level: cfg.Baseline.Level(baseline.DefaultAlpha)}
}

// key returns model key k's comparison, resolving it by name once.
func (s *baseState) key(k int32, name string) *baseKey {
	for int(k) >= len(s.keys) {
		s.keys = append(s.keys, baseKey{})
	}
	b := &s.keys[k]
	if !b.resolved {
		b.resolved = true
		if r := s.ref.Keys[name]; r != nil && r.HasModes() {
			b.ref = r
		}
	}
	return b
}

// judge counts execution e of model key k (value x) the first time it is
// asked and says whether it is flagged against the baseline, left to the
// detector, or waits (canWait: it may wait one more step).
func (s *baseState) judge(k int32, name string, x float64, e *execRec, canWait bool) baseVerdict {
	b := s.key(k, name)
	if b.ref == nil {
		return baseNone
	}
	first := e.score != baseCounted
	if first {
		e.score = baseCounted
		b.calls++
	}
	if x <= b.ref.Bound {
		return baseNone
	}
	if first {
		b.beyond++
		if !b.sig {
			b.sig = b.ref.Test(b.beyond, b.calls) <= s.level
		}
	}
	rate := float64(b.beyond) / float64(b.calls)
	switch {
	case b.sig:
		return baseFlag
	case canWait && rate > b.ref.Null():
		// more often than the test's null so far: it may decide soon
		return baseWait
	case rate > b.ref.P0() && x > b.ref.Max:
		// longer than any call of the baseline, and such calls more often
		// than there, not significantly (yet): an anomaly the end-of-run
		// comparison over all ranks confirms or unflags
		return baseFlag
	}
	return baseNone
}

// score is the outlier score of a value flagged against the baseline: its
// ratio to the bound.
func (s *baseState) score(k int32, x float64) float64 {
	return x / max(s.keys[k].ref.Bound, 1)
}

// explain adds to r, the record of an execution of model key k (value x)
// flagged against the baseline, the evidence and its words.
func (s *baseState) explain(r *provenance.Exec, k int32, name string, x float64) {
	b := &s.keys[k]
	// the test on the counts so far (it was significant when it first
	// was; the explanation says where it stands now)
	p := b.ref.Test(b.beyond, b.calls)
	ev := &provenance.BaselineEvidence{
		Source: s.ref.Source, Bound: b.ref.Bound, BaselineCalls: b.ref.Calls, BaselineBeyond: b.ref.Beyond,
		Calls: b.calls, Beyond: b.beyond, PValue: p,
	}
	verdict := "a slow mode the baseline %s did not have"
	if !b.sig {
		verdict = "beyond what the baseline %s had, not significantly so far (the end of the run decides)"
	}
	text := fmt.Sprintf("%s: "+verdict+": there %s of %s calls of %s took over %s; here %s of %s (%.2g%%) on this rank so far (binomial p = %.2g against %d× the baseline's rate, significant below %.2g)",
		fmtMicros(x), s.ref.Source, fmtCount(b.ref.Beyond), fmtCount(b.ref.Calls), name, fmtMicros(b.ref.Bound),
		fmtCount(b.beyond), fmtCount(b.calls), 100*float64(b.beyond)/float64(max(b.calls, 1)), p, baseline.Margin, s.level)
	if r.Explanation == nil {
		r.Explanation = &provenance.Explanation{Key: name, Value: x, Threshold: b.ref.Bound, Text: text}
	} else {
		r.Explanation.Text = text + "; " + r.Explanation.Text
	}
	r.Explanation.Baseline = ev
}

// fmtCount writes n with thousands separators.
func fmtCount(n uint64) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
