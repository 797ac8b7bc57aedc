package workload

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"

	"github.com/kipimo-hpc/kipimo/internal/frame"
)

// RankGen generates one rank's frames, step after step. It is not safe for
// concurrent use; different RankGens (even of the same rank) are independent
// and may run on different goroutines.
type RankGen struct {
	w       *Workload
	rank    uint32
	step    uint64
	threads []*cpuThread
	gpu     []*gpuStream
	burst   []uint64 // per step: bit fid set while fid bursts on this rank
	slow    bool     // this rank is the slow rank
	left    uint32
	right   uint32
	seenF   [numFuncs]bool
	seenC   [numCounters]bool
	tree    *treeGen // realistic profile and trace replays
}

// pending holds events generated ahead of the current step's end.
type pending struct {
	ev    []frame.FuncEvent
	ce    []frame.CounterEvent
	cm    []frame.CommEvent
	truth []Truth
}

type cpuThread struct {
	g       *RankGen
	tid     uint32
	rng     splitMix
	clock   uint64
	prog    *threadProgram
	started bool
	done    bool
	iter    int
	corr    uint64
	pending
}

type gpuStream struct {
	tid  uint32
	free uint64 // earliest start of the next kernel
	pending
}

// Rank returns a new generator for rank r, positioned before step 0. It
// panics if r is not a rank of the run.
func (w *Workload) Rank(r uint32) *RankGen {
	if int64(r) >= int64(w.cfg.Ranks) {
		panic(fmt.Sprintf("workload: rank %d out of range [0, %d)", r, w.cfg.Ranks))
	}
	if w.tree != nil {
		return &RankGen{w: w, rank: r, tree: w.tree.rankGen(r)}
	}
	R := uint32(w.cfg.Ranks)
	g := &RankGen{w: w, rank: r, left: (r + R - 1) % R, right: (r + 1) % R}
	g.slow = w.hasSlowRank && r == w.slowRank
	for tid := range w.cfg.ThreadsPerRank {
		t := &cpuThread{g: g, tid: uint32(tid), prog: programOf(uint32(tid))}
		t.rng.s = mix(w.cfg.Seed, 1, uint64(r), uint64(tid))
		// Threads start within a few µs of each other.
		t.clock = T0 + 1 + t.rng.intn(20)
		g.threads = append(g.threads, t)
	}
	for _, tid := range w.GPUThreads() {
		g.gpu = append(g.gpu, &gpuStream{tid: tid})
	}
	if w.burstStartThr != 0 {
		g.burst = make([]uint64, w.cfg.Steps)
		rng := splitMix{mix(w.cfg.Seed, 2, uint64(r))}
		var cands []uint32
		for fid := range numFuncs {
			if funcTable[fid].kind == SlowBurst {
				cands = append(cands, fid)
			}
		}
		for s := range g.burst {
			if rng.next() >= w.burstStartThr {
				continue
			}
			fid := cands[rng.intn(uint64(len(cands)))]
			n := 2 + int(rng.intn(3))
			for k := s; k < s+n && k < len(g.burst); k++ {
				g.burst[k] |= 1 << fid
			}
		}
	}
	return g
}

// Rank returns the rank this generator produces.
func (g *RankGen) Rank() uint32 { return g.rank }

// Step returns the io_step the next call to Next produces.
func (g *RankGen) Step() uint64 {
	if g.tree != nil {
		return g.tree.step
	}
	return g.step
}

// Next fills f (after resetting it) with the rank's next io_step and returns
// the truth records of the anomalous executions whose exit falls in that
// step; the returned slice belongs to the caller. f's slices are reused and
// stay valid until f is reset. After the last step Next returns io.EOF.
func (g *RankGen) Next(f *frame.Frame) ([]Truth, error) {
	if g.tree != nil {
		return g.tree.next(f)
	}
	w := g.w
	if g.step >= uint64(w.cfg.Steps) {
		return nil, io.EOF
	}
	f.Reset()
	f.PID, f.Rank, f.Step = w.cfg.PID, g.rank, g.step
	f.TStart = T0 + g.step*w.width
	f.TEnd = f.TStart + w.width
	last := g.step == uint64(w.cfg.Steps-1)
	end := f.TEnd
	if last {
		end = math.MaxUint64
	}
	for _, t := range g.threads {
		for !t.done && (last || t.clock < end) {
			t.unit()
		}
	}
	if g.step == 0 {
		g.metadata(f)
	}
	var truth []Truth
	for _, t := range g.threads {
		truth = t.cut(f, end, truth)
	}
	for _, s := range g.gpu {
		truth = s.cut(f, end, truth)
	}
	if last {
		for _, e := range f.Events {
			f.TEnd = max(f.TEnd, e.TS+1)
		}
	}
	for _, e := range f.Events {
		if !g.seenF[e.FID] {
			g.seenF[e.FID] = true
			f.Funcs = append(f.Funcs, frame.Name{ID: e.FID, Name: funcTable[e.FID].name})
		}
	}
	for _, e := range f.CounterEvents {
		if !g.seenC[e.CID] {
			g.seenC[e.CID] = true
			f.Counters = append(f.Counters, frame.Name{ID: e.CID, Name: counterNames[e.CID]})
		}
	}
	g.step++
	return truth, nil
}

