package instrument

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/mpitest"
)

// requireLAMMPS skips a test without Debian's lammps (lmp), unless
// KIPIMO_REQUIRE_MPI=1, where it fails.
func requireLAMMPS(t testing.TB) string {
	t.Helper()
	mpitest.Require(t, "lmp")
	requireMPI(t)
	lmp, err := exec.LookPath("lmp")
	if err != nil {
		t.Fatal(err)
	}
	return lmp
}

// mpiCounts are what testdata/mpicount.c counted on one rank.
type mpiCounts struct {
	calls map[string]int
	sends map[uint32][2]int64 // destination -> messages, bytes
}

func readCounts(t *testing.T, path string) mpiCounts {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	c := mpiCounts{calls: map[string]int{}, sends: map[uint32][2]int64{}}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var name string
		var n int
		var d uint32
		var msgs, bytes int64
		switch {
		case strings.HasPrefix(line, "call "):
			if _, err := fmt.Sscanf(line, "call %s %d", &name, &n); err != nil {
				t.Fatalf("%s: %q: %v", path, line, err)
			}
			c.calls[name] = n
		case strings.HasPrefix(line, "send "):
			if _, err := fmt.Sscanf(line, "send %d %d %d", &d, &msgs, &bytes); err != nil {
				t.Fatalf("%s: %q: %v", path, line, err)
			}
			c.sends[d] = [2]int64{msgs, bytes}
		}
	}
	return c
}

// LAMMPS, unmodified (Debian's dynamically linked lmp), on 2 ranks: its MPI
// calls and messages as the library streams them equal what an independent
// PMPI counter counts in a run of the same input, frames arrive while it
// runs, and its thermodynamic output is the same as without Kipimo.
func TestLAMMPSStreamsItsMPICalls(t *testing.T) {
	lmp := requireLAMMPS(t)
	lib := library(t)
	dir := t.TempDir()
	counter := filepath.Join(dir, "libmpicount.so")
	if b, err := exec.Command("mpicc", "-O1", "-fPIC", "-shared", "-o", counter, filepath.Join("testdata", "mpicount.c")).CombinedOutput(); err != nil {
		t.Fatalf("build the PMPI counter: %v\n%s", err, b)
	}
	input, err := filepath.Abs(filepath.Join("testdata", "lj.in"))
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"-np", "2", lmp, "-in", input, "-log", "none", "-var", "steps", "600"}
	base := mpitest.Env(os.Environ())

	plain, code := runProgram(t, base, "mpirun", args...)
	if code != 0 {
		t.Fatalf("lmp alone: status %d\n%s", code, plain)
	}
	countDir := t.TempDir()
	counted, code := runProgram(t, append(base, "LD_PRELOAD="+counter, "MPICOUNT_DIR="+countDir), "mpirun", args...)
	if code != 0 || mpitest.LAMMPSThermo(counted) != mpitest.LAMMPSThermo(plain) {
		t.Fatalf("lmp under the PMPI counter: status %d, thermo output differs", code)
	}

	ns := startNATS(t)
	nc := connect(t, ns)
	const run = "lammps"
	c := collect(t, nc, run)
	status := t.TempDir()
	env := lib.Environ(Env{NATSURL: ns.ClientURL(), Run: run, Period: 100 * time.Millisecond, StatusDir: status}, base)
	ctx := exec.Command("mpirun", args...)
	ctx.Env = env
	var outb strings.Builder
	ctx.Stdout, ctx.Stderr = &outb, &outb
	if err := ctx.Start(); err != nil {
		t.Fatal(err)
	}
	// Live: frames arrive while LAMMPS still runs.
	liveFrames := make(chan int, 1)
	go func() {
		select {
		case <-c.arrived:
		case <-time.After(30 * time.Second):
		}
		c.mu.Lock()
		n := 0
		for _, s := range c.ranks {
			n += s.frames
		}
		c.mu.Unlock()
		liveFrames <- n
	}()
	if err := ctx.Wait(); err != nil {
		t.Fatalf("lmp under Kipimo: %v\n%s", err, outb.String())
	}
	if n := <-liveFrames; n == 0 {
		t.Error("no frame arrived while LAMMPS ran")
	}
	if got, want := mpitest.LAMMPSThermo(outb.String()), mpitest.LAMMPSThermo(plain); got != want || want == "" {
		t.Errorf("thermo output under Kipimo:\n%s\nalone:\n%s", got, want)
	}
	c.waitEOS(t, 2)
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.bad) > 0 {
		t.Fatal(c.bad)
	}
	for r := uint32(0); r < 2; r++ {
		want := readCounts(t, filepath.Join(countDir, fmt.Sprintf("count.%d", r)))
		s := c.ranks[r]
		if s == nil {
			t.Fatalf("rank %d streamed nothing", r)
		}
		if s.unnamed != 0 || s.mismatch != 0 {
			t.Errorf("rank %d: %d events before their function's name, %d mismatched exits", r, s.unnamed, s.mismatch)
		}
		if s.frames < 3 {
			t.Errorf("rank %d: %d frames; with a 100ms period a run of over a second cuts more", r, s.frames)
		}
		total := 0
		for fn, n := range want.calls {
			total += n
			if s.calls[fn] != n {
				t.Errorf("rank %d: %s: %d executions streamed, the PMPI counter counted %d", r, fn, s.calls[fn], n)
			}
		}
		// Debian's LAMMPS asks its processor grid for neighbours
		// (functions that only the wrappers generated from mpi.h see).
		if want.calls["MPI_Cart_get"] == 0 || want.calls["MPI_Cart_rank"] == 0 {
			t.Errorf("rank %d: the counter counted %d MPI_Cart_get and %d MPI_Cart_rank calls; LAMMPS makes both",
				r, want.calls["MPI_Cart_get"], want.calls["MPI_Cart_rank"])
		}
		if total < 1000 {
			t.Errorf("rank %d: only %d MPI calls counted: the input is too small to test anything", r, total)
		}
		got := map[uint32][2]int64{}
		for _, cm := range s.comms {
			if cm.Kind == frame.Send && cm.Tag != 0xFFFFFFFF {
				g := got[cm.Partner]
				got[cm.Partner] = [2]int64{g[0] + 1, g[1] + int64(cm.Bytes)}
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want.sends) {
			t.Errorf("rank %d: sends (messages, bytes) per destination streamed %v, counted %v", r, got, want.sends)
		}
		t.Logf("rank %d: %d frames, %d MPI calls counted, sends %v", r, s.frames, total, want.sends)
	}
}
