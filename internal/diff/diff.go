// Package diff compares two performance profiles function by function, the
// question "what changed between these two runs": for each function (or
// call path) it gives the mean per-thread value of a chosen quantity in
// each profile, their ratio, the change of its total over all threads (the
// impact, by which rows are sorted), and whether the change is beyond the
// thread-to-thread spread by Welch's t-test on the per-thread values.
//
// A side of the comparison is a taudb.Trial, from any source the project
// reads (TAU profile directories, ParaProf .ppk, TAU XML, Caliper, a TAUdb
// trial, or a Kipimo run's profiles), plus, for Kipimo runs, the number of
// anomalies each thread had in each function, from the run's provenance
// store. Results print as a table (WriteText), a JSON document (WriteJSON)
// or a bar chart (WriteChart).
package diff

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"

	"gonum.org/v1/gonum/stat/distuv"

	"github.com/kipimo-hpc/kipimo/internal/taudb"
)

// Quantity is what is compared per function and thread.
type Quantity string

// The quantities Compare supports.
const (
	// Exclusive is the metric's exclusive value (time in the function
	// itself, without its callees).
	Exclusive Quantity = "exclusive"
	// Inclusive is the metric's inclusive value (with callees).
	Inclusive Quantity = "inclusive"
	// Calls is the number of calls.
	Calls Quantity = "calls"
	// Anomalies is the number of anomalous executions per 1,000 calls;
	// only Kipimo runs have it.
	Anomalies Quantity = "anomalies"
)

// Quantities lists the quantities in the order they are documented.
var Quantities = []Quantity{Exclusive, Inclusive, Calls, Anomalies}

// ParseQuantity checks a quantity name.
func ParseQuantity(s string) (Quantity, error) {
	for _, q := range Quantities {
		if string(q) == s {
			return q, nil
		}
	}
	names := make([]string, len(Quantities))
	for i, q := range Quantities {
		names[i] = string(q)
	}
	return "", fmt.Errorf("unknown quantity %q: want one of %s", s, strings.Join(names, ", "))
}

// DefaultAlpha is the significance level of the test unless Options says.
const DefaultAlpha = 0.05

// ThreadKey names a thread by its TAU node, context and thread ranks (a
// Kipimo run's rank is the node, its thread id the thread).
type ThreadKey struct{ Node, Context, Thread int }

// Side is one side of a comparison.
type Side struct {
	// Label is how the user named the source (a path, taudb:42).
	Label string
	// Kind says what the source is: a taudb format name (tau, ppk, xml,
	// caliper, caliper-json), "taudb" or "run".
	Kind string
	// Trial holds the profile.
	Trial *taudb.Trial
	// Anomalies counts anomalous executions per thread and function (flat
	// name, normalized as TAUdb normalizes timer names). Nil when the source
	// records no anomalies; a run without any has an empty, non-nil map.
	Anomalies map[ThreadKey]map[string]int64
}

// Options configure Compare.
type Options struct {
	// Quantity is what is compared; default Exclusive.
	Quantity Quantity
	// Metric is the TAU metric of Exclusive and Inclusive (TIME,
	// PAPI_TOT_CYC, ...); default TIME when both sides have it, else the
	// first metric of A that B has too.
	Metric string
	// CallPaths compares call-path nodes ("a => b") instead of flat
	// functions.
	CallPaths bool
	// Alpha is the test's significance level; default DefaultAlpha.
	Alpha float64
}

