// Package workload simulates an instrumented MPI+OpenMP(+CUDA) application and
// produces its event stream as frames (one rank, one io_step each), exactly as
// TAU's tracing plugin would stream them, together with the ground truth of the
// anomalies it injected.
//
// The simulated code is molecular-dynamics-like: thread 0 of every rank runs
// main (MPI_Init, setup, then timesteps of force kernels, a halo exchange with
// rank±1, integration and an MPI_Allreduce, a periodic io_write, finalize);
// the other CPU threads are OpenMP workers; with the GPU on, kernels run on
// virtual GPU threads (tids after the CPU threads) linked to their
// cudaLaunchKernel by a "Correlation ID" counter. Call stacks are up to seven
// levels deep and recursion-free; every execution's exclusive runtime is drawn
// from its function's distribution (one to three bounded modes, see FuncSpec),
// so a function's normal runtimes never produce extreme outliers.
//
// A run is deterministic: the same Config gives byte-identical frames and truth
// whatever order or concurrency the ranks are generated in. Each (rank,
// thread) has its own SplitMix64 stream derived from the seed.
//
// Time: every rank starts at T0 (µs since the epoch). io_step s covers
// [T0+s*W, T0+(s+1)*W), where the width W is chosen from the function
// distributions so that a rank emits about Config.EventsPerStep events per
// step. Events are cut into frames by timestamp, so executions span step
// boundaries (main spans the whole run). The last frame also carries the
// events of finalize that fall after the nominal end; its TEnd is extended to
// cover them.
//
// Events inside executions: counter samples (PAPI_TOT_INS, PAPI_L2_TCM,
// "Message size for all-reduce") and messages (halo exchange with rank±1 in
// MPI_Isend/MPI_Waitall, migrations to random ranks in MPI_Send/MPI_Recv) lie
// strictly inside the execution's own time, never at the timestamp of a
// function event, so they belong to the innermost open execution without
// ambiguity. The one exception is the "Correlation ID" counter on a GPU
// thread, which has its kernel's entry timestamp. Within a frame, each
// thread's events are contiguous and in timestamp order: CPU threads by tid,
// then the GPU threads.
//
// Ground truth: one Truth per injected anomalous execution; its io_step is
// the step that holds the execution's exit event, the step in which a
// detector can first judge it.
//
// Typical use:
//
//	w, err := workload.New(cfg)
//	var f frame.Frame
//	g := w.Rank(r)
//	for {
//		truth, err := g.Next(&f)
//		if err == io.EOF {
//			break
//		}
//		// use f (valid until the next call) and truth (caller-owned)
//	}
package workload

import (
	"errors"
	"fmt"
	"math"
	"strings"
)

// Kind names a kind of injected anomaly.
type Kind string

// Anomaly kinds. Each function can be hit by at most one kind (FuncSpec.Anomaly),
// so the kinds never mix inside one function's distribution.
const (
	// SlowCall is a single very slow call: exclusive runtime 6-16x the mean of
	// the function's highest mode.
	SlowCall Kind = "slow_call"
	// SlowRank: one rank (see Workload.SlowRank) is intermittently slow for
	// the whole run: its calls of the slow-rank functions are 4-6x slower
	// with probability Rates.SlowRank each.
	SlowRank Kind = "slow_rank"
	// SlowBurst: for a burst of 2-4 consecutive steps on one rank, calls of
	// one slow-burst function are 6-10x slower with probability
	// Rates.BurstCall each.
	SlowBurst Kind = "slow_burst"
	// SlowKernel is a GPU kernel 5-12x slower than its highest mode's mean.
	SlowKernel Kind = "slow_kernel"
	// FastOutlier is a fast-but-wrong execution: 0.05-0.2x the mean of the
	// function's lowest mode.
	FastOutlier Kind = "fast_outlier"
	// BeyondMax is the one kind of the realistic profile and of trace
	// replays: an execution 1.5-3x the function's natural maximum (the
	// largest value its normal executions take anywhere in the run, or in
	// the trace), rounded up to whole µs. Functions whose natural maximum is
	// below MinInjectMax are never hit.
	BeyondMax Kind = "beyond_max"
)

// Kinds lists the anomaly kinds of the classic profile; Workload.Kinds
// lists those of a given workload.
func Kinds() []Kind { return []Kind{SlowCall, SlowRank, SlowBurst, SlowKernel, FastOutlier} }