// cut moves the pending events with timestamps before end into f, and the
// truth records with exits before end into truth.
func (p *pending) cut(f *frame.Frame, end uint64, truth []Truth) []Truth {
	i := sort.Search(len(p.ev), func(i int) bool { return p.ev[i].TS >= end })
	f.Events = append(f.Events, p.ev[:i]...)
	p.ev = keepRest(p.ev, i)
	i = sort.Search(len(p.ce), func(i int) bool { return p.ce[i].TS >= end })
	f.CounterEvents = append(f.CounterEvents, p.ce[:i]...)
	p.ce = keepRest(p.ce, i)
	i = sort.Search(len(p.cm), func(i int) bool { return p.cm[i].TS >= end })
	f.Comms = append(f.Comms, p.cm[:i]...)
	p.cm = keepRest(p.cm, i)
	// Truth records are appended at exit time, so they are in exit order.
	i = sort.Search(len(p.truth), func(i int) bool { return p.truth[i].Exit >= end })
	truth = append(truth, p.truth[:i]...)
	p.truth = p.truth[:copy(p.truth, p.truth[i:])]
	return truth
}

// keepRest returns s without its first i elements. What is left between
// steps is the part of a call tree past the step's end: when it fills under
// a quarter of s's room it moves to a slice of its own size, so that a run
// of thousands of ranks does not keep a step's worth of room per rank and
// thread between the steps it generates.
func keepRest[T any](s []T, i int) []T {
	rest := s[i:]
	if cap(s) > 256 && 4*len(rest) < cap(s) {
		if len(rest) == 0 {
			return nil
		}
		return append(make([]T, 0, len(rest)), rest...)
	}
	return s[:copy(s, rest)]
}

// unit generates the thread's next piece of work: the root entry and the
// prologue, one loop iteration, or the epilogue and the root exit.
func (t *cpuThread) unit() {
	w := t.g.w
	p := t.prog
	if !t.started {
		t.started = true
		t.ev = append(t.ev, frame.FuncEvent{Tid: t.tid, Kind: frame.Entry, FID: p.root, TS: t.clock})
		t.idle()
		for _, f := range p.prologue {
			t.exec(f, 0)
			t.idle()
		}
		return
	}
	if t.clock+w.iterDur[p]+w.epiDur[p] > w.runEnd {
		for _, f := range p.epilogue {
			t.exec(f, 0)
			t.idle()
		}
		t.ev = append(t.ev, frame.FuncEvent{Tid: t.tid, Kind: frame.Exit, FID: p.root, TS: t.clock})
		t.done = true
		return
	}
	t.exec(p.loop, 0)
	t.iter++
	t.idle()
	if p.periodic != noFunc && t.iter%w.ioPeriod == 0 {
		t.exec(p.periodic, 0)
		t.idle()
	}
}

// idle advances the clock by the root function's own time between calls.
func (t *cpuThread) idle() { t.clock += 2 + (t.rng.next() & 3) }

// draw returns the exclusive runtime of an execution of fi entered at entry,
// and the anomaly kind injected into it ("" for a normal execution).
func (t *cpuThread) draw(fi *funcInfo, fid uint32, entry uint64) (uint64, Kind) {
	x := t.rng.next()
	mode := 0
	if fi.nmodes > 1 {
		y := t.rng.next()
		for y >= fi.cum[mode] {
			mode++
		}
	}
	v := fi.mean[mode] + fi.sd[mode]*noise3(x)
	var kind Kind
	if fi.anomThr != 0 {
		switch k := fi.def.kind; k {
		case SlowCall, SlowKernel:
			if t.rng.next() < fi.anomThr {
				v, kind = fi.top*(fi.lo+(fi.hi-fi.lo)*t.rng.float()), k
			}
		case SlowRank:
			if t.g.slow && t.rng.next() < fi.anomThr {
				v, kind = fi.top*(fi.lo+(fi.hi-fi.lo)*t.rng.float()), k
			}
		case SlowBurst:
			if t.g.burst != nil && t.g.burst[t.g.w.StepOf(entry)]&(1<<fid) != 0 && t.rng.next() < fi.anomThr {
				v, kind = fi.top*(fi.lo+(fi.hi-fi.lo)*t.rng.float()), k
			}
		case FastOutlier:
			if t.rng.next() < fi.anomThr {
				v, kind = fi.low*(fi.lo+(fi.hi-fi.lo)*t.rng.float()), k
			}
		}
	}
	return max(1, uint64(v+0.5)), kind
}