// Row is one function's comparison.
type Row struct {
	// Name is the function (or the call path "a => b").
	Name string `json:"name"`
	// A and B are the mean per-thread values over the threads that ran the
	// function (TAU's MEAN thread); 0 when no thread of that side ran it.
	A float64 `json:"a"`
	B float64 `json:"b"`
	// Ratio is B/A, nil when A is 0.
	Ratio *float64 `json:"ratio"`
	// TotalA and TotalB are the sums over threads; for Anomalies they are
	// the anomaly counts.
	TotalA float64 `json:"total_a"`
	TotalB float64 `json:"total_b"`
	// Impact is |TotalB - TotalA|, the sort key.
	Impact float64 `json:"impact"`
	// ThreadsA and ThreadsB count the threads with a value.
	ThreadsA int `json:"threads_a"`
	ThreadsB int `json:"threads_b"`
	// StddevA and StddevB are the sample standard deviations of the
	// per-thread values (n-1 in the denominator; 0 for fewer than 2).
	StddevA float64 `json:"stddev_a"`
	StddevB float64 `json:"stddev_b"`
	// Test is Welch's t-test of the per-thread values, nil when it cannot
	// be made (a side with fewer than 2 threads).
	Test *Welch `json:"test"`
	// AnomaliesA and AnomaliesB count the function's anomalies over all
	// threads when both sides are Kipimo runs (flat functions only).
	AnomaliesA *int64 `json:"anomalies_a,omitempty"`
	AnomaliesB *int64 `json:"anomalies_b,omitempty"`
	// Change is "up", "down" or "same" for a test that found the change
	// beyond the spread ("same" when it did not), "new" or "gone" for a
	// function only B or only A ran, and "untested" when the test could
	// not be made.
	Change string `json:"change"`
}

// Change values of a Row.
const (
	ChangeUp       = "up"
	ChangeDown     = "down"
	ChangeSame     = "same"
	ChangeNew      = "new"
	ChangeGone     = "gone"
	ChangeUntested = "untested"
)

// Result is a whole comparison.
type Result struct {
	A        SideInfo `json:"a"`
	B        SideInfo `json:"b"`
	Quantity Quantity `json:"quantity"`
	// Metric is the TAU metric compared ("" for Calls and Anomalies).
	Metric    string `json:"metric,omitempty"`
	CallPaths bool   `json:"call_paths"`
	// Test describes the significance test.
	Test TestInfo `json:"test"`
	// Sort names the sort rule.
	Sort string `json:"sort"`
	// Count is the number of functions compared; Functions may hold fewer
	// (Top).
	Count     int   `json:"count"`
	Functions []Row `json:"functions"`
}

// SideInfo describes a side in a Result.
type SideInfo struct {
	Source  string   `json:"source"`
	Kind    string   `json:"kind"`
	Name    string   `json:"name"`
	Threads int      `json:"threads"`
	Metrics []string `json:"metrics"`
	// Anomalies is the side's total anomaly count, for Kipimo runs.
	Anomalies *int64 `json:"anomalies,omitempty"`
}

// TestInfo names the significance test and its level.
type TestInfo struct {
	Name  string  `json:"name"`
	Alpha float64 `json:"alpha"`
}

// SortRule is the documented sort order of Result.Functions.
const SortRule = "impact: |total B - total A| over all threads, largest first; ties by name"

// TestName is the documented significance test.
const TestName = "Welch's two-sided t-test on the per-thread values"

// Compare compares a and b as opt says. Rows are sorted by impact.
func Compare(a, b *Side, opt Options) (*Result, error) {
	if a == nil || b == nil || a.Trial == nil || b.Trial == nil {
		return nil, errors.New("diff: both sides need a profile")
	}
	if opt.Quantity == "" {
		opt.Quantity = Exclusive
	}
	if _, err := ParseQuantity(string(opt.Quantity)); err != nil {
		return nil, err
	}
	if opt.Alpha == 0 {
		opt.Alpha = DefaultAlpha
	}
	if !(opt.Alpha > 0 && opt.Alpha < 1) {
		return nil, fmt.Errorf("significance level %v: want a number between 0 and 1", opt.Alpha)
	}
	res := &Result{A: info(a), B: info(b), Quantity: opt.Quantity, CallPaths: opt.CallPaths,
		Test: TestInfo{Name: TestName, Alpha: opt.Alpha}, Sort: SortRule}
	var ma, mb *taudb.Metric
	switch opt.Quantity {
	case Exclusive, Inclusive:
		name, err := pickMetric(a.Trial, b.Trial, opt.Metric)
		if err != nil {
			return nil, err
		}
		res.Metric = name
		ma, mb = findMetric(a.Trial, name), findMetric(b.Trial, name)
	case Anomalies:
		for _, s := range []*Side{a, b} {
			if s.Anomalies == nil {
				return nil, fmt.Errorf("%s has no anomaly counts: anomalies per 1,000 calls need a Kipimo run directory (with its provenance.db) on both sides", s.Label)
			}
		}
		if opt.CallPaths {
			return nil, errors.New("anomalies are counted per function, not per call path: drop --call-path")
		}
	}
	va, ta := perThread(a, ma, opt)
	vb, tb := perThread(b, mb, opt)
	names := make([]string, 0, len(va)+len(vb))
	for n := range va {
		names = append(names, n)
	}
	for n := range vb {
		if _, ok := va[n]; !ok {
			names = append(names, n)
		}
	}
	for _, n := range names {
		row := compareOne(n, va[n], vb[n], opt.Alpha)
		if opt.Quantity == Anomalies {
			row.TotalA, row.TotalB = ta[n], tb[n]
			row.Impact = math.Abs(row.TotalB - row.TotalA)
		}
		if a.Anomalies != nil && b.Anomalies != nil && !opt.CallPaths {
			ca, cb := countAnomalies(a, n), countAnomalies(b, n)
			row.AnomaliesA, row.AnomaliesB = &ca, &cb
		}
		res.Functions = append(res.Functions, row)
	}
	sort.Slice(res.Functions, func(i, j int) bool {
		x, y := res.Functions[i], res.Functions[j]
		if x.Impact != y.Impact {
			return x.Impact > y.Impact
		}
		return x.Name < y.Name
	})
	res.Count = len(res.Functions)
	return res, nil
}