// Factor ranges of the injected anomalies, relative to the mean of the
// function's highest mode (slow kinds), its lowest mode (FastOutlier) or its
// natural maximum (BeyondMax).
var factors = map[Kind][2]float64{
	SlowCall:    {6, 16},
	SlowRank:    {4, 6},
	SlowBurst:   {6, 10},
	SlowKernel:  {5, 12},
	FastOutlier: {0.05, 0.2},
	BeyondMax:   {1.5, 3},
}

// Factor returns the range of the runtime factor an anomaly of kind k is
// drawn from (uniformly).
func Factor(k Kind) (lo, hi float64) {
	f := factors[k]
	return f[0], f[1]
}

// Rates sets how often each anomaly kind is injected. All are probabilities
// in [0, 1]; 0 disables the kind.
type Rates struct {
	// SlowCall: per execution of a slow_call function.
	SlowCall float64 `json:"slow_call"`
	// SlowRank: per execution of a slow_rank function on the slow rank.
	SlowRank float64 `json:"slow_rank"`
	// SlowBurst: per (rank, step), that a burst of 2-4 steps starts there.
	SlowBurst float64 `json:"slow_burst"`
	// BurstCall: per execution of the bursting function inside a burst.
	BurstCall float64 `json:"burst_call"`
	// SlowKernel: per GPU kernel execution.
	SlowKernel float64 `json:"slow_kernel"`
	// FastOutlier: per execution of a fast_outlier function.
	FastOutlier float64 `json:"fast_outlier"`
	// BeyondMax: per execution, in the realistic profile, of a function
	// whose natural maximum is at least MinInjectMax µs (the classic profile
	// ignores it; trace replays have TraceConfig.Rate).
	BeyondMax float64 `json:"beyond_max,omitempty"`
}

// DefaultRates make about 0.1% of all executions of the classic profile
// anomalous. Up to about 0.5% per function, an injected anomaly stays more
// than six standard deviations (of the function's whole sample, anomalies
// included) away from the mean. In the realistic profile, BeyondMax hits
// 0.09% of the executions of the functions that can be hit: about 750 in 8
// ranks x 40 steps.
var DefaultRates = Rates{
	SlowCall:    0.001,
	SlowRank:    0.02,
	SlowBurst:   0.02,
	BurstCall:   0.05,
	SlowKernel:  0.002,
	FastOutlier: 0.002,
	BeyondMax:   0.0009,
}

// Scale returns r with every per-execution rate multiplied by f (SlowBurst,
// the burst start rate, is left alone), capped at 1.
func (r Rates) Scale(f float64) Rates {
	c := func(x float64) float64 { return min(1, x*f) }
	r.SlowCall, r.SlowRank, r.BurstCall = c(r.SlowCall), c(r.SlowRank), c(r.BurstCall)
	r.SlowKernel, r.FastOutlier = c(r.SlowKernel), c(r.FastOutlier)
	r.BeyondMax = c(r.BeyondMax)
	return r
}

// Config describes a run.
type Config struct {
	// PID is the program id carried by every frame and truth record.
	PID uint32 `json:"pid"`
	// Ranks is the number of MPI ranks.
	Ranks int `json:"ranks"`
	// ThreadsPerRank is the number of CPU threads per rank (tid 0 runs main,
	// the others are OpenMP workers).
	ThreadsPerRank int `json:"threads_per_rank"`
	// Steps is the number of io_steps (frames per rank).
	Steps int `json:"steps"`
	// Seed selects the run; the same Config gives the same bytes.
	Seed uint64 `json:"seed"`
	// EventsPerStep is the approximate number of events (function, counter
	// and communication) per rank per step.
	EventsPerStep int `json:"events_per_step"`
	// GPU adds CUDA offload: launches on thread 0 and kernels on two virtual
	// GPU threads per rank.
	GPU bool `json:"gpu"`
	// Rates sets the anomaly injection.
	Rates Rates `json:"rates"`
	// Profile is the simulated code's profile: ProfileClassic (also "") or
	// ProfileRealistic. The realistic profile uses ThreadsPerRank, GPU and
	// Rates.BeyondMax; its EventsPerStep may be 0 for
	// RealisticEventsPerStep.
	Profile string `json:"profile,omitempty"`
}

// DefaultConfig is a small but interesting run: 8 ranks of 2 threads, 30
// steps of about 30,000 events per rank, GPU off, seed 1.
func DefaultConfig() Config {
	return Config{
		Ranks:          8,
		ThreadsPerRank: 2,
		Steps:          30,
		Seed:           1,
		EventsPerStep:  30000,
		Rates:          DefaultRates,
	}
}

// Limits on Config values.
const (
	MaxRanks         = 1 << 20
	MaxThreads       = 1024
	MaxSteps         = 1 << 24
	MinEventsPerStep = 100
	MaxEventsPerStep = 1 << 25
)

