package instrument

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/mpitest"
)

// A C program (testdata/persist.c) that moves messages with persistent
// requests (MPI_Send_init, MPI_Ssend_init, MPI_Bsend_init,
// MPI_Rsend_init, MPI_Recv_init; MPI_Start and MPI_Startall; receives
// completed by MPI_Wait, MPI_Waitall, MPI_Test, MPI_Testall, MPI_Waitany,
// MPI_Waitsome and MPI_Testany, one pair on a communicator whose ranks are
// the world's reversed) and calls the non-blocking collectives other than
// MPI_Ibcast, MPI_Ireduce, MPI_Iallreduce, MPI_Iallgather and
// MPI_Ialltoall, run on 2 ranks under Open MPI and under MPICH with the
// library built for its MPI: every message streams once as a KP_SEND at the
// sender (each MPI_Start of a persistent send) and once as a KP_RECV at the
// receiver (each completion of a started persistent receive), with the
// partner's MPI_COMM_WORLD rank, the tag and the bytes, and each
// collective's part as the blocking twin's rule gives it: exactly the
// program's own notes, none missing and none twice. Each call the program
// makes a known number of times streams as that many executions; its
// output is the same as alone.
func TestPersistentRequestsAndNonblockingCollectivesRecordTheirMessages(t *testing.T) {
	requireMPI(t)
	const (
		ranks = 2
		iters = 20
	)
	for _, k := range installedMPIs {
		t.Run(k.name, func(t *testing.T) {
			mpitest.Require(t, k.mpicc, k.mpirun)
			prog := filepath.Join(t.TempDir(), "persist")
			if b, err := exec.Command(k.mpicc, "-O1", "-o", prog, filepath.Join("testdata", "persist.c")).CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", k.mpicc, err, b)
			}
			lib := libraryFor(t, k.mpirun, "-np", fmt.Sprint(ranks), prog)
			if lib.MPI == "" {
				t.Fatal("the library was built without its MPI wrappers")
			}
			// Calls made a known number of times per iteration, on every
			// rank, and once per run (at most once per iteration: those
			// are checked by their totals).
			each := map[string]int{
				"MPI_Start": 7, "MPI_Startall": 3, "MPI_Waitall": 2, "MPI_Barrier": 1,
				"MPI_Igather": 1, "MPI_Igatherv": 1, "MPI_Iscatter": 1, "MPI_Iscatterv": 1,
				"MPI_Iallgatherv": 1, "MPI_Ialltoallv": 1, "MPI_Ireduce_scatter": 1,
				"MPI_Ireduce_scatter_block": 1, "MPI_Iscan": 1, "MPI_Iexscan": 1,
			}
			perRank := []map[string]int{
				{"MPI_Wait": 4 * iters, "MPI_Send_init": 4, "MPI_Ssend_init": 1, "MPI_Bsend_init": 1,
					"MPI_Rsend_init": 1, "MPI_Recv_init": 6, "MPI_Request_free": 13},
				{"MPI_Wait": 3 * iters, "MPI_Waitany": iters, "MPI_Send_init": 4, "MPI_Ssend_init": 1,
					"MPI_Bsend_init": 1, "MPI_Recv_init": 7, "MPI_Request_free": 13},
			}
			for _, m := range perRank {
				for fn, n := range each {
					m[fn] = n * iters
				}
			}
			polled := []string{"MPI_Test", "MPI_Testall", "MPI_Testany", "MPI_Waitsome"}
			commRun(t, lib, k.mpirun, prog, ranks, iters, perRank, polled)
		})
	}
}

