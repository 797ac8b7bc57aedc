package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

// genSummary is what `kipimo gen --json` prints.
type genSummary struct {
	Frames            int                   `json:"frames"`
	Events            int64                 `json:"events"`
	AnomaliesInjected int                   `json:"anomalies_injected"`
	Bytes             int64                 `json:"bytes"` // total size of the frame files
	ByKind            map[workload.Kind]int `json:"anomalies_by_kind"`
	Ranks             int                   `json:"ranks"`
	Steps             int                   `json:"steps"`
	Seed              uint64                `json:"seed"`
	StepWidthUS       uint64                `json:"step_width_us"`
	Out               string                `json:"out"`
	// Profile is classic, realistic or replay (--from); Applications, for
	// a replay, names the application each rank replays.
	Profile      string   `json:"profile"`
	Applications []string `json:"applications,omitempty"`
}

func newGenCmd() *cobra.Command {
	cfg := workload.DefaultConfig()
	var (
		out    string
		asJSON bool
		scale  float64
		ev     evalFlags
	)
	cmd := &cobra.Command{
		Use:   "gen --out DIR [--profile classic|realistic | --from TRACE...] [flags]",
		Short: "Generate a synthetic or trace-replay run with injected anomalies",
		Long: `Gen writes the event stream of a run with known anomalies: one binary frame
file per rank, DIR/rank-<r>.frames, holding the rank's frames in io_step order,
and DIR/truth.jsonl, one JSON line per injected anomalous execution {pid, rank,
tid, fid, func, io_step, entry, exit, runtime_exclusive, kind}, where io_step is
the step holding the execution's exit. The same flags give byte-identical files.

The run is one of:

  --profile classic (the default) simulates an instrumented MPI+OpenMP(+CUDA)
  code whose runtimes are bounded bell curves. Anomaly kinds: slow_call (one
  call 6-16x slower), slow_rank (one rank intermittently 4-6x slower in its
  FFTs), slow_burst (a function 6-10x slower on one rank for 2-4 steps),
  slow_kernel (a GPU kernel 5-12x slower, with --gpu) and fast_outlier (an
  execution at 5-20% of its normal time); about 0.1% of executions.

  --profile realistic simulates the same kind of code with the shapes real
  runtimes have: log-normal tails, bimodal kernels, wrappers of 0, 1 or 2 µs,
  rank imbalance, a slow drift over the steps and heavy-tailed MPI waits
  (default 40 steps of about 8,200 events per rank).

  --from TRACE replays real traces (TAU, Chrome/PyTorch, Caliper, OTF2, frames;
  the format from --format or the names): each --from is one application (a
  directory stands for its files), ranks take the applications in turn, and
  every rank runs its trace rank's call trees cycle after cycle (default 8
  ranks, 40 steps of about 20,000 events per rank). With --times recorded
  (the default) each call path of each thread replays the exclusive times it
  recorded, in their recorded order, each rank and cycle starting at its own
  phase; --times draw draws every execution's time independently from its
  function's recorded times instead.

In the realistic profile and replays the one anomaly kind is beyond_max: an
execution 1.5-3x the function's natural maximum (its largest normal value in
the whole run, or in the trace), in functions whose maximum is at least 10 µs.
No normal value exceeds the maximum, so an ideal detector finds every one and
nothing else. See docs/evaluation.md.`,
		Example: `  kipimo gen --ranks 8 --steps 50 --seed 7 --out run --json
  kipimo gen --out run --gpu --events-per-step 100000 --slow-call 0.002
  kipimo gen --profile realistic --out real
  kipimo gen --from traces/tau/ --from trace.pt.trace.json.gz --out replay
  kipimo gen --from app.json.gz --format chrome --ranks 4 --steps 10 --beyond-max 0.001 --out replay`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return fmt.Errorf("gen: --out is required: name the directory to write the frame files and truth.jsonl into")
			}
			if !(scale >= 0) || math.IsInf(scale, 0) {
				return fmt.Errorf("gen: --anomaly-scale must be a finite number >= 0, got %v", scale)
			}
			start := time.Now()
			wl, err := ev.workload(cmd.Context(), cmd.Flags(), cfg, scale, cmd.ErrOrStderr())
			if err != nil {
				return fmt.Errorf("gen: %w", err)
			}
			sum, err := generateRun(cmd.Context(), wl, out)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if asJSON {
				b, err := json.Marshal(sum)
				if err != nil {
					return fmt.Errorf("gen: %w", err)
				}
				_, err = fmt.Fprintf(w, "%s\n", b)
				return err
			}
			secs := time.Since(start).Seconds()
			of := "of"
			if sum.Profile == workload.ProfileReplay {
				of = "of up to" // each application's steps hold whole cycles
			}
			_, err = fmt.Fprintf(w, "wrote %d frames (%d ranks x %d steps %s %.1f ms) to %s\n"+
				"%d events, %d bytes (%.2f bytes/event), generated at %.1fM events/s\n"+
				"%d anomalies injected %v, listed in %s\n",
				sum.Frames, sum.Ranks, sum.Steps, of, float64(sum.StepWidthUS)/1000, out,
				sum.Events, sum.Bytes, float64(sum.Bytes)/float64(max(1, sum.Events)), float64(sum.Events)/secs/1e6,
				sum.AnomaliesInjected, kindList(wl.Kinds(), sum.ByKind), filepath.Join(out, "truth.jsonl"))
			return err
		},
	}
	f := cmd.Flags()
	f.StringVarP(&out, "out", "o", "", "directory to write rank-<r>.frames and truth.jsonl into (created if missing)")
	f.IntVar(&cfg.Ranks, "ranks", cfg.Ranks, "number of MPI ranks")
	f.IntVar(&cfg.Steps, "steps", cfg.Steps, "number of io_steps (frames per rank)")
	f.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the run; the same seed gives the same bytes")
	f.IntVar(&cfg.EventsPerStep, "events-per-step", cfg.EventsPerStep, "approximate number of events per rank per io_step (sets the step width)")
	f.IntVar(&cfg.ThreadsPerRank, "threads", cfg.ThreadsPerRank, "CPU threads per rank (thread 0 runs main, the others are OpenMP workers)")
	f.BoolVar(&cfg.GPU, "gpu", cfg.GPU, "offload kernels to two CUDA streams per rank (GPU virtual threads after the CPU threads)")
	f.Uint32Var(&cfg.PID, "pid", cfg.PID, "program id written in every frame")
	f.BoolVar(&asJSON, "json", false, `print a one-line JSON summary {"frames","events","anomalies_injected","bytes",...}`)
	f.Float64Var(&cfg.Rates.SlowCall, "slow-call", cfg.Rates.SlowCall, "probability that an execution of a slow_call function is a very slow call")
	f.Float64Var(&cfg.Rates.SlowRank, "slow-rank", cfg.Rates.SlowRank, "probability that a slow_rank function call on the slow rank is slow (0: no slow rank)")
	f.Float64Var(&cfg.Rates.SlowBurst, "slow-burst", cfg.Rates.SlowBurst, "probability, per rank and step, that a burst of slow calls starts")
	f.Float64Var(&cfg.Rates.BurstCall, "burst-call", cfg.Rates.BurstCall, "probability that a call of the bursting function is slow during a burst")
	f.Float64Var(&cfg.Rates.SlowKernel, "slow-kernel", cfg.Rates.SlowKernel, "probability that a GPU kernel is slow (with --gpu)")
	f.Float64Var(&cfg.Rates.FastOutlier, "fast-outlier", cfg.Rates.FastOutlier, "probability that an execution of a fast_outlier function is far too fast")
	f.Float64Var(&scale, "anomaly-scale", 1, "multiply every per-execution anomaly rate by this factor (0 injects none; the burst start rate is kept)")
	ev.add(f, true)
	return cmd
}

