package workload

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/frame"
)

func TestCallTreeWellFormed(t *testing.T) {
	for _, tc := range testConfigs() {
		t.Run(tc.name, func(t *testing.T) {
			d := generate(t, tc.cfg) // fails on any malformed stream
			if d.maxDepth < 5 {
				t.Errorf("deepest call stack has depth %d, want >= 5", d.maxDepth)
			}
			t.Log(d)
		})
	}
}

func TestExecutionsSpanSteps(t *testing.T) {
	for _, tc := range testConfigs() {
		if tc.cfg.Steps < 2 {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			d := generate(t, tc.cfg)
			var roots, others int
			for _, x := range d.execs {
				if x.entryStep == x.exitStep {
					continue
				}
				if x.fid == fMain || x.fid == fWorkerMain {
					roots++
				} else {
					others++
				}
			}
			if roots == 0 || others == 0 {
				t.Errorf("executions spanning a step boundary: %d roots, %d others; want both > 0", roots, others)
			}
		})
	}
}

// runAll generates every rank of w on its own goroutine, in reverse order,
// to show that scheduling does not change the output.
func runAll(t *testing.T, w *Workload, concurrent bool) ([][]frame.Frame, [][]Truth) {
	t.Helper()
	R := w.Config().Ranks
	frames := make([][]frame.Frame, R)
	truth := make([][]Truth, R)
	var wg sync.WaitGroup
	errs := make([]error, R)
	one := func(r int) {
		g := w.Rank(uint32(r))
		for {
			var f frame.Frame
			tr, err := g.Next(&f)
			if err == io.EOF {
				return
			}
			if err != nil {
				errs[r] = err
				return
			}
			frames[r] = append(frames[r], f)
			truth[r] = append(truth[r], tr...)
		}
	}
	for r := R - 1; r >= 0; r-- {
		if concurrent {
			wg.Go(func() { one(r) })
		} else {
			one(r)
		}
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return frames, truth
}

func TestDeterminism(t *testing.T) {
	base := DefaultConfig()
	base.Ranks, base.Steps, base.EventsPerStep, base.GPU = 4, 5, 5000, true
	base.Rates = DefaultRates.Scale(5)
	other := base
	other.Seed++
	for _, tc := range []struct {
		name       string
		a, b       Config
		concurrent bool
		same       bool
	}{
		{"same seed, sequential", base, base, false, true},
		{"same seed, concurrent ranks", base, base, true, true},
		{"other seed", base, other, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wa, err := New(tc.a)
			if err != nil {
				t.Fatal(err)
			}
			wb, err := New(tc.b)
			if err != nil {
				t.Fatal(err)
			}
			fa, ta := runAll(t, wa, false)
			fb, tb := runAll(t, wb, tc.concurrent)
			same := reflect.DeepEqual(fa, fb) && reflect.DeepEqual(ta, tb)
			if same != tc.same {
				t.Errorf("runs identical = %v, want %v", same, tc.same)
			}
		})
	}
}

func TestFunctions(t *testing.T) {
	w, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	fs := w.Functions()
	if len(fs) < 30 {
		t.Errorf("%d functions, want tens", len(fs))
	}
	names := map[string]bool{}
	modes := map[int]int{}
	kinds := map[Kind]int{}
	for i, f := range fs {
		if f.ID != uint32(i) {
			t.Errorf("function %d has id %d", i, f.ID)
		}
		if names[f.Name] {
			t.Errorf("function name %q twice", f.Name)
		}
		names[f.Name] = true
		modes[len(f.Modes)]++
		kinds[f.Anomaly]++
		var sum float64
		for j, m := range f.Modes {
			sum += m.Weight
			if m.Mean-3*m.StdDev < 1 {
				t.Errorf("%s mode %d reaches below 1 µs", f.Name, j)
			}
			if j > 0 {
				p := f.Modes[j-1]
				// Neighbouring modes are at least 6 (pooled) standard
				// deviations apart beyond their supports.
				if gap := (m.Mean - 3*m.StdDev) - (p.Mean + 3*p.StdDev); gap < 6*math.Max(m.StdDev, p.StdDev) {
					t.Errorf("%s modes %d and %d are only %.1f µs apart", f.Name, j-1, j, gap)
				}
			}
		}
		if math.Abs(sum-1) > 1e-9 {
			t.Errorf("%s mode weights sum to %v", f.Name, sum)
		}
	}
	for _, n := range []int{1, 2, 3} {
		if modes[n] == 0 {
			t.Errorf("no function with %d modes", n)
		}
	}
	for _, k := range Kinds() {
		if kinds[k] == 0 {
			t.Errorf("no function can get anomaly kind %s", k)
		}
	}
	for _, want := range []string{"main", "timestep", "compute_forces", "MPI_Allreduce", "MPI_Isend", "MPI_Waitall", "cudaLaunchKernel", "io_write"} {
		if !names[want] {
			t.Errorf("no function %q", want)
		}
	}
}

