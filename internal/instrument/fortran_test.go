package instrument

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/mpitest"
)

// A Fortran MPI program, through each of its three interfaces (mpif.h, use
// mpi, use mpi_f08), unmodified and built with mpif90 of Open MPI and of
// MPICH (each with the library built for it): every MPI call it makes, of
// a function with rules of its own or of one wrapped from mpi.h
// (MPI_Get_version), streams as an execution of the MPI function's name, as many as an
// independent counter of its Fortran calls counts (testdata/mpifcount.c,
// preloaded alone in a second run) and as the program's own loop makes, and
// its output is the same as in the counter's run.
func TestFortranMPIProgramsStreamTheirCalls(t *testing.T) {
	requireMPI(t)
	const (
		ranks = 2
		iters = 1000
	)
	for _, k := range installedMPIs {
		t.Run(k.name, func(t *testing.T) {
			mpif90 := strings.Replace(k.mpicc, "mpicc", "mpif90", 1)
			mpitest.Require(t, k.mpicc, k.mpirun, mpif90)
			dir := t.TempDir()
			counter := filepath.Join(dir, "libmpifcount.so")
			if b, err := exec.Command(k.mpicc, "-O1", "-fPIC", "-shared", "-o", counter,
				filepath.Join("testdata", "mpifcount.c"), "-ldl").CombinedOutput(); err != nil {
				t.Fatalf("build the Fortran PMPI counter: %v\n%s", err, b)
			}
			for _, src := range []string{"fringh.f90", "fring.f90", "fring08.f90"} {
				t.Run(src, func(t *testing.T) {
					prog := filepath.Join(dir, src+".exe")
					if b, err := exec.Command(mpif90, "-O1", "-o", prog, filepath.Join("testdata", src)).CombinedOutput(); err != nil {
						t.Fatalf("%s %s: %v\n%s", mpif90, src, err, b)
					}
					lib := libraryFor(t, k.mpirun, "-np", "2", prog)
					fortranRun(t, lib, k.mpirun, counter, []string{"-np", fmt.Sprint(ranks), prog, fmt.Sprint(iters)}, ranks, iters)
				})
			}
		})
	}
}

// fortranRun runs a ring program under the counter and under Kipimo, and
// compares.
func fortranRun(t *testing.T, lib *Library, mpirun, counter string, args []string, ranks uint32, iters int) {
	base := mpitest.Env(os.Environ())
	countDir := t.TempDir()
	plain, code := runProgram(t, append(base, "LD_PRELOAD="+counter, "MPICOUNT_DIR="+countDir), mpirun, args...)
	if code != 0 || strings.Count(plain, " total ") != int(ranks) {
		t.Fatalf("under the counter: status %d, output\n%s", code, plain)
	}
	ns := startNATS(t)
	nc := connect(t, ns)
	const run = "fortran"
	c := collect(t, nc, run)
	env := lib.Environ(Env{NATSURL: ns.ClientURL(), Run: run, Period: 50 * time.Millisecond}, base)
	out, code := runProgram(t, env, mpirun, args...)
	if code != 0 || sortedLines(out) != sortedLines(plain) {
		t.Errorf("under Kipimo: status %d, output\n%s\nunder the counter:\n%s", code, out, plain)
	}
	c.waitEOS(t, int(ranks))
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.bad) > 0 {
		t.Fatal(c.bad)
	}
	known := map[string]int{
		"MPI_Init": 1, "MPI_Comm_rank": 1, "MPI_Comm_size": 1, "MPI_Get_version": 1,
		"MPI_Sendrecv_replace": iters, "MPI_Allreduce": iters, "MPI_Finalize": 1,
	}
	for r := range ranks {
		s := c.ranks[r]
		if s == nil {
			t.Fatalf("rank %d streamed nothing", r)
		}
		want := readCounts(t, filepath.Join(countDir, fmt.Sprintf("count.%d", r)))
		for fn, n := range known {
			if want.calls[fn] != n {
				t.Errorf("rank %d: the counter counted %d calls of %s, the program makes %d", r, want.calls[fn], fn, n)
			}
			if s.calls[fn] != want.calls[fn] {
				t.Errorf("rank %d: %s: %d executions streamed, the counter counted %d", r, fn, s.calls[fn], want.calls[fn])
			}
		}
		// Nothing else: a Fortran call is recorded once, not again by the C
		// wrapper of a function it calls.
		for fn, n := range s.calls {
			if _, ok := known[fn]; !ok {
				t.Errorf("rank %d: %d executions of %s, which the program does not call", r, n, fn)
			}
		}
		if s.mismatch != 0 || s.unnamed != 0 {
			t.Errorf("rank %d: %d mismatched exits, %d events before their function's name", r, s.mismatch, s.unnamed)
		}
	}
}
