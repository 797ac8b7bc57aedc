package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/kipimo-hpc/kipimo/internal/adnode"
	"github.com/kipimo-hpc/kipimo/internal/config"
	"github.com/kipimo-hpc/kipimo/internal/daemon"
	"github.com/kipimo-hpc/kipimo/internal/instrument"
	"github.com/kipimo-hpc/kipimo/internal/run"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

func newRunCmd() *cobra.Command {
	var (
		cfg         run.Config
		wl          = workload.DefaultConfig()
		scale       float64
		jsonOut     bool
		keepServing bool
		execMode    bool
		injects     []string
		ev          evalFlags
		memLimit    string
		natsAuth    *daemon.NATSAuth
		base        adnode.BaselineFlags
	)
	cmd := &cobra.Command{
		Use:   "run [flags] [--format FORMAT FILE... | --exec -- COMMAND [ARGS...]]",
		Short: "Run the whole pipeline in one process, on a live program, a synthetic run or traces",
		Long: `Run starts everything Kipimo needs in one process, with nothing installed: an
embedded NATS server with JetStream (data under --out), the parameter server and
its dashboard, the provenance service on a SQLite store, one detector per rank,
and the summary writer. The input is a synthetic MPI application with injected
anomalies (the default; --ranks, --steps, --seed, --gpu, --profile classic or
realistic), a replay of real traces with injected anomalies (--from TRACE, see
docs/evaluation.md), traces made by other
tools (files and directories as arguments, or --input, with --format
tau|caliper|chrome|otf2|frames), or a program running now (--exec -- COMMAND).

With --exec, the command runs with Kipimo's event library preloaded (built
from its embedded C sources with the system's cc and mpicc on first use, then
cached): MPI calls of unmodified dynamically linked MPI programs are seen
through PMPI, every function of code built with -finstrument-functions, and
regions marked with the kipimo.h API. Each rank cuts an io_step every --period
and streams it to the detectors while the command runs; the dashboard is live
meanwhile. The command's output and exit status are its own: kipimo exits with
the command's status. --inject FUNC:PROB:DELAY[@RANKS] delays calls on purpose and
scores the detection against them.

Each run keeps its data under --out in a directory named by its id (--run;
by default run-<UTC time>, made unique). An id that an earlier run there
holds is refused: choose another, or give --replace to delete that run and
start again under its id. A run is never added to another run's store.

Ctrl-C or SIGTERM ends a run early and keeps what it found: the input stops
(a command run with --exec gets the signal, its whole process group), the
pipeline drains, and the summary, store and profiles are written, saying the
run was interrupted. A second Ctrl-C quits at once.

At the end it prints what was found (with precision and recall against the
injected anomalies for synthetic runs and replays, and for directories of
frame files that kipimo gen wrote with their truth.jsonl), how fast, how much
data was kept, where the results are, and the commands to explore them.`,
		Example: `  kipimo run
  kipimo run --ranks 16 --steps 100 --gpu --algorithm hbos
  kipimo run --profile realistic
  kipimo run --from traces/tau/ --from trace.pt.trace.json.gz --ranks 8 --steps 40
  kipimo run --format chrome --step 100ms trace.json.gz
  kipimo run --format frames rank-*.frames
  kipimo gen --from trace/ --ranks 1024 --out replay && kipimo run --format frames replay
  kipimo run --keep-serving --http 127.0.0.1:8080
  kipimo run --exec -- mpirun -np 4 ./app input.dat
  kipimo run --exec --inject MPI_Send:0.0008:1s -- mpirun -np 2 lmp -in in.lj -var steps 3000`,
		Args: func(cmd *cobra.Command, args []string) error {
			if execMode && len(args) == 0 {
				return errors.New("--exec needs a command after --, e.g. kipimo run --exec -- mpirun -np 4 ./app")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := config.Apply(cmd.Flags(), nil); err != nil {
				return err
			}
			if !execMode {
				cfg.Inputs = append(cfg.Inputs, args...)
			}
			if len(cfg.Inputs) > 0 && cfg.InputFormat == "" {
				f, err := inputFormat(cfg.Inputs)
				if err != nil {
					return err
				}
				cfg.InputFormat = f
				fmt.Fprintf(cmd.ErrOrStderr(), "input format: %s, from the names (--format overrides)\n", f)
			}
			if len(cfg.Inputs) > 0 {
				if err := reportInputs(cmd.ErrOrStderr(), cfg.Inputs); err != nil {
					return err
				}
			}
			if *natsAuth != (daemon.NATSAuth{}) {
				if cfg.NATSURL == "" {
					return errors.New("the --nats-* credentials and TLS flags are for the server of --nats: the embedded NATS server asks for none")
				}
				cfg.NATSAuth = *natsAuth
				if execMode {
					// The event library in the command's processes
					// reads its credentials from its URL.
					u, err := libraryNATSURL(cfg.NATSURL, natsAuth)
					if err != nil {
						return err
					}
					cfg.NATSURL = u
				}
			}
			if execMode {
				cfg.Live.Command = args
				for _, s := range injects {
					in, err := instrument.ParseInjection(s)
					if err != nil {
						return fmt.Errorf("--inject: %w", err)
					}
					cfg.Live.Inject = append(cfg.Live.Inject, in)
				}
				cfg.Live.Seed = wl.Seed
			} else if len(injects) > 0 || len(cfg.Live.Exclude) > 0 {
				return errors.New("--inject and --exclude apply to a program run with --exec")
			}
			if ev.replaying() {
				if execMode || len(cfg.Inputs) > 0 {
					return errors.New("--from replays traces with injected anomalies; it excludes --exec and input traces")
				}
				tc, err := ev.traces(cmd.Flags(), wl, scale, cfg.InputFormat)
				if err != nil {
					return err
				}
				cfg.From = tc
				// Rank r replays application r mod len(--from).
				names := make([]string, tc.Ranks)
				for r := range names {
					names[r] = filepath.Base(ev.from[r%len(ev.from)])
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "replaying %s\n", describeApps(names))
			} else if !execMode && len(cfg.Inputs) == 0 {
				var err error
				if wl, err = ev.synthetic(cmd.Flags(), wl, scale); err != nil {
					return err
				}
			} else if scale != 1 {
				wl.Rates = wl.Rates.Scale(scale)
			}
			dsnFromEnv := cfg.TaudbDSN == ""
			if dsnFromEnv {
				cfg.TaudbDSN = os.Getenv("KIPIMO_TAUDB_DSN")
			}
			if cfg.TaudbDSN != "" && cfg.RunID != "" {
				if err := checkRunTrial(cmd.Context(), cfg.TaudbDSN, cfg.RunID, dsnFromEnv); err != nil {
					return err
				}
			}
			cfg.Workload = wl
			if err := base.Load(cmd.Context(), &cfg.Detector); err != nil {
				return err
			}
			if err := applyMemoryLimit(cmd.ErrOrStderr(), memLimit); err != nil {
				return err
			}
			return runPipeline(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), cfg, jsonOut, keepServing)
		},
	}
	f := cmd.Flags()
	config.AddConfigFlag(f)
	f.StringVar(&cfg.Out, "out", "kipimo-out", "directory that holds each run's data, provenance store and TAU profiles under <out>/<run>")
	f.StringVar(&cfg.RunID, "run", "", "run id: the run's directory under --out and its NATS subjects; an id an earlier run holds is refused (default run-<UTC time>, made unique)")
	f.BoolVar(&cfg.Replace, "replace", false, "delete the earlier run of the same --run id (its directory under --out) and start again under that id")
	f.IntVar(&wl.Ranks, "ranks", wl.Ranks, "synthetic run: MPI ranks")
	f.IntVar(&wl.Steps, "steps", wl.Steps, "synthetic run: io_steps")
	f.Uint64Var(&wl.Seed, "seed", wl.Seed, "synthetic run: seed (same seed, same run)")
	f.IntVar(&wl.EventsPerStep, "events-per-step", wl.EventsPerStep, "synthetic run: events per rank per step")
	f.IntVar(&wl.ThreadsPerRank, "threads", wl.ThreadsPerRank, "synthetic run: CPU threads per rank")
	f.BoolVar(&wl.GPU, "gpu", wl.GPU, "synthetic run: offload kernels to GPU streams")
	f.Float64Var(&scale, "anomaly-scale", 1, "synthetic run: multiply every anomaly injection rate")
	f.StringSliceVar(&cfg.Inputs, "input", nil, "trace files or directories to run on instead of a synthetic run (also as arguments)")
	f.StringVar(&cfg.InputFormat, "format", "", "format of --input, and of --from traces (for --from the default comes from the names): tau, caliper, chrome, otf2 or frames")
	f.DurationVar(&cfg.Step, "step", 0, "traces: io_step length in trace time (default 1s)")
	f.StringVar(&cfg.StepMarker, "step-marker", "", "traces: start a new io_step at each entry of this function")
	adnode.AddFlags(f, &cfg.Detector)
	adnode.AddBaselineFlags(f, &base)
	f.StringVar(&cfg.HTTP, "http", "127.0.0.1:0", "dashboard address (port 0 picks a free port)")
	f.BoolVar(&keepServing, "keep-serving", false, "keep the dashboard up after the run until interrupted")
	f.StringVar(&cfg.TaudbDSN, "taudb", "", "PostgreSQL DSN: also store the run as a TAUdb trial (env KIPIMO_TAUDB or KIPIMO_TAUDB_DSN)")
	f.IntVar(&cfg.MaxLag, "max-lag", 0, "io_steps a rank's input may run ahead of its detector before the input waits (back-pressure); 0: 16, fewer beyond 256 ranks so that at most 4,096 frames wait in all (at least 2)")
	f.StringVar(&cfg.NATSURL, "nats", "", "use this NATS server instead of an embedded one (a token as nats://TOKEN@host:4222; credentials with --nats-user, --nats-creds...)")
	natsAuth = addNATSAuth(f)
	f.BoolVar(&cfg.KeepNATS, "keep-nats", false, "keep the embedded NATS server's data (<out>/<run>/nats) after the run; by default it is deleted, everything kept being in the provenance store")
	f.StringVar(&memLimit, "memory-limit", "auto", daemon.MemoryLimitUsage)
	f.BoolVar(&jsonOut, "json", false, "print the summary as JSON (with --exec: the last line of stdout, after the command's output)")
	f.BoolVar(&execMode, "exec", false, "run the command given after -- under the event library and monitor it live")
	f.DurationVar(&cfg.Live.Period, "period", time.Second, "--exec: io_step period of each rank (like TAU_ADIOS2_PERIOD)")
	f.StringSliceVar(&cfg.Live.Exclude, "exclude", nil, "--exec: shell patterns of functions not recorded (repeat or comma-separate)")
	ev.add(f, false)
	f.StringArrayVar(&injects, "inject", nil, "--exec: FUNC:PROB:DELAY[@RANKS], delay FUNC by DELAY with probability PROB per call (@RANKS, e.g. @2 or @0-1+6: on those ranks only) and score detection against it (repeatable)")
	return cmd
}

