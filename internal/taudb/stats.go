package taudb

import "math"

// acc accumulates one quantity over the threads that have a node, in thread
// order, in double, as TAU's DataSource.generateStatistics does.
type acc struct {
	sum, sumSq, min, max float64
	k                    int
}

func (a *acc) add(v float64) {
	if a.k == 0 || v < a.min {
		a.min = v
	}
	if a.k == 0 || v > a.max {
		a.max = v
	}
	a.sum += v
	a.sumSq += v * v
	a.k++
}

func (a *acc) mean() float64 {
	if a.k == 0 {
		return 0
	}
	return a.sum * (1.0 / float64(a.k))
}

func (a *acc) meanAll(n int) float64 { return a.sum * (1.0 / float64(n)) }

func stddev(sumSq, mean float64, n int) float64 {
	if n <= 1 {
		return 0
	}
	return math.Sqrt(math.Abs(sumSq*(1.0/float64(n)) - mean*mean))
}

func (a *acc) stddev() float64 { return stddev(a.sumSq, a.mean(), a.k) }

func (a *acc) stddevAll(n int) float64 { return stddev(a.sumSq, a.meanAll(n), n) }

// stat returns the derived statistic idx of a over k threads having the
// node and n real threads.
func (a *acc) stat(idx, n int) float64 {
	switch idx {
	case MeanWithoutNulls:
		return a.mean()
	case Total:
		return a.sum
	case StddevWithoutNulls:
		return a.stddev()
	case Min:
		return a.min
	case Max:
		return a.max
	case MeanWithNulls:
		return a.meanAll(n)
	case StddevWithNulls:
		return a.stddevAll(n)
	}
	return 0
}

// finite maps the NaN of a 0/0 percent to 0.
func finite(v float64) float64 {
	if math.IsNaN(v) {
		return 0
	}
	return v
}

// ComputeDerived (re)computes the percents of the real threads and the
// derived threads -1..-7 with their call data, values and counter values,
// following TAU's loader exactly (see the package README of the reference
// data): sums in thread order, means as sum*(1.0/k), population standard
// deviations, percents of the thread's (or the sum of threads') largest
// inclusive value, and the STDDEV percents TAU writes. A derived node is
// kept only where its derived call count is > 0; its calls and subroutines
// are truncated to whole numbers, as TAU stores them.
func (tr *Trial) ComputeDerived() {
	tr.dropDerived()
	real := tr.RealThreads()
	n := len(real)
	derived := map[int]*Thread{}
	for _, idx := range DerivedIndexes {
		derived[idx] = tr.AddThread(idx, idx, idx, idx)
	}
	if n == 0 {
		return
	}
	nm := len(tr.Metrics)
	// Largest inclusive value per thread and metric, and their sum.
	maxI := make([][]float64, n)
	top := make([]float64, nm)
	for i, th := range real {
		maxI[i] = make([]float64, nm)
		for _, d := range th.CallData {
			if d.Calls <= 0 {
				continue
			}
			for mi, v := range d.Values {
				if v != nil && v.Inclusive > maxI[i][mi] {
					maxI[i][mi] = v.Inclusive
				}
			}
		}
		for mi := range top {
			top[mi] += maxI[i][mi]
		}
		for _, d := range th.CallData {
			for mi, v := range d.Values {
				if v != nil {
					div := maxI[i][mi] / 100.0
					v.InclusivePercent = finite(v.Inclusive / div)
					v.ExclusivePercent = finite(v.Exclusive / div)
				}
			}
		}
	}
	fn := float64(n)
	for _, c := range tr.Callpaths {
		var calls, subrs acc
		incl := make([]acc, nm)
		excl := make([]acc, nm)
		for _, th := range real {
			d := th.CallDataFor(c)
			if d == nil || d.Calls <= 0 {
				continue
			}
			calls.add(d.Calls)
			subrs.add(d.Subroutines)
			for mi := 0; mi < nm; mi++ {
				var i, e float64
				if v := d.Value(tr.Metrics[mi]); v != nil {
					i, e = v.Inclusive, v.Exclusive
				}
				incl[mi].add(i)
				excl[mi].add(e)
			}
		}
		if calls.k == 0 {
			continue
		}
		for _, idx := range DerivedIndexes {
			cv := calls.stat(idx, n)
			if !(cv > 0) {
				continue
			}
			d := tr.AddCallData(derived[idx], c)
			d.Calls = math.Trunc(cv)
			d.Subroutines = math.Trunc(subrs.stat(idx, n))
			for mi, m := range tr.Metrics {
				iv, ev := incl[mi].stat(idx, n), excl[mi].stat(idx, n)
				v := d.SetValue(m, iv, ev)
				div := top[mi] / 100.0
				switch idx {
				case Total:
					v.InclusivePercent, v.ExclusivePercent = iv/div, ev/div
				case MeanWithoutNulls, MeanWithNulls:
					v.InclusivePercent = incl[mi].sum / div
					v.ExclusivePercent = excl[mi].mean() / (div / fn)
				case Min, Max:
					v.InclusivePercent, v.ExclusivePercent = iv/(div/fn), ev/(div/fn)
				case StddevWithoutNulls, StddevWithNulls:
					v.InclusivePercent = iv / incl[mi].mean() * 100.0
					v.ExclusivePercent = ev / excl[mi].mean()
				}
				v.InclusivePercent, v.ExclusivePercent = finite(v.InclusivePercent), finite(v.ExclusivePercent)
			}
		}
	}
	tr.computeCounterStats(real, derived)
}

// computeCounterStats fills the derived threads' counter values: each of
// sample count, maximum, minimum, mean and sum of squares gets the same
// statistic over the threads that have the counter. TAU's loader does not
// store these rows; they are kept in memory only.
func (tr *Trial) computeCounterStats(real []*Thread, derived map[int]*Thread) {
	n := len(real)
	for _, c := range tr.Counters {
		var f [5]acc
		for _, th := range real {
			v := th.CounterValueFor(c)
			if v == nil {
				continue
			}
			for i, x := range [5]float64{v.SampleCount, v.Maximum, v.Minimum, v.Mean, v.SumSquares} {
				f[i].add(x)
			}
		}
		if f[0].k == 0 {
			continue
		}
		for _, idx := range DerivedIndexes {
			v := tr.AddCounterValue(derived[idx], c)
			v.SampleCount, v.Maximum, v.Minimum, v.Mean, v.SumSquares =
				f[0].stat(idx, n), f[1].stat(idx, n), f[2].stat(idx, n), f[3].stat(idx, n), f[4].stat(idx, n)
		}
	}
}

// dropDerived removes the derived threads and everything hanging off them.
func (tr *Trial) dropDerived() {
	kept := tr.Threads[:0]
	for _, th := range tr.Threads {
		if th.IsDerived() {
			delete(tr.threadsByIndex, th.Index)
			continue
		}
		kept = append(kept, th)
	}
	for i := len(kept); i < len(tr.Threads); i++ {
		tr.Threads[i] = nil
	}
	tr.Threads = kept
}
