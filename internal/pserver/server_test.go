package pserver

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// startNATS starts an embedded NATS server with JetStream for one test.
func startNATS(t testing.TB) (*natsx.Server, *nats.Conn) {
	t.Helper()
	ns, err := natsx.StartServer(natsx.DefaultServerConfig(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	return ns, connect(t, ns)
}

func connect(t testing.TB, ns *natsx.Server) *nats.Conn {
	t.Helper()
	nc, err := natsx.Connect(context.Background(), ns.ClientURL(), "pserver-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func startServer(t testing.TB, nc *nats.Conn, cfg Config) *Server {
	t.Helper()
	s, err := New(cfg, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Start(ctx, nc); err != nil {
		t.Fatal(err)
	}
	return s
}

// sync sends one request the way a detector does and returns the reply.
func doSync(t testing.TB, nc *nats.Conn, run string, shard int, req *syncproto.SyncRequest) syncproto.SyncReply {
	t.Helper()
	data, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	m, err := nc.Request(natsx.Subjects{Run: run}.Sync(shard), data, 10*time.Second)
	if err != nil {
		t.Fatalf("sync %d/%d seq %d to shard %d: %v", req.PID, req.Rank, req.Seq, shard, err)
	}
	var rep syncproto.SyncReply
	if err := json.Unmarshal(m.Data, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Error != "" {
		t.Fatalf("sync error: %s", rep.Error)
	}
	return rep
}

func state(s *Server) *State {
	var out *State
	s.View(func(st *State) {
		data, _, err := encodeState(st)
		if err != nil {
			panic(err)
		}
		var derr error
		if out, derr = decodeState(data, st.Agg.Window); derr != nil {
			panic(derr)
		}
	})
	return out
}

func TestSyncOverNATS(t *testing.T) {
	for _, mode := range []string{DurabilityWAL, DurabilitySnapshot, DurabilityNone} {
		t.Run(mode, func(t *testing.T) {
			_, nc := startNATS(t)
			s := startServer(t, nc, Config{Run: "r1", Durability: mode})
			defer s.Shutdown(context.Background())
			g := newGenRun(4, 3, 5, 1, 11)
			for _, row := range g.reqs {
				for i := range row {
					rep := doSync(t, nc, "r1", 0, &row[i])
					if !rep.Applied || rep.LastSeq != row[i].Seq || len(rep.Models) != len(row[i].Models) {
						t.Fatalf("reply %+v to seq %d", rep, row[i].Seq)
					}
				}
			}
			// A retried request is answered with the model but not applied again.
			rep := doSync(t, nc, "r1", 0, &g.reqs[2][0])
			if rep.Applied || len(rep.Models) != 5 {
				t.Errorf("retry: applied=%v with %d models, want not applied with 5", rep.Applied, len(rep.Models))
			}
			want := reference(t, g.all(), DefaultWindow)
			for _, m := range rep.Models {
				if !momentsEqual(m.Moments, want.Models[m.Key].Moments) {
					t.Errorf("reply model %q = %+v, want %+v", m.Key, m.Moments, want.Models[m.Key].Moments)
				}
			}
			got := state(s)
			compareModels(t, mode, want, got)
			compareAggregates(t, mode, want, got)
			// Garbage gets an error reply, not a crash.
			m, err := nc.Request(natsx.Subjects{Run: "r1"}.Sync(0), []byte("{bad"), 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			var bad syncproto.SyncReply
			if err := json.Unmarshal(m.Data, &bad); err != nil || bad.Error == "" {
				t.Errorf("garbage request: reply %q, want an error", m.Data)
			}
		})
	}
}

// TestRestartKeepsEveryCount crashes the pserver mid-run (no final snapshot)
// and starts a new one against the same bucket and log: every count of the
// uninterrupted run is there at the end. The detector whose request was in
// flight resends it (it got no reply), which must not count twice.
func TestRestartKeepsEveryCount(t *testing.T) {
	tests := []struct {
		name  string
		mode  string
		crash bool
	}{
		{"wal crash", DurabilityWAL, true},
		{"wal clean shutdown", DurabilityWAL, false},
		{"snapshot clean shutdown", DurabilitySnapshot, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, nc := startNATS(t)
			cfg := Config{Run: "restart", Durability: tc.mode, SnapshotEvery: 7, SnapshotInterval: time.Hour}
			g := newGenRun(6, 10, 8, 2, 21)
			a := startServer(t, nc, cfg)
			for _, row := range g.reqs[:5] {
				for i := range row {
					doSync(t, nc, "restart", 0, &row[i])
				}
			}
			// Detectors 0-2 of step 5 are answered; the pserver dies while the
			// request of detector 3 is being handled.
			for i := range 3 {
				doSync(t, nc, "restart", 0, &g.reqs[5][i])
			}
			if tc.crash {
				a.abort()
			} else if err := a.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			b := startServer(t, nc, cfg)
			defer b.Shutdown(context.Background())
			rep := doSync(t, nc, "restart", 0, &g.reqs[5][1]) // a retry of an answered request
			if rep.Applied {
				t.Error("a request answered before the restart was applied again")
			}
			for _, row := range g.reqs[5:] {
				for i := range row {
					doSync(t, nc, "restart", 0, &row[i])
				}
			}
			want := reference(t, g.all(), DefaultWindow)
			got := state(b)
			compareModels(t, tc.name, want, got)
			compareAggregates(t, tc.name, want, got)
			if got.Applied != want.Applied {
				t.Errorf("applied %d requests over the run, want %d", got.Applied, want.Applied)
			}
		})
	}
}

// TestShardsAgreeWithOneInstance runs the same input through one instance and
// through two instances splitting the model keys by syncproto.Shard.
func TestShardsAgreeWithOneInstance(t *testing.T) {
	_, nc := startNATS(t)
	g := newGenRun(5, 6, 24, 4, 31)
	one := startServer(t, nc, Config{Run: "one", Durability: DurabilityNone})
	defer one.Shutdown(context.Background())
	s0 := startServer(t, nc, Config{Run: "two", Shard: 0, Shards: 2})
	defer s0.Shutdown(context.Background())
	s1 := startServer(t, nc, Config{Run: "two", Shard: 1, Shards: 2})
	defer s1.Shutdown(context.Background())
	for _, row := range g.reqs {
		for i := range row {
			rep := doSync(t, nc, "one", 0, &row[i])
			var shardModels int
			for si, part := range splitShards(row[i], 2) {
				r := doSync(t, nc, "two", si, &part)
				shardModels += len(r.Models)
				for _, m := range r.Models {
					if syncproto.Shard(m.Key, 2) != si {
						t.Fatalf("shard %d answered with key %q of shard %d", si, m.Key, syncproto.Shard(m.Key, 2))
					}
				}
			}
			if shardModels != len(rep.Models) {
				t.Fatalf("shards answered %d models, one instance %d", shardModels, len(rep.Models))
			}
		}
	}
	whole, a, b := state(one), state(s0), state(s1)
	if len(a.Models) == 0 || len(b.Models) == 0 {
		t.Fatalf("shards hold %d and %d models: the split is degenerate", len(a.Models), len(b.Models))
	}
	merged := NewState(DefaultWindow)
	for k, m := range a.Models {
		merged.Models[k] = m
	}
	for k, m := range b.Models {
		if merged.Models[k] != nil {
			t.Errorf("key %q held by both shards", k)
		}
		merged.Models[k] = m
	}
	merged.Counters = a.Counters
	compareModels(t, "two shards", whole, merged)
	hists := 0
	for k, w := range whole.Models {
		if !w.Histogram.Empty() {
			hists++
			if !slices.Equal(w.Histogram.Counts, merged.Models[k].Histogram.Counts) || w.Histogram.FirstEdge != merged.Models[k].Histogram.FirstEdge {
				t.Errorf("histogram of %q differs between one instance and the shards", k)
			}
		}
	}
	if hists == 0 {
		t.Error("no histograms in the run")
	}
	compareAggregates(t, "shard 0 aggregates", whole, a)
	if len(b.Counters) != 0 || len(b.Agg.Ranks) != 0 {
		t.Errorf("shard 1 holds %d counters and %d ranks; they belong to shard 0", len(b.Counters), len(b.Agg.Ranks))
	}
}

// TestQueueGroupInstancesShareShard runs two instances on the same shard: the
// requests are spread over both, and both end with the full state.
func TestQueueGroupInstancesShareShard(t *testing.T) {
	ns, nc := startNATS(t)
	cfg := Config{Run: "qg"}
	a := startServer(t, connect(t, ns), cfg)
	defer a.Shutdown(context.Background())
	b := startServer(t, connect(t, ns), cfg)
	defer b.Shutdown(context.Background())
	g := newGenRun(6, 6, 6, 1, 41)
	for _, row := range g.reqs {
		for i := range row {
			doSync(t, nc, "qg", 0, &row[i])
		}
	}
	want := reference(t, g.all(), DefaultWindow)
	deadline := time.Now().Add(10 * time.Second)
	for _, s := range []*Server{a, b} {
		for s.walSeq() < uint64(len(g.all())) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		got := state(s)
		compareModels(t, "instance", want, got)
		compareAggregates(t, "instance", want, got)
	}
	var served [2]float64
	for i, s := range []*Server{a, b} {
		mf, _ := s.metrics.reg.Gather()
		for _, f := range mf {
			if f.GetName() == "kipimo_ps_sync_latency_seconds" {
				served[i] = float64(f.GetMetric()[0].GetHistogram().GetSampleCount())
			}
		}
	}
	if served[0] == 0 || served[1] == 0 || served[0]+served[1] != float64(len(g.all())) {
		t.Errorf("instances answered %v requests, want both some and %d in all", served, len(g.all()))
	}
}

func TestFinishPublishesGlobalRecords(t *testing.T) {
	_, nc := startNATS(t)
	s := startServer(t, nc, Config{Run: "fin", Durability: DurabilityNone})
	g := newGenRun(3, 2, 4, 0, 51)
	for _, row := range g.reqs {
		for i := range row {
			doSync(t, nc, "fin", 0, &row[i])
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	str, err := js.Stream(ctx, natsx.ProvStream("fin"))
	if err != nil {
		t.Fatal(err)
	}
	want := reference(t, g.all(), DefaultWindow)
	for kind, n := range map[provenance.Kind]int{provenance.KindFuncStats: len(want.Models), provenance.KindCounterStats: len(want.Counters)} {
		msg, err := str.GetLastMsgForSubject(ctx, natsx.Subjects{Run: "fin"}.Prov(string(kind)))
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		var recs []json.RawMessage
		if err := json.Unmarshal(msg.Data, &recs); err != nil || len(recs) != n {
			t.Fatalf("%s batch: %d records (%v), want %d", kind, len(recs), err, n)
		}
		if kind == provenance.KindFuncStats {
			var r provenance.GlobalFuncStats
			_ = json.Unmarshal(recs[0], &r)
			m := want.Models[r.Func]
			if m == nil || r.Stats.Count != m.Moments.N || r.Anomalies != m.Anomalies || r.FID != keyID(r.Func) {
				t.Errorf("func_stats record %+v does not match the model %+v", r, m)
			}
		}
	}
}