// exec generates one execution of fid, its children first-to-last, and
// advances the thread's clock to its exit. ord is the call's ordinal among
// its siblings of the same function.
func (t *cpuThread) exec(fid uint32, ord uint32) {
	fi := &t.g.w.funcs[fid]
	var counts [8]uint32
	var n uint32
	for i := range fi.children {
		c := &fi.children[i]
		if c.probThr != 0 && t.rng.next() >= c.probThr {
			continue
		}
		k := c.min
		if c.max > c.min {
			k += uint32(t.rng.intn(uint64(c.max - c.min + 1)))
		}
		counts[i] = k
		n += k
	}
	entry := t.clock
	excl, kind := t.draw(fi, fid, entry)
	// Every gap between children must hold at least 2 µs so that counters
	// and messages sit strictly inside the execution's own time.
	excl = max(excl, 2*uint64(n+1))
	t.ev = append(t.ev, frame.FuncEvent{Tid: t.tid, Kind: frame.Entry, FID: fid, TS: entry})
	last := excl
	if n > 0 {
		gap := excl / uint64(n+1)
		for i := range fi.children {
			c := fi.children[i].fid
			for j := range counts[i] {
				t.clock += gap
				t.exec(c, j)
			}
		}
		last = excl - uint64(n)*gap
	}
	if d := fi.def; len(d.counters) > 0 || d.comm != commNone || d.launch {
		t.extras(d, ord, t.clock+last/2, excl)
	}
	t.clock += last
	t.ev = append(t.ev, frame.FuncEvent{Tid: t.tid, Kind: frame.Exit, FID: fid, TS: t.clock})
	if kind != "" {
		t.record(&t.pending, t.tid, fid, kind, entry, t.clock, excl)
	}
}

func (t *cpuThread) record(p *pending, tid, fid uint32, kind Kind, entry, exit, excl uint64) {
	g := t.g
	p.truth = append(p.truth, Truth{
		PID: g.w.cfg.PID, Rank: g.rank, Tid: tid, FID: fid, Func: funcTable[fid].name,
		Step: g.w.StepOf(exit), Entry: entry, Exit: exit, Exclusive: excl, Kind: kind,
	})
}

// extras emits what happens inside an execution's own time at ts: counter
// samples, messages, and a kernel launch.
func (t *cpuThread) extras(d *funcDef, ord uint32, ts, excl uint64) {
	g := t.g
	for _, c := range d.counters {
		var v uint64
		r := t.rng.next()
		switch c {
		case cTotIns: // about 2.4 instructions per ns, ±10%
			v = excl * (2160 + r%480)
		case cL2TCM:
			v = excl * (6 + r%12)
		case cAllreduceBytes:
			v = 8 << (r % 3)
		}
		t.ce = append(t.ce, frame.CounterEvent{Tid: t.tid, CID: c, Value: v, TS: ts})
	}
	switch d.comm {
	case commHaloSend:
		partner, tag := g.left, uint32(tagHaloLeft)
		if ord%2 == 1 {
			partner, tag = g.right, tagHaloRight
		}
		t.cm = append(t.cm, frame.CommEvent{Tid: t.tid, Kind: frame.Send, Tag: tag, Partner: partner, Bytes: t.haloBytes(), TS: ts})
	case commHaloRecv:
		t.cm = append(t.cm,
			frame.CommEvent{Tid: t.tid, Kind: frame.Recv, Tag: tagHaloRight, Partner: g.left, Bytes: t.haloBytes(), TS: ts},
			frame.CommEvent{Tid: t.tid, Kind: frame.Recv, Tag: tagHaloLeft, Partner: g.right, Bytes: t.haloBytes(), TS: ts})
	case commRandSend, commRandRecv:
		kind := frame.Send
		if d.comm == commRandRecv {
			kind = frame.Recv
		}
		t.cm = append(t.cm, frame.CommEvent{Tid: t.tid, Kind: kind, Tag: tagMigrate, Partner: t.randomPeer(), Bytes: 24 * (16 + t.rng.intn(240)), TS: ts})
	}
	if d.launch {
		t.launch(ord, ts)
	}
}

// haloBytes is the size of one halo message: 2,000-3,000 atoms of 24 bytes.
func (t *cpuThread) haloBytes() uint64 { return 24 * (2000 + t.rng.intn(1000)) }

