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

// The ring program on 2 ranks with 2 OpenMP threads each, under Open MPI
// and under MPICH (each with the library built for the program's MPI):
// every call arrives, nested as the program nests it, on the thread that
// made it; the comm events are the messages the program sends; the
// injected delays are recorded with the entry time of the delayed
// execution.
func TestMPIRingProgram(t *testing.T) {
	requireMPI(t)
	for _, k := range installedMPIs {
		t.Run(k.name, func(t *testing.T) {
			mpitest.Require(t, k.mpicc, k.mpirun)
			ringProgram(t, k)
		})
	}
}

func ringProgram(t *testing.T, k mpiKind) {
	// The program links with the library of the default build (kipimo lib
	// --libs); under MPICH the preloaded one is another build's.
	base := library(t)
	prog := filepath.Join(t.TempDir(), "ring")
	cargs := append([]string{"-O1", "-g", "-fopenmp"}, strings.Fields(base.CFlags())...)
	cargs = append(cargs, filepath.Join("testdata", "ring.c"), "-o", prog)
	cargs = append(cargs, strings.Fields(base.LDFlags())...)
	if b, err := exec.Command(k.mpicc, cargs...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", k.mpicc, strings.Join(cargs, " "), err, b)
	}
	lib := libraryFor(t, k.mpirun, "-np", "2", prog)
	if lib.MPI == "" {
		t.Fatal("the library was built without its MPI wrappers although mpicc is there")
	}
	ns := startNATS(t)
	nc := connect(t, ns)
	const (
		run     = "ring"
		ranks   = 2
		threads = 2
		iters   = 200
		inner   = 5
		bytes   = 4096
	)
	c := collect(t, nc, run)
	status := t.TempDir()
	baseEnv := mpitest.Env(append(os.Environ(), fmt.Sprintf("OMP_NUM_THREADS=%d", threads)))
	env := lib.Environ(Env{
		NATSURL: ns.ClientURL(), Run: run, Period: 50 * time.Millisecond, StatusDir: status,
		Inject: []Injection{{Func: "exchange", Prob: 0.05, Delay: 20 * time.Millisecond}}, Seed: 7,
	}, baseEnv)
	args := []string{"-np", fmt.Sprint(ranks), prog, fmt.Sprint(iters), fmt.Sprint(inner), fmt.Sprint(bytes)}
	plain, plainCode := runProgram(t, baseEnv, k.mpirun, args...)
	out, code := runProgram(t, env, k.mpirun, args...)
	if code != 0 || plainCode != 0 || sortedLines(out) != sortedLines(plain) {
		t.Errorf("under Kipimo: status %d, output\n%s\nalone: status %d, output\n%s", code, out, plainCode, plain)
	}
	c.waitEOS(t, ranks)
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.bad) > 0 {
		t.Fatal(c.bad)
	}
	st, err := ReadStatus(status)
	if err != nil || len(st) != ranks {
		t.Fatalf("status files: %d (%v), want %d", len(st), err, ranks)
	}
	for r := uint32(0); r < ranks; r++ {
		s := c.ranks[r]
		if s == nil {
			t.Fatalf("rank %d sent nothing", r)
		}
		want := map[string]int{
			"main": 1, "setup": 1, "finish": 1, "iterate": iters, "exchange": iters, "compute": iters,
			"kernel": iters * threads * inner, "leaf": iters * threads * inner,
			"MPI_Init_thread": 1, "MPI_Finalize": 1, "MPI_Comm_rank": 1, "MPI_Comm_size": 1,
			"MPI_Isend": iters, "MPI_Irecv": iters, "MPI_Waitall": iters, "MPI_Allreduce": iters,
		}
		for fn, w := range want {
			if s.calls[fn] != w {
				t.Errorf("rank %d: %s: %d calls, want %d", r, fn, s.calls[fn], w)
			}
		}
		wantParents := map[string]string{
			"iterate": "main", "exchange": "iterate", "compute": "iterate", "leaf": "kernel",
			"MPI_Isend": "exchange", "MPI_Irecv": "exchange", "MPI_Waitall": "exchange", "MPI_Allreduce": "iterate",
			"MPI_Init_thread": "main", "MPI_Finalize": "main",
		}
		for fn, p := range wantParents {
			if len(s.parents[fn]) != 1 || s.parents[fn][p] == 0 {
				t.Errorf("rank %d: %s called from %v, want only %s", r, fn, s.parents[fn], p)
			}
		}
		if len(s.threads) != threads {
			t.Errorf("rank %d: function events on threads %v, want %d threads", r, s.threads, threads)
		}
		if s.mismatch != 0 || s.unnamed != 0 {
			t.Errorf("rank %d: %d exits did not match their entries, %d events came before their function's name", r, s.mismatch, s.unnamed)
		}
		// Comm events: ITERS sends to the next rank and ITERS receives from
		// the previous one, BYTES each, tag 7; the Allreduce's collective
		// events carry the collective tag.
		next, prev := (r+1)%ranks, (r+ranks-1)%ranks
		var sends, recvs, coll int
		for _, cm := range s.comms {
			switch {
			case cm.Tag == 0xFFFFFFFF:
				coll++
				if cm.Bytes != 8 || cm.Partner != r {
					t.Errorf("rank %d: collective event %+v, want 8 bytes with itself", r, cm)
				}
			case cm.Kind == frame.Send:
				sends++
				if cm.Partner != next || cm.Bytes != bytes || cm.Tag != 7 {
					t.Errorf("rank %d: send %+v, want %d bytes to rank %d, tag 7", r, cm, bytes, next)
				}
			default:
				recvs++
				if cm.Partner != prev || cm.Bytes != bytes || cm.Tag != 7 {
					t.Errorf("rank %d: receive %+v, want %d bytes from rank %d, tag 7", r, cm, bytes, prev)
				}
			}
		}
		if sends != iters || recvs != iters || coll != 2*iters {
			t.Errorf("rank %d: %d sends, %d receives, %d collective events; want %d, %d, %d", r, sends, recvs, coll, iters, iters, 2*iters)
		}
		// Every injected delay is an execution of exchange that entered at
		// the recorded time and lasted at least the delay.
		var rs *Status
		for i := range st {
			if st[i].Rank == r {
				rs = &st[i]
			}
		}
		if rs == nil {
			t.Fatalf("no status file of rank %d", r)
		}
		if rs.FramesDropped != 0 || rs.EventsDropped != 0 || rs.FramesSent != uint64(s.frames) {
			t.Errorf("rank %d status %+v: want %d frames sent, nothing dropped", r, rs, s.frames)
		}
		if len(rs.Injected) == 0 || len(rs.Injected) > iters/5 {
			t.Errorf("rank %d: %d injected delays in %d calls at p=0.05", r, len(rs.Injected), iters)
		}
		byEntry := map[uint64]execution{}
		for _, e := range s.execs {
			if e.fn == "exchange" {
				byEntry[e.entry] = e
			}
		}
		for _, in := range rs.Injected {
			e, ok := byEntry[in.Entry]
			if !ok || in.Func != "exchange" || in.DelayUS != 20000 {
				t.Errorf("rank %d: injected %+v matches no execution of exchange", r, in)
				continue
			}
			if e.exit-e.entry < in.DelayUS {
				t.Errorf("rank %d: injected execution lasted %d µs, less than its delay", r, e.exit-e.entry)
			}
		}
	}
}

func sortedLines(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i := 1; i < len(lines); i++ {
		for j := i; j > 0 && lines[j] < lines[j-1]; j-- {
			lines[j], lines[j-1] = lines[j-1], lines[j]
		}
	}
	return strings.Join(lines, "\n")
}
