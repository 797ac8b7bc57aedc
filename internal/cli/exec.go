package cli

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kipimo-hpc/kipimo/internal/config"
	"github.com/kipimo-hpc/kipimo/internal/daemon"
	"github.com/kipimo-hpc/kipimo/internal/instrument"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
)

func newExecCmd() *cobra.Command {
	var (
		env     instrument.Env
		injects []string
		noMPI   bool
		auth    *daemon.NATSAuth
	)
	cmd := &cobra.Command{
		Use:   "exec --run ID [flags] -- COMMAND [ARGS...]",
		Short: "Run one process (one rank) with the event library, streaming to external daemons",
		Long: `Exec runs COMMAND with Kipimo's event library preloaded, set up to stream to a
NATS server (normally the node-local one) under run ID, and nothing else: it
replaces itself with the command, so no Go runtime stays in the rank, and the
command's output, signals and exit status are its own. It is the per-rank
launcher for clusters, where the detectors (ad), the parameter server and the
provenance service run as their own daemons:

  mpirun -np 64 kipimo exec --nats nats://127.0.0.1:4222 --run $SLURM_JOB_ID -- ./app
  srun kipimo exec --run $SLURM_JOB_ID -- ./app

The library is built on first use into the cache (see kipimo lib); build it
once before launching many ranks. Every flag is also a KIPIMO_<FLAG>
environment variable, the same ones the library itself reads.`,
		Example: `  kipimo exec --run r1 -- ./app input.dat
  mpirun -np 4 kipimo exec --run r1 --period 500ms --inject MPI_Allreduce:0.01:20ms -- ./app`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return errors.New("give the command to run after --, e.g. kipimo exec --run r1 -- ./app")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := config.Apply(cmd.Flags(), nil); err != nil {
				return err
			}
			if err := natsx.ValidRun(env.Run); err != nil {
				return fmt.Errorf("--run: %w", err)
			}
			url, err := libraryNATSURL(env.NATSURL, auth)
			if err != nil {
				return err
			}
			env.NATSURL = url
			for _, s := range injects {
				in, err := instrument.ParseInjection(s)
				if err != nil {
					return fmt.Errorf("--inject: %w", err)
				}
				env.Inject = append(env.Inject, in)
			}
			path, err := exec.LookPath(args[0])
			if err != nil {
				return fmt.Errorf("the command to run: %w", err)
			}
			lib, err := buildForExec(cmd, noMPI, args)
			if err != nil {
				return err
			}
			// Replace this process with the command: the rank is the
			// program itself, with the library inside.
			return syscall.Exec(path, args, lib.Environ(env, os.Environ()))
		},
	}
	f := cmd.Flags()
	config.AddConfigFlag(f)
	f.StringVar(&env.NATSURL, "nats", "nats://127.0.0.1:4222", "NATS server the frames go to (the node-local one); a token as nats://TOKEN@host:4222")
	auth = addNATSAuth(f)
	f.StringVar(&env.Run, "run", "", "run id on the NATS subjects (required)")
	f.Uint32Var(&env.PID, "pid", 0, "program id on the subjects (one per program of an MPMD job)")
	f.DurationVar(&env.Period, "period", time.Second, "io_step period (like TAU_ADIOS2_PERIOD)")
	f.StringSliceVar(&env.Exclude, "exclude", nil, "shell patterns of functions not recorded (repeat or comma-separate)")
	f.StringArrayVar(&injects, "inject", nil, "FUNC:PROB:DELAY[@RANKS]: delay FUNC by DELAY with probability PROB per call, recorded as ground truth; @RANKS (e.g. @2 or @0-1+6) on those ranks only (repeatable)")
	f.Uint64Var(&env.Seed, "seed", 1, "seed of the injection draws")
	f.StringVar(&env.StatusDir, "status-dir", "", "directory each process writes its status (frames sent and dropped, injected calls) to at exit")
	f.IntVar(&env.BufferEvents, "buffer-events", 0, "events each thread's buffer holds (default 131072)")
	f.Int64Var(&env.QueueBytes, "queue-bytes", 0, "bound of encoded frames waiting for the server; beyond it frames are dropped and counted (default 64 MiB)")
	f.BoolVar(&env.NoCounters, "no-counters", false, "do not record the per-step process counters (CPU time, RSS, context switches)")
	f.BoolVar(&noMPI, "no-mpi", false, "do not load the MPI wrappers even when an MPI is installed")
	return cmd
}

