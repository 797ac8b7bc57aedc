package ad

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

// TestIncarnationKeptByCheckpoint checks the sync state's incarnation: every
// detector draws its own, non-zero, and sends it in every request; a
// detector restored from a checkpoint keeps it (its resent requests are
// still deduplicated by the pserver), and a checkpoint of incarnation 0 is
// refused.
func TestIncarnationKeptByCheckpoint(t *testing.T) {
	ps := newFakePServer()
	rs := &recordingSyncer{ps: ps}
	cfg := Config{Syncer: rs}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(context.Background())
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(context.Background())
	if a.sync.incarnation == 0 || a.sync.incarnation == b.sync.incarnation {
		t.Fatalf("incarnations %x and %x: want two different non-zero ones", a.sync.incarnation, b.sync.incarnation)
	}
	wcfg := workload.DefaultConfig()
	wcfg.Ranks, wcfg.Steps, wcfg.EventsPerStep = 1, 3, 2000
	w, err := workload.New(wcfg)
	if err != nil {
		t.Fatal(err)
	}
	g := w.Rank(0)
	var f frame.Frame
	for range wcfg.Steps {
		if _, err := g.Next(&f); err != nil {
			t.Fatal(err)
		}
		if err := a.Process(context.Background(), &f); err != nil {
			t.Fatal(err)
		}
	}
	cp, err := a.Checkpoint()
	if err != nil {
		t.Fatal(err)
	}
	c, err := Restore(cfg, cp)
	if err != nil {
		t.Fatal(err)
	}
	if c.sync.incarnation != a.sync.incarnation {
		t.Errorf("restored incarnation %x, checkpointed %x", c.sync.incarnation, a.sync.incarnation)
	}
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	rs.mu.Lock()
	n := len(rs.reqs)
	for _, q := range rs.reqs {
		if q.Incarnation != a.sync.incarnation {
			t.Errorf("request seq %d of incarnation %x, want %x", q.Seq, q.Incarnation, a.sync.incarnation)
		}
	}
	rs.mu.Unlock()
	if n == 0 {
		t.Fatal("no request was sent")
	}

	a.sync.incarnation = 0
	zero, err := a.Checkpoint()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Restore(cfg, zero); err == nil {
		t.Error("a checkpoint of incarnation 0 was restored")
	}
}

// refusingSyncer answers shard 0's request with Seq refuse as the pserver
// answers an invalid request, and passes every other to ps.
type refusingSyncer struct {
	ps     *fakePServer
	refuse uint64

	mu    sync.Mutex
	tries int // requests with Seq refuse received
	steps int // step summaries the refused request carried
}

func (r *refusingSyncer) Sync(ctx context.Context, shard int, req *syncproto.SyncRequest) (*syncproto.SyncReply, error) {
	if shard == 0 && req.Seq == r.refuse {
		r.mu.Lock()
		r.tries++
		r.steps = len(req.Steps)
		r.mu.Unlock()
		return &syncproto.SyncReply{Error: "invalid sync request: for the test", Invalid: true}, nil
	}
	return r.ps.Sync(ctx, shard, req)
}

// TestRefusedSyncIsDropped checks that a request the pserver refuses as
// invalid is sent once and dropped (counted as a sync failure, its step
// summaries as dropped): the detector's later requests go through, and it
// closes, instead of resending the refused request for ever.
func TestRefusedSyncIsDropped(t *testing.T) {
	rs := &refusingSyncer{ps: newFakePServer(), refuse: 2}
	// no settling: every summary is its own io_step's (none of executions
	// labelled after the step they ran in)
	d, err := New(Config{Syncer: rs, SettleCount: -1})
	if err != nil {
		t.Fatal(err)
	}
	wcfg := workload.DefaultConfig()
	wcfg.Ranks, wcfg.Steps, wcfg.EventsPerStep = 1, 6, 2000
	w, err := workload.New(wcfg)
	if err != nil {
		t.Fatal(err)
	}
	g := w.Rank(0)
	var f frame.Frame
	for range wcfg.Steps {
		if _, err := g.Next(&f); err != nil {
			t.Fatal(err)
		}
		if err := d.Process(context.Background(), &f); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := d.Close(ctx); err != nil {
		t.Fatalf("close: %v", err)
	}
	st := d.Stats()
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.tries != 1 || rs.steps == 0 {
		t.Errorf("the refused request was sent %d times with %d step summaries, want once with some", rs.tries, rs.steps)
	}
	if st.SyncFailures != 1 || st.DroppedSummaries != uint64(rs.steps) {
		t.Errorf("%d sync failures, %d dropped summaries; want 1 and %d", st.SyncFailures, st.DroppedSummaries, rs.steps)
	}
	if got := rs.ps.stepCount(); got != wcfg.Steps-rs.steps {
		t.Errorf("the pserver got %d step summaries, want %d (all but the refused ones)", got, wcfg.Steps-rs.steps)
	}
}
