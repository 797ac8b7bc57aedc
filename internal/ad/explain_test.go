package ad

import (
	"math"
	"strings"
	"testing"
)

func TestExplain(t *testing.T) {
	for _, tc := range []struct {
		name  string
		m     model
		x     float64
		ratio float64
		text  []string
	}{
		{"beyond the natural range", model{name: "MPI_Allreduce", natMax: 700, natThr: 980, p99: 310, logMean: math.Log1p(100), logStd: 0.5}, 2100, 3,
			[]string{"3.0× the largest natural runtime of MPI_Allreduce (700 µs), 1.4 ms longer than it", "6.8× its p99 over all ranks (310 µs)", "6 σ in log time", "flagged beyond 980 µs"}},
		{"inside it", model{name: "f", natMax: 700, natThr: 980}, 800, 800.0 / 700,
			[]string{"within the natural range of f (largest natural runtime 700 µs)"}},
		{"a function that takes no time", model{name: "g", natMax: 0, natThr: 1}, 12, 0,
			[]string{"12 µs where g naturally takes no measurable time", "flagged beyond 1 µs"}},
		{"unusually fast", model{name: "k", natMin: 80, natMax: 120, natLowThr: 40.8, natThr: 168}, 6, 0.05,
			[]string{"6 µs, below the natural range of k (smallest natural runtime 80 µs): unusually fast; flagged below 41 µs"}},
		{"seconds", model{name: "h", natMax: 2e6, natThr: 2.8e6}, 6e7, 30,
			[]string{"30× the largest natural runtime of h (2.00 s), 58.00 s longer than it"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := explain(&tc.m, tc.x)
			if math.Abs(e.Ratio-tc.ratio) > 1e-9 || e.Value != tc.x || e.Key != tc.m.name || e.Excess != tc.x-tc.m.natMax {
				t.Errorf("explanation %+v", e)
			}
			for _, w := range tc.text {
				if !strings.Contains(e.Text, w) {
					t.Errorf("text %q lacks %q", e.Text, w)
				}
			}
		})
	}
}
