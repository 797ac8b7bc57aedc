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

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/mpitest"
)

// commKey is one kind of message as a comm event records it.
type commKey struct {
	kind    frame.CommKind
	partner uint32
	tag     uint32
	bytes   uint64
}

func (k commKey) String() string {
	kind := "S"
	if k.kind == frame.Recv {
		kind = "R"
	}
	return fmt.Sprintf("%s partner %d tag %d %d bytes", kind, k.partner, k.tag, k.bytes)
}

// A Fortran MPI program (testdata/fcomm.F90) through each of its three
// interfaces (mpif.h, use mpi, use mpi_f08), built with mpif90 of Open MPI
// and of MPICH and run on 3 ranks under the library built for its MPI:
// every message it sends and receives (blocking, synchronous, ready,
// buffered and non-blocking sends; receives completed by MPI_Recv,
// MPI_Sendrecv(_replace) and each MPI_Wait and MPI_Test function, with and
// without statuses) and its part in each collective (MPI_IN_PLACE
// included) streams as a comm event with the partner's MPI_COMM_WORLD
// rank, the tag and the bytes, exactly as many as the program's own notes
// of what it moved say, none twice; the calls that do not poll stream as
// many executions as the program makes; its output is the same as alone.
func TestFortranMPIProgramsRecordTheirMessages(t *testing.T) {
	requireMPI(t)
	const (
		ranks = 3
		iters = 20
	)
	eachFortranBuild(t, "fcomm.F90", ranks, func(t *testing.T, lib *Library, mpirun, prog string) {
		fortranCommRun(t, lib, mpirun, prog, ranks, iters)
	})
}

// fortranCommRun runs fcomm alone and under the library, and compares what
// the library streamed with the program's notes.
func fortranCommRun(t *testing.T, lib *Library, mpirun, prog string, ranks uint32, iters int) {
	t.Helper()
	// Calls every rank makes a known number of times per iteration (the
	// Test loops and MPI_Waitsome poll: at least once).
	each := map[string]int{
		"MPI_Send": 5, "MPI_Isend": 5, "MPI_Irecv": 9, "MPI_Recv": 1, "MPI_Waitall": 1,
		"MPI_Wait": 1, "MPI_Waitany": 2, "MPI_Sendrecv": 1, "MPI_Sendrecv_replace": 1,
		"MPI_Barrier": 1, "MPI_Bcast": 1, "MPI_Reduce": 1, "MPI_Allreduce": 1, "MPI_Gather": 2,
		"MPI_Gatherv": 1, "MPI_Scatter": 1, "MPI_Scatterv": 1, "MPI_Allgather": 2,
		"MPI_Allgatherv": 1, "MPI_Alltoall": 1, "MPI_Alltoallv": 1, "MPI_Reduce_scatter": 1,
	}
	calls := make([]map[string]int, ranks)
	for r := range calls {
		c := maps.Clone(each)
		switch r {
		case 0:
			c["MPI_Ssend"], c["MPI_Rsend"], c["MPI_Bsend"] = 1, 1, 1
		case 1:
			c["MPI_Recv"], c["MPI_Irecv"], c["MPI_Wait"] = 2, 10, 2
		case 2:
			c["MPI_Recv"] = 2
		}
		for fn, n := range c {
			c[fn] = n * iters
		}
		calls[r] = c
	}
	commRun(t, lib, mpirun, prog, ranks, iters, calls, []string{"MPI_Test", "MPI_Testany", "MPI_Testall", "MPI_Testsome", "MPI_Waitsome"})
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

// readNotes reads the program's notes: "S|R partner tag bytes count" per
// line, tag -1 for a collective.
func readNotes(t *testing.T, path string) map[commKey]int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	notes := map[commKey]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var kind string
		var partner uint32
		var tag int32
		var bytes uint64
		var n int
		if _, err := fmt.Sscanf(line, "%s %d %d %d %d", &kind, &partner, &tag, &bytes, &n); err != nil || (kind != "S" && kind != "R") {
			t.Fatalf("%s: %q: %v", path, line, err)
		}
		k := commKey{frame.Send, partner, uint32(tag), bytes}
		if kind == "R" {
			k.kind = frame.Recv
		}
		notes[k] += n
	}
	return notes
}

// eachFortranBuild builds testdata/src with the mpif90 of each installed
// MPI through each of the three Fortran interfaces (mpif.h, use mpi, use
// mpi_f08: the test programs select theirs by preprocessor flags), builds
// the library for that program and MPI, and calls run in a subtest.
func eachFortranBuild(t *testing.T, src string, ranks int, run func(t *testing.T, lib *Library, mpirun, prog string)) {
	t.Helper()
	forms := []struct {
		name  string
		flags []string
	}{
		{"mpif.h", []string{"-DMPIF_H", "-fallow-argument-mismatch"}},
		{"use mpi", nil},
		{"use mpi_f08", []string{"-DF08"}},
	}
	for _, k := range installedMPIs {
		t.Run(k.name, func(t *testing.T) {
			mpif90 := strings.Replace(k.mpicc, "mpicc", "mpif90", 1)
			mpitest.Require(t, k.mpicc, k.mpirun, mpif90)
			for _, form := range forms {
				t.Run(form.name, func(t *testing.T) {
					dir := t.TempDir()
					prog := filepath.Join(dir, strings.TrimSuffix(src, filepath.Ext(src)))
					args := append([]string{"-O1", "-J", dir}, form.flags...)
					args = append(args, "-o", prog, filepath.Join("testdata", src))
					if b, err := exec.Command(mpif90, args...).CombinedOutput(); err != nil {
						t.Fatalf("%s %s: %v\n%s", mpif90, strings.Join(args, " "), err, b)
					}
					lib := libraryFor(t, k.mpirun, "-np", fmt.Sprint(ranks), prog)
					if lib.MPI == "" {
						t.Fatal("the library was built without its MPI wrappers")
					}
					run(t, lib, k.mpirun, prog)
				})
			}
		})
	}
}