// normalAndAnomalous splits the executions of each function into normal and
// injected ones (by the truth), skipping the thread roots whose own time is
// the idle time between calls.
func (d *runData) byFunction(t *testing.T) (normal, anomalous map[uint32][]uint64) {
	t.Helper()
	type key struct {
		rank, tid, fid uint32
		entry          uint64
	}
	injected := map[key]bool{}
	for _, tr := range d.truth {
		injected[key{tr.Rank, tr.Tid, tr.FID, tr.Entry}] = true
	}
	normal, anomalous = map[uint32][]uint64{}, map[uint32][]uint64{}
	for _, x := range d.execs {
		if x.fid == fMain || x.fid == fWorkerMain {
			continue
		}
		if injected[key{x.rank, x.tid, x.fid, x.entry}] {
			anomalous[x.fid] = append(anomalous[x.fid], x.excl)
		} else {
			normal[x.fid] = append(normal[x.fid], x.excl)
		}
	}
	return normal, anomalous
}

func TestDistributions(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Ranks, cfg.Steps, cfg.GPU = 4, 10, true
	cfg.Rates = DefaultRates.Scale(3)
	cfg.Rates.SlowBurst = 0.2
	d := generate(t, cfg)
	normal, anomalous := d.byFunction(t)
	specs := d.w.Functions()
	for fid, spec := range specs {
		vals := normal[uint32(fid)]
		if len(vals) == 0 {
			continue
		}
		t.Run(spec.Name, func(t *testing.T) {
			// Every normal execution lies inside one of the modes' supports
			// (whole µs: rounding moves a value by at most 0.5).
			counts := make([]int, len(spec.Modes))
			for _, v := range vals {
				found := false
				for i, m := range spec.Modes {
					if float64(v) >= m.Mean-3*m.StdDev-0.5 && float64(v) <= m.Mean+3*m.StdDev+0.5 {
						counts[i]++
						found = true
						break
					}
				}
				if !found {
					t.Fatalf("normal exclusive runtime %d µs outside every mode %+v", v, spec.Modes)
				}
			}
			// Each mode holds its share of the executions.
			if len(vals) >= 500 {
				for i, m := range spec.Modes {
					share := float64(counts[i]) / float64(len(vals))
					if math.Abs(share-m.Weight) > 0.05 {
						t.Errorf("mode %d holds %.3f of %d executions, want %.2f", i, share, len(vals), m.Weight)
					}
				}
			}
			// Injected anomalies lie far outside every mode.
			lo, hi := spec.NormalRange()
			for _, v := range anomalous[uint32(fid)] {
				if spec.Anomaly == FastOutlier {
					if float64(v) > lo/2 {
						t.Errorf("fast outlier of %d µs is not below half the normal minimum %.1f", v, lo)
					}
				} else if float64(v) < 2*hi {
					t.Errorf("%s anomaly of %d µs is not above twice the normal maximum %.1f", spec.Anomaly, v, hi)
				}
			}
			if spec.Anomaly == "" && len(anomalous[uint32(fid)]) > 0 {
				t.Errorf("%d anomalies injected into a function without an anomaly kind", len(anomalous[uint32(fid)]))
			}
		})
	}
}

