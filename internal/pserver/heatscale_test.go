package pserver

import (
	"math/rand/v2"
	"testing"
)

// noisyRun is a run where every rank reports a few anomalies in most
// io_steps (Poisson-like noise of mean about mean) and one rank, slow,
// many more: what a reader must find at a glance.
func noisyRun(ranks, steps int, slow uint32, mean, slowCount uint64) *scaleRun {
	g := &scaleRun{ranks: ranks, steps: steps, hot: [2]uint32{slow, slow}}
	rng := rand.New(rand.NewPCG(34, uint64(ranks)))
	for range steps {
		row := make([]uint64, ranks)
		for r := range row {
			// A binomial draw of 4·mean trials at 1/4.
			for range 4 * mean {
				if rng.IntN(4) == 0 {
					row[r]++
				}
			}
			if uint32(r) == slow {
				row[r] = slowCount
			}
		}
		g.anomalies = append(g.anomalies, row)
	}
	return g
}

// The heat map's colour scale keeps one slow rank visible among noisy ones:
// its cells, and its band's at 4,096 ranks, are in the top class and no
// other cell is, whatever the number of ranks; with noise alone no cell is
// in the top class, and a quiet run's one anomalous rank is still coloured
// beyond the typical class.
func TestHeatScaleShowsOneSlowRank(t *testing.T) {
	const top = HeatClasses - 1
	for _, tc := range []struct {
		name         string
		ranks, steps int
		mean, slow   uint64
	}{
		{"8 ranks", 8, 20, 3, 30},
		{"1,024 ranks", 1024, 10, 3, 40},
		{"4,096 ranks", 4096, 10, 3, 40},
		{"4,096 quiet ranks", 4096, 10, 0, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			slow := uint32(tc.ranks * 2 / 3)
			g := noisyRun(tc.ranks, tc.steps, slow, tc.mean, tc.slow)
			perm := make([]int, tc.ranks)
			for i := range perm {
				perm[i] = i
			}
			st := NewState(tc.steps)
			g.apply(st.Agg, 0, tc.steps, perm)
			h := heatMap(st, 0)
			if len(h.Scale.Edges) != HeatClasses-1 {
				t.Fatalf("scale %+v", h.Scale)
			}
			slowCells := 0
			for i, c := range h.Cells {
				v, isSlow := c[2], false
				if h.Banded {
					v = h.Peaks[i]
					b := h.Bands[c[0]]
					isSlow = b.First <= slow && slow <= b.Last
				} else {
					isSlow = h.Ranks[c[0]].Rank == slow
				}
				class := h.Scale.Class(v)
				if isSlow {
					slowCells++
					if class != top {
						t.Errorf("the slow rank's cell at step %d: value %d in class %d of scale %+v", h.Steps[c[1]], v, class, h.Scale)
					}
				} else if class == top {
					t.Errorf("a noisy cell (row %d, step %d, value %d) is in the top class of scale %+v", c[0], h.Steps[c[1]], v, h.Scale)
				}
			}
			if slowCells != tc.steps {
				t.Errorf("%d cells of the slow rank, want %d", slowCells, tc.steps)
			}
		})
	}
	// Noise alone: nothing is in the top class.
	g := noisyRun(4096, 10, 0, 3, 3)
	perm := make([]int, 4096)
	for i := range perm {
		perm[i] = i
	}
	st := NewState(10)
	g.apply(st.Agg, 0, 10, perm)
	h := heatMap(st, 0)
	for i := range h.Cells {
		if h.Scale.Class(h.Peaks[i]) == top {
			t.Fatalf("noise alone reaches the top class: peak %d, scale %+v", h.Peaks[i], h.Scale)
		}
	}
}

// The scale's typical value is the median of every cell, empty ones
// included.
func TestNewHeatScale(t *testing.T) {
	for _, tc := range []struct {
		vals    []uint64
		cells   int
		typical uint64
	}{
		{nil, 0, 1},
		{[]uint64{9}, 100, 1},               // one cell of many: the rest are empty
		{[]uint64{5, 5, 5, 5}, 4, 5},        // every cell alike
		{[]uint64{1, 2, 3, 4, 50}, 5, 3},    // one outlier does not move it
		{[]uint64{7, 7, 7, 1, 1, 1}, 10, 1}, // more empty cells than not
		{[]uint64{2, 2, 2, 2, 2, 2}, 10, 2}, // more full cells than empty
		{[]uint64{4, 4, 4, 4, 4, 4}, 12, 4}, // half: the upper median
	} {
		s := newHeatScale(tc.vals, tc.cells)
		if s.Typical != tc.typical || s.Edges[0] != tc.typical || s.Edges[2] != 4*tc.typical {
			t.Errorf("newHeatScale(%v, %d) = %+v, want typical %d", tc.vals, tc.cells, s, tc.typical)
		}
	}
}