// buildForExec builds the library with the MPI wrappers when an MPI is
// there, for the MPI of command's program when given; when they cannot be
// built for it, the command runs uninstrumented (the zero Library).
func buildForExec(cmd *cobra.Command, noMPI bool, command []string) (*instrument.Library, error) {
	ctx := cmd.Context()
	if !noMPI {
		lib, err := instrument.Build(ctx, instrument.BuildOptions{MPI: true, Command: command})
		if errors.Is(err, instrument.ErrProgramMPI) {
			fmt.Fprintf(cmd.ErrOrStderr(), "kipimo: %v\nkipimo: running %s uninstrumented\n", err, command[0])
			return &instrument.Library{}, nil
		}
		if !errors.Is(err, instrument.ErrNoMPI) {
			return lib, err
		}
	}
	return instrument.Build(ctx, instrument.BuildOptions{Command: command})
}

func newLibCmd() *cobra.Command {
	var cflags, libs, preload, dir, noMPI bool
	cmd := &cobra.Command{
		Use:   "lib [--cflags] [--libs] [--preload] [--dir]",
		Short: "Build the in-process event library and print how to use it",
		Long: `Lib builds Kipimo's event library from the C sources embedded in kipimo, with
the system's C compiler ($CC or cc) and, for the MPI wrappers, mpicc ($MPICC),
into the cache ($KIPIMO_CACHE_DIR, else the user's cache directory), unless
the same build is already there. It then prints where the library is and how
to build programs against it. With a flag, it prints only that, for build
files:

  CFLAGS  += $(shell kipimo lib --cflags)
  LDFLAGS += $(shell kipimo lib --libs)

Programs compiled with -finstrument-functions report every function; the
kipimo.h API marks regions, counters, metadata and steps (C, C++, Fortran);
unmodified MPI programs are seen through PMPI when preloaded.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			lib, err := buildForExec(cmd, noMPI, nil)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			var parts []string
			if cflags {
				parts = append(parts, lib.CFlags())
			}
			if libs {
				parts = append(parts, lib.LDFlags())
			}
			if preload {
				parts = append(parts, lib.Preload())
			}
			if dir {
				parts = append(parts, lib.Dir)
			}
			if len(parts) > 0 {
				_, err := fmt.Fprintln(out, strings.Join(parts, " "))
				return err
			}
			mpi := "not built (no mpicc)"
			if lib.MPI != "" {
				mpi = lib.MPI
			}
			_, err = fmt.Fprintf(out, `event library   %s
  core          %s
  MPI wrappers  %s
  header        %s/%s
compile with    %s
link with       %s
preload with    LD_PRELOAD="%s"
run with        kipimo run --exec -- COMMAND   (or kipimo exec --run ID -- COMMAND per rank)
`, lib.Dir, lib.Core, mpi, lib.Include(), instrument.Header, lib.CFlags(), lib.LDFlags(), lib.Preload())
			return err
		},
	}
	f := cmd.Flags()
	f.BoolVar(&cflags, "cflags", false, "print the compiler flags (-finstrument-functions and the header's directory)")
	f.BoolVar(&libs, "libs", false, "print the linker flags")
	f.BoolVar(&preload, "preload", false, "print the LD_PRELOAD value")
	f.BoolVar(&dir, "dir", false, "print the library's directory")
	f.BoolVar(&noMPI, "no-mpi", false, "do not build the MPI wrappers")
	return cmd
}
