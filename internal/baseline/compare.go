package baseline

import (
	"math"
	"sort"

	"github.com/kipimo-hpc/kipimo/internal/stats"
)

// Current is one model key of the run compared with a baseline, at its
// end: its global statistics.
type Current struct {
	Name string
	// Calls and TotalUs are the key's executions and their total runtime
	// (µs).
	Calls   uint64
	TotalUs float64
	// Hist is the key's natural-range histogram (nil with Chimbuko's rules).
	Hist *stats.TailHist
}

// Report is the comparison of a run with its baseline (the summary's
// baseline key).
type Report struct {
	// Source and Kind name the baseline (Reference.Source, Reference.Kind).
	Source string `json:"source"`
	Kind   string `json:"kind"`
	// Compared says what was compared: with a TAU baseline only mean time
	// per call and calls.
	Compared string `json:"compared"`
	// IOSteps and BaselineIOSteps are the runs' io_steps (0: unknown).
	IOSteps         uint64 `json:"io_steps"`
	BaselineIOSteps uint64 `json:"baseline_io_steps"`
	// Level is the per-key significance level of the tests (alpha over the
	// keys tested).
	Level float64 `json:"level"`
	// Functions are the keys both runs have, by extra time (ExtraUs),
	// largest first.
	Functions []FuncComparison `json:"functions"`
	// Absent are this run's keys the baseline lacks (listed, not compared),
	// Missing the baseline's keys this run did not call.
	Absent  []string `json:"absent"`
	Missing []string `json:"missing"`
}

// FuncComparison is one key of this run against the baseline.
type FuncComparison struct {
	Func string `json:"func"`
	// Calls, TotalUs and MeanUs are this run's, Baseline* the baseline's.
	Calls           uint64  `json:"calls"`
	BaselineCalls   uint64  `json:"baseline_calls"`
	MeanUs          float64 `json:"mean_us"`
	BaselineMeanUs  float64 `json:"baseline_mean_us"`
	MeanRatio       float64 `json:"mean_ratio"`
	CallsPerStep    float64 `json:"calls_per_step,omitempty"`
	BaseCallsPerStp float64 `json:"baseline_calls_per_step,omitempty"`
	// CallsRatio is this run's calls per io_step over the baseline's (calls
	// over calls when either run's io_steps are unknown).
	CallsRatio float64 `json:"calls_ratio"`
	// TimePerStepRatio is this run's time per io_step over the baseline's
	// (total time over total time when io_steps are unknown).
	TimePerStepRatio float64 `json:"time_per_step_ratio"`
	// ExtraUs is this run's time less what its calls took at the
	// baseline's mean per call (µs): what the rows are ordered by (io_steps
	// cut by wall time, as live runs cut them, would skew a scale by
	// io_steps).
	ExtraUs float64 `json:"extra_us"`
	// P50, P99 (µs) and their baseline values; 0 without histograms.
	P50         float64 `json:"p50_us,omitempty"`
	P99         float64 `json:"p99_us,omitempty"`
	BaselineP50 float64 `json:"baseline_p50_us,omitempty"`
	BaselineP99 float64 `json:"baseline_p99_us,omitempty"`
	// ShiftP99 is the one-sided binomial p-value of this run's calls above
	// the baseline's p99 against Margin times the 1% the baseline had at
	// most (this run's p99 has shifted up when it is below Level).
	ShiftP99 float64 `json:"shift_p99_p_value,omitempty"`
	// CallRateP is the p-value of this run's calls per io_step being no
	// higher than the baseline's (calls of both runs split by io_steps,
	// binomial); only with both runs' io_steps.
	CallRateP float64 `json:"call_rate_p_value,omitempty"`
	// NewMode is the slow mode this run has beyond the baseline's bound,
	// when the test finds its rate significantly higher.
	NewMode *NewMode `json:"new_mode,omitempty"`
	// Slower says what is significantly worse: "new slow mode", "p99
	// shifted", "more calls per io_step" (empty: nothing beyond noise).
	Slower []string `json:"slower,omitempty"`
}