// Top keeps the first n rows (all for n <= 0).
func (r *Result) Top(n int) {
	if n > 0 && len(r.Functions) > n {
		r.Functions = r.Functions[:n]
	}
}

func info(s *Side) SideInfo {
	si := SideInfo{Source: s.Label, Kind: s.Kind, Name: s.Trial.Name, Threads: len(s.Trial.RealThreads())}
	for _, m := range s.Trial.Metrics {
		si.Metrics = append(si.Metrics, m.Name)
	}
	if s.Anomalies != nil {
		var n int64
		for _, fs := range s.Anomalies {
			for _, c := range fs {
				n += c
			}
		}
		si.Anomalies = &n
	}
	return si
}

// findMetric finds a metric by exact name, then ignoring case.
func findMetric(tr *taudb.Trial, name string) *taudb.Metric {
	if m := tr.Metric(name); m != nil {
		return m
	}
	for _, m := range tr.Metrics {
		if strings.EqualFold(m.Name, name) {
			return m
		}
	}
	return nil
}

func pickMetric(a, b *taudb.Trial, want string) (string, error) {
	names := func(tr *taudb.Trial) string {
		var s []string
		for _, m := range tr.Metrics {
			s = append(s, m.Name)
		}
		return strings.Join(s, ", ")
	}
	if want != "" {
		for _, tr := range []*taudb.Trial{a, b} {
			if findMetric(tr, want) == nil {
				return "", fmt.Errorf("metric %q: %s has %s", want, tr.Name, names(tr))
			}
		}
		return findMetric(a, want).Name, nil
	}
	if findMetric(a, "TIME") != nil && findMetric(b, "TIME") != nil {
		return findMetric(a, "TIME").Name, nil
	}
	for _, m := range a.Metrics {
		if findMetric(b, m.Name) != nil {
			return m.Name, nil
		}
	}
	return "", fmt.Errorf("the two profiles share no metric: %s has %s, %s has %s", a.Name, names(a), b.Name, names(b))
}

// countAnomalies sums function fn's anomalies over s's threads.
func countAnomalies(s *Side, fn string) int64 {
	var n int64
	for _, fs := range s.Anomalies {
		n += fs[fn]
	}
	return n
}

// perThread returns, per function or call path, the values of its real
// threads in thread order, and for Anomalies its anomaly count over those
// threads.
func perThread(s *Side, m *taudb.Metric, opt Options) (map[string][]float64, map[string]float64) {
	out := map[string][]float64{}
	counts := map[string]float64{}
	for _, th := range s.Trial.RealThreads() {
		var anom map[string]int64
		if opt.Quantity == Anomalies {
			anom = s.Anomalies[ThreadKey{th.NodeRank, th.ContextRank, th.ThreadRank}]
		}
		for _, d := range th.CallData {
			c := d.Callpath
			if (c.Parent != nil) != opt.CallPaths {
				continue
			}
			var v float64
			switch opt.Quantity {
			case Exclusive, Inclusive:
				tv := d.Value(m)
				if tv == nil {
					continue
				}
				v = tv.Exclusive
				if opt.Quantity == Inclusive {
					v = tv.Inclusive
				}
			case Calls:
				v = d.Calls
			case Anomalies:
				if d.Calls <= 0 {
					continue
				}
				v = 1000 * float64(anom[c.Name]) / d.Calls
				counts[c.Name] += float64(anom[c.Name])
			}
			out[c.Name] = append(out[c.Name], v)
		}
	}
	return out, counts
}

