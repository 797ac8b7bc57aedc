// Package storetest is the one test suite every provenance.Store
// implementation runs (Run), and a deterministic generator of realistic
// provenance records (Generate) for tests, golden files and benchmarks.
package storetest

import (
	"fmt"
	"math/rand/v2"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// GenConfig shapes a generated set of executions.
type GenConfig struct {
	Seed     uint64
	N        int // number of executions
	Programs int // pids 0..Programs-1; default 1
	Ranks    int // default 8
	Threads  int // default 2
	Steps    int // default 20
	Window   int // executions before and after in the event window; default 5
	Anomaly  bool
}

var funcNames = []string{
	"main", "MPI_Allreduce", "MPI_Send", "MPI_Recv", "MPI_Waitall", "compute_forces",
	"update_positions", "Kokkos::parallel_for [type=Functor]", "io_write_checkpoint",
	"cudaMemcpyAsync", "solver::iterate", "halo_exchange",
}

// Generate builds cfg.N executions deterministically from cfg.Seed. Event
// ids are unique per program (and distinct within a record: call stack
// parents, window neighbours and the execution itself); about one in ten is a GPU execution.
func Generate(cfg GenConfig) []provenance.Exec {
	if cfg.Programs <= 0 {
		cfg.Programs = 1
	}
	if cfg.Ranks <= 0 {
		cfg.Ranks = 8
	}
	if cfg.Threads <= 0 {
		cfg.Threads = 2
	}
	if cfg.Steps <= 0 {
		cfg.Steps = 20
	}
	if cfg.Window <= 0 {
		cfg.Window = 5
	}
	cfg.Window = min(cfg.Window, 10) // event ids of a window stay below the execution's own
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6b6970696d6f))
	const base = uint64(1_700_000_000_000_000)
	next := map[[3]uint64]uint64{}
	out := make([]provenance.Exec, 0, cfg.N)
	for range cfg.N {
		pid := uint32(rng.IntN(cfg.Programs))
		rank := uint32(rng.IntN(cfg.Ranks))
		tid := uint32(rng.IntN(cfg.Threads))
		step := uint64(rng.IntN(cfg.Steps))
		k := [3]uint64{uint64(pid), uint64(rank), step}
		idx := next[k]
		next[k] = idx + 1
		id := fmt.Sprintf("%d:%d:%d", rank, step, idx*50+25+uint64(rng.IntN(25)))
		fid := uint32(rng.IntN(len(funcNames)))
		tstart := base + step*1_000_000
		entry := tstart + uint64(rng.IntN(900_000))
		rt := uint64(10 + rng.ExpFloat64()*2000)
		if cfg.Anomaly {
			rt *= 10
		}
		ex := rt - uint64(rng.IntN(int(rt/2)+1))
		gpu := rng.IntN(10) == 0
		e := provenance.Exec{
			Entry: entry, Exit: entry + rt, EventID: id, FID: fid, Func: funcNames[fid],
			PID: pid, RID: rank, TID: tid, RuntimeTotal: rt, RuntimeExclusive: ex,
			IOStep: step, IOStepTStart: tstart, IOStepTEnd: tstart + 999_999,
			OutlierScore: float64(rng.IntN(100000)) / 1000, IsGPUEvent: gpu,
			FuncStats: provenance.FuncStats{
				Count: float64(1000 + rng.IntN(100000)), Mean: 200 + float64(rng.IntN(1000)),
				Stddev: float64(rng.IntN(300)), Minimum: 10, Maximum: float64(rt),
				Skewness: float64(rng.IntN(400)) / 100, Kurtosis: float64(rng.IntN(900)) / 100,
			},
			Hostname: fmt.Sprintf("node%02d", rank/4),
		}
		e.OutlierSeverity = float64(ex)
		e.FuncStats.Accumulate = e.FuncStats.Count * e.FuncStats.Mean
		if cfg.Anomaly {
			e.Algorithm = "sstd"
		}
		depth := 1 + rng.IntN(3)
		e.CallStack = append(e.CallStack, provenance.CallFrame{Entry: entry, Exit: e.Exit, FID: fid, Func: e.Func, EventID: id, IsAnomaly: cfg.Anomaly})
		for d := 1; d <= depth; d++ {
			pf := uint32(rng.IntN(len(funcNames)))
			e.CallStack = append(e.CallStack, provenance.CallFrame{
				Entry: entry - uint64(d*100), Exit: 0, FID: pf, Func: funcNames[pf],
				EventID: fmt.Sprintf("%d:%d:%d", rank, step, idx*50+uint64(d)),
			})
		}
		for c := range rng.IntN(3) {
			e.CounterEvents = append(e.CounterEvents, provenance.CounterEvent{
				CounterIdx: uint32(c), CounterName: []string{"PAPI_TOT_CYC", "Memory Footprint (VmRSS) (KB)"}[c%2],
				CounterValue: uint64(rng.IntN(1 << 30)), PID: pid, RID: rank, TID: tid, TS: entry + uint64(c),
			})
		}
		t := entry - uint64(cfg.Window)*300
		for w := -cfg.Window; w <= cfg.Window; w++ {
			wf := uint32(rng.IntN(len(funcNames)))
			wid := fmt.Sprintf("%d:%d:%d", rank, step, idx*50+uint64(4+w+cfg.Window))
			we := provenance.WindowExec{Entry: t, Exit: t + 150, FID: wf, Func: funcNames[wf], EventID: wid, ParentEventID: e.CallStack[len(e.CallStack)-1].EventID}
			if w == 0 {
				we = provenance.WindowExec{Entry: entry, Exit: e.Exit, FID: fid, Func: e.Func, EventID: id, ParentEventID: we.ParentEventID, IsAnomaly: cfg.Anomaly}
			}
			e.EventWindow.ExecWindow = append(e.EventWindow.ExecWindow, we)
			t += 300
		}
		for range rng.IntN(2) {
			peer := uint32(rng.IntN(cfg.Ranks))
			e.EventWindow.CommWindow = append(e.EventWindow.CommWindow, provenance.CommRecord{
				Type: "SEND", PID: pid, RID: rank, TID: tid, Src: rank, Tar: peer,
				Bytes: uint64(rng.IntN(1 << 20)), Tag: uint32(rng.IntN(100)), Timestamp: entry + 5, ExecdataKey: id,
			})
		}
		if gpu {
			e.GPULocation = &provenance.GPULocation{Context: 1, Device: uint32(rng.IntN(4)), Stream: uint32(rng.IntN(8)), Thread: 16 + tid}
			e.GPUParent = &provenance.GPUParent{EventID: e.CallStack[1].EventID, TID: 0, CallStack: e.CallStack[1:]}
		}
		e.Normalize()
		out = append(out, e)
	}
	return out
}