// NewMode is a key's calls beyond the baseline's bound that are
// significantly more frequent than in the baseline (Key.Test at the best
// cut beyond the bound, FromUs; PValue is its p-value times the cuts tried).
type NewMode struct {
	Bound          float64 `json:"bound_us"`
	Calls          uint64  `json:"calls"`
	Beyond         uint64  `json:"beyond"`
	Fraction       float64 `json:"fraction"`
	BaselineCalls  uint64  `json:"baseline_calls"`
	BaselineBeyond uint64  `json:"baseline_beyond"`
	PValue         float64 `json:"p_value"`
	// FromUs is where the mode starts: runtimes beyond it are in it
	// (InMode of them). It is the cut at or beyond Bound, between two of
	// this run's bins, whose calls beyond are least likely under the
	// baseline's rate beyond it (Margin times, smoothed): the first bin of
	// the new mode, past the slow calls the baseline had as well. The
	// end-of-run relabelling keeps the anomalies beyond it.
	FromUs float64 `json:"from_us"`
	InMode uint64  `json:"in_mode"`
	// BaselineInMode is the baseline's calls beyond FromUs.
	BaselineInMode uint64 `json:"baseline_in_mode"`
	// TypicalUs is the median of this run's runtimes in the mode.
	TypicalUs float64 `json:"typical_us"`
}

// modeStart returns where the new mode of this run's histogram h (n calls)
// starts against baseline key k: the cut, the calls beyond it, the log
// p-value of that many against Margin times the baseline's (smoothed)
// calls beyond it, and how many cuts were tried (one below each of this
// run's bins beyond k.Bound).
func modeStart(k *Key, h *stats.TailHist, n uint64) (from float64, in uint64, logp float64, cuts int) {
	from, in, logp = k.Bound, Above(h, k.Bound), 0
	below := k.Bound // the largest runtime of this run below the cut
	above := in
	for i := range h.Counts {
		if h.Counts[i] == 0 {
			continue
		}
		if h.Mins[i] <= k.Bound {
			below = max(below, h.Maxs[i])
			continue
		}
		cuts++
		null := min(1, Margin*(float64(Beyond(k.Hist, below))+1)/(float64(k.Calls)+2))
		if p := logUpperTail(above, n, null); p < logp {
			logp, from, in = p, below, above
		}
		above -= h.Counts[i]
		below = h.Maxs[i]
	}
	return from, in, logp, cuts
}

// callRateTolerance is how much more often per io_step a key must be
// called, beyond the test, to count as called more: codes whose loops run
// a fixed number of times per step would otherwise show a significant
// difference for a handful of extra calls.
const callRateTolerance = 1.05

// Compare compares the run's keys cur (ioSteps io_steps, 0 when unknown)
// with r at the per-key level r.Level(alpha).
func Compare(r *Reference, cur []Current, ioSteps uint64, alpha float64) *Report {
	rep := &Report{Source: r.Source, Kind: r.Kind, IOSteps: ioSteps, BaselineIOSteps: r.IOSteps, Level: r.Level(alpha),
		Functions: []FuncComparison{}, Absent: []string{}, Missing: []string{}}
	rep.Compared = "time per io_step, p50 and p99, calls per io_step and new slow modes (binomial tests)"
	if r.Kind == KindTAU {
		rep.Compared = "mean time per call and calls only: a TAU profile has no histograms and no io_steps"
	}
	steps := ioSteps > 0 && r.IOSteps > 0
	seen := map[string]bool{}
	for _, c := range cur {
		seen[c.Name] = true
		k := r.Keys[c.Name]
		if k == nil {
			rep.Absent = append(rep.Absent, c.Name)
			continue
		}
		rep.Functions = append(rep.Functions, compareKey(k, c, ioSteps, r.IOSteps, steps, rep.Level))
	}
	for _, n := range r.Names() {
		if !seen[n] {
			rep.Missing = append(rep.Missing, n)
		}
	}
	sort.Strings(rep.Absent)
	sort.SliceStable(rep.Functions, func(i, j int) bool {
		a, b := rep.Functions[i], rep.Functions[j]
		if a.ExtraUs != b.ExtraUs {
			return a.ExtraUs > b.ExtraUs
		}
		return a.Func < b.Func
	})
	return rep
}