func compareOne(name string, a, b []float64, alpha float64) Row {
	r := Row{Name: name, ThreadsA: len(a), ThreadsB: len(b)}
	var sa, sb float64
	r.A, sa, r.TotalA = describe(a)
	r.B, sb, r.TotalB = describe(b)
	r.StddevA, r.StddevB = math.Sqrt(sa), math.Sqrt(sb)
	r.Impact = math.Abs(r.TotalB - r.TotalA)
	if r.A != 0 {
		q := r.B / r.A
		r.Ratio = &q
	}
	switch {
	case len(a) == 0:
		r.Change = ChangeNew
	case len(b) == 0:
		r.Change = ChangeGone
	default:
		w, ok := WelchTest(a, b)
		if !ok {
			r.Change = ChangeUntested
			break
		}
		r.Test = &w
		switch {
		case w.P >= alpha:
			r.Change = ChangeSame
		case r.B > r.A:
			r.Change = ChangeUp
		default:
			r.Change = ChangeDown
		}
	}
	return r
}

// describe returns the mean, the sample variance (n-1) and the sum of xs.
func describe(xs []float64) (mean, variance, sum float64) {
	if len(xs) == 0 {
		return 0, 0, 0
	}
	for _, x := range xs {
		sum += x
	}
	mean = sum / float64(len(xs))
	if len(xs) < 2 {
		return mean, 0, sum
	}
	var ss float64
	for _, x := range xs {
		d := x - mean
		ss += d * d
	}
	return mean, ss / float64(len(xs)-1), sum
}

// Welch is the outcome of Welch's t-test.
type Welch struct {
	// T is (mean B - mean A) / sqrt(varA/nA + varB/nB); ±Inf when both
	// sides have no spread and their means differ.
	T float64 `json:"t"`
	// DF is the Welch–Satterthwaite degrees of freedom.
	DF float64 `json:"df"`
	// P is the two-sided p-value.
	P float64 `json:"p"`
}

// MarshalJSON writes infinite t and degrees of freedom as strings, which
// JSON numbers cannot hold.
func (w Welch) MarshalJSON() ([]byte, error) {
	num := func(v float64) string {
		switch {
		case math.IsInf(v, 1):
			return `"+Inf"`
		case math.IsInf(v, -1):
			return `"-Inf"`
		case math.IsNaN(v):
			return `"NaN"`
		}
		return fmt.Sprint(v)
	}
	return []byte(`{"t":` + num(w.T) + `,"df":` + num(w.DF) + `,"p":` + num(w.P) + `}`), nil
}

// WelchTest compares the means of a and b with Welch's unequal-variances
// t-test, two-sided. It needs at least two values on each side (ok false
// otherwise). When both sides have zero variance the test is degenerate:
// P is 0 if the means differ (any difference is beyond a spread of zero)
// and 1 if they are equal.
func WelchTest(a, b []float64) (w Welch, ok bool) {
	na, nb := float64(len(a)), float64(len(b))
	if len(a) < 2 || len(b) < 2 {
		return Welch{}, false
	}
	ma, va, _ := describe(a)
	mb, vb, _ := describe(b)
	qa, qb := va/na, vb/nb
	se2 := qa + qb
	diff := mb - ma
	if se2 == 0 {
		switch {
		case diff > 0:
			return Welch{T: math.Inf(1), DF: na + nb - 2, P: 0}, true
		case diff < 0:
			return Welch{T: math.Inf(-1), DF: na + nb - 2, P: 0}, true
		}
		return Welch{T: 0, DF: na + nb - 2, P: 1}, true
	}
	w.T = diff / math.Sqrt(se2)
	w.DF = se2 * se2 / (qa*qa/(na-1) + qb*qb/(nb-1))
	st := distuv.StudentsT{Mu: 0, Sigma: 1, Nu: w.DF}
	w.P = 2 * st.Survival(math.Abs(w.T))
	if w.P > 1 {
		w.P = 1
	}
	return w, true
}