func kindList(kinds []workload.Kind, m map[workload.Kind]int) string {
	s := "("
	for i, k := range kinds {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%s %d", k, m[k])
	}
	return s + ")"
}

// rankResult is what generating one rank produced.
type rankResult struct {
	truth  []workload.Truth
	frames int
	events int64
	bytes  int64
}

// generateRun writes the frame files of every rank and truth.jsonl into dir,
// generating ranks concurrently (one goroutine per core). Files are written
// under temporary names and renamed once complete, so an interrupted run
// leaves no truncated file under a final name.
func generateRun(ctx context.Context, w *workload.Workload, dir string) (genSummary, error) {
	cfg := w.Config()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return genSummary{}, fmt.Errorf("gen: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	results := make([]rankResult, cfg.Ranks)
	errs := make([]error, cfg.Ranks)
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(cfg.Ranks, runtime.GOMAXPROCS(0)) {
		wg.Go(func() {
			for r := range next {
				res, err := writeRank(ctx, w, uint32(r), dir)
				results[r], errs[r] = res, err
				if err != nil {
					cancel()
				}
			}
		})
	}
feed:
	for r := range cfg.Ranks {
		select {
		case next <- r:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return genSummary{}, err
		}
	}
	if err := ctx.Err(); err != nil {
		return genSummary{}, fmt.Errorf("gen: %w", err)
	}

	sum := genSummary{ByKind: map[workload.Kind]int{}, Ranks: cfg.Ranks, Steps: cfg.Steps, Seed: cfg.Seed, StepWidthUS: w.StepWidth(), Out: dir, Profile: w.Profile()}
	if w.Profile() == workload.ProfileReplay {
		sum.Applications = w.Applications()
	}
	var truth []workload.Truth
	for _, res := range results {
		sum.Frames += res.frames
		sum.Events += res.events
		sum.Bytes += res.bytes
		truth = append(truth, res.truth...)
	}
	for _, k := range w.Kinds() {
		sum.ByKind[k] = 0
	}
	for _, t := range truth {
		sum.ByKind[t.Kind]++
	}
	sum.AnomaliesInjected = len(truth)
	err := writeAtomically(filepath.Join(dir, "truth.jsonl"), func(fw io.Writer) error {
		return workload.WriteTruth(fw, truth)
	})
	if err != nil {
		return genSummary{}, fmt.Errorf("gen: %w", err)
	}
	return sum, nil
}

// writeRank generates rank r and writes its frame file.
func writeRank(ctx context.Context, w *workload.Workload, r uint32, dir string) (rankResult, error) {
	var res rankResult
	path := filepath.Join(dir, fmt.Sprintf("rank-%d.frames", r))
	cw := &countingWriter{}
	err := writeAtomically(path, func(fw io.Writer) error {
		cw.w = fw
		fwr := frame.NewWriter(cw)
		g := w.Rank(r)
		var f frame.Frame
		for {
			if err := ctx.Err(); err != nil {
				return err
			}
			truth, err := g.Next(&f)
			if err == io.EOF {
				break
			}
			if err != nil {
				return err
			}
			if err := fwr.Write(&f); err != nil {
				return fmt.Errorf("step %d: %w", f.Step, err)
			}
			res.truth = append(res.truth, truth...)
			res.frames++
			res.events += int64(f.NumEvents())
		}
		return fwr.Flush()
	})
	if err != nil {
		return res, fmt.Errorf("gen: rank %d: %w", r, err)
	}
	res.bytes = cw.n
	return res, nil
}

// writeAtomically writes path through write into a temporary file in the
// same directory and renames it into place when write and close succeed.
func writeAtomically(path string, write func(io.Writer) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	err = write(tmp)
	if err == nil {
		err = tmp.Chmod(0o644)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// countingWriter counts the bytes written through it.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// evalFlags are the flags that choose an evaluation workload, shared by
// gen and run: the synthetic profile, or traces to replay.
type evalFlags struct {
	profile string
	from    []string
	format  string
	rate    float64
	maxIdle uint64
	times   string
}

// add registers the flags; withFormat adds --format (run has its own).
func (e *evalFlags) add(f *pflag.FlagSet, withFormat bool) {
	f.StringVar(&e.profile, "profile", workload.ProfileClassic, "synthetic run: classic (bounded bell curves) or realistic (log-normal tails, bimodal kernels, µs-quantised wrappers, rank imbalance, drift, heavy-tailed MPI waits)")
	f.StringArrayVar(&e.from, "from", nil, "replay this trace (a file, or a directory of one run's files) instead of a synthetic run; repeat for more applications, which ranks take in turn")
	if withFormat {
		f.StringVar(&e.format, "format", "", "format of the --from traces: tau, caliper, chrome, otf2 or frames (default: from the names)")
	}
	f.Float64Var(&e.rate, "beyond-max", 0, "realistic and --from: probability that an execution is injected 1.5-3x beyond its function's natural maximum (default 0.0009 realistic, 0.00015 --from)")
	f.Uint64Var(&e.maxIdle, "max-idle", workload.DefaultMaxIdle, "--from: longest idle time (µs) kept between calls while no thread of the trace is in a function")
	f.StringVar(&e.times, "times", workload.TimesRecorded, "--from: recorded (each call path's recorded exclusive times in their order, a phase per rank and cycle) or draw (each execution drawn independently from its function's recorded times)")
}

// replaying reports whether traces are to be replayed.
func (e *evalFlags) replaying() bool { return len(e.from) > 0 }

// synthetic returns cfg set up for the chosen profile: a realistic run
// defaults to 40 steps of RealisticEventsPerStep events unless the flags
// set them.
func (e *evalFlags) synthetic(flags *pflag.FlagSet, cfg workload.Config, scale float64) (workload.Config, error) {
	cfg.Profile = e.profile
	if e.profile == workload.ProfileRealistic {
		if !flags.Changed("steps") {
			cfg.Steps = workload.DefaultTraceSteps
		}
		if !flags.Changed("events-per-step") {
			cfg.EventsPerStep = 0
		}
		if flags.Changed("beyond-max") {
			cfg.Rates.BeyondMax = e.rate
		}
	} else if flags.Changed("beyond-max") {
		return cfg, fmt.Errorf("--beyond-max applies to --profile realistic and --from")
	}
	if flags.Changed("times") {
		return cfg, fmt.Errorf("--times applies to --from replays: a synthetic run draws its times from its own distributions")
	}
	if err := cfg.Validate(); err != nil {
		return cfg, err
	}
	cfg.Rates = cfg.Rates.Scale(scale)
	return cfg, nil
}

// traces returns the replay's configuration from the flags; format is
// the traces' format ("" to detect it from each --from's names).
func (e *evalFlags) traces(flags *pflag.FlagSet, cfg workload.Config, scale float64, format string) (workload.TraceConfig, error) {
	if flags.Changed("profile") {
		return workload.TraceConfig{}, errors.New("--profile chooses a synthetic run; --from replays traces instead: give one of them")
	}
	for _, name := range []string{"gpu", "threads"} {
		if flags.Changed(name) {
			return workload.TraceConfig{}, fmt.Errorf("--%s describes the synthetic run; a replay takes its threads from the traces", name)
		}
	}
	tc := workload.DefaultTraceConfig()
	for _, p := range e.from {
		tc.Apps = append(tc.Apps, workload.TraceApp{Files: []string{p}, Format: format})
	}
	tc.PID, tc.Ranks, tc.Seed, tc.MaxIdle, tc.Times = cfg.PID, cfg.Ranks, cfg.Seed, e.maxIdle, e.times
	if flags.Changed("steps") {
		tc.Steps = cfg.Steps
	}
	if flags.Changed("events-per-step") {
		tc.EventsPerStep = cfg.EventsPerStep
	}
	if flags.Changed("beyond-max") {
		tc.Rate = e.rate
	}
	if err := tc.Validate(); err != nil {
		return tc, err
	}
	tc.Rate = min(1, tc.Rate*scale)
	return tc, nil
}

// workload builds the run the flags describe, reporting a replay's
// reading and ranks on progress.
func (e *evalFlags) workload(ctx context.Context, flags *pflag.FlagSet, cfg workload.Config, scale float64, progress io.Writer) (*workload.Workload, error) {
	if !e.replaying() {
		c, err := e.synthetic(flags, cfg, scale)
		if err != nil {
			return nil, err
		}
		return workload.New(c)
	}
	tc, err := e.traces(flags, cfg, scale, e.format)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(progress, "reading %d trace(s) to replay...\n", len(tc.Apps))
	w, err := workload.FromTraces(ctx, tc)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(progress, "replaying %s\n", describeApps(w.Applications()))
	return w, nil
}

// describeApps says which ranks replay which application.
func describeApps(apps []string) string {
	var order []string
	ranks := map[string][]string{}
	for r, a := range apps {
		if _, ok := ranks[a]; !ok {
			order = append(order, a)
		}
		ranks[a] = append(ranks[a], strconv.Itoa(r))
	}
	parts := make([]string, len(order))
	for i, a := range order {
		parts[i] = fmt.Sprintf("%s on ranks %s", a, strings.Join(ranks[a], ","))
	}
	return strings.Join(parts, "; ")
}