// TestSeparable checks, on the default run, that a plain six-sigma rule
// flags every injected anomaly and no normal execution when it judges each
// step's executions (by exit) against per-function statistics accumulated
// over all ranks up to and including that step, anomalies included, as a
// streaming detector does.
func TestSeparable(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Steps = 8
	cfg.GPU = true
	d := generate(t, cfg)
	type key struct {
		rank, tid, fid uint32
		entry          uint64
	}
	injected := map[key]Kind{}
	for _, tr := range d.truth {
		injected[key{tr.Rank, tr.Tid, tr.FID, tr.Entry}] = tr.Kind
	}
	byStep := make([][]execRec, cfg.Steps)
	for _, x := range d.execs {
		if x.fid != fMain && x.fid != fWorkerMain { // own time is idle time
			byStep[x.exitStep] = append(byStep[x.exitStep], x)
		}
	}
	var n, mean, m2 [numFuncs]float64
	tp, fn := map[Kind]int{}, map[Kind]int{}
	var fp, normals int
	for _, xs := range byStep {
		for _, x := range xs {
			v := float64(x.excl)
			n[x.fid]++
			delta := v - mean[x.fid]
			mean[x.fid] += delta / n[x.fid]
			m2[x.fid] += delta * (v - mean[x.fid])
		}
		for _, x := range xs {
			f := x.fid
			flagged := n[f] > 1 && math.Abs(float64(x.excl)-mean[f]) > 6*math.Sqrt(m2[f]/(n[f]-1))
			kind, isAnomaly := injected[key{x.rank, x.tid, f, x.entry}]
			switch {
			case isAnomaly && flagged:
				tp[kind]++
			case isAnomaly:
				fn[kind]++
			case flagged:
				fp++
			default:
				normals++
			}
		}
	}
	var tps, fns int
	for _, k := range Kinds() {
		t.Logf("%-12s %5d flagged, %3d missed", k, tp[k], fn[k])
		tps += tp[k]
		fns += fn[k]
		if tp[k] == 0 {
			t.Errorf("no %s anomaly in the default run with the GPU on", k)
		}
	}
	recall := float64(tps) / float64(tps+fns)
	t.Logf("six-sigma, streaming: recall %.4f, %d of %d normal executions flagged (%v)", recall, fp, normals+fp, d)
	if recall < 0.95 || fp > 0 {
		t.Errorf("recall %.4f with %d false positives, want >= 0.95 and none", recall, fp)
	}
	frac := float64(len(d.truth)) / float64(len(d.execs))
	if frac < 0.0005 || frac > 0.005 {
		t.Errorf("default run: %.4f%% of executions anomalous, want 0.05%%-0.5%%", 100*frac)
	}
}

func TestTruthMatchesExecutions(t *testing.T) {
	for _, tc := range testConfigs() {
		t.Run(tc.name, func(t *testing.T) {
			d := generate(t, tc.cfg)
			type key struct {
				rank, tid, fid uint32
				entry          uint64
			}
			execs := map[key]execRec{}
			for _, x := range d.execs {
				execs[key{x.rank, x.tid, x.fid, x.entry}] = x
			}
			seen := map[key]bool{}
			kinds := map[Kind]int{}
			for _, tr := range d.truth {
				k := key{tr.Rank, tr.Tid, tr.FID, tr.Entry}
				x, ok := execs[k]
				switch {
				case !ok:
					t.Fatalf("truth %+v matches no execution", tr)
				case seen[k]:
					t.Fatalf("truth %+v listed twice", tr)
				case x.exit != tr.Exit || x.excl != tr.Exclusive:
					t.Fatalf("truth %+v: execution has exit %d, exclusive %d", tr, x.exit, x.excl)
				case x.exitStep != tr.Step:
					t.Fatalf("truth %+v: exit is in step %d", tr, x.exitStep)
				case tr.PID != tc.cfg.PID || tr.Func != funcTable[tr.FID].name || tr.Kind != funcTable[tr.FID].kind:
					t.Fatalf("truth %+v: pid, name or kind wrong", tr)
				}
				seen[k] = true
				kinds[tr.Kind]++
			}
			t.Logf("%v; by kind %v", d, kinds)
			if tc.name == "gpu" {
				for _, k := range Kinds() {
					if kinds[k] == 0 {
						t.Errorf("no %s anomaly injected", k)
					}
				}
			}
		})
	}
}

