package baseline

import (
	"math"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/stats"
)

var rule = stats.TailRule{Ratio: 1.4, Recur: 5, RecurFrac: 0.005, Resolution: 1, Alpha: 1e-4}

func TestUpperTail(t *testing.T) {
	for _, tc := range []struct {
		k, n uint64
		p    float64
		want float64
	}{
		{0, 10, 0.5, 1},
		{1, 1, 0.5, 0.5},
		{10, 10, 0.5, math.Pow(0.5, 10)},
		{9, 10, 0.5, 11 * math.Pow(0.5, 10)},
		{3, 10, 0.5, 1}, // below the mean: a one-sided test never rejects
		{2, 1000, 1e-5, 1 - math.Pow(1-1e-5, 1000) - 1000*1e-5*math.Pow(1-1e-5, 999)},
		{11, 10, 0.5, 0},
		{1, 10, 0, 0},
		// 60 of 10,000 against 1 in 100,000: vanishingly unlikely
		{60, 10000, 1e-5, 0},
	} {
		got := UpperTail(tc.k, tc.n, tc.p)
		if tc.want == 0 {
			if got > 1e-100 {
				t.Errorf("UpperTail(%d, %d, %g) = %g, want about 0", tc.k, tc.n, tc.p, got)
			}
			continue
		}
		if math.Abs(got-tc.want) > 1e-7*tc.want {
			t.Errorf("UpperTail(%d, %d, %g) = %.12g, want %.12g", tc.k, tc.n, tc.p, got, tc.want)
		}
	}
}

// hist builds a TailHist of values.
func hist(values ...float64) *stats.TailHist {
	var h stats.TailHist
	for _, v := range values {
		h.Add(v)
	}
	return &h
}

// repeat returns n copies of the values.
func repeat(n int, values ...float64) []float64 {
	var out []float64
	for range n {
		out = append(out, values...)
	}
	return out
}

func TestFromFuncStats(t *testing.T) {
	body := repeat(1000, 8, 9, 10, 11, 12)
	h := hist(append(body, 3000)...) // one stall of 3 ms among 5,001 calls
	fs := []provenance.GlobalFuncStats{
		{Func: "MPI_Irecv", Stats: provenance.FuncStats{Count: 3000, Accumulate: 30000}, NaturalHist: h, IOSteps: 10},
		// the same key from a second shard or program: merged
		{Func: "MPI_Irecv", Stats: provenance.FuncStats{Count: 2001, Accumulate: 23000}, IOSteps: 10},
		{Func: "setup", Stats: provenance.FuncStats{Count: 1, Accumulate: 5}},
	}
	r, err := FromFuncStats("base", fs, rule)
	if err != nil {
		t.Fatal(err)
	}
	k := r.Keys["MPI_Irecv"]
	if r.IOSteps != 10 || k == nil || k.Calls != 5001 || k.TotalUs != 53000 || k.Bound < 12 || k.Bound > 20 || k.Beyond != 1 || k.P50 != 10 || k.P99 != 12 || k.Max != 3000 {
		t.Fatalf("reference %+v, MPI_Irecv %+v: want 5,001 calls, a bound of 12-20 µs with the stall beyond it", r, k)
	}
	if got, want := k.P0(), 2.0/5003; got != want {
		t.Errorf("P0 = %g, want the smoothed (1+1)/(5001+2) = %g", got, want)
	}
	if s := r.Keys["setup"]; s == nil || s.HasModes() {
		t.Errorf("setup %+v: a key without a histogram is known but cannot be tested", s)
	}
	if lvl := r.Level(0.001); lvl != 0.001 {
		t.Errorf("Level = %g, want 0.001 over the one key that can be tested", lvl)
	}
	if _, err := FromFuncStats("old", []provenance.GlobalFuncStats{{Func: "f", Stats: provenance.FuncStats{Count: 1}}}, rule); err == nil || !strings.Contains(err.Error(), "natural_hist") {
		t.Errorf("records without histograms: %v, want an error saying so", err)
	}
	if _, err := FromFuncStats("none", nil, rule); err == nil {
		t.Error("no records: want an error")
	}
	bad := &stats.TailHist{Lo: 0, Counts: []uint64{1}, Mins: []float64{500}, Maxs: []float64{500}}
	if _, err := FromFuncStats("bad", []provenance.GlobalFuncStats{{Func: "f", NaturalHist: bad}}, rule); err == nil {
		t.Error("a malformed histogram: want an error")
	}
}