// GenerateOthers builds a few records of every non-execution kind for pid.
func GenerateOthers(pid uint32, ranks int) (meta []provenance.Metadata, fs []provenance.GlobalFuncStats, cs []provenance.GlobalCounterStats, prof []provenance.ThreadProfile) {
	for r := range ranks {
		meta = append(meta,
			provenance.Metadata{Descr: "Hostname", PID: pid, RID: uint32(r), TID: 0, Value: fmt.Sprintf("node%02d", r/4)},
			provenance.Metadata{Descr: "CUDA Device", PID: pid, RID: uint32(r), TID: 16, Value: "NVIDIA A100"})
		prof = append(prof, provenance.ThreadProfile{PID: pid, Rank: uint32(r), TID: 0, Step: 19, Final: true,
			Timers:   []provenance.TimerProfile{{Name: "main", Calls: 1, Inclusive: 1e6, Exclusive: 1e3}, {Name: "main => MPI_Send", Calls: 10, Inclusive: 50, Exclusive: 50}},
			Counters: []provenance.CounterProfile{{Name: "PAPI_TOT_CYC", Count: 3, Min: 1, Max: 3, Mean: 2, SumSqr: 14}}})
	}
	for i, f := range funcNames {
		fs = append(fs, provenance.GlobalFuncStats{PID: pid, FID: uint32(i), Func: f, Stats: provenance.FuncStats{Count: 10, Mean: float64(i)}, Anomalies: uint64(i)})
	}
	cs = append(cs, provenance.GlobalCounterStats{PID: pid, Counter: "PAPI_TOT_CYC", Stats: provenance.FuncStats{Count: 3}})
	return
}

// ExecBatch wraps executions as a batch of kind.
func ExecBatch(kind provenance.Kind, execs []provenance.Exec) provenance.Batch {
	return provenance.Batch{Kind: kind, Execs: execs}
}

// Anomalies is provenance.KindAnomalies, for brevity in tests.
const Anomalies = provenance.KindAnomalies

// Aggregate groups execs (already filtered) as by says, limited to limit
// groups: the reference Store.Aggregate is checked against.
func Aggregate(execs []provenance.Exec, by provenance.GroupBy, limit int) []provenance.Group {
	type key struct {
		rank uint32
		fn   string
		step uint64
	}
	counts := map[key]int64{}
	for i := range execs {
		e := &execs[i]
		var k key
		switch by {
		case provenance.ByRank:
			k.rank = e.RID
		case provenance.ByFunc:
			k.fn = e.Func
		case provenance.ByStep:
			k.step = e.IOStep
		case provenance.ByRankFunc:
			k.rank, k.fn = e.RID, e.Func
		}
		counts[k]++
	}
	gs := make([]provenance.Group, 0, len(counts))
	for k, n := range counts {
		gs = append(gs, provenance.MakeGroup(by, k.rank, k.fn, k.step, n))
	}
	return provenance.SortGroups(gs, limit)
}
