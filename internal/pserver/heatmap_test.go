package pserver

import (
	"bytes"
	"encoding/gob"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// scaleRun is a synthetic run of many ranks reporting step summaries only:
// anomalies[step][rank] is what each rank reported, drawn at random, with
// the ranks of hot (a range) ten times more anomalous.
type scaleRun struct {
	ranks, steps int
	hot          [2]uint32 // [first, last] rank of the anomalous range
	anomalies    [][]uint64
}

func newScaleRun(ranks, steps int, hot [2]uint32, seed uint64) *scaleRun {
	g := &scaleRun{ranks: ranks, steps: steps, hot: hot}
	rng := rand.New(rand.NewPCG(seed, 11))
	for range steps {
		row := make([]uint64, ranks)
		for r := range row {
			if rng.Float64() < 0.1 {
				row[r] = 1 + uint64(rng.IntN(3))
			}
			if uint32(r) >= hot[0] && uint32(r) <= hot[1] {
				row[r] += 10 + uint64(rng.IntN(10))
			}
		}
		g.anomalies = append(g.anomalies, row)
	}
	return g
}

// summary is rank r's step summary of step.
func (g *scaleRun) summary(step, r int) syncproto.StepSummary {
	n := g.anomalies[step][r]
	s := syncproto.StepSummary{Step: uint64(step), Anomalies: n, Executions: 1000, Events: 2000, MinTS: uint64(step) * 1000, MaxTS: uint64(step)*1000 + 999}
	if n > 0 {
		s.Funcs = []syncproto.FuncAnomalyMetrics{{Func: funcName(r % 7), Count: n}}
	}
	return s
}

// request is rank r's sync request of step (Seq step+1).
func (g *scaleRun) request(step, r int) syncproto.SyncRequest {
	return syncproto.SyncRequest{PID: 0, Rank: uint32(r), Seq: uint64(step + 1), Step: uint64(step), Algorithm: "sstd",
		Steps: []syncproto.StepSummary{g.summary(step, r)}}
}

// apply feeds the steps [from, to) to a, ranks in the order perm gives.
func (g *scaleRun) apply(a *Aggregates, from, to int, perm []int) {
	for step := from; step < to; step++ {
		for _, r := range perm {
			s := g.summary(step, r)
			a.AddStep(DetectorID{0, uint32(r)}, &s)
		}
	}
}

// bandSum is the expected cell of ranks [first, last] at step: their
// anomalies and how many had any.
func (g *scaleRun) bandSum(step int, first, last uint32) (sum, hot uint64) {
	for r := first; r <= last && int(r) < g.ranks; r++ {
		if n := g.anomalies[step][r]; n > 0 {
			sum += n
			hot++
		}
	}
	return sum, hot
}

func TestHeatMapBands(t *testing.T) {
	for _, tc := range []struct {
		name              string
		ranks, steps      int
		banded            bool
		bands, bandRanks  int // expected bands and ranks per band (all full)
		shuffled, viaGob  bool
		last, wantColumns int
	}{
		{name: "128 ranks, one row each", ranks: 128, steps: 5, last: 0, wantColumns: 5},
		{name: "129 ranks, bands of 16", ranks: 129, steps: 5, banded: true, bands: 9, bandRanks: 16, last: 3, wantColumns: 3},
		{name: "1024 ranks, bands of 16", ranks: 1024, steps: 4, banded: true, bands: 64, bandRanks: 16, wantColumns: 4},
		{name: "4096 ranks, bands of 64", ranks: 4096, steps: 6, banded: true, bands: 64, bandRanks: 64, last: 4, wantColumns: 4},
		{name: "4096 ranks arriving shuffled", ranks: 4096, steps: 3, banded: true, bands: 64, bandRanks: 64, shuffled: true, wantColumns: 3},
		{name: "4096 ranks from a snapshot", ranks: 4096, steps: 3, banded: true, bands: 64, bandRanks: 64, viaGob: true, wantColumns: 3},
		{name: "16384 ranks, bands of 256", ranks: 16384, steps: 2, banded: true, bands: 64, bandRanks: 256, wantColumns: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newScaleRun(tc.ranks, tc.steps, [2]uint32{uint32(tc.ranks / 3), uint32(tc.ranks/3 + 20)}, 5)
			perm := make([]int, tc.ranks)
			for i := range perm {
				perm[i] = i
			}
			if tc.shuffled {
				rand.New(rand.NewPCG(9, 9)).Shuffle(len(perm), func(i, j int) { perm[i], perm[j] = perm[j], perm[i] })
			}
			st := NewState(16)
			g.apply(st.Agg, 0, tc.steps, perm)
			if tc.viaGob {
				var buf bytes.Buffer
				if err := gob.NewEncoder(&buf).Encode(st.Agg); err != nil {
					t.Fatal(err)
				}
				var a Aggregates
				if err := gob.NewDecoder(&buf).Decode(&a); err != nil {
					t.Fatal(err)
				}
				a.fill()
				st.Agg = &a
			}
			h := heatMap(st, tc.last)
			if h.Banded != tc.banded || len(h.Steps) != tc.wantColumns || h.RankCount != tc.ranks {
				t.Fatalf("banded %v, %d steps, %d ranks; want %v, %d, %d", h.Banded, len(h.Steps), h.RankCount, tc.banded, tc.wantColumns, tc.ranks)
			}
			first := tc.steps - tc.wantColumns
			if !tc.banded {
				if len(h.Ranks) != tc.ranks {
					t.Fatalf("%d rows, want %d", len(h.Ranks), tc.ranks)
				}
				got := map[[2]uint64]uint64{}
				for _, c := range h.Cells {
					got[[2]uint64{h.Steps[c[1]], uint64(h.Ranks[c[0]].Rank)}] = c[2]
				}
				for step := first; step < tc.steps; step++ {
					for r := range tc.ranks {
						if got[[2]uint64{uint64(step), uint64(r)}] != g.anomalies[step][r] {
							t.Fatalf("step %d rank %d: %d anomalies, want %d", step, r, got[[2]uint64{uint64(step), uint64(r)}], g.anomalies[step][r])
						}
					}
				}
				return
			}
			if len(h.Bands) != tc.bands || len(h.Ranks) != 0 || len(h.HotRanks) != len(h.Cells) {
				t.Fatalf("%d bands, %d rank rows, %d hot counts for %d cells; want %d bands and no rank rows", len(h.Bands), len(h.Ranks), len(h.HotRanks), len(h.Cells), tc.bands)
			}
			for i, b := range h.Bands {
				lo := uint32(i * tc.bandRanks)
				hi := min(lo+uint32(tc.bandRanks)-1, uint32(tc.ranks-1))
				if b.First != lo || b.Last != hi || b.Ranks != int(hi-lo+1) || b.ID != fmt.Sprintf("0:%d-%d", lo, hi) {
					t.Fatalf("band %d is %+v, want ranks %d-%d", i, b, lo, hi)
				}
			}
			got := map[[2]int][2]uint64{}
			for i, c := range h.Cells {
				got[[2]int{int(h.Steps[c[1]]), int(c[0])}] = [2]uint64{c[2], h.HotRanks[i]}
			}
			var wantMax uint64
			for step := first; step < tc.steps; step++ {
				for i, b := range h.Bands {
					sum, hot := g.bandSum(step, b.First, b.Last)
					wantMax = max(wantMax, sum)
					if got[[2]int{step, i}] != [2]uint64{sum, hot} {
						t.Fatalf("step %d band %s: (anomalies, hot ranks) %v, want (%d, %d)", step, b.ID, got[[2]int{step, i}], sum, hot)
					}
				}
			}
			if h.Max != wantMax {
				t.Errorf("max %d, want %d", h.Max, wantMax)
			}

			// Drilling into the band of the hot ranks shows its ranks alone.
			var hb Band
			for _, b := range h.Bands {
				if b.First <= g.hot[0] && g.hot[0] <= b.Last {
					hb = b
				}
			}
			d, err := heatMapView(st, tc.last, hb.ID)
			if err != nil {
				t.Fatal(err)
			}
			if d.Banded || d.Band == nil || d.Band.Ranks != tc.bandRanks || len(d.Ranks) != tc.bandRanks || d.Ranks[0].Rank != hb.First || d.Ranks[len(d.Ranks)-1].Rank != hb.Last {
				t.Fatalf("drill-down into %s: banded %v, band %+v, %d rows", hb.ID, d.Banded, d.Band, len(d.Ranks))
			}
			for _, c := range d.Cells {
				step, r := int(d.Steps[c[1]]), d.Ranks[c[0]].Rank
				if c[2] != g.anomalies[step][r] {
					t.Fatalf("drill-down step %d rank %d: %d anomalies, want %d", step, r, c[2], g.anomalies[step][r])
				}
			}
			var cells int
			for step := first; step < tc.steps; step++ {
				for r := hb.First; r <= hb.Last; r++ {
					if g.anomalies[step][r] > 0 {
						cells++
					}
				}
			}
			if len(d.Cells) != cells {
				t.Errorf("drill-down has %d cells, want %d", len(d.Cells), cells)
			}
		})
	}
}

