package instrument

import (
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// ExplainNoEvents says why a command run with the library may have
// streamed no event, each reason with what to do about it. status is what
// its processes reported at their exit (ReadStatus), env the environment it
// ran with (l.Environ). It returns at least one reason.
func (l *Library) ExplainNoEvents(ctx context.Context, command, env []string, status []Status) []string {
	cm := detectMPI(ctx, command)
	var why []string
	rootRefused := len(command) > 0 && os.Geteuid() == 0 && envValue(env, "OMPI_ALLOW_RUN_AS_ROOT") == "" &&
		(cm.family == FamilyOpenMPI || cm.launcher && launcherFamily(lookPath(command[0])) == FamilyOpenMPI)
	if rootRefused {
		why = append(why, "Open MPI refuses to run as root, and the command runs as root: set "+
			"OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 (or run as another user)")
	}
	if l.Core == "" {
		why = append(why, "the program ran uninstrumented: no MPI wrappers could be built for its MPI "+
			"(see the warning above)")
		return why
	}
	instrumented := false
	if cm.program != "" {
		static, cyg := programSymbols(cm.program)
		instrumented = cyg
		switch {
		case static:
			why = append(why, fmt.Sprintf("%s has MPI linked in statically: a preloaded library cannot see its "+
				"calls; link it with the MPI's shared library (mpicc without -static), or build it with "+
				"-finstrument-functions to see its own functions", cm.program))
		case cm.mpiLib == "" && !cyg:
			why = append(why, fmt.Sprintf("%s is not an MPI program (it loads no MPI library) and was not built "+
				"with -finstrument-functions or the kipimo.h API, so there is nothing to record: build it with "+
				"the flags of `kipimo lib --cflags --libs`", cm.program))
		}
	}
	if len(status) == 0 && (cm.launcher || cm.program == "") && !rootRefused {
		why = append(why, "no process reported loading the library: the launcher may not pass LD_PRELOAD and "+
			"the KIPIMO_* variables to the ranks (Open MPI across nodes: mpirun -x LD_PRELOAD -x KIPIMO_NATS "+
			"-x KIPIMO_RUN -x KIPIMO_PID; Slurm: srun --export=ALL), or the command runs the program through "+
			"a script or container that resets the environment")
	}
	if len(why) == 0 && !instrumented {
		why = append(why, "the processes loaded the library but made no recorded call: is the program dynamically "+
			"linked against MPI, or built with -finstrument-functions or the kipimo.h API?")
	}
	if len(why) == 0 {
		why = append(why, "the processes produced events but none arrived: see the processes' last errors "+
			"in the run's summary (the NATS server may have been unreachable from them)")
	}
	return why
}

// programSymbols says whether the program defines MPI_Init itself (MPI
// linked statically) and whether it calls __cyg_profile_func_enter (built
// with -finstrument-functions).
func programSymbols(path string) (staticMPI, cyg bool) {
	f, err := elf.Open(path)
	if err != nil {
		return false, false
	}
	defer f.Close()
	syms, _ := f.DynamicSymbols()
	if all, err := f.Symbols(); err == nil {
		syms = append(syms, all...)
	}
	for _, s := range syms {
		switch s.Name {
		case "MPI_Init", "PMPI_Init":
			if s.Section != elf.SHN_UNDEF {
				staticMPI = true
			}
		case "__cyg_profile_func_enter":
			cyg = true
		}
		if strings.HasPrefix(s.Name, "kipimo_") && s.Section == elf.SHN_UNDEF {
			cyg = true // the API
		}
	}
	return staticMPI, cyg
}

// envValue is the value of key in env, the last one set.
func envValue(env []string, key string) string {
	v := ""
	for _, kv := range env {
		if k, val, ok := strings.Cut(kv, "="); ok && k == key {
			v = val
		}
	}
	return v
}

// lookPath is the path exec would run for name, or name.
func lookPath(name string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	return name
}
