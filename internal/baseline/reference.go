// Package baseline holds a finished run's final per-key models as the
// reference a later run of the same code is compared with while it runs
// (kipimo run --baseline, ad --baseline): per model key (a function, or a
// call path) its natural-range histogram, natural range, calls and the
// run's io_steps. It reads them from a Kipimo run (its provenance store or
// run directory, or provdb's HTTP API) or from a TAU profile or TAUdb trial
// (per-function calls and times only), and provides the statistics the
// comparison rests on: a one-sided binomial test of a key's rate of calls
// beyond the baseline's bound against Margin times the baseline's own
// (UpperTail, Key.Test) and the summary's
// per-function comparison (Compare).
//
// A Reference is read-only once loaded: the detectors of a process share
// one.
package baseline

import (
	"fmt"
	"math"
	"sort"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/stats"
)

// Kinds of reference (Reference.Kind).
const (
	// KindRun is a Kipimo run: final func_stats records with natural-range
	// histograms.
	KindRun = "run"
	// KindTAU is a TAU profile or TAUdb trial: per-function calls and times
	// only, so only mean time per call and calls are compared.
	KindTAU = "tau"
)

// DefaultAlpha is the significance level of a new slow mode over all keys
// (Bonferroni: each key is tested at DefaultAlpha over the number of keys).
const DefaultAlpha = 1e-3

// Reference is a baseline run's final models by key.
type Reference struct {
	// Source is the baseline as the user named it.
	Source string
	// Kind is KindRun or KindTAU.
	Kind string
	// IOSteps is how many io_steps the baseline had (0: unknown, as in TAU
	// profiles).
	IOSteps uint64
	// Keys are the model keys (function names, or call paths).
	Keys map[string]*Key
	// Rule is the natural-range rule the keys' bounds were read with (zero
	// for KindTAU, which has none).
	Rule stats.TailRule
}

// Key is one model key of a baseline.
type Key struct {
	Name string
	// Calls is the key's executions in the baseline, TotalUs their total
	// runtime (µs; the models' statistic: exclusive unless the run was
	// inclusive).
	Calls   uint64
	TotalUs float64
	// Hist is the key's final natural-range histogram (nil from TAU).
	Hist *stats.TailHist
	// Bound is the threshold beyond which the baseline's own natural range
	// flags a runtime (µs; 0 without a histogram), and Beyond the baseline's
	// calls beyond it: the rate a later run's calls beyond Bound are tested
	// against.
	Bound  float64
	Beyond uint64
	// P50 and P99 are the baseline's median and 99th percentile, Max its
	// largest runtime (µs; 0 without a histogram).
	P50, P99, Max float64
}

// HasModes reports whether the key can be tested for new slow modes (its
// baseline has a histogram).
func (k *Key) HasModes() bool { return k.Hist != nil && k.Calls > 0 }

// MeanUs is the key's mean runtime per call in the baseline (µs).
func (k *Key) MeanUs() float64 {
	if k.Calls == 0 {
		return 0
	}
	return k.TotalUs / float64(k.Calls)
}

// P0 is the baseline's smoothed rate of calls beyond Bound,
// (Beyond+1)/(Calls+2): never 0, so that a rate the baseline never showed
// needs a few calls, not one, to be significant.
func (k *Key) P0() float64 { return (float64(k.Beyond) + 1) / (float64(k.Calls) + 2) }

// Margin is how many times the baseline's rate of calls beyond its bound
// (P0), or beyond its p99, a run's rate may reach and still count as
// noise: the tail of runtimes varies that much between two clean runs of
// one code on a shared machine, whose stalls hit several calls at once,
// more than the binomial test's independent calls allow (two clean LAMMPS
// runs: 2 and 24 of 16,210 MPI_Send calls beyond 85 ms; 22 and 54 of 606
// MPI_Sendrecv calls beyond 224 µs).
const Margin = 5

// Null is the rate of calls beyond Bound the test takes as no worse than
// the baseline: Margin times P0, at most 1.
func (k *Key) Null() float64 { return min(1, Margin*k.P0()) }

// Test returns the p-value of beyond calls beyond Bound out of calls under
// the rate Null: the probability of at least that many were the run no
// worse than the baseline.
func (k *Key) Test(beyond, calls uint64) float64 { return UpperTail(beyond, calls, k.Null()) }

// Level is the per-key significance level: alpha over the number of keys
// that can be tested (Bonferroni), alpha DefaultAlpha when 0.
func (r *Reference) Level(alpha float64) float64 {
	if alpha <= 0 {
		alpha = DefaultAlpha
	}
	n := 0
	for _, k := range r.Keys {
		if k.HasModes() {
			n++
		}
	}
	return alpha / float64(max(n, 1))
}

