package instrument

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// clangOMP builds testdata/omp_counts.c with clang and LLVM's libomp, or
// skips the test where they are missing (failing it instead when
// KIPIMO_REQUIRE_OMPT=1).
func clangOMP(t *testing.T) string {
	t.Helper()
	prog := filepath.Join(t.TempDir(), "omp_counts")
	b, err := exec.Command("clang", "-O1", "-g", "-fopenmp", "-o", prog, filepath.Join("testdata", "omp_counts.c")).CombinedOutput()
	if err == nil {
		if b, err = exec.Command("ldd", prog).CombinedOutput(); err == nil && !strings.Contains(string(b), "libomp") {
			err = fmt.Errorf("not linked with libomp")
		}
	}
	if err != nil {
		if os.Getenv("KIPIMO_REQUIRE_OMPT") == "1" {
			t.Fatalf("clang -fopenmp with libomp: %v\n%s (KIPIMO_REQUIRE_OMPT=1)", err, b)
		}
		t.Skipf("no clang with libomp (Debian: apt-get install clang libomp-dev): %v", err)
	}
	return prog
}

// ompCounts reads what omp_counts says it ran: regions begun, and per
// OpenMP thread number the implicit tasks, loops and explicit barriers.
func ompCounts(t *testing.T, out string) (regions int, per map[int][3]int) {
	t.Helper()
	per = map[int][3]int{}
	for _, line := range strings.Split(out, "\n") {
		var n, a, b, c int
		switch {
		case strings.HasPrefix(line, "regions "):
			fmt.Sscanf(line, "regions %d", &regions)
		case strings.HasPrefix(line, "thread "):
			if _, err := fmt.Sscanf(line, "thread %d tasks %d loops %d barriers %d", &n, &a, &b, &c); err != nil {
				t.Fatalf("line %q: %v", line, err)
			}
			per[n] = [3]int{a, b, c}
		}
	}
	return regions, per
}

// runOMP runs prog alone and under the library, checks that its output and
// status are the same, and returns the output and the frames' view.
func runOMP(t *testing.T, lib *Library, prog, run string, args ...string) (string, *threadView) {
	t.Helper()
	plain, plainCode := runProgram(t, append(os.Environ(), "OMP_NUM_THREADS=4"), prog, args...)
	ns := startNATS(t)
	nc := connect(t, ns)
	l := logFrames(t, nc, run)
	env := lib.Environ(Env{NATSURL: ns.ClientURL(), Run: run, Period: 20 * time.Millisecond}, append(os.Environ(), "OMP_NUM_THREADS=4"))
	out, code := runProgram(t, env, prog, args...)
	if plainCode != 3 || code != plainCode || out != plain {
		t.Fatalf("under Kipimo: status %d, output\n%s\nalone: status %d, output\n%s", code, out, plainCode, plain)
	}
	l.waitEOS(t)
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.bad) > 0 {
		t.Fatal(l.bad)
	}
	v := rebuild(l.frames)
	if v.mismatch != 0 || v.open != 0 || len(v.dropped) != 0 {
		t.Errorf("%d exits did not match their entries, %d executions left open, dropped %v", v.mismatch, v.open, v.dropped)
	}
	return out, v
}

// An OpenMP program built with clang and LLVM's libomp
// (testdata/omp_counts.c), unmodified, run under the library: on each
// thread, marked with its OpenMP thread number, as many implicit tasks,
// loops ("omp for") and explicit barriers as the program counted itself,
// each inside an implicit task; the parallel regions on the initial thread
// alone, each around that thread's implicit task; one implicit barrier per
// loop in each thread's tasks (the loop's, without nowait) and, on the
// initial thread, the barrier closing each region; no other execution; every
// execution closed; output and status unchanged.
func TestOMPTProgramStreamsItsRegions(t *testing.T) {
	prog := clangOMP(t)
	lib := library(t)
	const regions = 25
	out, v := runOMP(t, lib, prog, "ompt", fmt.Sprint(regions))
	began, per := ompCounts(t, out)
	if began != regions || len(per) != 4 {
		t.Fatalf("program output:\n%s", out)
	}
	type key struct {
		num        int
		fn, parent string
	}
	got := map[key]int{}
	threadOf := map[uint32]int{}
	for tid, m := range v.meta {
		if n, ok := m["OpenMP Thread"]; ok {
			var num int
			fmt.Sscan(n, &num)
			threadOf[tid] = num
		}
	}
	for _, x := range v.execs {
		num, ok := threadOf[x.tid]
		if !ok {
			num = -1
		}
		got[key{num, x.fn, x.parent}]++
	}
	var lines []string
	for k, n := range got {
		lines = append(lines, fmt.Sprintf("thread %d: %s (in %q) x%d", k.num, k.fn, k.parent, n))
	}
	sort.Strings(lines)
	t.Logf("executions:\n%s", strings.Join(lines, "\n"))
	if len(threadOf) != 4 {
		t.Errorf("OpenMP thread numbers on %d threads (%v), want 4", len(threadOf), threadOf)
	}
	const (
		par  = "omp parallel @ main"
		task = "omp implicit task @ main"
	)
	for num, c := range per {
		taskParent := ""
		if num == 0 {
			taskParent = par
			if got[key{0, par, ""}] != regions {
				t.Errorf("thread 0: %d parallel regions, want %d", got[key{0, par, ""}], regions)
			}
		}
		want := map[key]int{
			{num, task, taskParent}:                                  c[0],
			{num, "omp for @ main", task}:                            c[1],
			{num, "omp barrier @ main", task}:                        c[2],
			{num, "omp implicit barrier (worksharing) @ main", task}: c[1],
		}
		if num == 0 {
			want[key{num, "omp implicit barrier (parallel) @ main", task}] = c[0]
		}
		for k, w := range want {
			if got[k] != w {
				t.Errorf("thread %d: %d executions of %s in %q, want %d", num, got[k], k.fn, k.parent, w)
			}
		}
	}
	expected := 0
	for num, c := range per {
		expected += c[0] + 2*c[1] + c[2]
		if num == 0 {
			expected += regions + c[0]
		}
	}
	if len(v.execs) != expected {
		t.Errorf("%d executions, want %d", len(v.execs), expected)
	}
}

// The same program built with GCC, whose libgomp has no OMPT, and compiler
// instrumentation: it runs as it does alone, its functions stream, and no
// OpenMP region is reported.
func TestOMPTAbsentUnderLibgomp(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no gcc")
	}
	lib := library(t)
	prog := filepath.Join(t.TempDir(), "omp_counts_gomp")
	args := append([]string{"-O1", "-g", "-fopenmp"}, strings.Fields(lib.CFlags())...)
	args = append(args, "-o", prog, filepath.Join("testdata", "omp_counts.c"))
	if b, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, b)
	}
	_, v := runOMP(t, lib, prog, "gomp", "5")
	mains := 0
	for _, x := range v.execs {
		if strings.HasPrefix(x.fn, "omp ") {
			t.Fatalf("an OpenMP region %q under libgomp", x.fn)
		}
		if x.fn == "main" {
			mains++
		}
	}
	if mains != 1 {
		t.Errorf("main streamed %d times, want once", mains)
	}
}