func TestAnomalyStructure(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Ranks, cfg.Steps, cfg.EventsPerStep = 6, 20, 10000
	cfg.Rates.SlowBurst = 0.05
	d := generate(t, cfg)
	slow, ok := d.w.SlowRank()
	if !ok {
		t.Fatal("no slow rank with a non-zero slow_rank rate")
	}
	bursts := make([][]uint64, cfg.Ranks)
	for r := range bursts {
		bursts[r] = d.w.Rank(uint32(r)).burst
	}
	kinds := map[Kind]int{}
	for _, tr := range d.truth {
		kinds[tr.Kind]++
		switch tr.Kind {
		case SlowRank:
			if tr.Rank != slow {
				t.Errorf("slow_rank anomaly on rank %d, the slow rank is %d", tr.Rank, slow)
			}
		case SlowBurst:
			// The burst is decided at the execution's entry.
			if s := d.w.StepOf(tr.Entry); bursts[tr.Rank][s]&(1<<tr.FID) == 0 {
				t.Errorf("slow_burst anomaly of %s on rank %d in step %d, outside its bursts", tr.Func, tr.Rank, s)
			}
		}
	}
	var nbursts int
	for _, steps := range bursts {
		for s, mask := range steps {
			if mask != 0 && (s == 0 || steps[s-1]&mask != mask) {
				nbursts++
			}
		}
	}
	if kinds[SlowRank] == 0 || kinds[SlowBurst] == 0 || nbursts == 0 {
		t.Errorf("%d slow_rank and %d slow_burst anomalies in %d bursts", kinds[SlowRank], kinds[SlowBurst], nbursts)
	}
	t.Logf("slow rank %d; %d bursts; anomalies by kind %v", slow, nbursts, kinds)
}

func TestGPUCorrelation(t *testing.T) {
	for _, tc := range testConfigs() {
		if !tc.cfg.GPU {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			d := generate(t, tc.cfg)
			gpuTids := map[uint32]bool{}
			for _, tid := range d.w.GPUThreads() {
				gpuTids[tid] = true
			}
			for r, frames := range d.frames {
				keys := map[uint32]map[string]bool{}
				for _, m := range frames[0].Metadata {
					if keys[m.Tid] == nil {
						keys[m.Tid] = map[string]bool{}
					}
					keys[m.Tid][m.Key] = true
				}
				for tid := range gpuTids {
					for _, k := range []string{"CUDA Context", "CUDA Device", "CUDA Stream"} {
						if !keys[tid][k] {
							t.Errorf("rank %d GPU tid %d has no %q metadata", r, tid, k)
						}
					}
				}
				for tid := range d.w.CPUThreads() {
					if keys[uint32(tid)]["CUDA Stream"] {
						t.Errorf("rank %d CPU tid %d marked as a CUDA stream", r, tid)
					}
				}
			}
			type launch struct {
				entry uint64
				used  bool
			}
			launches := map[[2]uint64]*launch{} // (rank, corr)
			for _, x := range d.execs {
				if x.fid == fCudaLaunchKernel {
					if len(x.corr) != 1 {
						t.Fatalf("launch with %d correlation ids", len(x.corr))
					}
					k := [2]uint64{uint64(x.rank), x.corr[0]}
					if launches[k] != nil {
						t.Fatalf("rank %d: correlation id %d on two launches", x.rank, x.corr[0])
					}
					launches[k] = &launch{entry: x.entry}
				}
			}
			var kernels int
			for _, x := range d.execs {
				isKernel := funcTable[x.fid].gpu
				if isKernel != gpuTids[x.tid] {
					t.Fatalf("%s on tid %d (GPU threads %v)", funcTable[x.fid].name, x.tid, d.w.GPUThreads())
				}
				if !isKernel {
					continue
				}
				kernels++
				if len(x.corr) != 1 {
					t.Fatalf("kernel with %d correlation ids at its entry", len(x.corr))
				}
				l := launches[[2]uint64{uint64(x.rank), x.corr[0]}]
				switch {
				case l == nil:
					t.Fatalf("rank %d: kernel %s with correlation id %d has no launch", x.rank, funcTable[x.fid].name, x.corr[0])
				case l.used:
					t.Fatalf("rank %d: two kernels for correlation id %d", x.rank, x.corr[0])
				case l.entry >= x.entry:
					t.Fatalf("rank %d: kernel starts at %d, before its launch at %d", x.rank, x.entry, l.entry)
				}
				l.used = true
			}
			if kernels == 0 || kernels != len(launches) {
				t.Errorf("%d kernels for %d launches", kernels, len(launches))
			}
		})
	}
}

