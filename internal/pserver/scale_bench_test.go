package pserver

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/stats"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// BenchmarkDashboardScale measures what the dashboard costs the pserver at
// 256 and 4,096 ranks: each iteration is one rank's sync (a step summary
// with anomalies of 3 functions and 20 model deltas) applied to a server
// already holding 8 steps of every rank, and after every 256 syncs one
// dashboard update is built and encoded as the SSE hub does. The cost of a
// sync and of an update should not depend on the number of ranks. It
// reports syncs/s and the sync's p99-ms, the update's p50 in push-ms and
// its size in push-B.
func BenchmarkDashboardScale(b *testing.B) {
	for _, ranks := range []int{256, 4096} {
		b.Run(fmt.Sprintf("ranks=%d", ranks), func(b *testing.B) {
			s, err := New(Config{Run: "bench", Durability: DurabilityNone, Window: 16}, zerolog.Nop())
			if err != nil {
				b.Fatal(err)
			}
			req := func(step, r int) *syncproto.SyncRequest {
				q := &syncproto.SyncRequest{PID: 0, Rank: uint32(r), Seq: uint64(step + 1), Step: uint64(step), Algorithm: "sstd"}
				for f := range 20 {
					var m stats.Moments
					m.Push(float64(10*(f+1) + r%7))
					q.Models = append(q.Models, syncproto.ModelDelta{Key: funcName(f), Moments: m})
				}
				sum := syncproto.StepSummary{Step: uint64(step), Executions: 1000, Events: 2000}
				for f := range 3 {
					n := uint64((r*7 + step*3 + f) % 4)
					sum.Anomalies += n
					sum.Funcs = append(sum.Funcs, syncproto.FuncAnomalyMetrics{Func: funcName((r + f) % 20), Count: n})
				}
				q.Steps = []syncproto.StepSummary{sum}
				return q
			}
			for step := range 8 {
				for r := range ranks {
					s.apply(req(step, r), 0)
				}
			}
			const pushEvery = 256
			lat := make([]time.Duration, 0, 1<<16)
			var push []time.Duration
			var pushBytes int
			var syncTime time.Duration
			i := 0
			for b.Loop() {
				b.StopTimer()
				q := req(8+i/ranks, i%ranks)
				b.StartTimer()
				t0 := time.Now()
				if rep := s.apply(q, 0); rep.Error != "" {
					b.Fatal(rep.Error)
				}
				d := time.Since(t0)
				syncTime += d
				if len(lat) < cap(lat) {
					lat = append(lat, d)
				}
				if i++; i%pushEvery == 0 {
					t0 := time.Now()
					data, err := json.Marshal(s.update(context.Background()))
					if err != nil {
						b.Fatal(err)
					}
					push = append(push, time.Since(t0))
					pushBytes = len(data)
				}
			}
			slices.Sort(lat)
			slices.Sort(push)
			b.ReportMetric(float64(i)/syncTime.Seconds(), "syncs/s")
			b.ReportMetric(float64(lat[int(0.99*float64(len(lat)-1))].Microseconds())/1000, "p99-ms")
			if len(push) > 0 {
				b.ReportMetric(float64(push[len(push)/2].Microseconds())/1000, "push-ms")
				b.ReportMetric(float64(pushBytes), "push-B")
			}
		})
	}
}
