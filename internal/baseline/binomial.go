package baseline

import "math"

// UpperTail is P(X >= k) for X binomial with n trials and success
// probability p: the p-value of k successes in a one-sided test that p is
// not exceeded. It is exact to a few ulps for the small tails that
// matter (summed in log space from k upwards) and 1 when k <= n*p, where a
// one-sided test can never reject.
func UpperTail(k, n uint64, p float64) float64 { return math.Exp(logUpperTail(k, n, p)) }

// logUpperTail is the natural log of UpperTail, which tells tails apart
// that UpperTail rounds to 0.
func logUpperTail(k, n uint64, p float64) float64 {
	switch {
	case k == 0:
		return 0
	case k > n || p <= 0:
		return math.Inf(-1)
	case p >= 1:
		return 0
	case float64(k) <= float64(n)*p:
		return 0
	}
	nf := float64(n)
	lgN, _ := math.Lgamma(nf + 1)
	lp, lq := math.Log(p), math.Log1p(-p)
	logPMF := func(i float64) float64 {
		a, _ := math.Lgamma(i + 1)
		b, _ := math.Lgamma(nf - i + 1)
		return lgN - a - b + i*lp + (nf-i)*lq
	}
	// Beyond the mean the terms fall at least geometrically: sum until
	// they no longer move the total.
	first := logPMF(float64(k))
	sum, term := 1.0, 1.0
	for i := float64(k); i < nf; i++ {
		term *= (nf - i) / (i + 1) * p / (1 - p)
		sum += term
		if term < sum*1e-17 {
			break
		}
	}
	return math.Min(0, first+math.Log(sum))
}
