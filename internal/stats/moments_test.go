package stats

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"gonum.org/v1/gonum/stat"
)

func relErr(got, want float64) float64 {
	if want == 0 {
		return math.Abs(got)
	}
	return math.Abs(got-want) / math.Abs(want)
}

// twoPass computes skewness sqrt(n) M3 / M2^1.5 and excess kurtosis
// n M4 / M2^2 - 3 directly from the data (not bias-corrected, as Moments).
func twoPass(xs []float64) (skew, kurt float64) {
	var mean float64
	for _, x := range xs {
		mean += x
	}
	mean /= float64(len(xs))
	var m2, m3, m4 float64
	for _, x := range xs {
		d := x - mean
		m2 += d * d
		m3 += d * d * d
		m4 += d * d * d * d
	}
	n := float64(len(xs))
	return math.Sqrt(n) * m3 / math.Pow(m2, 1.5), n*m4/(m2*m2) - 3
}

func TestMomentsSplitMerge(t *testing.T) {
	const n, parts = 1_000_000, 64
	rng := rand.New(rand.NewPCG(1, 2))
	datasets := []struct {
		name string
		gen  func() float64
	}{
		{"lognormal runtimes", func() float64 { return math.Exp(5 + rng.NormFloat64()) }},
		{"bimodal with offset", func() float64 {
			if rng.IntN(10) < 3 {
				return 1e6 + 900 + 30*rng.NormFloat64()
			}
			return 1e6 + 400 + 15*rng.NormFloat64()
		}},
		{"exponential", func() float64 { return rng.ExpFloat64() * 100 }},
	}
	for _, ds := range datasets {
		t.Run(ds.name, func(t *testing.T) {
			xs := make([]float64, n)
			for i := range xs {
				xs[i] = ds.gen()
			}
			// unequal parts: cut points drawn at random
			cuts := []int{0, n}
			for len(cuts) < parts+1 {
				cuts = append(cuts, 1+rng.IntN(n-1))
			}
			slices.Sort(cuts)
			var merged Moments
			for i := 0; i < parts; i++ {
				var m Moments
				for _, x := range xs[cuts[i]:cuts[i+1]] {
					m.Push(x)
				}
				merged.Merge(m)
			}
			mean, variance := stat.MeanVariance(xs, nil)
			skew, kurt := twoPass(xs)
			lo, hi := math.Inf(1), math.Inf(-1)
			for _, x := range xs {
				lo, hi = math.Min(lo, x), math.Max(hi, x)
			}
			checks := []struct {
				what      string
				got, want float64
			}{
				{"count", merged.N, n},
				{"mean", merged.Mean, mean},
				{"variance", merged.Variance(), variance},
				{"stddev", merged.Stddev(), math.Sqrt(variance)},
				{"skewness", merged.Skewness(), skew},
				{"kurtosis", merged.Kurtosis(), kurt},
				{"min", merged.Min, lo},
				{"max", merged.Max, hi},
			}
			for _, c := range checks {
				if e := relErr(c.got, c.want); e > 1e-9 {
					t.Errorf("%s: merged %.17g, batch %.17g, relative error %.3g > 1e-9", c.what, c.got, c.want, e)
				}
			}
		})
	}
}