func TestBandParameter(t *testing.T) {
	st := NewState(8)
	g := newScaleRun(300, 1, [2]uint32{0, 0}, 1)
	g.apply(st.Agg, 0, 1, slices.Collect(func(yield func(int) bool) {
		for i := range 300 {
			if !yield(i) {
				return
			}
		}
	}))
	for _, tc := range []struct {
		name, band string
		rows       int
		bad        bool
	}{
		{name: "one band", band: "0:16-31", rows: 16},
		{name: "past the last rank", band: "0:290-400", rows: 10},
		{name: "other program", band: "3:0-100", rows: 0},
		{name: "reversed", band: "0:31-16", bad: true},
		{name: "no program", band: "16-31", bad: true},
		{name: "words", band: "all", bad: true},
		{name: "trailing text", band: "0:16-31x", bad: true},
		{name: "leading zero", band: "0:016-31", bad: true},
		{name: "past 32 bits", band: "0:16-4294967296", bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := heatMapView(st, 0, tc.band)
			if (err != nil) != tc.bad {
				t.Fatalf("error %v, want error %v", err, tc.bad)
			}
			if !tc.bad && len(h.Ranks) != tc.rows {
				t.Errorf("%d rows, want %d", len(h.Ranks), tc.rows)
			}
		})
	}
}