func compareKey(k *Key, c Current, steps, baseSteps uint64, haveSteps bool, level float64) FuncComparison {
	// The call rate of a TAU baseline, which has no io_steps, is its
	// calls: CallsRatio compares totals.
	f := FuncComparison{Func: c.Name, Calls: c.Calls, BaselineCalls: k.Calls, BaselineMeanUs: k.MeanUs()}
	if c.Calls > 0 {
		f.MeanUs = c.TotalUs / float64(c.Calls)
	}
	f.MeanRatio = ratio(f.MeanUs, f.BaselineMeanUs)
	if haveSteps {
		f.CallsPerStep = float64(c.Calls) / float64(steps)
		f.BaseCallsPerStp = float64(k.Calls) / float64(baseSteps)
		f.CallsRatio = ratio(f.CallsPerStep, f.BaseCallsPerStp)
		f.TimePerStepRatio = ratio(c.TotalUs/float64(steps), k.TotalUs/float64(baseSteps))
		// Under equal rates, this run's share of both runs' calls is its
		// share of their io_steps.
		f.CallRateP = UpperTail(c.Calls, c.Calls+k.Calls, float64(steps)/float64(steps+baseSteps))
		// Live runs cut io_steps by wall time (--period): a faster run has
		// fewer io_steps for the same calls. More calls per io_step count
		// only with more calls in all.
		if f.CallRateP <= level && f.CallsRatio > callRateTolerance && float64(c.Calls) > callRateTolerance*float64(k.Calls) {
			f.Slower = append(f.Slower, "more calls per io_step")
		}
	} else {
		f.CallsRatio = ratio(float64(c.Calls), float64(k.Calls))
		f.TimePerStepRatio = ratio(c.TotalUs, k.TotalUs)
	}
	f.ExtraUs = c.TotalUs - float64(c.Calls)*k.MeanUs()
	if c.Hist == nil || !k.HasModes() {
		return f
	}
	f.P50, f.P99 = c.Hist.Quantile(0.5), c.Hist.Quantile(0.99)
	f.BaselineP50, f.BaselineP99 = k.P50, k.P99
	n := c.Hist.N()
	above := Above(c.Hist, k.P99)
	// at most 1% of the baseline's calls lie above its p99; Margin times
	// that is noise
	f.ShiftP99 = UpperTail(above, n, Margin*0.01)
	if f.ShiftP99 <= level && f.P99 > k.P99 {
		f.Slower = append(f.Slower, "p99 shifted")
	}
	beyond := Above(c.Hist, k.Bound)
	from, in, logp, cuts := modeStart(k, c.Hist, n)
	// the cut is the best of cuts tried: Bonferroni over them
	if p := math.Min(1, math.Exp(logp)*float64(cuts)); cuts > 0 && p <= level {
		m := &NewMode{Bound: k.Bound, Calls: n, Beyond: beyond, Fraction: float64(beyond) / float64(max(n, 1)),
			BaselineCalls: k.Calls, BaselineBeyond: k.Beyond, PValue: p, FromUs: from, InMode: in,
			BaselineInMode: Beyond(k.Hist, from)}
		m.TypicalUs = medianBeyond(c.Hist, m.FromUs)
		f.NewMode = m
		f.Slower = append([]string{"new slow mode"}, f.Slower...)
	}
	return f
}

// medianBeyond is the median of h's values beyond bound, read at bin
// resolution.
func medianBeyond(h *stats.TailHist, bound float64) float64 {
	var sub stats.TailHist
	for i := range h.Counts {
		if h.Counts[i] > 0 && h.Maxs[i] > bound {
			x := stats.TailHist{Lo: h.Lo + i, Counts: []uint64{h.Counts[i]}, Mins: []float64{h.Mins[i]}, Maxs: []float64{h.Maxs[i]}}
			if err := sub.Merge(x); err != nil {
				return 0
			}
		}
	}
	if sub.N() == 0 {
		return 0
	}
	return sub.Quantile(0.5)
}

func ratio(a, b float64) float64 {
	if b <= 0 || math.IsNaN(a) || math.IsNaN(b) {
		return 0
	}
	return a / b
}
