package instrument

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"

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
