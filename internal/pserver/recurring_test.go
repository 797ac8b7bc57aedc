package pserver

import (
	"math"
	"reflect"
	"testing"

	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/stats"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// A recurring 25 ms stall in 0.6% of an MPI call's executions, sent by rank
// 2 from io_step 3 on, is reported once with its fraction, typical runtime,
// share of the time, first io_step and rank, whatever the order the deltas
// arrive in; rare single stalls of another key are not.
func TestRecurringModes(t *testing.T) {
	rule := stats.TailRule{Ratio: 1.4, Recur: 5, RecurFrac: 0.005, Resolution: 1, Alpha: 1e-4}
	type delta struct {
		rank uint32
		step uint64
		f, g stats.TailHist
	}
	var deltas []delta
	for rank := range uint32(4) {
		for step := range uint64(6) {
			d := delta{rank: rank, step: step}
			for i := range 2000 {
				d.f.Add(float64(3 + i%10))
				d.g.Add(float64(3 + i%10))
			}
			if rank == 2 && step >= 3 {
				for i := range 80 {
					d.f.Add(float64(25000 + i))
				}
			}
			if rank == 1 && step == 4 {
				d.g.Add(30000)
				d.g.Add(31000)
			}
			deltas = append(deltas, d)
		}
	}
	apply := func(order []int) *State {
		st := NewState(4)
		seq := map[uint32]uint64{}
		for _, i := range order {
			d := deltas[i]
			seq[d.rank]++
			f, g := d.f.Clone(), d.g.Clone()
			req := &syncproto.SyncRequest{Rank: d.rank, Seq: seq[d.rank], Step: d.step, Algorithm: "tail", TailRule: &rule,
				Models: []syncproto.ModelDelta{{Key: "MPI_Irecv", Tail: &f}, {Key: "MPI_Wait", Tail: &g}}}
			if _, err := st.Apply(req); err != nil {
				t.Fatal(err)
			}
		}
		return st
	}
	fwd := make([]int, len(deltas))
	rev := make([]int, len(deltas))
	for i := range deltas {
		fwd[i], rev[i] = i, len(deltas)-1-i
	}
	state := apply(fwd)
	got := state.Recurring()
	if len(got) != 1 {
		t.Fatalf("recurring %+v, want MPI_Irecv's stall alone", got)
	}
	r := got[0]
	wantFrac := 240.0 / (48000 + 240)
	if r.Func != "MPI_Irecv" || math.Abs(r.CallsFraction-wantFrac) > 0.25*wantFrac || r.FirstIOStep != 3 || !reflect.DeepEqual(r.Ranks, []uint32{2}) {
		t.Errorf("recurring %+v, want MPI_Irecv at %.4f of the calls from io_step 3 on rank 2", r, wantFrac)
	}
	if r.TypicalUs < 24000 || r.TypicalUs > 26000 || r.TimeShare < 0.9 {
		t.Errorf("typical %v µs, time share %v: want about 25 ms and most of the time", r.TypicalUs, r.TimeShare)
	}
	if other := apply(rev).Recurring(); !reflect.DeepEqual(other, got) {
		t.Errorf("in reverse order: %+v, want %+v", other, got)
	}
	// The final func_stats records carry it, for kipimo query.
	srv, err := New(Config{Run: "recurring"}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	srv.st = state
	for _, f := range srv.FuncStatsRecords() {
		switch {
		case f.Func == "MPI_Irecv" && (f.Recurring == nil || !reflect.DeepEqual(*f.Recurring, r.RecurringMode)):
			t.Errorf("func_stats of MPI_Irecv: recurring %+v, want %+v", f.Recurring, r.RecurringMode)
		case f.Func == "MPI_Wait" && f.Recurring != nil:
			t.Errorf("func_stats of MPI_Wait: recurring %+v, want none", f.Recurring)
		}
	}
}