// Names returns the reference's keys in order.
func (r *Reference) Names() []string {
	out := make([]string, 0, len(r.Keys))
	for n := range r.Keys {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// FromFuncStats builds a reference from a Kipimo run's final func_stats
// records (the records of every pserver shard; keys met twice, from two
// programs, are merged). rule is the natural-range rule the bound is read
// with (the detectors' Config.TailRule).
func FromFuncStats(source string, fs []provenance.GlobalFuncStats, rule stats.TailRule) (*Reference, error) {
	if len(fs) == 0 {
		return nil, fmt.Errorf("baseline %s: no final func_stats records: give a finished Kipimo run (its statistics are written when it ends)", source)
	}
	r := &Reference{Source: source, Kind: KindRun, Keys: map[string]*Key{}, Rule: rule}
	hists := 0
	for _, f := range fs {
		if f.Func == "" {
			continue
		}
		r.IOSteps = max(r.IOSteps, f.IOSteps)
		k := r.Keys[f.Func]
		if k == nil {
			k = &Key{Name: f.Func}
			r.Keys[f.Func] = k
		}
		if f.Stats.Count > 0 && !math.IsNaN(f.Stats.Accumulate) && !math.IsInf(f.Stats.Accumulate, 0) {
			k.Calls += uint64(f.Stats.Count)
			k.TotalUs += f.Stats.Accumulate
		}
		if f.NaturalHist == nil {
			continue
		}
		if err := f.NaturalHist.Validate(); err != nil {
			return nil, fmt.Errorf("baseline %s: natural_hist of %s: %w", source, f.Func, err)
		}
		if k.Hist == nil {
			k.Hist = &stats.TailHist{}
		}
		if err := k.Hist.Merge(*f.NaturalHist); err != nil {
			return nil, fmt.Errorf("baseline %s: natural_hist of %s: %w", source, f.Func, err)
		}
		hists++
	}
	if hists == 0 {
		return nil, fmt.Errorf("baseline %s: its func_stats records carry no natural_hist: the run was made by an older Kipimo or with Chimbuko's rules; run the baseline again", source)
	}
	for _, k := range r.Keys {
		if k.Hist != nil {
			k.fill(rule)
		}
	}
	return r, nil
}

// WithRule returns r with its keys' bounds, calls beyond them and
// quantiles read with rule: r itself when they already are, or when r has
// no histograms (KindTAU). A process that loads a baseline before it knows
// the detectors' rule (a standalone pserver) reads it again with theirs.
func (r *Reference) WithRule(rule stats.TailRule) *Reference {
	if r.Kind != KindRun || r.Rule == rule {
		return r
	}
	out := &Reference{Source: r.Source, Kind: r.Kind, IOSteps: r.IOSteps, Keys: make(map[string]*Key, len(r.Keys)), Rule: rule}
	for n, k := range r.Keys {
		c := *k
		if c.Hist != nil {
			c.fill(rule)
		}
		out.Keys[n] = &c
	}
	return out
}

// fill reads the bound, the calls beyond it and the quantiles from Hist.
func (k *Key) fill(rule stats.TailRule) {
	_, hi := k.Hist.NaturalRange(rule)
	k.Bound = rule.Threshold(hi)
	k.Beyond = Beyond(k.Hist, k.Bound)
	k.P50, k.P99 = k.Hist.Quantile(0.5), k.Hist.Quantile(0.99)
	for i := len(k.Hist.Counts) - 1; i >= 0; i-- {
		if k.Hist.Counts[i] > 0 {
			k.Max = k.Hist.Maxs[i]
			break
		}
	}
	if n := k.Hist.N(); n > k.Calls {
		k.Calls = n
	}
}

// Beyond counts the values of h beyond bound: a bin whose largest value is
// beyond it counts whole (the count errs high, which makes the baseline's
// rate, and so the test, conservative).
func Beyond(h *stats.TailHist, bound float64) uint64 {
	var n uint64
	for i := len(h.Counts) - 1; i >= 0; i-- {
		if h.Counts[i] == 0 {
			continue
		}
		if h.Maxs[i] <= bound {
			break
		}
		n += h.Counts[i]
	}
	return n
}

// Above counts the values of h beyond bound, only bins whose smallest value
// is beyond it (the count errs low: a run's calls beyond a baseline's
// bound, so that the test stays conservative).
func Above(h *stats.TailHist, bound float64) uint64 {
	var n uint64
	for i := len(h.Counts) - 1; i >= 0; i-- {
		if h.Counts[i] == 0 {
			continue
		}
		if h.Mins[i] <= bound {
			break
		}
		n += h.Counts[i]
	}
	return n
}