func runPipeline(ctx context.Context, stdout, stderr io.Writer, cfg run.Config, jsonOut, keepServing bool) error {
	log := zerolog.New(zerolog.ConsoleWriter{Out: stderr, TimeFormat: time.TimeOnly}).With().Timestamp().Logger().Level(zerolog.GlobalLevel())
	if zerolog.GlobalLevel() == zerolog.InfoLevel {
		// Lifecycle messages of every component would drown the progress
		// line and the summary; --log-level debug shows them.
		zerolog.SetGlobalLevel(zerolog.WarnLevel)
		defer zerolog.SetGlobalLevel(zerolog.InfoLevel)
	}
	// SIGINT and SIGTERM end the run early but keep what it found (the
	// pipeline's Interrupt); only a second one quits at once. The context
	// kipimo's main cancels on them is left behind for that.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	ctx = context.WithoutCancel(ctx)
	p, err := run.Start(ctx, cfg, log)
	if err != nil {
		return natsAuthHint(err, &cfg.NATSAuth)
	}
	tty := isTerminal(stderr)
	var serving atomic.Bool // the run is over; only its dashboard is up
	stopped, stopWatch := watchSignals(sigs, p, stderr, tty, &serving)
	defer stopWatch() // after Close: a second Ctrl-C still quits during it
	defer func() {
		p.Close(ctx)
		if note := p.CloseNote(); note != "" {
			fmt.Fprintln(stderr, note)
		}
	}()
	if keepServing {
		fmt.Fprintf(stderr, "dashboard: %s (live during the run and after it, until interrupted)\n", p.DashboardURL())
	} else {
		fmt.Fprintf(stderr, "dashboard: %s (live while the run lasts; --keep-serving keeps it up after)\n", p.DashboardURL())
	}
	ep := p.Endpoints()
	fmt.Fprintf(stderr, "endpoints: NATS %s, provenance API %s, in %s while the run lasts (kipimo callstack %s, kipimo query list --url %s)\n",
		ep.NATS, ep.ProvDB, filepath.Join(p.Dir(), run.EndpointsFile), p.Dir(), p.Dir())
	var progress func(run.Progress)
	if tty {
		progress = func(pr run.Progress) {
			rate := 0.0
			if pr.Elapsed > 0 {
				rate = float64(pr.Events) / pr.Elapsed.Seconds()
			}
			steps := fmt.Sprintf("%d", pr.Step)
			if pr.Steps > 0 {
				steps = fmt.Sprintf("%d/%d", pr.Step, pr.Steps)
			}
			behind := ""
			switch {
			case pr.Stalled > 0:
				behind = fmt.Sprintf("  input waiting %.1fs for rank %d (%d steps behind)", pr.Stalled.Seconds(), pr.BehindRank, pr.Behind)
			case pr.Behind > 1:
				behind = fmt.Sprintf("  rank %d is %d steps behind", pr.BehindRank, pr.Behind)
			}
			fmt.Fprintf(stderr, "\r\033[Kstep %s  %d frames  %.2fM events/s  %d anomalies%s", steps, pr.Frames, rate/1e6, pr.Anomalies, behind)
		}
	}
	if len(cfg.Live.Command) > 0 {
		// The command's own output shares the terminal: no progress line.
		progress = nil
		fmt.Fprintf(stderr, "monitoring %q as run %s\n", strings.Join(cfg.Live.Command, " "), p.RunID())
	}
	sum, err := p.Execute(ctx, progress)
	if tty {
		fmt.Fprint(stderr, "\r\033[K")
	}
	if err != nil {
		return err
	}
	if keepServing {
		sum.DashboardServed = run.DashboardUntilInterrupted
	}
	if jsonOut {
		err = sum.WriteJSON(stdout)
	} else {
		err = sum.WriteText(stdout)
	}
	if err != nil {
		return err
	}
	if keepServing && sum.Interrupted == "" {
		fmt.Fprintf(stderr, "serving the dashboard at %s until interrupted\n", p.DashboardURL())
		serving.Store(true)
		<-stopped
	}
	if l := sum.Live; l != nil && l.ExitCode != 0 {
		return &run.ExitError{Code: l.ExitCode}
	}
	if sum.Interrupted != "" {
		code := interruptStatus
		if sum.Interrupted == run.SignalName(syscall.SIGTERM) {
			code = 128 + int(syscall.SIGTERM)
		}
		return &interruptedError{sig: sum.Interrupted, code: code}
	}
	return nil
}