// TestTopRanksKeptInOrder checks the top-ranks list the aggregates keep as
// counts grow against a sort of the ranks' totals summed independently.
func TestTopRanksKeptInOrder(t *testing.T) {
	for _, tc := range []struct {
		name         string
		ranks, steps int
		seed         uint64
	}{
		{name: "fewer ranks than the list", ranks: 6, steps: 4, seed: 1},
		{name: "ties at zero", ranks: 40, steps: 1, seed: 2},
		{name: "200 ranks", ranks: 200, steps: 12, seed: 3},
		{name: "2000 ranks", ranks: 2000, steps: 5, seed: 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newScaleRun(tc.ranks, tc.steps, [2]uint32{uint32(tc.ranks / 2), uint32(tc.ranks / 2)}, tc.seed)
			perm := rand.New(rand.NewPCG(tc.seed, 1)).Perm(tc.ranks)
			st := NewState(8)
			g.apply(st.Agg, 0, tc.steps, perm)
			type rt struct {
				rank uint32
				n    uint64
			}
			var want []rt
			for r := range tc.ranks {
				var n uint64
				for step := range tc.steps {
					n += g.anomalies[step][r]
				}
				want = append(want, rt{uint32(r), n})
			}
			slices.SortFunc(want, func(a, b rt) int {
				if a.n != b.n {
					if a.n > b.n {
						return -1
					}
					return 1
				}
				return int(a.rank) - int(b.rank)
			})
			for _, n := range []int{1, 5, 10} {
				got := topRanks(st, n, "count")
				if len(got) != min(n, tc.ranks) {
					t.Fatalf("n=%d: %d rows", n, len(got))
				}
				for i, r := range got {
					if r.Rank != want[i].rank || r.Anomalies != want[i].n {
						t.Fatalf("n=%d row %d: rank %d with %d, want rank %d with %d", n, i, r.Rank, r.Anomalies, want[i].rank, want[i].n)
					}
				}
			}
		})
	}
}

// TestFuncRanksCounted checks the per-function rank counts of the top
// functions against the run's own (rank r reports function r mod 7).
func TestFuncRanksCounted(t *testing.T) {
	g := newScaleRun(700, 3, [2]uint32{0, 99}, 8)
	st := NewState(8)
	g.apply(st.Agg, 0, 3, rand.New(rand.NewPCG(1, 1)).Perm(700))
	want := map[string]int{}
	for r := range 700 {
		for step := range 3 {
			if g.anomalies[step][r] > 0 {
				want[funcName(r%7)]++
				break
			}
		}
	}
	rows := topFuncs(st, 0, "count")
	if len(rows) != len(want) {
		t.Fatalf("%d functions, want %d", len(rows), len(want))
	}
	for _, r := range rows {
		if r.Ranks != want[r.Func] {
			t.Errorf("%s: %d ranks, want %d", r.Func, r.Ranks, want[r.Func])
		}
	}
}

// FuzzParseBand checks that a band parameter is accepted only as the
// canonical pid:first-last with first <= last, and that opening any band
// of a small run returns only ranks inside it.
func FuzzParseBand(f *testing.F) {
	for _, s := range []string{"0:0-15", "0:1024-1087", "3:0-4095", "0:31-16", "1:2", "", "0:-1-5", "0: 1-2"} {
		f.Add(s)
	}
	st := NewState(4)
	g := newScaleRun(200, 2, [2]uint32{10, 12}, 2)
	g.apply(st.Agg, 0, 2, rand.New(rand.NewPCG(2, 2)).Perm(200))
	f.Fuzz(func(t *testing.T, id string) {
		b, err := parseBand(id)
		if err != nil {
			return
		}
		if b.First > b.Last || fmt.Sprintf("%d:%d-%d", b.PID, b.First, b.Last) != id {
			t.Fatalf("accepted %q as %+v", id, b)
		}
		h, err := heatMapView(st, 0, id)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range h.Ranks {
			if r.PID != b.PID || r.Rank < b.First || r.Rank > b.Last {
				t.Fatalf("band %q shows rank %+v", id, r)
			}
		}
		if b.PID == 0 && b.First < 200 && len(h.Ranks) != int(min(b.Last, 199)-b.First+1) {
			t.Fatalf("band %q shows %d ranks", id, len(h.Ranks))
		}
	})
}
