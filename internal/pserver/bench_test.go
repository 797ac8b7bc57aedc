package pserver

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/stats"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

const (
	benchDetectors = 4096
	benchFuncs     = 200
)

// benchPayloads pre-encodes each detector's model deltas (200 functions with
// realistic moments), so the benchmark measures the pserver, not the client's
// JSON encoder; each request only splices in its Seq.
func benchPayloads(detectors, funcs int) [][]byte {
	rng := rand.New(rand.NewPCG(1, 2))
	out := make([][]byte, detectors)
	for d := range detectors {
		models := make([]syncproto.ModelDelta, funcs)
		for f := range funcs {
			var m stats.Moments
			for range 1 + rng.IntN(30) {
				m.Push(float64(f+1)*10 + rng.NormFloat64())
			}
			models[f] = syncproto.ModelDelta{Key: funcName(f), Moments: m, Anomalies: uint64(rng.IntN(2))}
		}
		b, _ := json.Marshal(models)
		sum, _ := json.Marshal([]syncproto.StepSummary{{Anomalies: 3, Executions: 4000, Events: 8000}})
		out[d] = fmt.Appendf(nil, `{"pid":0,"rank":%d,"algorithm":"sstd","models":%s,"steps":%s,`, d, b, sum)
	}
	return out
}

func withSeq(prefix []byte, seq uint64) []byte {
	b := slices.Clip(prefix)
	b = append(b, `"seq":`...)
	b = strconv.AppendUint(b, seq, 10)
	b = append(b, `,"io_step":`...)
	b = strconv.AppendUint(b, seq-1, 10)
	return append(b, '}')
}

// BenchmarkSync4096 simulates 4,096 detectors syncing once per step, 200
// functions each, through real NATS request/reply on loopback: each b.N
// iteration is one step in which every detector sends one request; conc
// detectors have a request outstanding at any time (spread over 16 client
// connections). Latency is request-to-reply as the detector sees it.
func BenchmarkSync4096(b *testing.B) {
	payloads := benchPayloads(benchDetectors, benchFuncs)
	for _, mode := range []string{DurabilityNone, DurabilityWAL} {
		for _, conc := range []int{8, 32, 128} {
			b.Run(fmt.Sprintf("%s/conc=%d", mode, conc), func(b *testing.B) {
				benchSync(b, payloads, mode, conc)
			})
		}
	}
}

func benchSync(b *testing.B, payloads [][]byte, mode string, conc int) {
	ns, err := natsx.StartServer(natsx.DefaultServerConfig(b.TempDir()))
	if err != nil {
		b.Fatal(err)
	}
	defer ns.Shutdown()
	srvConn := connect(b, ns)
	s, err := New(Config{Run: "bench", Durability: mode, Window: 16}, zerolog.Nop())
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Start(ctx, srvConn); err != nil {
		b.Fatal(err)
	}
	defer s.Shutdown(ctx)
	conns := make([]*nats.Conn, 16)
	for i := range conns {
		conns[i] = connect(b, ns)
	}
	subject := natsx.Subjects{Run: "bench"}.Sync(0)
	lat := make([]time.Duration, 0, b.N*len(payloads))
	var mu sync.Mutex
	b.ResetTimer()
	start := time.Now()
	for step := range b.N {
		next := make(chan int, len(payloads))
		for d := range payloads {
			next <- d
		}
		close(next)
		var wg sync.WaitGroup
		var failed error
		for w := range conc {
			wg.Go(func() {
				nc := conns[w%len(conns)]
				local := make([]time.Duration, 0, len(payloads)/conc+1)
				for d := range next {
					data := withSeq(payloads[d], uint64(step+1))
					t0 := time.Now()
					m, err := nc.Request(subject, data, 30*time.Second)
					local = append(local, time.Since(t0))
					if err == nil && len(m.Data) < 100 {
						err = fmt.Errorf("short reply %q", m.Data)
					}
					if err != nil {
						mu.Lock()
						failed = err
						mu.Unlock()
						return
					}
				}
				mu.Lock()
				lat = append(lat, local...)
				mu.Unlock()
			})
		}
		wg.Wait()
		if failed != nil {
			b.Fatal(failed)
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	slices.Sort(lat)
	pct := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000 }
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(float64(len(lat)*benchFuncs)/elapsed.Seconds(), "merges/s")
	b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "syncs/s")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkSyncHandler measures one request's work inside the pserver without
// NATS: decode (200 model deltas), apply, reply encode, on a state that
// already holds 4,096 detectors; it reports the same units.
func BenchmarkSyncHandler(b *testing.B) {
	payloads := benchPayloads(benchDetectors, benchFuncs)
	s, err := New(Config{Run: "bench", Durability: DurabilityNone, Window: 16}, zerolog.Nop())
	if err != nil {
		b.Fatal(err)
	}
	for d := range payloads {
		s.applyRaw(withSeq(payloads[d], 1), 0)
	}
	lat := make([]time.Duration, 0, b.N)
	datas := make([][]byte, 0, 1024)
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		if i%1024 == 0 {
			b.StopTimer()
			datas = datas[:0]
			for j := range 1024 {
				datas = append(datas, withSeq(payloads[(i+j)%len(payloads)], uint64(2+(i+j)/len(payloads))))
			}
			b.StartTimer()
		}
		t0 := time.Now()
		rep := s.applyRaw(datas[i%1024], 0)
		if _, err := json.Marshal(rep); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	elapsed := time.Since(start)
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[int(0.99*float64(len(lat)-1))].Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(b.N*benchFuncs)/elapsed.Seconds(), "merges/s")
}

// BenchmarkWindowMemory measures the heap the aggregates hold per (rank,
// io_step) cell of the window, each step carrying anomalies of 4 functions
// per rank; B/record is bytes per cell, including the per-rank and per-(rank,
// function) totals spread over the cells.
func BenchmarkWindowMemory(b *testing.B) {
	const ranks, window = 1024, 100
	sums := make([]syncproto.StepSummary, window)
	for i := range sums {
		sums[i] = syncproto.StepSummary{Step: uint64(i), Anomalies: 4, Executions: 1000, Events: 2000}
		for f := range 4 {
			sums[i].Funcs = append(sums[i].Funcs, syncproto.FuncAnomalyMetrics{Func: funcName(f), Count: 1})
		}
	}
	var per float64
	for range b.N {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		a := NewAggregates(window)
		for i := range sums {
			for r := range uint32(ranks) {
				a.AddStep(DetectorID{0, r}, &sums[i])
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		per = float64(after.HeapAlloc-before.HeapAlloc) / (ranks * window)
		runtime.KeepAlive(a)
	}
	b.ReportMetric(per, "B/record")
}