// interruptStatus is the exit status of a run that Ctrl-C ended early, as
// a shell reports a program that SIGINT ended (SIGTERM: 143).
const interruptStatus = 128 + int(syscall.SIGINT)

// interruptedError ends kipimo run with a status saying it was interrupted,
// once the summary is written; main prints nothing more.
type interruptedError struct {
	sig  string
	code int
}

func (e *interruptedError) Error() string { return "interrupted (" + e.sig + ")" }

// ExitCode is the status kipimo exits with.
func (e *interruptedError) ExitCode() int { return e.code }

// watchSignals handles the signals of sigs during a run: the first asks p
// to end the run early (Interrupt) and closes the channel it returns (once
// serving is set, the run is over and the first only stops the dashboard
// kept up after it); a second kills a live run's command and exits at
// once. stop ends the watch; it returns once the watching goroutine has.
func watchSignals(sigs <-chan os.Signal, p *run.Pipeline, stderr io.Writer, tty bool, serving *atomic.Bool) (stopped <-chan struct{}, stop func()) {
	first := make(chan struct{})
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var sig os.Signal
		select {
		case sig = <-sigs:
		case <-done:
			return
		}
		if tty {
			fmt.Fprint(stderr, "\r\033[K") // the progress line
		}
		if serving.Load() {
			fmt.Fprintf(stderr, "%s: stopping the dashboard (the run is over)\n", run.SignalName(sig))
		} else {
			fmt.Fprintf(stderr, "%s: ending the run and keeping what it found (again to quit at once)\n", run.SignalName(sig))
			p.Interrupt(sig)
		}
		close(first)
		select {
		case sig = <-sigs:
		case <-done:
			return
		}
		p.Kill()
		fmt.Fprintf(stderr, "%s again: quitting; %s holds what was stored so far\n", run.SignalName(sig), p.Dir())
		os.Exit(interruptStatus)
	}()
	return first, func() {
		close(done)
		wg.Wait()
	}
}

// applyMemoryLimit applies a --memory-limit value to this process and says
// on w which limit is in force, if any.
func applyMemoryLimit(w io.Writer, value string) error {
	lim, err := daemon.ApplyMemoryLimit(value)
	if err != nil {
		return err
	}
	if lim.Bytes > 0 {
		fmt.Fprintf(w, "memory limit: %s\n", lim)
	}
	return nil
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