func TestComms(t *testing.T) {
	for _, tc := range testConfigs() {
		t.Run(tc.name, func(t *testing.T) {
			d := generate(t, tc.cfg)
			R := uint32(tc.cfg.Ranks)
			var sends, recvs, migrations int
			for r, frames := range d.frames {
				rank := uint32(r)
				left, right := (rank+R-1)%R, (rank+1)%R
				for _, f := range frames {
					for _, c := range f.Comms {
						var want uint32
						switch {
						case c.Tag == tagMigrate:
							migrations++
							if R > 1 && c.Partner == rank {
								t.Fatalf("rank %d migrates atoms to itself", rank)
							}
							continue
						case c.Kind == frame.Send && c.Tag == tagHaloLeft, c.Kind == frame.Recv && c.Tag == tagHaloRight:
							want = left
						case c.Kind == frame.Send && c.Tag == tagHaloRight, c.Kind == frame.Recv && c.Tag == tagHaloLeft:
							want = right
						default:
							t.Fatalf("unexpected message %+v", c)
						}
						if c.Partner != want {
							t.Fatalf("rank %d: halo message %+v, want partner %d", rank, c, want)
						}
						if c.Bytes == 0 {
							t.Fatalf("empty message %+v", c)
						}
						if c.Kind == frame.Send {
							sends++
						} else {
							recvs++
						}
					}
				}
			}
			if sends == 0 || sends != recvs || (sends > 200 && migrations == 0) {
				t.Errorf("%d halo sends, %d halo receives, %d migrations", sends, recvs, migrations)
			}
		})
	}
}

func TestMetadataAndDictionary(t *testing.T) {
	for _, tc := range testConfigs() {
		t.Run(tc.name, func(t *testing.T) {
			d := generate(t, tc.cfg)
			for r, frames := range d.frames {
				meta := map[string]string{}
				for _, m := range frames[0].Metadata {
					if m.Tid == 0 {
						meta[m.Key] = m.Value
					}
				}
				for _, k := range []string{"Hostname", "CPU Type", "OS Name", "MPI Rank", "MPI Size", "TAU Version"} {
					if meta[k] == "" {
						t.Errorf("rank %d: no %q metadata", r, k)
					}
				}
				if meta["MPI Rank"] != fmt.Sprint(r) || meta["MPI Size"] != fmt.Sprint(tc.cfg.Ranks) {
					t.Errorf("rank %d: MPI Rank %q, MPI Size %q", r, meta["MPI Rank"], meta["MPI Size"])
				}
				funcs := map[uint32]string{}
				ctrs := map[uint32]string{}
				for _, f := range frames {
					if f.Step > 0 && len(f.Metadata) > 0 {
						t.Errorf("rank %d step %d repeats metadata", r, f.Step)
					}
					for _, n := range f.Funcs {
						if _, dup := funcs[n.ID]; dup {
							t.Errorf("rank %d step %d: function id %d announced again", r, f.Step, n.ID)
						}
						funcs[n.ID] = n.Name
					}
					for _, n := range f.Counters {
						if _, dup := ctrs[n.ID]; dup {
							t.Errorf("rank %d step %d: counter id %d announced again", r, f.Step, n.ID)
						}
						ctrs[n.ID] = n.Name
					}
					for _, e := range f.Events {
						if funcs[e.FID] != funcTable[e.FID].name {
							t.Fatalf("rank %d step %d: function id %d used with name %q announced", r, f.Step, e.FID, funcs[e.FID])
						}
					}
					for _, e := range f.CounterEvents {
						if ctrs[e.CID] != counterNames[e.CID] {
							t.Fatalf("rank %d step %d: counter id %d used with name %q announced", r, f.Step, e.CID, ctrs[e.CID])
						}
					}
				}
			}
		})
	}
}

