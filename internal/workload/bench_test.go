package workload

import (
	"context"
	"io"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/frame"
)

// BenchmarkGenerate measures generation speed on one goroutine: every rank
// of a run, step after step, into one reused frame.
func BenchmarkGenerate(b *testing.B) {
	for _, bc := range []struct {
		name string
		gpu  bool
	}{{"cpu", false}, {"gpu", true}} {
		b.Run(bc.name, func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.Ranks, cfg.Steps, cfg.GPU = 2, 20, bc.gpu
			w, err := New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			var f frame.Frame
			var events int
			b.ReportAllocs()
			for b.Loop() {
				for r := range cfg.Ranks {
					g := w.Rank(uint32(r))
					for {
						if _, err := g.Next(&f); err == io.EOF {
							break
						} else if err != nil {
							b.Fatal(err)
						}
						events += f.NumEvents()
					}
				}
			}
			b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// BenchmarkGenerateEval measures the evaluation workloads the same way: the
// realistic profile and a replay of the three evaluation traces (reading
// the traces is outside the timed loop).
func BenchmarkGenerateEval(b *testing.B) {
	for _, bc := range []struct {
		name string
		make func() (*Workload, error)
	}{
		{"realistic", func() (*Workload, error) {
			cfg := DefaultConfig()
			cfg.Profile, cfg.Ranks, cfg.Steps, cfg.EventsPerStep, cfg.GPU = ProfileRealistic, 2, 10, 0, true
			return New(cfg)
		}},
		{"replay", func() (*Workload, error) {
			cfg := DefaultTraceConfig(EvalApps("testdata/eval")...)
			cfg.Ranks, cfg.Steps = 3, 5
			return FromTraces(context.Background(), cfg)
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			w, err := bc.make()
			if err != nil {
				b.Fatal(err)
			}
			var f frame.Frame
			var events int
			b.ReportAllocs()
			for b.Loop() {
				for r := range w.Config().Ranks {
					g := w.Rank(uint32(r))
					for {
						if _, err := g.Next(&f); err == io.EOF {
							break
						} else if err != nil {
							b.Fatal(err)
						}
						events += f.NumEvents()
					}
				}
			}
			b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
		})
	}
}
