// Package stats holds the running statistics that detectors keep and the
// parameter server merges: moments up to the fourth order (merged exactly, after
// Pébay) and HBOS histograms.
//
// Values are plain data and are not safe for concurrent use.
package stats

import "math"

// Moments is a running summary of a sample: count, mean, the central moment
// sums M2..M4, minimum and maximum. The zero value is an empty sample.
type Moments struct {
	N    float64 `json:"n"`
	Mean float64 `json:"mean"`
	M2   float64 `json:"m2"`
	M3   float64 `json:"m3"`
	M4   float64 `json:"m4"`
	Min  float64 `json:"min"`
	Max  float64 `json:"max"`
}

// Push adds one value.
func (m *Moments) Push(x float64) {
	n1 := m.N
	m.N++
	n := m.N
	delta := x - m.Mean
	dn := delta / n
	dn2 := dn * dn
	term1 := delta * dn * n1
	m.Mean += dn
	m.M4 += term1*dn2*(n*n-3*n+3) + 6*dn2*m.M2 - 4*dn*m.M3
	m.M3 += term1*dn*(n-2) - 3*dn*m.M2
	m.M2 += term1
	if n1 == 0 || x < m.Min {
		m.Min = x
	}
	if n1 == 0 || x > m.Max {
		m.Max = x
	}
}

// Merge adds the sample summarised by b to m (the exact parallel merge).
func (m *Moments) Merge(b Moments) {
	if b.N == 0 {
		return
	}
	if m.N == 0 {
		*m = b
		return
	}
	na, nb := m.N, b.N
	n := na + nb
	d := b.Mean - m.Mean
	d2 := d * d
	m2 := m.M2 + b.M2 + d2*na*nb/n
	m3 := m.M3 + b.M3 + d2*d*na*nb*(na-nb)/(n*n) + 3*d*(na*b.M2-nb*m.M2)/n
	m4 := m.M4 + b.M4 + d2*d2*na*nb*(na*na-na*nb+nb*nb)/(n*n*n) +
		6*d2*(na*na*b.M2+nb*nb*m.M2)/(n*n) + 4*d*(na*b.M3-nb*m.M3)/n
	m.Mean += d * nb / n
	m.N, m.M2, m.M3, m.M4 = n, m2, m3, m4
	m.Min = math.Min(m.Min, b.Min)
	m.Max = math.Max(m.Max, b.Max)
}

// Variance is the sample variance (ddof = 1); 0 below two values.
func (m Moments) Variance() float64 {
	if m.N < 2 {
		return 0
	}
	return m.M2 / (m.N - 1)
}

// Stddev is the sample standard deviation (ddof = 1).
func (m Moments) Stddev() float64 { return math.Sqrt(m.Variance()) }

// Skewness is sqrt(n) M3 / M2^1.5 (not bias-corrected); 0 when M2 is 0.
func (m Moments) Skewness() float64 {
	if m.M2 == 0 {
		return 0
	}
	return math.Sqrt(m.N) * m.M3 / math.Pow(m.M2, 1.5)
}

// Kurtosis is the excess kurtosis n M4 / M2^2 - 3 (not bias-corrected); 0 when
// M2 is 0.
func (m Moments) Kurtosis() float64 {
	if m.M2 == 0 {
		return 0
	}
	return m.N*m.M4/(m.M2*m.M2) - 3
}
