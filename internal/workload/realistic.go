package workload

import (
	"fmt"
	"math"
	"strconv"

	"github.com/kipimo-hpc/kipimo/internal/frame"
)

// Profiles of the synthetic workload (Config.Profile).
const (
	// ProfileClassic is the original simulated MD code: every function's
	// runtimes are one to three bounded bell curves.
	ProfileClassic = "classic"
	// ProfileRealistic has the shapes real runtimes show: log-normal tails,
	// bimodal kernels, wrappers whose values are only 0, 1 or 2 µs, rank
	// imbalance, a slow drift over the run and heavy-tailed MPI waits. Its
	// only anomalies (kind BeyondMax) lie 1.5-3x beyond each function's
	// natural maximum, the largest value it can take on any rank and step.
	ProfileRealistic = "realistic"
	// ProfileReplay names workloads made by FromTraces.
	ProfileReplay = "replay"
)

// Profiles lists the profiles New accepts.
var Profiles = []string{ProfileClassic, ProfileRealistic}

// RealisticEventsPerStep is the events per rank per step of the realistic
// profile when Config.EventsPerStep is 0: 8 ranks x 40 steps give about
// 2.6M events.
const RealisticEventsPerStep = 8200

// realisticBuilder assembles the realistic profile's template.
type realisticBuilder struct {
	tr       *treeRun
	cfg      Config
	rankFrac []float64
	cidOf    map[string]uint32
}

func (b *realisticBuilder) fn(name, group string, gpu bool, d *synth) uint32 {
	f := tfunc{name: name, group: group, gpu: gpu}
	if d != nil { // roots have no distribution: they span the run
		f.d = d
	}
	b.tr.funcs = append(b.tr.funcs, f)
	return uint32(len(b.tr.funcs) - 1)
}

func (b *realisticBuilder) cid(name string) uint32 {
	if id, ok := b.cidOf[name]; ok {
		return id
	}
	b.tr.counters = append(b.tr.counters, name)
	id := uint32(len(b.tr.counters) - 1)
	b.cidOf[name] = id
	return id
}

// Distribution constructors; imbalanced and drifting ones scale with the
// rank and the step.
func (b *realisticBuilder) logn(median, sd, imb, drift float64) *synth {
	return &synth{shape: shapeLogNormal, a: median, b: sd, imb: imb, drift: drift, rankFrac: b.rankFrac, steps: uint64(b.cfg.Steps)}
}

func (b *realisticBuilder) bimodal(w, m1, s1, m2, s2, imb, drift float64) *synth {
	return &synth{shape: shapeBimodal, w: w, a: m1, c: s1, b: m2, d: s2, imb: imb, drift: drift, rankFrac: b.rankFrac, steps: uint64(b.cfg.Steps)}
}

func (b *realisticBuilder) pareto(scale, alpha, limit float64) *synth {
	return &synth{shape: shapePareto, a: scale, b: alpha, c: limit}
}

func levels(w ...float64) *synth {
	cum := make([]float64, len(w))
	acc := 0.0
	for i, x := range w {
		acc += x
		cum[i] = acc
	}
	cum[len(cum)-1] = 1
	return &synth{shape: shapeLevels, levels: cum}
}

// node builds a template node whose own time is spread evenly around its
// children; extras go in the middle of the last own-time segment.
func node(fid uint32, extras []textra, children ...*tnode) *tnode {
	n := &tnode{fid: fid, children: children, gaps: make([]uint64, len(children)+1)}
	for i := range n.gaps {
		n.gaps[i] = 2
	}
	for _, x := range extras {
		x.gap, x.off = int32(len(children)), 1
		n.extras = append(n.extras, x)
	}
	return n
}

func rep(n *tnode, k int) []*tnode {
	out := make([]*tnode, k)
	for i := range out {
		out[i] = n
	}
	return out
}

