// Package mpitest holds what the tests that run real MPI programs share:
// finding the tools they need (skipping without them, failing in CI), the
// environment Open MPI needs on a test machine, and a machine-wide lock so
// that MPI jobs of different test packages do not run at the same time.
//
// Test packages running at once (go test ./... runs them in parallel) would
// otherwise put two MPI jobs that busy-poll on the same cores, and what the
// tests measure (message timings, detection of injected delays) would be the
// scheduler's.
package mpitest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// Require skips t when a tool is not on PATH, unless KIPIMO_REQUIRE_MPI=1
// (CI), where it fails.
func Require(t testing.TB, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("KIPIMO_REQUIRE_MPI") == "1" {
				t.Fatalf("%s not found and KIPIMO_REQUIRE_MPI=1", tool)
			}
			t.Skipf("%s not found (Debian: apt-get install gcc openmpi-bin libopenmpi-dev lammps)", tool)
		}
	}
}

// Env is env with what Open MPI needs to run tests: root allowed (CI runs
// as root in a container) and more ranks than cores.
func Env(env []string) []string {
	return append(env, "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", "OMPI_MCA_rmaps_base_oversubscribe=1")
}

// Lock holds the machine's MPI test lock until t ends. Under -short it
// skips t instead: a real MPI job takes tens of seconds to minutes, and the
// short pass (CI's race pass) checks the Go side, which the full pass has
// already run against the same jobs.
func Lock(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("a live MPI job: left out under -short")
	}
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "kipimo-mpi-tests.lock"), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatalf("MPI test lock: %v", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		t.Fatalf("MPI test lock: %v", err)
	}
	t.Cleanup(func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	})
}

// LAMMPSThermo is LAMMPS's thermodynamic output (the table from its "Step"
// header to "Loop time"): what the simulation computed, without timings, so
// runs with and without instrumentation compare equal.
func LAMMPSThermo(out string) string {
	var b strings.Builder
	in := false
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "Step"):
			in = true
		case strings.HasPrefix(line, "Loop time"):
			in = false
		}
		if in {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}
