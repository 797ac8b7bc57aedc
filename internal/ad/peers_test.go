package ad

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

func TestPeerKind(t *testing.T) {
	for name, want := range map[string]int8{
		"MPI_Waitall": peerP2P, "mpi_waitall_": peerP2P, "PMPI_Recv": peerP2P, "MPI_Ssend": peerP2P, "MPI_Sendrecv": peerP2P,
		"MPI_Neighbor_alltoall": peerP2P, "MPI_Allreduce": peerColl, "mpi_barrier_": peerColl, "MPI_Reduce_scatter_block": peerColl,
		"MPI_Send": peerWork, "MPI_Isend": peerWork, "MPI_Irecv": peerWork, "MPI_Init": peerWork, "compute": peerWork, "pack": peerWork,
	} {
		if got := peerKind(name); got != want {
			t.Errorf("peerKind(%q) = %d, want %d", name, got, want)
		}
	}
}

// A rank's step summary carries its time per function and its waits by
// partner: the executions that completed in the step, a wait's time for
// each partner whose message it completed, a collective's partner (the rank
// itself) not among them.
func TestPeerStep(t *testing.T) {
	ps := newFakePServer()
	d, err := New(Config{Rank: 4, Syncer: ps, SyncWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	names := []frame.Name{{ID: 1, Name: "main"}, {ID: 2, Name: "compute"}, {ID: 3, Name: "MPI_Waitall"}, {ID: 4, Name: "MPI_Allreduce"}, {ID: 5, Name: "MPI_Isend"}}
	ev := func(kind frame.EventKind, fid uint32, ts uint64) frame.FuncEvent {
		return frame.FuncEvent{Kind: kind, FID: fid, TS: ts}
	}
	f0 := frame.Frame{Rank: 4, Step: 0, TStart: 0, TEnd: 1000, Funcs: names,
		Events: []frame.FuncEvent{
			ev(frame.Entry, 1, 0),
			ev(frame.Entry, 2, 10), ev(frame.Exit, 2, 40),
			ev(frame.Entry, 5, 45), ev(frame.Exit, 5, 50),
			ev(frame.Entry, 2, 50), ev(frame.Exit, 2, 60),
			ev(frame.Entry, 3, 60), ev(frame.Exit, 3, 100),
			ev(frame.Entry, 4, 100), ev(frame.Exit, 4, 150),
			// still open at the step's end: not in the step
			ev(frame.Entry, 2, 900),
		},
		Comms: []frame.CommEvent{
			{Kind: frame.Send, Partner: 3, Tag: 1, Bytes: 8, TS: 46},
			{Kind: frame.Recv, Partner: 3, Tag: 1, Bytes: 8, TS: 99},
			{Kind: frame.Recv, Partner: 5, Tag: 1, Bytes: 8, TS: 100},
			{Kind: frame.Recv, Partner: 3, Tag: 2, Bytes: 8, TS: 100},
			{Kind: frame.Send, Partner: 4, Tag: collTag, Bytes: 8, TS: 149},
			{Kind: frame.Recv, Partner: 4, Tag: collTag, Bytes: 8, TS: 150},
		},
	}
	f1 := frame.Frame{Rank: 4, Step: 1, TStart: 1000, TEnd: 2000,
		Events: []frame.FuncEvent{ev(frame.Exit, 2, 1005), ev(frame.Entry, 3, 1010), ev(frame.Exit, 3, 1012), ev(frame.Exit, 1, 1020)},
	}
	ctx := context.Background()
	for _, f := range []*frame.Frame{&f0, &f1} {
		if err := d.Process(ctx, f); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Close(ctx); err != nil {
		t.Fatal(err)
	}
	want := map[uint64]*syncproto.PeerStep{
		0: {Start: 0, End: 1000, Funcs: []syncproto.PeerFunc{
			{Func: "MPI_Allreduce", Kind: syncproto.PeerCollective, Us: 50, Calls: 1, MaxUs: 50},
			{Func: "MPI_Isend", Us: 5, Calls: 1, MaxUs: 5},
			{Func: "MPI_Waitall", Kind: syncproto.PeerP2P, Us: 40, Calls: 1, MaxUs: 40},
			{Func: "compute", Us: 40, Calls: 2, MaxUs: 30},
		}, Waits: []syncproto.PeerWait{{Partner: 3, Us: 40}, {Partner: 5, Us: 40}}},
		1: {Start: 1000, End: 2000, Funcs: []syncproto.PeerFunc{
			{Func: "MPI_Waitall", Kind: syncproto.PeerP2P, Us: 2, Calls: 1, MaxUs: 2},
			{Func: "compute", Us: 105, Calls: 1, MaxUs: 105},
			{Func: "main", Us: 1020 - 30 - 5 - 10 - 40 - 50 - 105 - 2, Calls: 1, MaxUs: 1020 - 30 - 5 - 10 - 40 - 50 - 105 - 2},
		}},
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for step, w := range want {
		got := ps.steps[[2]uint64{4, step}].Peer
		if !reflect.DeepEqual(got, w) {
			t.Errorf("io_step %d: peer %+v, want %+v", step, got, w)
		}
		if got != nil {
			if err := got.Validate(); err != nil {
				t.Errorf("io_step %d: %v", step, err)
			}
		}
	}
}