// commRun runs prog on ranks ranks, alone and under the library, and
// checks that what the library streamed is what the program noted: its
// comm events, key by key, and calls[rank] executions of each function
// named there (at least iters of those in polled).
func commRun(t *testing.T, lib *Library, mpirun, prog string, ranks uint32, iters int, calls []map[string]int, polled []string) {
	t.Helper()
	base := mpitest.Env(os.Environ())
	alone, notes := t.TempDir(), t.TempDir()
	args := func(dir string) []string {
		return []string{"-np", fmt.Sprint(ranks), prog, fmt.Sprint(iters), dir}
	}
	plain, code := runProgram(t, base, mpirun, args(alone)...)
	if code != 0 || strings.Count(plain, " checksum ") != int(ranks) {
		t.Fatalf("alone: status %d, output\n%s", code, plain)
	}
	ns := startNATS(t)
	nc := connect(t, ns)
	run := filepath.Base(prog)
	c := collect(t, nc, run)
	env := lib.Environ(Env{NATSURL: ns.ClientURL(), Run: run, Period: 50 * time.Millisecond}, base)
	out, code := runProgram(t, env, mpirun, args(notes)...)
	if code != 0 || sortedLines(out) != sortedLines(plain) {
		t.Errorf("under Kipimo: status %d, output\n%s\nalone:\n%s", code, out, plain)
	}
	c.waitEOS(t, int(ranks))
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.bad) > 0 {
		t.Fatal(c.bad)
	}
	for r := range ranks {
		s := c.ranks[r]
		if s == nil {
			t.Fatalf("rank %d streamed nothing", r)
		}
		want := readNotes(t, filepath.Join(notes, fmt.Sprintf("expect.%d", r)))
		if again := readNotes(t, filepath.Join(alone, fmt.Sprintf("expect.%d", r))); !maps.Equal(want, again) {
			t.Errorf("rank %d: the program's notes differ between its runs:\n%v\n%v", r, want, again)
		}
		got := map[commKey]int{}
		for _, e := range s.comms {
			got[commKey{e.Kind, e.Partner, e.Tag, e.Bytes}]++
		}
		var wantN, gotN int
		keys := slices.SortedFunc(maps.Keys(want), func(a, b commKey) int { return strings.Compare(a.String(), b.String()) })
		for _, key := range keys {
			wantN += want[key]
			if got[key] != want[key] {
				t.Errorf("rank %d: %d comm events %s, the program moved %d", r, got[key], key, want[key])
			}
		}
		for key, n := range got {
			gotN += n
			if _, ok := want[key]; !ok {
				t.Errorf("rank %d: %d comm events %s, which the program did not move", r, n, key)
			}
		}
		t.Logf("rank %d: %d comm events streamed, %d messages and collective parts noted by the program", r, gotN, wantN)
		for fn, n := range calls[r] {
			if s.calls[fn] != n {
				t.Errorf("rank %d: %d executions of %s, the program makes %d", r, s.calls[fn], fn, n)
			}
		}
		for _, fn := range polled {
			if s.calls[fn] < iters {
				t.Errorf("rank %d: %d executions of %s, the program makes at least %d", r, s.calls[fn], fn, iters)
			}
		}
		if s.mismatch != 0 || s.unnamed != 0 {
			t.Errorf("rank %d: %d mismatched exits, %d events before their function's name", r, s.mismatch, s.unnamed)
		}
	}
}

// The same from Fortran (testdata/fpersist.F90), through each of its three
// interfaces (mpif.h, use mpi, use mpi_f08), built with mpif90 of Open MPI
// and of MPICH and run on 2 ranks: persistent sends and receives (made by
// MPI_Send_init, MPI_Ssend_init and MPI_Recv_init, started by MPI_Start and
// MPI_Startall, completed by MPI_Wait, MPI_Waitall, MPI_Test, MPI_Waitany
// and MPI_Testall) and MPI_Igather, MPI_Iallgatherv, MPI_Ialltoallv,
// MPI_Iscan and MPI_Iexscan stream exactly the comm events the program
// notes, and as many executions as it makes.
func TestFortranPersistentRequestsRecordTheirMessages(t *testing.T) {
	requireMPI(t)
	const (
		ranks = 2
		iters = 20
	)
	each := map[string]int{
		"MPI_Start": 6, "MPI_Startall": 2, "MPI_Wait": 4, "MPI_Waitall": 2, "MPI_Waitany": 1,
		"MPI_Igather": 1, "MPI_Iallgatherv": 1, "MPI_Ialltoallv": 1, "MPI_Iscan": 1, "MPI_Iexscan": 1,
	}
	calls := map[string]int{"MPI_Send_init": 3, "MPI_Ssend_init": 1, "MPI_Recv_init": 4, "MPI_Request_free": 8}
	for fn, n := range each {
		calls[fn] = n * iters
	}
	eachFortranBuild(t, "fpersist.F90", ranks, func(t *testing.T, lib *Library, mpirun, prog string) {
		commRun(t, lib, mpirun, prog, ranks, iters, []map[string]int{calls, calls},
			[]string{"MPI_Test", "MPI_Testall"})
	})
}
