package instrument

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/mpitest"
)

// requireApp skips a test without one of Debian's MPI applications (failing
// with KIPIMO_REQUIRE_MPI=1), needs MPI, and holds the machine's MPI lock.
func requireApp(t *testing.T, app string) string {
	t.Helper()
	mpitest.Require(t, app, "nm", "ldd")
	requireMPI(t)
	path, err := exec.LookPath(app)
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// stackCounter builds testdata/mpistack.c, the independent counter that is
// preloaded in front of Kipimo's library and counts every call of the MPI
// functions it lists in the run that Kipimo measures.
func stackCounter(t *testing.T) string {
	t.Helper()
	lib := filepath.Join(t.TempDir(), "libmpistack.so")
	if b, err := exec.Command("mpicc", "-O1", "-fPIC", "-shared", "-o", lib, filepath.Join("testdata", "mpistack.c"), "-ldl").CombinedOutput(); err != nil {
		t.Fatalf("build the stacked MPI counter: %v\n%s", err, b)
	}
	return lib
}

// stacked is env (the library's) with the counter preloaded in front of
// the library, writing its counts into countDir.
func stacked(t *testing.T, env []string, counter, countDir string) []string {
	t.Helper()
	out := slices.Clone(env)
	for i, kv := range out {
		if v, ok := strings.CutPrefix(kv, "LD_PRELOAD="); ok {
			out[i] = "LD_PRELOAD=" + counter + " " + v
			return append(out, "MPICOUNT_DIR="+countDir)
		}
	}
	t.Fatal("the library's environment has no LD_PRELOAD")
	return nil
}

// notCounted are the MPI functions that neither Kipimo nor the counter
// records: the clock reads and the handle conversions.
var notCounted = regexp.MustCompile(`(?i)^(mpi_wtime|mpi_wtick|mpi_pcontrol|mpi_.*_(f2c|c2f))_*$`)

// importedMPI lists the MPI functions (C and Fortran symbols) that program
// and the shared libraries it loads (other than the MPI's own) import.
func importedMPI(t *testing.T, program string) []string {
	t.Helper()
	files := []string{program}
	ldd, err := exec.Command("ldd", program).Output()
	if err != nil {
		t.Fatalf("ldd %s: %v", program, err)
	}
	for _, line := range strings.Split(string(ldd), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[1] == "=>" && !strings.Contains(f[0], "libmpi") && !strings.Contains(f[0], "libopen-") {
			files = append(files, f[2])
		}
	}
	seen := map[string]bool{}
	for _, f := range files {
		out, err := exec.Command("nm", "-D", "--undefined-only", f).Output()
		if err != nil {
			continue // a library without dynamic symbols
		}
		for _, line := range strings.Split(string(out), "\n") {
			fs := strings.Fields(line)
			if len(fs) == 0 {
				continue
			}
			sym, _, _ := strings.Cut(fs[len(fs)-1], "@")
			if (strings.HasPrefix(sym, "MPI_") || strings.HasPrefix(sym, "mpi_")) && !notCounted.MatchString(sym) {
				seen[sym] = true
			}
		}
	}
	var out []string
	for s := range seen {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// sameRunCounts checks, rank by rank, that the calls of every MPI function
// in the frames a run streamed (executions and summarised calls, what its
// profiles count) equal what the stacked counter counted in that run, and
// that every MPI function the program imports is one the counter counts.
// It returns the MPI calls counted per rank.
func sameRunCounts(t *testing.T, c *collector, countDir string, ranks int, imported []string) []int {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.bad) > 0 {
		t.Fatal(c.bad)
	}
	totals := make([]int, ranks)
	for r := range ranks {
		want := readCounts(t, filepath.Join(countDir, fmt.Sprintf("count.%d", r)))
		if r == 0 {
			for _, sym := range imported {
				name := "MPI_" + strings.TrimSuffix(sym[4:], "_")
				found := false
				for fn := range want.calls {
					found = found || strings.EqualFold(fn, name)
				}
				if !found {
					t.Errorf("the program imports %s, which testdata/mpistack.c does not count: add it there", sym)
				}
			}
		}
		s := c.ranks[uint32(r)]
		if s == nil {
			t.Fatalf("rank %d streamed nothing", r)
		}
		if s.unnamed != 0 || s.mismatch != 0 {
			t.Errorf("rank %d: %d events before their function's name, %d exits without their entry", r, s.unnamed, s.mismatch)
		}
		for tid, st := range s.open {
			for _, o := range st {
				t.Errorf("rank %d, thread %d: %s entered at %d never exits", r, tid, s.names[o.fid], o.entry)
			}
		}
		for fn, n := range want.calls {
			totals[r] += n
			if s.calls[fn] != n {
				t.Errorf("rank %d: %s: %d calls streamed and summarised (%d of them summarised, %d dropped), the counter counted %d in the same run",
					r, fn, s.calls[fn], s.summarised[fn], s.droppedCalls[fn], n)
			}
		}
		for fn, n := range s.calls {
			if _, ok := want.calls[fn]; !ok && strings.HasPrefix(fn, "MPI_") {
				t.Errorf("rank %d: %s: %d calls streamed, a function testdata/mpistack.c does not count: add it there", r, fn, n)
			}
		}
		summarised := 0
		for _, n := range s.summarised {
			summarised += n
		}
		var each []string
		for fn, n := range want.calls {
			if n > 0 {
				each = append(each, fmt.Sprintf("%s %d/%d", fn, n, s.calls[fn]))
			}
		}
		slices.Sort(each)
		t.Logf("rank %d: %d frames, %d MPI calls counted, %d of them summarised; counted/streamed: %s",
			r, s.frames, totals[r], summarised, strings.Join(each, ", "))
	}
	return totals
}

// hpccChecks are the lines of HPCC's output file that say whether its
// results verified: what it computed, without timings.
func hpccChecks(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "hpccoutf.txt"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, "passed") || strings.Contains(line, "FAILED") || strings.Contains(line, "errors in") {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return strings.Join(out, "\n")
}

// runHPCC runs Debian's HPCC on 2 ranks with testdata/hpccinf.txt (a 400 x
// 400 HPL problem and the other tests sized from it) in a directory of its
// own, which it returns with the output file in it.
func runHPCC(t *testing.T, hpcc string, env []string) string {
	t.Helper()
	dir := t.TempDir()
	in, err := os.ReadFile(filepath.Join("testdata", "hpccinf.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "hpccinf.txt"), in, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, code := runProgramIn(t, dir, env, "mpirun", "-np", "2", hpcc); code != 0 {
		t.Fatalf("hpcc exited with status %d", code)
	}
	return dir
}

// HPCC, unmodified (Debian's hpcc), on 2 ranks: the calls of every MPI
// function it makes, the millions of MPI_Test and MPI_Testany calls of its
// RandomAccess polling loops included, equal per rank what an independent
// counter preloaded in front of the library counts in the same run (two
// runs poll different numbers of times); no call is dropped, no path is
// broken, and its verification output is the same as without Kipimo.
func TestHPCCCountsEqualCounterInSameRun(t *testing.T) {
	hpcc := requireApp(t, "hpcc")
	lib := library(t)
	counter := stackCounter(t)
	base := mpitest.Env(os.Environ())
	plain := hpccChecks(t, runHPCC(t, hpcc, base))
	if strings.Count(plain, "passed") < 4 {
		t.Fatalf("hpcc alone verified:\n%s\nwant its RandomAccess, PTRANS and HPL checks passed", plain)
	}

	ns := startNATS(t)
	nc := connect(t, ns)
	const run = "hpcc"
	c := collect(t, nc, run)
	countDir := t.TempDir()
	env := stacked(t, lib.Environ(Env{NATSURL: ns.ClientURL(), Run: run, Period: 200 * time.Millisecond}, base), counter, countDir)
	dir := runHPCC(t, hpcc, env)
	if got := hpccChecks(t, dir); got != plain {
		t.Errorf("hpcc's verification under Kipimo:\n%s\nalone:\n%s", got, plain)
	}
	c.waitEOS(t, 2)
	totals := sameRunCounts(t, c, countDir, 2, importedMPI(t, hpcc))
	want := readCounts(t, filepath.Join(countDir, "count.0"))
	if want.calls["MPI_Testany"] < 10000 || want.calls["MPI_Cancel"] == 0 || totals[0] < 100000 {
		t.Errorf("rank 0: %d MPI calls, %d MPI_Testany and %d MPI_Cancel: the input no longer runs HPCC's polling loops",
			totals[0], want.calls["MPI_Testany"], want.calls["MPI_Cancel"])
	}
}
