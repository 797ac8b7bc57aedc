package pserver

import (
	"testing"

	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/baseline"
	"github.com/kipimo-hpc/kipimo/internal/stats"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// The final func_stats records carry each key's natural-range histogram (a
// later run's baseline), and with a baseline the final range of a key with
// a new slow mode ends where the mode starts, so that the end-of-run
// relabelling keeps its executions; other keys keep their own range.
func TestFinalRangesAgainstBaseline(t *testing.T) {
	rule := baselineRule
	state := func(stall bool) *State { return irecvState(t, stall) }
	clean, err := New(Config{Run: "clean"}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	clean.st = state(false)
	fs := clean.FuncStatsRecords()
	for _, f := range fs {
		if f.NaturalHist == nil || f.NaturalHist.N() != 20000 {
			t.Fatalf("func_stats %+v: want the key's histogram of its 20,000 runtimes", f)
		}
	}
	ref, err := baseline.FromFuncStats("clean", fs, rule)
	if err != nil {
		t.Fatal(err)
	}
	own, err := New(Config{Run: "own"}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	own.st = state(true)
	if r := own.FinalRanges()["MPI_Irecv"]; r.High < 25000 {
		t.Fatalf("without a baseline MPI_Irecv's range %+v: the test assumes the mode is natural", r)
	}
	srv, err := New(Config{Run: "stalls", Baseline: ref}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	srv.st = state(true)
	ranges := srv.FinalRanges()
	if r := ranges["MPI_Irecv"]; r.High < ref.Keys["MPI_Irecv"].Bound || r.High >= 25000 {
		t.Errorf("MPI_Irecv's final range %+v: want it to end before the new mode at 25 ms, not before the baseline's bound %.0f", r, ref.Keys["MPI_Irecv"].Bound)
	}
	if r, want := ranges["MPI_Wait"], own.FinalRanges()["MPI_Wait"]; r != want {
		t.Errorf("MPI_Wait's final range %+v, want its own %+v", r, want)
	}
	for _, f := range srv.FuncStatsRecords() {
		if f.NaturalRange == nil || *f.NaturalRange != ranges[f.Func] {
			t.Errorf("func_stats of %s: range %+v, want the final %+v", f.Func, f.NaturalRange, ranges[f.Func])
		}
	}
	if rep := srv.CompareBaseline(); rep == nil || len(rep.Functions) != 2 || rep.Functions[0].Func != "MPI_Irecv" || rep.Functions[0].NewMode == nil || rep.Functions[0].NewMode.InMode != 200 {
		t.Errorf("comparison %+v: want MPI_Irecv first with its 200 stalls", rep)
	}
}

// baselineRule is the natural-range rule of the baseline tests' models.
var baselineRule = stats.TailRule{Ratio: 1.4, Recur: 5, RecurFrac: 0.005, Resolution: 1, Alpha: 1e-4}

// irecvState is the state of 2 ranks x 5 steps of MPI_Irecv and MPI_Wait,
// 2,000 runtimes of 3-12 µs each per step and rank; with stall, 1% of
// MPI_Irecv's calls also take 25 ms (a recurring mode, natural within the
// run).
func irecvState(t testing.TB, stall bool) *State {
	t.Helper()
	st := NewState(4)
	for rank := range uint32(2) {
		for step := range uint64(5) {
			var f, g stats.TailHist
			for i := range 2000 {
				f.Add(float64(3 + i%10))
				g.Add(float64(3 + i%10))
			}
			if stall {
				for i := range 20 {
					f.Add(float64(25000 + i))
				}
			}
			req := &syncproto.SyncRequest{Rank: rank, Seq: step + 1, Step: step, Algorithm: "tail", TailRule: &baselineRule,
				Models: []syncproto.ModelDelta{{Key: "MPI_Irecv", Tail: &f}, {Key: "MPI_Wait", Tail: &g}}}
			if _, err := st.Apply(req); err != nil {
				t.Fatal(err)
			}
		}
	}
	return st
}