func TestEventsPerStep(t *testing.T) {
	for _, tc := range []struct {
		name string
		eps  int
		gpu  bool
		thr  int
	}{
		{"5k", 5000, false, 2},
		{"30k gpu", 30000, true, 2},
		{"100k 4 threads", 100000, false, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Ranks, cfg.Steps, cfg.EventsPerStep, cfg.GPU, cfg.ThreadsPerRank = 1, 6, tc.eps, tc.gpu, tc.thr
			w, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			g := w.Rank(0)
			var f frame.Frame
			for {
				if _, err := g.Next(&f); err == io.EOF {
					break
				}
				// The first step holds MPI_Init and setup, the last one
				// finalize; the steps between run at the steady rate.
				if f.Step == 0 || f.Step == uint64(cfg.Steps-1) {
					continue
				}
				if n := f.NumEvents(); math.Abs(float64(n)/float64(tc.eps)-1) > 0.15 {
					t.Errorf("step %d has %d events, want %d ±15%%", f.Step, n, tc.eps)
				}
			}
		})
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		want string // "" for valid
	}{
		{"default", func(*Config) {}, ""},
		{"no ranks", func(c *Config) { c.Ranks = 0 }, "ranks must be between"},
		{"no threads", func(c *Config) { c.ThreadsPerRank = 0 }, "threads per rank"},
		{"no steps", func(c *Config) { c.Steps = 0 }, "steps must be"},
		{"few events", func(c *Config) { c.EventsPerStep = 10 }, "events per step"},
		{"negative rate", func(c *Config) { c.Rates.SlowCall = -0.1 }, "rate slow_call"},
		{"NaN rate", func(c *Config) { c.Rates.FastOutlier = math.NaN() }, "rate fast_outlier"},
		{"rate above one", func(c *Config) { c.Rates.BurstCall = 2 }, "rate burst_call"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.mod(&c)
			err := c.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
			if _, err := New(c); err == nil {
				t.Fatal("New accepted an invalid config")
			}
		})
	}
}

func TestTruthJSON(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Ranks, cfg.Steps, cfg.EventsPerStep, cfg.GPU = 2, 4, 5000, true
	cfg.Rates = DefaultRates.Scale(5)
	_, truth := runAll(t, mustNew(t, cfg), false)
	var all []Truth
	for _, tr := range truth {
		all = append(all, tr...)
	}
	if len(all) == 0 {
		t.Fatal("no anomalies")
	}
	var buf bytes.Buffer
	if err := WriteTruth(&buf, all); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Count(buf.String(), "\n"); lines != len(all) {
		t.Fatalf("%d lines for %d records", lines, len(all))
	}
	for _, field := range []string{`"pid":`, `"rank":`, `"tid":`, `"fid":`, `"func":`, `"io_step":`, `"entry":`, `"kind":`} {
		if !strings.Contains(strings.SplitN(buf.String(), "\n", 2)[0], field) {
			t.Errorf("truth line has no %s field", field)
		}
	}
	back, err := ReadTruth(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, all) {
		t.Fatal("truth changed in a JSON round trip")
	}
	for _, bad := range []struct{ name, in, want string }{
		{"not json", "{\"pid\":1}\nnope\n", "line 2"},
		{"unknown field", `{"pid":1,"colour":"red"}`, "unknown field"},
		{"two values", `{"pid":1} {"pid":2}`, "more than one"},
	} {
		t.Run(bad.name, func(t *testing.T) {
			_, err := ReadTruth(strings.NewReader(bad.in))
			if err == nil || !strings.Contains(err.Error(), bad.want) {
				t.Fatalf("error %v, want one containing %q", err, bad.want)
			}
		})
	}
}

func mustNew(t *testing.T, cfg Config) *Workload {
	t.Helper()
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func TestRankOutOfRange(t *testing.T) {
	w := mustNew(t, DefaultConfig())
	defer func() {
		if recover() == nil {
			t.Fatal("Rank accepted a rank beyond the run")
		}
	}()
	w.Rank(uint32(w.Config().Ranks))
}
