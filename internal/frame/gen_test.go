package frame

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// genConfig shapes a synthetic MPI-like frame for tests and benchmarks.
type genConfig struct {
	Seed     uint64
	Threads  int
	Funcs    int
	MaxDepth int
	Events   int // approximate number of function events
}

// genFrame builds a frame of nested calls: each thread enters and leaves
// functions (recursion-free call stacks up to MaxDepth deep) with gaps of
// tens to thousands of microseconds, samples counters inside some executions
// and sends or receives messages inside the "MPI" functions (fid < 8). Events
// of all threads are merged in timestamp order, as a tracer would emit them.
func genFrame(c genConfig) *Frame {
	rng := rand.New(rand.NewPCG(c.Seed, c.Seed^0x9e3779b97f4a7c15))
	f := &Frame{PID: 1, Rank: 3, Step: 17, TStart: 1_700_000_000_000_000}
	for i := range c.Funcs {
		name := fmt.Sprintf("solver::kernel_%02d", i)
		if i < 8 {
			name = []string{"MPI_Send", "MPI_Recv", "MPI_Isend", "MPI_Irecv", "MPI_Wait", "MPI_Allreduce", "MPI_Barrier", "MPI_Bcast"}[i]
		}
		f.Funcs = append(f.Funcs, Name{ID: uint32(i), Name: name})
	}
	f.Counters = []Name{{0, "PAPI_TOT_CYC"}, {1, "PAPI_FP_OPS"}, {2, "PAPI_L2_DCM"}, {3, "Correlation ID"}}
	f.Metadata = []Meta{{0, "Hostname", "node042"}, {0, "CPU Type", "AMD EPYC 7763 64-Core Processor"}}

	gap := func() uint64 {
		// log-uniform between 10 and 5000 µs
		return uint64(math.Exp(math.Log(10) + rng.Float64()*(math.Log(5000)-math.Log(10))))
	}
	perThread := c.Events / c.Threads
	type item struct {
		ts   uint64
		kind int // 0 func, 1 counter, 2 comm
		i    int
	}
	var order []item
	var evs []FuncEvent
	var ctrs []CounterEvent
	var comms []CommEvent
	var cyc uint64
	for t := range c.Threads {
		tid := uint32(t)
		ts := f.TStart + uint64(rng.IntN(100))
		var stack []uint32
		n := 0
		for n < perThread || len(stack) > 0 {
			ts += gap()
			enter := len(stack) == 0 || (len(stack) < c.MaxDepth && n < perThread && rng.IntN(2) == 0)
			if enter {
				// choose a function not already on the stack
				var fid uint32
				for {
					if len(stack) >= 2 && rng.IntN(3) == 0 {
						fid = uint32(rng.IntN(8)) // MPI near the leaves
					} else {
						fid = uint32(8 + rng.IntN(c.Funcs-8))
					}
					if !slices.Contains(stack, fid) {
						break
					}
				}
				stack = append(stack, fid)
				evs = append(evs, FuncEvent{Tid: tid, Kind: Entry, FID: fid, TS: ts})
				order = append(order, item{ts, 0, len(evs) - 1})
				if rng.IntN(20) == 0 {
					cyc += uint64(rng.IntN(1_000_000))
					ctrs = append(ctrs, CounterEvent{Tid: tid, CID: uint32(rng.IntN(3)), Value: cyc, TS: ts})
					order = append(order, item{ts, 1, len(ctrs) - 1})
				}
				if fid < 4 {
					comms = append(comms, CommEvent{Tid: tid, Kind: CommKind(fid & 1), Tag: uint32(rng.IntN(64)),
						Partner: uint32(rng.IntN(64)), Bytes: uint64(8 << rng.IntN(16)), TS: ts + 1})
					order = append(order, item{ts + 1, 2, len(comms) - 1})
				}
			} else {
				fid := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				evs = append(evs, FuncEvent{Tid: tid, Kind: Exit, FID: fid, TS: ts})
				order = append(order, item{ts, 0, len(evs) - 1})
			}
			n++
		}
	}
	slices.SortStableFunc(order, func(a, b item) int {
		if a.ts != b.ts {
			if a.ts < b.ts {
				return -1
			}
			return 1
		}
		return a.kind - b.kind
	})
	for _, it := range order {
		switch it.kind {
		case 0:
			f.Events = append(f.Events, evs[it.i])
		case 1:
			f.CounterEvents = append(f.CounterEvents, ctrs[it.i])
		case 2:
			f.Comms = append(f.Comms, comms[it.i])
		}
	}
	last := f.TStart
	for _, e := range f.Events {
		last = max(last, e.TS)
	}
	f.TEnd = last + 10
	return f
}

func benchFrame() *Frame {
	return genFrame(genConfig{Seed: 42, Threads: 4, Funcs: 50, MaxDepth: 6, Events: 100_000})
}