// randomPeer returns a rank other than this one (this one in a 1-rank run).
func (t *cpuThread) randomPeer() uint32 {
	R := uint64(t.g.w.cfg.Ranks)
	if R == 1 {
		return 0
	}
	p := uint32(t.rng.intn(R - 1))
	if p >= t.g.rank {
		p++
	}
	return p
}

// launch emits the correlation id of a kernel launched at ts and the
// kernel's execution on its GPU stream: it starts a few µs after the launch,
// or when the previous kernel on that stream ends.
func (t *cpuThread) launch(ord uint32, ts uint64) {
	g := t.g
	if len(g.gpu) == 0 {
		return
	}
	// Only thread 0 launches kernels (see threadProgram), so one sequence
	// per thread numbers the launches of the rank 1, 2, 3, ... as CUPTI does.
	t.corr++
	corr := t.corr
	t.ce = append(t.ce, frame.CounterEvent{Tid: t.tid, CID: cCorrelation, Value: corr, TS: ts})
	kfid := kernelOf[int(ord)%len(kernelOf)]
	s := g.gpu[int(ord)%len(g.gpu)]
	start := max(ts+3+t.rng.intn(6), s.free)
	excl, kind := t.draw(&g.w.funcs[kfid], kfid, start)
	exit := start + excl
	s.ev = append(s.ev,
		frame.FuncEvent{Tid: s.tid, Kind: frame.Entry, FID: kfid, TS: start},
		frame.FuncEvent{Tid: s.tid, Kind: frame.Exit, FID: kfid, TS: exit})
	s.ce = append(s.ce, frame.CounterEvent{Tid: s.tid, CID: cCorrelation, Value: corr, TS: start})
	s.free = exit + 1 + t.rng.intn(3)
	if kind != "" {
		t.record(&s.pending, s.tid, kfid, kind, start, exit, excl)
	}
}

// metadata adds the first frame's metadata: node and run facts on thread 0,
// the OpenMP thread number on every CPU thread, and the CUDA keys that mark
// the GPU virtual threads.
func (g *RankGen) metadata(f *frame.Frame) {
	w := g.w
	const ranksPerNode = 4
	host := fmt.Sprintf("nid%05d", 1000+int(g.rank)/ranksPerNode)
	md := func(tid uint32, k, v string) { f.Metadata = append(f.Metadata, frame.Meta{Tid: tid, Key: k, Value: v}) }
	md(0, "Hostname", host)
	md(0, "Node Name", host)
	md(0, "MPI Processor Name", host)
	md(0, "MPI Rank", strconv.FormatUint(uint64(g.rank), 10))
	md(0, "MPI Size", strconv.Itoa(w.cfg.Ranks))
	md(0, "CPU Type", "AMD EPYC 7763 64-Core Processor")
	md(0, "CPU Vendor", "AuthenticAMD")
	md(0, "CPU Cores", "64")
	md(0, "CPU MHz", "2450.000")
	md(0, "Cache Size", "512 KB")
	md(0, "Memory Size", "263921080 kB")
	md(0, "OS Name", "Linux")
	md(0, "OS Release", "5.14.21-150500.55.49_13.0.56-cray_shasta_c")
	md(0, "OS Version", "#1 SMP PREEMPT_DYNAMIC Tue Mar 12 12:00:00 UTC 2024")
	md(0, "OS Machine", "x86_64")
	md(0, "Executable", "/opt/apps/mdsim/bin/mdsim")
	md(0, "Command Line", "./mdsim -in in.lj")
	md(0, "CWD", "/scratch/run")
	md(0, "Starting Timestamp", strconv.FormatUint(T0, 10))
	md(0, "TAU Version", "2.33.1")
	md(0, "TAU_TRACE", "on")
	md(0, "TAU_PROFILE", "off")
	md(0, "TAU_PLUGINS", "libTAU-adios2-trace-plugin.so")
	md(0, "OMP_NUM_THREADS", strconv.Itoa(w.cfg.ThreadsPerRank))
	md(0, "Workload Seed", strconv.FormatUint(w.cfg.Seed, 10))
	for tid := range w.cfg.ThreadsPerRank {
		md(uint32(tid), "OMP Thread", strconv.Itoa(tid))
	}
	for i, s := range g.gpu {
		md(s.tid, "CUDA Context", "1")
		md(s.tid, "CUDA Device", strconv.Itoa(int(g.rank)%ranksPerNode))
		md(s.tid, "CUDA Stream", strconv.Itoa(13+i))
		md(s.tid, "GPU Name", "NVIDIA A100-SXM4-40GB")
	}
}
