package adnode

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/ad"
	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

func startNATS(t testing.TB) (*natsx.Server, *nats.Conn) {
	t.Helper()
	cfg := natsx.DefaultServerConfig(t.TempDir())
	srv, err := natsx.StartServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return srv, nc
}

// natsDouble serves a fakePServer on the sync subjects; stop and start
// simulate an outage.
type natsDouble struct {
	ps   *fakePServer
	nc   *nats.Conn
	subj natsx.Subjects
	mu   sync.Mutex
	sub  *nats.Subscription
}

func (n *natsDouble) start(t testing.TB) {
	n.mu.Lock()
	defer n.mu.Unlock()
	sub, err := n.nc.Subscribe(n.subj.Sync(0), func(m *nats.Msg) {
		var req syncproto.SyncRequest
		if err := json.Unmarshal(m.Data, &req); err != nil {
			b, _ := json.Marshal(syncproto.SyncReply{Error: err.Error()})
			_ = m.Respond(b)
			return
		}
		b, _ := json.Marshal(n.ps.handle(0, &req))
		_ = m.Respond(b)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	n.sub = sub
}

func (n *natsDouble) stop(t testing.TB) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.sub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if err := n.nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestEightRanksSurvivePServerOutage(t *testing.T) {
	_, nc := startNATS(t)
	const run = "outage"
	subj := natsx.Subjects{Run: run}
	wcfg := workload.DefaultConfig()
	wcfg.Ranks, wcfg.Steps, wcfg.EventsPerStep = 8, 16, 4000
	wcfg.Rates = workload.DefaultRates.Scale(5)
	w, err := workload.New(wcfg)
	if err != nil {
		t.Fatal(err)
	}
	double := &natsDouble{ps: newFakePServer(), nc: nc, subj: subj}
	double.start(t)
	sink := &MemorySink{}
	coll := NewCollector(4, nil)
	ranks := []uint32{0, 1, 2, 3, 4, 5, 6, 7}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	type result struct {
		stats []ad.Stats
		err   error
	}
	done := make(chan result, 1)
	ready := make(chan struct{})
	go func() {
		st, err := Serve(ctx, ServeConfig{
			Conn: nc, Run: run, Ranks: ranks, Collector: coll, Logger: zerolog.Nop(), Ready: func() { close(ready) },
			Detector: ad.Config{Algorithm: ad.SSTD, Sink: sink, Syncer: &NATSSyncer{Conn: nc, Subjects: subj},
				SyncWait: 2 * time.Second, SyncTimeout: 500 * time.Millisecond, SyncBackoffMax: 200 * time.Millisecond},
		})
		done <- result{st, err}
	}()
	select {
	case <-ready:
	case r := <-done:
		t.Fatalf("serve ended before it was ready: %v", r.err)
	}
	gens := make([]*workload.RankGen, len(ranks))
	for i := range gens {
		gens[i] = w.Rank(uint32(i))
	}
	minFrames := func() uint64 {
		n := ^uint64(0)
		for _, d := range coll.detectors {
			n = min(n, d.Stats().Frames)
		}
		return n
	}
	var f frame.Frame
	var buf []byte
	publishStep := func(step int) {
		for i, g := range gens {
			if _, err := g.Next(&f); err != nil && !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			buf = frame.AppendBinary(buf[:0], &f)
			if err := nc.Publish(subj.Frames(0, uint32(i)), buf); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, "step to be processed", func() bool { return minFrames() >= uint64(step+1) })
	}
	const outFrom, outTo = 4, 8 // pserver down for steps 4..7
	var anomaliesBefore uint64
	for s := 0; s < wcfg.Steps; s++ {
		if s == outFrom {
			double.stop(t)
			for _, d := range coll.detectors {
				anomaliesBefore += d.Stats().Anomalies
			}
		}
		if s == outTo {
			var during, failures uint64
			for _, d := range coll.detectors {
				st := d.Stats()
				during += st.Anomalies
				failures += st.SyncFailures
				if st.Lag == 0 {
					t.Errorf("rank %d reports no sync lag during the outage", st.Rank)
				}
			}
			if during <= anomaliesBefore {
				t.Errorf("no anomalies detected during the outage (%d before, %d after)", anomaliesBefore, during)
			}
			if failures == 0 {
				t.Error("no sync failures counted during the outage")
			}
			t.Logf("during the outage: %d anomalies, %d sync failures", during-anomaliesBefore, failures)
			double.start(t)
		}
		publishStep(s)
		if s == 2 {
			checkProbes(t, nc, subj, len(ranks))
		}
		if s == outTo {
			// The request of the outage is retried (same Seq) with backoff;
			// once answered, the next step's request carries every delta
			// accumulated meanwhile. Step on until all ranks have caught up.
			caught := false
			for s+1 < wcfg.Steps-1 && !caught {
				caught = true
				for _, d := range coll.detectors {
					if d.Stats().Lag > 1 {
						caught = false
					}
				}
				if !caught {
					time.Sleep(300 * time.Millisecond)
					s++
					publishStep(s)
				}
			}
			if !caught {
				t.Fatal("detectors did not catch up with the restarted pserver")
			}
		}
	}
	for i := range ranks {
		if err := nc.PublishMsg(&nats.Msg{Subject: subj.Frames(0, uint32(i)), Header: nats.Header{EndOfStreamHeader: []string{"1"}}}); err != nil {
			t.Fatal(err)
		}
	}
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	var total ad.Stats
	for _, s := range res.stats {
		total.Add(s)
		if s.Frames != uint64(wcfg.Steps) || s.BadFrames != 0 {
			t.Errorf("rank %d: %d frames (%d bad), want %d", s.Rank, s.Frames, s.BadFrames, wcfg.Steps)
		}
		if s.Lag != 0 {
			t.Errorf("rank %d still %d steps behind the pserver", s.Rank, s.Lag)
		}
	}
	t.Logf("totals: %+v", total)
	// The merged model caught up: every execution of every rank is in it,
	// exactly once.
	all := sink.All()
	perFunc := map[string]uint64{}
	for _, p := range all.Profiles {
		if !p.Final {
			continue
		}
		for _, tm := range p.Timers {
			perFunc[tm.Name] += tm.Calls
		}
	}
	var checked int
	for _, spec := range w.Functions() {
		want := perFunc[spec.Name]
		if want == 0 {
			continue
		}
		checked++
		if got := double.ps.total(spec.Name); got != float64(want) {
			t.Errorf("%s: pserver model has %v executions, detectors completed %d", spec.Name, got, want)
		}
	}
	if checked == 0 {
		t.Fatal("no function profiles published")
	}
	double.ps.mu.Lock()
	nsteps := len(double.ps.steps)
	dups := double.ps.dups
	double.ps.mu.Unlock()
	if nsteps != len(ranks)*wcfg.Steps {
		t.Errorf("pserver got %d step summaries, want %d", nsteps, len(ranks)*wcfg.Steps)
	}
	t.Logf("pserver: %d step summaries, %d duplicate requests ignored", nsteps, dups)
	if total.Anomalies == 0 || len(all.Anomalies) == 0 {
		t.Error("no anomalies")
	}
}

// checkProbes asks one detector, then all of them, for their open call stacks.
func checkProbes(t *testing.T, nc *nats.Conn, subj natsx.Subjects, nranks int) {
	t.Helper()
	m, err := nc.Request(subj.Callstack(0, 3), nil, 2*time.Second)
	if err != nil {
		t.Fatalf("call-stack probe of rank 3: %v", err)
	}
	var rep syncproto.CallstackReply
	if err := json.Unmarshal(m.Data, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Rank != 3 || rep.IOStep != 2 || len(rep.Threads) == 0 || len(rep.Threads[0].Frames) == 0 || rep.Threads[0].Frames[0].Func != "main" {
		t.Fatalf("call-stack reply of rank 3: %+v", rep)
	}
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest(subj.AllCallstacks(), inbox, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	seen := map[uint32]bool{}
	for len(seen) < nranks {
		m, err := sub.NextMsg(2 * time.Second)
		if err != nil {
			t.Fatalf("scatter-gather probe: %d of %d answered: %v", len(seen), nranks, err)
		}
		var r syncproto.CallstackReply
		if err := json.Unmarshal(m.Data, &r); err != nil {
			t.Fatal(err)
		}
		seen[r.Rank] = true
	}
}
