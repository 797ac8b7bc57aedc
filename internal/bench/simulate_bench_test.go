package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/pserver"
	"github.com/kipimo-hpc/kipimo/internal/stats"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// BenchmarkNodeSync measures one pserver shard (write-ahead log on) taking
// the merged writes of nodes of 64 ranks through NATS, as a sharded run at
// scale sends them: each iteration is one io_step in which each of 64 nodes
// (4,096 ranks) sends one request carrying every rank's deltas of the
// shard's 50 keys (200 functions over 4 shards: 3,200 merges a request),
// all nodes at once. Moments only (as SSTD sends them; the tail and
// histogram algorithms send more per key). It reports merges/s, requests/s,
// the round trip's p50-ms and p99-ms and the request's B/record per key
// delta.
func BenchmarkNodeSync(b *testing.B) {
	const nodes, perNode, keys = 64, 64, 50
	ns, err := natsx.StartServer(natsx.DefaultServerConfig(b.TempDir()))
	if err != nil {
		b.Fatal(err)
	}
	defer ns.Shutdown()
	ctx := context.Background()
	srv, err := natsx.Connect(ctx, ns.ClientURL(), "pserver-0")
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	c := pserver.DefaultConfig()
	c.NATS, c.Run, c.HTTPAddr = "", "bench", ""
	ps, err := pserver.New(c, zerolog.Nop())
	if err != nil {
		b.Fatal(err)
	}
	if err := ps.Start(ctx, srv); err != nil {
		b.Fatal(err)
	}
	defer ps.Shutdown(ctx)
	conns := make([]*nats.Conn, 16)
	for i := range conns {
		if conns[i], err = natsx.Connect(ctx, ns.ClientURL(), fmt.Sprintf("ad-%04d", i)); err != nil {
			b.Fatal(err)
		}
		defer conns[i].Close()
	}
	rng := rand.New(rand.NewPCG(1, 2))
	deltas := make([]stats.Moments, nodes*perNode*keys)
	for i := range deltas {
		for range 1 + rng.IntN(30) {
			deltas[i].Push(float64(i%keys+1)*10 + rng.NormFloat64())
		}
	}
	request := func(node, step int) []byte {
		q := syncproto.SyncRequest{PID: 0, Rank: uint32(node * perNode), Step: uint64(step), Algorithm: "sstd", Node: fmt.Sprintf("node-%d", node)}
		for r := range perNode {
			q.Ranks = append(q.Ranks, syncproto.RankPart{Rank: uint32(node*perNode + r), Seq: uint64(step + 1)})
		}
		for k := range keys {
			base := (node*perNode)*keys + k
			d := syncproto.ModelDelta{Key: fmt.Sprintf("solver::kernel_%03d", k), Moments: deltas[base]}
			for r := 1; r < perNode; r++ {
				d.More = append(d.More, syncproto.ModelPart{Moments: deltas[base+r*keys]})
			}
			q.Models = append(q.Models, d)
		}
		data, err := json.Marshal(&q)
		if err != nil {
			b.Fatal(err)
		}
		return data
	}
	subject := natsx.Subjects{Run: "bench"}.Sync(0)
	var lat []time.Duration
	var mu sync.Mutex
	var bytes int
	var elapsed time.Duration
	step := 0
	for b.Loop() {
		b.StopTimer()
		reqs := make([][]byte, nodes)
		for n := range reqs {
			reqs[n] = request(n, step)
			bytes += len(reqs[n])
		}
		step++
		b.StartTimer()
		t0 := time.Now()
		var wg sync.WaitGroup
		for n := range nodes {
			wg.Go(func() {
				s := time.Now()
				m, err := conns[n%len(conns)].Request(subject, reqs[n], time.Minute)
				if err == nil && len(m.Data) < 100 {
					err = fmt.Errorf("short reply %q", m.Data)
				}
				if err != nil {
					b.Error(err)
					return
				}
				mu.Lock()
				lat = append(lat, time.Since(s))
				mu.Unlock()
			})
		}
		wg.Wait()
		elapsed += time.Since(t0)
	}
	slices.Sort(lat)
	merges := float64(len(lat) * perNode * keys)
	b.ReportMetric(merges/elapsed.Seconds(), "merges/s")
	b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "requests/s")
	b.ReportMetric(float64(lat[len(lat)/2])/float64(time.Millisecond), "p50-ms")
	b.ReportMetric(float64(lat[int(0.99*float64(len(lat)-1))])/float64(time.Millisecond), "p99-ms")
	b.ReportMetric(float64(bytes)/float64(step*nodes*perNode*keys), "B/record")
	b.ReportMetric(0, "ns/op")
}