// The summary's comparison: a new slow mode and a shifted p99 are found
// with their statistics, a key as in the baseline is not slower, keys on
// one side only are listed, and rows are ordered by extra time.
func TestCompare(t *testing.T) {
	body := repeat(2000, 8, 9, 10, 11, 12)
	fs := []provenance.GlobalFuncStats{
		{Func: "MPI_Irecv", Stats: provenance.FuncStats{Count: 10000, Accumulate: 100000}, NaturalHist: hist(body...), IOSteps: 100},
		{Func: "compute", Stats: provenance.FuncStats{Count: 10000, Accumulate: 2e6}, NaturalHist: hist(repeat(2000, 150, 180, 200, 220, 250)...), IOSteps: 100},
		{Func: "gone", Stats: provenance.FuncStats{Count: 5, Accumulate: 5}, NaturalHist: hist(1, 1, 1, 1, 1), IOSteps: 100},
	}
	r, err := FromFuncStats("base", fs, rule)
	if err != nil {
		t.Fatal(err)
	}
	stalled := append(repeat(1990, 8, 9, 10, 11, 12), repeat(50, 25000)...) // 0.5% at 25 ms
	cur := []Current{
		{Name: "MPI_Irecv", Calls: 10000, TotalUs: 99500 + 50*25000, Hist: hist(stalled...)},
		{Name: "compute", Calls: 10000, TotalUs: 2e6, Hist: hist(repeat(2000, 150, 180, 200, 220, 250)...)},
		{Name: "new_func", Calls: 3, TotalUs: 3},
	}
	rep := Compare(r, cur, 100, 0.001)
	if len(rep.Functions) != 2 || rep.Functions[0].Func != "MPI_Irecv" || rep.Functions[1].Func != "compute" {
		t.Fatalf("functions %+v: want MPI_Irecv (extra time) before compute", rep.Functions)
	}
	f := rep.Functions[0]
	if f.NewMode == nil || f.NewMode.Beyond != 50 || f.NewMode.InMode != 50 || f.NewMode.FromUs < f.NewMode.Bound || f.NewMode.FromUs >= 25000 || f.NewMode.BaselineBeyond != 0 || f.NewMode.PValue > rep.Level || f.NewMode.TypicalUs < 24000 || f.NewMode.TypicalUs > 27000 {
		t.Errorf("MPI_Irecv %+v new mode %+v: want 50 calls beyond the bound at about 25 ms, significant", f, f.NewMode)
	}
	if f.ShiftP99 < 0.5 || len(f.Slower) != 1 || f.Slower[0] != "new slow mode" || f.TimePerStepRatio < 13 || f.CallsRatio != 1 {
		t.Errorf("MPI_Irecv %+v: want a new slow mode (0.5%% of the calls leave the p99 where it was), 13x the time per io_step at the same calls", f)
	}
	// Slow calls the baseline had too (about 3 ms, twice as many here) are
	// not the new mode: it starts past them.
	noisy, err := FromFuncStats("noisy", []provenance.GlobalFuncStats{{Func: "MPI_Irecv", Stats: provenance.FuncStats{Count: 10008},
		NaturalHist: hist(append(body, repeat(8, 3000)...)...), IOSteps: 100}}, rule)
	if err != nil {
		t.Fatal(err)
	}
	mixed := hist(append(append(repeat(1990, 8, 9, 10, 11, 12), repeat(16, 3100)...), repeat(50, 25000)...)...)
	if f := Compare(noisy, []Current{{Name: "MPI_Irecv", Calls: mixed.N(), Hist: mixed}}, 100, 0.001).Functions[0]; f.NewMode == nil ||
		f.NewMode.Beyond != 66 || f.NewMode.InMode != 50 || f.NewMode.FromUs < 3100 || f.NewMode.FromUs >= 25000 {
		t.Errorf("MPI_Irecv with slow calls as in the baseline and a new mode %+v: want the mode from past 3.1 ms, its 50 calls", f.NewMode)
	}
	// 3% of the calls beyond: the p99 moves, not beyond Margin times the
	// baseline's 1% above it; 10% do
	for _, tc := range []struct {
		stalls  int
		shifted bool
	}{{300, false}, {1000, true}} {
		cur[0].Hist = hist(append(repeat(2000-tc.stalls/5, 8, 9, 10, 11, 12), repeat(tc.stalls, 25000)...)...)
		f := Compare(r, cur, 100, 0.001).Functions[0]
		if got := len(f.Slower) == 2 && f.Slower[1] == "p99 shifted"; got != tc.shifted || f.P99 != 25000 || f.NewMode == nil {
			t.Errorf("MPI_Irecv with %d stalls in 10,000 calls %+v: want a new mode, p99 shifted %v", tc.stalls, f, tc.shifted)
		}
	}
	if c := rep.Functions[1]; len(c.Slower) != 0 || c.NewMode != nil || c.TimePerStepRatio != 1 {
		t.Errorf("compute %+v: as in the baseline, want nothing slower", c)
	}
	if len(rep.Absent) != 1 || rep.Absent[0] != "new_func" || len(rep.Missing) != 1 || rep.Missing[0] != "gone" {
		t.Errorf("absent %v missing %v: want new_func and gone", rep.Absent, rep.Missing)
	}
	// twice the calls per io_step
	rep = Compare(r, []Current{{Name: "compute", Calls: 20000, TotalUs: 4e6, Hist: hist(repeat(4000, 150, 180, 200, 220, 250)...)}}, 100, 0.001)
	if c := rep.Functions[0]; c.CallsRatio != 2 || c.CallRateP > rep.Level || len(c.Slower) != 1 || c.Slower[0] != "more calls per io_step" || c.ExtraUs != 0 {
		t.Errorf("compute called twice as often: %+v", c)
	}
	// the same calls in half the io_steps (a live run cuts io_steps by
	// wall time, and this one ran faster): not more calls
	rep = Compare(r, []Current{{Name: "compute", Calls: 10000, TotalUs: 2e6, Hist: hist(repeat(2000, 150, 180, 200, 220, 250)...)}}, 50, 0.001)
	if c := rep.Functions[0]; c.CallsRatio != 2 || len(c.Slower) != 0 {
		t.Errorf("compute's calls in fewer io_steps: %+v, want nothing slower", c)
	}
}
