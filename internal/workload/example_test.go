package workload_test

import (
	"context"
	"fmt"
	"io"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

// Feed a consumer step by step without materialising the run.
func ExampleRankGen_Next() {
	cfg := workload.DefaultConfig()
	cfg.Ranks, cfg.Steps, cfg.EventsPerStep, cfg.Seed = 2, 3, 5000, 42
	w, err := workload.New(cfg)
	if err != nil {
		panic(err)
	}
	var f frame.Frame // reused for every step
	for r := range cfg.Ranks {
		g := w.Rank(uint32(r))
		frames := 0
		for {
			truth, err := g.Next(&f)
			if err == io.EOF {
				break
			}
			if err != nil {
				panic(err)
			}
			_ = truth // the anomalies whose exit is in this frame
			frames++
		}
		fmt.Printf("rank %d: %d frames\n", r, frames)
	}
	// Output:
	// rank 0: 3 frames
	// rank 1: 3 frames
}

// Select the functions a test wants by their distribution and anomaly kind.
func ExampleWorkload_Functions() {
	w, err := workload.New(workload.DefaultConfig())
	if err != nil {
		panic(err)
	}
	var uni, multi int
	for _, s := range w.Functions() {
		if s.Anomaly != workload.SlowCall {
			continue
		}
		if s.Multimodal() {
			multi++
		} else {
			uni++
		}
	}
	fmt.Printf("slow_call functions: %d unimodal, %d multimodal\n", uni, multi)
	// Output:
	// slow_call functions: 24 unimodal, 9 multimodal
}

// A replay of the evaluation traces: ranks take the applications in turn.
func ExampleFromTraces() {
	cfg := workload.DefaultTraceConfig(workload.EvalApps("testdata/eval")...)
	cfg.Ranks, cfg.Steps = 4, 2
	w, err := workload.FromTraces(context.Background(), cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(w.Profile(), w.Applications())
	var f frame.Frame
	g := w.Rank(1)
	for {
		if _, err := g.Next(&f); err != nil {
			break
		}
	}
	fmt.Println("rank 1 ran", w.Cycles(1), "cycles of", w.CallsPerCycle(1)["mat_mult"], "mat_mult kernel")
	// Output:
	// replay [kanika_phase1 opencl_course_L5 pytorch_simple_add kanika_phase1]
	// rank 1 ran 220 cycles of 1 mat_mult kernel
}