// Validate reports the first thing wrong with c.
func (c Config) Validate() error {
	var errs []string
	add := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	if c.Ranks < 1 || c.Ranks > MaxRanks {
		add("ranks must be between 1 and %d, got %d", MaxRanks, c.Ranks)
	}
	if c.ThreadsPerRank < 1 || c.ThreadsPerRank > MaxThreads {
		add("threads per rank must be between 1 and %d, got %d", MaxThreads, c.ThreadsPerRank)
	}
	if c.Steps < 1 || c.Steps > MaxSteps {
		add("steps must be between 1 and %d, got %d", MaxSteps, c.Steps)
	}
	realistic := c.Profile == ProfileRealistic
	if c.Profile != "" && c.Profile != ProfileClassic && !realistic {
		add("profile must be one of %v, got %q", Profiles, c.Profile)
	}
	if (!realistic || c.EventsPerStep != 0) && (c.EventsPerStep < MinEventsPerStep || c.EventsPerStep > MaxEventsPerStep) {
		add("events per step must be between %d and %d, got %d", MinEventsPerStep, MaxEventsPerStep, c.EventsPerStep)
	}
	for _, r := range []struct {
		name string
		v    float64
	}{
		{"slow_call", c.Rates.SlowCall}, {"slow_rank", c.Rates.SlowRank}, {"slow_burst", c.Rates.SlowBurst},
		{"burst_call", c.Rates.BurstCall}, {"slow_kernel", c.Rates.SlowKernel}, {"fast_outlier", c.Rates.FastOutlier},
		{"beyond_max", c.Rates.BeyondMax},
	} {
		if !(r.v >= 0 && r.v <= 1) { // also rejects NaN
			add("rate %s must be in [0, 1], got %v", r.name, r.v)
		}
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

// Mode is one mode of a function's exclusive-runtime distribution: a bounded
// bell curve (Irwin-Hall of three uniforms) with the given mean and standard
// deviation in microseconds, supported on Mean ± 3 StdDev.
type Mode struct {
	Weight float64 `json:"weight"`
	Mean   float64 `json:"mean_us"`
	StdDev float64 `json:"stddev_us"`
}

// FuncSpec describes one function of the simulated application.
type FuncSpec struct {
	ID    uint32 `json:"fid"`
	Name  string `json:"name"`
	Group string `json:"group"` // TAU group: TAU_USER, MPI, CUDA, IO, OpenMP, TAU_DEFAULT
	// Modes of the normal exclusive runtime (µs); weights sum to 1.
	Modes []Mode `json:"modes"`
	// GPU is true for kernels, which run on GPU virtual threads.
	GPU bool `json:"gpu"`
	// Anomaly is the kind of anomaly that may be injected into this
	// function, or "" if none is.
	Anomaly Kind `json:"anomaly,omitempty"`
	// NaturalMin and NaturalMax bound the normal exclusive runtimes (µs) of
	// a realistic-profile or replayed function (Modes is empty for them):
	// every normal execution lies in [NaturalMin, NaturalMax], and every
	// injected one at 1.5 NaturalMax or more.
	NaturalMin float64 `json:"natural_min_us,omitempty"`
	NaturalMax float64 `json:"natural_max_us,omitempty"`
}

// Multimodal reports whether the function has two or more runtime modes.
func (s FuncSpec) Multimodal() bool { return len(s.Modes) > 1 }

// NormalRange returns the bounds every normal exclusive runtime of the
// function lies within (µs, before rounding to whole microseconds).
func (s FuncSpec) NormalRange() (lo, hi float64) {
	if len(s.Modes) == 0 {
		return s.NaturalMin, s.NaturalMax
	}
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, m := range s.Modes {
		lo = min(lo, m.Mean-3*m.StdDev)
		hi = max(hi, m.Mean+3*m.StdDev)
	}
	return lo, hi
}

// Truth is one injected anomalous execution.
type Truth struct {
	PID  uint32 `json:"pid"`
	Rank uint32 `json:"rank"`
	Tid  uint32 `json:"tid"`
	FID  uint32 `json:"fid"`
	Func string `json:"func"`
	// Step is the io_step holding the execution's exit.
	Step  uint64 `json:"io_step"`
	Entry uint64 `json:"entry"`
	Exit  uint64 `json:"exit"`
	// Exclusive is the execution's exclusive runtime in µs.
	Exclusive uint64 `json:"runtime_exclusive"`
	Kind      Kind   `json:"kind"`
}

// T0 is the start time of every run, in µs since the epoch
// (2025-06-15T16:26:40Z), like TAU's timestamps.
const T0 uint64 = 1_750_000_000_000_000

// funcInfo is the generator's precomputed form of a funcDef.
type funcInfo struct {
	def      *funcDef
	mean, sd [3]float64
	cum      [3]uint64 // mode selection: draw < cum[i] selects mode i
	nmodes   int
	top, low float64 // highest and lowest mode means
	anomThr  uint64  // per-execution injection threshold for def.kind (0 = never)
	lo, hi   float64 // factor range of def.kind
	children []childInfo
}

type childInfo struct {
	fid      uint32
	min, max uint32
	probThr  uint64 // 0: always present
}

// Workload is a configured run. It is immutable after New and safe for
// concurrent use; each RankGen it hands out is owned by one goroutine.
type Workload struct {
	cfg      Config
	funcs    [numFuncs]funcInfo
	width    uint64 // io_step width W, µs
	runEnd   uint64 // T0 + Steps*W
	ioPeriod int    // io_write every ioPeriod timesteps
	// expected duration (µs) of one loop iteration and of the epilogue, per program
	iterDur, epiDur map[*threadProgram]uint64
	slowRank        uint32
	hasSlowRank     bool
	burstStartThr   uint64
	burstCallThr    uint64
	// tree, when set, is the realistic profile or a trace replay, which
	// generate through the tree engine instead.
	tree *treeRun
}

// New checks cfg and prepares the run of its profile.
func New(cfg Config) (*Workload, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("workload config: %w", err)
	}
	if cfg.Profile == ProfileRealistic {
		return fromTree(cfg, newRealistic(cfg)), nil
	}
	w := &Workload{cfg: cfg, iterDur: map[*threadProgram]uint64{}, epiDur: map[*threadProgram]uint64{}}
	for fid := range numFuncs {
		d := &funcTable[fid]
		fi := &w.funcs[fid]
		fi.def = d
		fi.nmodes = len(d.modes)
		fi.low = math.Inf(1)
		var acc float64
		for i, m := range d.modes {
			fi.mean[i], fi.sd[i] = m.Mean, m.StdDev
			acc += m.Weight
			fi.cum[i] = threshold(acc)
			fi.top = max(fi.top, m.Mean)
			fi.low = min(fi.low, m.Mean)
		}
		fi.cum[fi.nmodes-1] = ^uint64(0)
		if d.kind != "" {
			fi.lo, fi.hi = Factor(d.kind)
		}
		switch d.kind {
		case SlowCall:
			fi.anomThr = threshold(cfg.Rates.SlowCall)
		case SlowRank:
			fi.anomThr = threshold(cfg.Rates.SlowRank)
		case SlowBurst:
			fi.anomThr = threshold(cfg.Rates.BurstCall)
		case SlowKernel:
			fi.anomThr = threshold(cfg.Rates.SlowKernel)
		case FastOutlier:
			fi.anomThr = threshold(cfg.Rates.FastOutlier)
		}
		for _, c := range d.children {
			if c.gpuOnly && !cfg.GPU {
				continue
			}
			ci := childInfo{fid: c.fid, min: c.min, max: c.max}
			if c.prob > 0 {
				ci.probThr = threshold(c.prob)
			}
			fi.children = append(fi.children, ci)
		}
	}

	// Choose the step width so that a rank emits about EventsPerStep events
	// per step, from the expected events and duration of each thread's loop.
	var rate float64 // events per µs per rank
	for tid := range cfg.ThreadsPerRank {
		p := programOf(uint32(tid))
		ev, dur := w.expect(p.loop)
		rate += ev / dur
		if _, ok := w.iterDur[p]; !ok {
			w.iterDur[p] = uint64(dur)
			var epi float64
			for _, f := range p.epilogue {
				_, d := w.expect(f)
				epi += d
			}
			w.epiDur[p] = uint64(epi)
		}
	}
	w.width = max(1, uint64(math.Round(float64(cfg.EventsPerStep)/rate)))
	w.runEnd = T0 + uint64(cfg.Steps)*w.width
	w.ioPeriod = max(1, int(math.Round(float64(w.width)/float64(w.iterDur[&mainProgram]))))

	if cfg.Rates.SlowRank > 0 {
		w.hasSlowRank = true
		w.slowRank = uint32(mix(cfg.Seed, 0x510e) % uint64(cfg.Ranks))
	}
	w.burstStartThr = threshold(cfg.Rates.SlowBurst)
	w.burstCallThr = threshold(cfg.Rates.BurstCall)
	return w, nil
}

func programOf(tid uint32) *threadProgram {
	if tid == 0 {
		return &mainProgram
	}
	return &workerProgram
}

// expect returns the expected number of events and the expected duration
// (µs, on the calling thread) of one execution of fid, children included.
func (w *Workload) expect(fid uint32) (events, dur float64) {
	fi := &w.funcs[fid]
	d := fi.def
	for i := range fi.nmodes {
		dur += d.modes[i].Weight * d.modes[i].Mean
	}
	events = 2 + float64(len(d.counters))
	switch d.comm {
	case commHaloSend, commRandSend, commRandRecv:
		events++
	case commHaloRecv:
		events += 2
	}
	if d.launch {
		events += 4 // correlation counter on the CPU; kernel entry, exit and counter on the GPU
	}
	for _, c := range fi.children {
		n := float64(c.min+c.max) / 2
		if c.probThr != 0 {
			n *= float64(c.probThr) / math.MaxUint64
		}
		e, t := w.expect(c.fid)
		events += n * e
		dur += n * t
	}
	return events, dur
}

// fromTree wraps a tree workload.
func fromTree(cfg Config, tr *treeRun) *Workload {
	cfg.Ranks, cfg.Steps, cfg.PID, cfg.Seed = tr.ranks, tr.steps, tr.pid, tr.seed
	return &Workload{cfg: cfg, tree: tr, width: tr.width, runEnd: T0 + uint64(tr.steps)*tr.width}
}

// Config returns the run's configuration (for a trace replay: its ranks,
// steps, seed and pid, and Profile "replay").
func (w *Workload) Config() Config { return w.cfg }

// Profile returns the workload's profile: ProfileClassic, ProfileRealistic
// or ProfileReplay.
func (w *Workload) Profile() string {
	if w.tree != nil {
		return w.tree.profile
	}
	return ProfileClassic
}

// Kinds lists the anomaly kinds this workload can inject.
func (w *Workload) Kinds() []Kind {
	if w.tree != nil {
		return append([]Kind(nil), w.tree.kinds...)
	}
	return Kinds()
}

// StepWidth returns the io_step width W in µs; step s covers
// [T0+s*W, T0+(s+1)*W). In a replay of several applications each has its
// own width (RankStepWidth) and StepWidth is the widest.
func (w *Workload) StepWidth() uint64 { return w.width }

// RankStepWidth returns the io_step width of rank r's frames.
func (w *Workload) RankStepWidth(r uint32) uint64 {
	if w.tree != nil {
		return w.tree.apps[w.tree.rankApp[r]].width
	}
	return w.width
}

// StepOf returns the io_step holding timestamp ts (the last step for times
// after the nominal end of the run) on the ranks whose steps are
// StepWidth wide.
func (w *Workload) StepOf(ts uint64) uint64 {
	if ts < T0 {
		return 0
	}
	return min((ts-T0)/w.width, uint64(w.cfg.Steps-1))
}

// SlowRank returns the rank hit by SlowRank anomalies; ok is false when that
// kind is disabled (always, outside the classic profile).
func (w *Workload) SlowRank() (rank uint32, ok bool) { return w.slowRank, w.hasSlowRank }

// Functions returns the specs of all functions, indexed by function id.
func (w *Workload) Functions() []FuncSpec {
	if w.tree != nil {
		return w.tree.funcSpecs()
	}
	out := make([]FuncSpec, numFuncs)
	for fid := range numFuncs {
		d := &funcTable[fid]
		out[fid] = FuncSpec{ID: fid, Name: d.name, Group: d.group, Modes: append([]Mode(nil), d.modes...), GPU: d.gpu, Anomaly: d.kind}
	}
	return out
}

// Counters returns the counter names, indexed by counter id.
func (w *Workload) Counters() []string {
	if w.tree != nil {
		return append([]string(nil), w.tree.counters...)
	}
	return append([]string(nil), counterNames[:]...)
}

// CPUThreads is the number of CPU threads per rank (tids 0..CPUThreads-1).
func (w *Workload) CPUThreads() int { return w.cfg.ThreadsPerRank }

// GPUThreads returns the tids of the GPU virtual threads of each rank (none
// when the GPU is off, and for trace replays, whose GPU threads are those of
// their traces, marked by their metadata).
func (w *Workload) GPUThreads() []uint32 {
	if !w.cfg.GPU || w.Profile() == ProfileReplay {
		return nil
	}
	out := make([]uint32, numGPUStreams)
	for i := range out {
		out[i] = uint32(w.cfg.ThreadsPerRank + i)
	}
	return out
}
