package instrument

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/mpitest"
)

// nwchemEnergyRE finds the SCF energy in NWChem's output.
var nwchemEnergyRE = regexp.MustCompile(`Total SCF energy =\s+(-?[0-9.]+)`)

// runNWChem runs Debian's NWChem on 2 ranks with testdata/h2o.nw (an SCF
// energy of water in the STO-3G basis) in a directory of its own, and
// returns the SCF energy it printed.
func runNWChem(t *testing.T, nwchem string, env []string) float64 {
	t.Helper()
	dir := t.TempDir()
	in, err := os.ReadFile(filepath.Join("testdata", "h2o.nw"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "h2o.nw"), in, 0o644); err != nil {
		t.Fatal(err)
	}
	out, code := runProgramIn(t, dir, env, "mpirun", "-np", "2", nwchem, "h2o.nw")
	m := nwchemEnergyRE.FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("nwchem exited with status %d without an SCF energy:\n%s", code, out)
	}
	e, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// NWChem, unmodified (Debian's nwchem-openmpi: Fortran that calls MPI
// through Global Arrays over MPI one-sided communication; it also imports
// Fortran entry points, which this input does not call), on 2 ranks: the
// calls of every MPI function it makes equal per rank what an independent counter
// preloaded in front of the library counts in the same run; no call is
// dropped, no path is broken, and the energy it computes is the same as
// without Kipimo.
func TestNWChemCountsEqualCounterInSameRun(t *testing.T) {
	nwchem := requireApp(t, "nwchem")
	lib := library(t)
	counter := stackCounter(t)
	base := mpitest.Env(os.Environ())
	plain := runNWChem(t, nwchem, base)

	ns := startNATS(t)
	nc := connect(t, ns)
	const run = "nwchem"
	c := collect(t, nc, run)
	countDir := t.TempDir()
	env := stacked(t, lib.Environ(Env{NATSURL: ns.ClientURL(), Run: run, Period: 200 * time.Millisecond}, base), counter, countDir)
	// The energy converges to 1e-8 Hartree; the order in which Global
	// Arrays hands out tasks (and so sums) differs between runs.
	if got := runNWChem(t, nwchem, env); got-plain > 1e-6 || plain-got > 1e-6 {
		t.Errorf("SCF energy under Kipimo %.9f, alone %.9f", got, plain)
	}
	c.waitEOS(t, 2)
	totals := sameRunCounts(t, c, countDir, 2, importedMPI(t, nwchem))
	want := readCounts(t, filepath.Join(countDir, "count.0"))
	if totals[0] < 1000 || want.calls["MPI_Win_lock"] == 0 && want.calls["MPI_Win_lock_all"] == 0 {
		t.Errorf("rank 0: %d MPI calls, %d MPI_Win_lock and %d MPI_Win_lock_all: the input no longer runs NWChem's one-sided communication",
			totals[0], want.calls["MPI_Win_lock"], want.calls["MPI_Win_lock_all"])
	}
}