func cat(parts ...[]*tnode) []*tnode {
	var out []*tnode
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// expected is the expected duration of a subtree (µs).
func (tr *treeRun) expected(n *tnode) float64 {
	d := tr.funcs[n.fid].d.meanValue()
	for _, c := range n.children {
		d += tr.expected(c)
	}
	return d
}

func countEvents(n *tnode) int {
	e := 2 + len(n.extras)
	for _, c := range n.children {
		e += countEvents(c)
	}
	return e
}

// newRealistic prepares the realistic profile.
func newRealistic(cfg Config) *treeRun {
	tr := &treeRun{profile: ProfileRealistic, steps: cfg.Steps, ranks: cfg.Ranks, pid: cfg.PID, seed: cfg.Seed, corrCID: noFunc}
	b := &realisticBuilder{tr: tr, cfg: cfg, cidOf: map[string]uint32{}}
	b.rankFrac = make([]float64, cfg.Ranks)
	for r := range b.rankFrac {
		rng := splitMix{mix(cfg.Seed, 4, uint64(r))}
		b.rankFrac[r] = rng.float()
	}
	R := uint32(cfg.Ranks)
	left, right := (R-1)%R, 1%R
	ins := b.cid("PAPI_TOT_INS")
	arBytes := b.cid("Message size for all-reduce")
	hw := func() []textra { return []textra{{cid: ins, perUS: 2400}} }

	fMain := b.fn("main", "TAU_DEFAULT", false, nil)
	fStep := b.fn("timestep", "TAU_USER", false, b.logn(12, 0.3, 0, 0))
	fForces := b.fn("compute_forces", "TAU_USER", false, b.logn(30, 0.3, 0.1, 0))
	fPair := b.fn("pair_kernel", "TAU_USER", false, b.bimodal(0.7, 60, 3, 140, 6, 0.25, 0.15))
	fNeigh := b.fn("neighbor_check", "TAU_USER", false, levels(0.5, 0.4, 0.1))
	fBonded := b.fn("bonded_kernel", "TAU_USER", false, b.logn(80, 0.35, 0.2, 0.1))
	fZero := b.fn("vec_zero", "TAU_USER", false, levels(0.7, 0.3))
	fHalo := b.fn("halo_exchange", "TAU_USER", false, b.logn(15, 0.25, 0, 0))
	fPack := b.fn("pack_buffer", "TAU_USER", false, b.bimodal(0.6, 25, 1.5, 45, 2, 0, 0))
	fTypeSize := b.fn("MPI_Type_size", "MPI", false, levels(0.6, 0.35, 0.05))
	fIrecv := b.fn("MPI_Irecv", "MPI", false, b.logn(3, 0.2, 0, 0))
	fIsend := b.fn("MPI_Isend", "MPI", false, b.logn(5, 0.25, 0, 0))
	fWaitall := b.fn("MPI_Waitall", "MPI", false, b.pareto(8, 1.1, 900))
	fUnpack := b.fn("unpack_buffer", "TAU_USER", false, b.bimodal(0.6, 25, 1.5, 45, 2, 0, 0))
	fIntegrate := b.fn("integrate", "TAU_USER", false, b.logn(150, 0.2, 0.2, 0.2))
	fConstr := b.fn("apply_constraints", "TAU_USER", false, b.bimodal(0.8, 40, 2, 110, 4, 0.1, 0))
	fAllreduce := b.fn("MPI_Allreduce", "MPI", false, b.pareto(4, 0.8, 1800))

	halo := []textra{{comm: true, msg: frame.CommEvent{Kind: frame.Send, Tag: tagHaloLeft, Partner: left, Bytes: 48000}, rel: true}}
	haloR := []textra{{comm: true, msg: frame.CommEvent{Kind: frame.Send, Tag: tagHaloRight, Partner: right, Bytes: 48000}, rel: true}}
	recv := []textra{
		{comm: true, msg: frame.CommEvent{Kind: frame.Recv, Tag: tagHaloRight, Partner: left, Bytes: 48000}, rel: true},
		{comm: true, msg: frame.CommEvent{Kind: frame.Recv, Tag: tagHaloLeft, Partner: right, Bytes: 48000}, rel: true},
	}
	pair := node(fPair, hw())
	forces := node(fForces, nil, cat(rep(pair, 4), rep(node(fNeigh, nil), 6), []*tnode{node(fBonded, hw())}, rep(node(fZero, nil), 4))...)
	haloX := node(fHalo, nil, cat(
		rep(node(fPack, nil), 2), rep(node(fTypeSize, nil), 4), rep(node(fIrecv, nil), 2),
		[]*tnode{node(fIsend, halo), node(fIsend, haloR), node(fWaitall, recv)},
		rep(node(fUnpack, nil), 2))...)
	integ := node(fIntegrate, hw(), node(fConstr, nil))
	allred := node(fAllreduce, []textra{{cid: arBytes, value: 8}})
	stepKids := []*tnode{forces, haloX, integ}

	var gpuTrees [][]ttree
	if cfg.GPU {
		corr := b.cid(CorrelationCounter)
		tr.corrCID = corr
		fOffload := b.fn("gpu_offload", "TAU_USER", false, b.logn(8, 0.2, 0, 0))
		fLaunch := b.fn("cudaLaunchKernel", "CUDA", false, b.logn(6, 0.15, 0, 0))
		fSync := b.fn("cudaStreamSynchronize", "CUDA", false, b.pareto(10, 1.0, 2000))
		kernels := []uint32{
			b.fn("nonbonded_kernel", "CUDA", true, b.bimodal(0.75, 300, 10, 520, 15, 0.15, 0.1)),
			b.fn("pme_spread_kernel", "CUDA", true, b.logn(120, 0.3, 0, 0.1)),
			b.fn("integrate_kernel", "CUDA", true, b.logn(60, 0.1, 0, 0)),
		}
		var launches []*tnode
		for k := range kernels {
			launches = append(launches, node(fLaunch, []textra{{cid: corr, value: uint64(k + 1)}}))
		}
		stepKids = append(stepKids, node(fOffload, nil, append(launches, node(fSync, nil))...))
		// Kernels start where the launches are expected.
		var at float64
		for _, c := range stepKids[:len(stepKids)-1] {
			at += tr.expected(c)
		}
		at += tr.funcs[fStep].d.meanValue() / 2
		gpuTrees = make([][]ttree, numGPUStreams)
		for k, kf := range kernels {
			at += tr.funcs[fLaunch].d.meanValue() + 5
			kn := &tnode{fid: kf, gaps: []uint64{2}, extras: []textra{{cid: corr, value: uint64(k + 1)}}}
			s := k % numGPUStreams
			gpuTrees[s] = append(gpuTrees[s], ttree{off: uint64(at), root: kn})
		}
	}
	stepKids = append(stepKids, allred)
	timestep := node(fStep, nil, stepKids...)

	fWorker := b.fn("omp_thread_main", "OpenMP", false, nil)
	fRegion := b.fn("omp_parallel_region", "OpenMP", false, b.logn(10, 0.2, 0, 0))
	fChunk := b.fn("compute_chunk", "TAU_USER", false, b.bimodal(0.5, 70, 3, 160, 6, 0.25, 0.15))
	fReduce := b.fn("vec_reduce", "TAU_USER", false, b.logn(20, 0.15, 0, 0))
	fBarrier := b.fn("omp_barrier", "OpenMP", false, b.pareto(3, 1.2, 600))
	region := node(fRegion, nil, cat(rep(node(fChunk, hw()), 3), rep(node(fReduce, nil), 3), []*tnode{node(fBarrier, nil)})...)

	threads := []tthread{{tid: 0, root: fMain, trees: []ttree{{root: timestep}}}}
	events := countEvents(timestep)
	period := tr.expected(timestep)
	for tid := 1; tid < cfg.ThreadsPerRank; tid++ {
		threads = append(threads, tthread{tid: uint32(tid), root: fWorker, trees: []ttree{{root: region}}})
		events += countEvents(region)
		period = max(period, tr.expected(region))
	}
	for i, trees := range gpuTrees {
		threads = append(threads, tthread{tid: uint32(cfg.ThreadsPerRank + i), root: noFunc, trees: trees})
		for _, t := range trees {
			events += countEvents(t.root)
			period = max(period, float64(t.off)+tr.expected(t.root))
		}
	}
	app := &tapp{name: "simulated MD code", period: uint64(math.Ceil(period*1.4)) + 20, corrSpan: 3}
	for r := range cfg.Ranks {
		app.ranks = append(app.ranks, trank{threads: threads, meta: realisticMeta(cfg, uint32(r))})
	}
	tr.apps = []*tapp{app}
	tr.assignRanks()
	eps := cfg.EventsPerStep
	if eps == 0 {
		eps = RealisticEventsPerStep
	}
	tr.finish(eps, cfg.Rates.BeyondMax)
	return tr
}

// realisticMeta is rank r's first-frame metadata.
func realisticMeta(cfg Config, r uint32) []frame.Meta {
	const ranksPerNode = 4
	host := fmt.Sprintf("nid%05d", 1000+int(r)/ranksPerNode)
	md := []frame.Meta{
		{Key: "Hostname", Value: host},
		{Key: "Node Name", Value: host},
		{Key: "Executable", Value: "/opt/apps/mdsim/bin/mdsim"},
		{Key: "Starting Timestamp", Value: strconv.FormatUint(T0, 10)},
		{Key: "TAU_TRACE", Value: "on"},
		{Key: "OMP_NUM_THREADS", Value: strconv.Itoa(cfg.ThreadsPerRank)},
		{Key: "Workload Seed", Value: strconv.FormatUint(cfg.Seed, 10)},
	}
	for tid := range cfg.ThreadsPerRank {
		md = append(md, frame.Meta{Tid: uint32(tid), Key: "OMP Thread", Value: strconv.Itoa(tid)})
	}
	if cfg.GPU {
		for i := range numGPUStreams {
			tid := uint32(cfg.ThreadsPerRank + i)
			md = append(md,
				frame.Meta{Tid: tid, Key: "CUDA Context", Value: "1"},
				frame.Meta{Tid: tid, Key: "CUDA Device", Value: strconv.Itoa(int(r) % ranksPerNode)},
				frame.Meta{Tid: tid, Key: "CUDA Stream", Value: strconv.Itoa(13 + i)})
		}
	}
	return md
}
