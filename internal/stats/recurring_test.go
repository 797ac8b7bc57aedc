package stats

import (
	"math"
	"testing"
)

func TestSlowMode(t *testing.T) {
	// a µs body: an MPI call that takes 3-12 µs
	body := logSpread(50000, 3, 12)
	rule := TailRule{Ratio: 1.4, Recur: 5, RecurFrac: 0.005, Resolution: 1, Alpha: 1e-4}
	for _, tc := range []struct {
		name     string
		values   []float64
		want     bool
		calls    float64 // fraction of the calls in the mode
		typical  float64
		minShare float64 // of the time, at least
		maxShare float64 // of the time, at most
	}{
		{"a 0.6% mode at 25 ms", cat(body, logSpread(302, 25000, 25400)), true, 0.006, 25200, 0.9, 1},
		{"a 5% mode at 20 ms", cat(body, logSpread(2632, 20000, 20300)), true, 0.05, 20150, 0.99, 1},
		{"rare single stalls", cat(body, repeat(25000, 10), repeat(60000, 5), repeat(3e5, 2)), false, 0, 0, 0, 0},
		{"a mode too cheap to matter", cat(body, logSpread(300, 40, 45)), false, 0, 0, 0, 0},
		{"no mode", body, false, 0, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := histOf(tc.values...)
			m, ok := h.SlowMode(rule, DefaultRecurringShare)
			if ok != tc.want {
				t.Fatalf("SlowMode found %v (%+v), want %v", ok, m, tc.want)
			}
			if !ok {
				return
			}
			if math.Abs(m.CallsFraction-tc.calls) > 0.25*tc.calls {
				t.Errorf("calls fraction %v, want %v within 25%%", m.CallsFraction, tc.calls)
			}
			if math.Abs(m.Typical-tc.typical) > 0.1*tc.typical {
				t.Errorf("typical %v µs, want %v within 10%%", m.Typical, tc.typical)
			}
			if m.TimeShare < tc.minShare || m.TimeShare > tc.maxShare {
				t.Errorf("time share %v, want in [%v, %v]", m.TimeShare, tc.minShare, tc.maxShare)
			}
			if TailBin(m.Lo) != m.LoBin || TailBin(m.Hi) != m.HiBin {
				t.Errorf("bins %d..%d do not hold %v..%v", m.LoBin, m.HiBin, m.Lo, m.Hi)
			}
		})
	}
}
