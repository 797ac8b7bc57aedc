package run

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/hatchetread"
	"github.com/kipimo-hpc/kipimo/internal/instrument"
	"github.com/kipimo-hpc/kipimo/internal/mpitest"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/pserver"
)

// `kipimo run --exec -- mpirun -np 2 lmp ...` with 100 ms delays injected
// into MPI_Send: LAMMPS streams live, its output is unchanged, and the detectors
// find the injected delays with precision and recall of at least 0.8.
func TestLiveLAMMPSInjectedDelays(t *testing.T) {
	mpitest.Require(t, "cc", "mpicc", "mpirun", "lmp")
	mpitest.Lock(t)
	input, err := filepath.Abs("../instrument/testdata/lj.in")
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"mpirun", "-np", "2", "lmp", "-in", input, "-log", "none", "-var", "steps", "3000"}
	for _, kv := range mpitest.Env(nil) {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	plain, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("lmp alone: %v\n%s", err, plain)
	}
	var out bytes.Buffer
	cfg := Config{Out: t.TempDir(), RunID: "lammps", Live: LiveConfig{
		Command: args, Period: 250 * time.Millisecond, Seed: 1,
		// 1 s: beyond the natural range of a rank's MPI_Send on a CI
		// machine that runs other test packages on the same two cores,
		// where the scheduler alone stretches sends to hundreds of ms, a
		// continuous tail the detector rightly learns as natural
		// (docs/instrumentation.md has the 25 ms figures of a quiet
		// machine). 0.08% of the sends, about 20 of them: each delay also
		// holds the partner rank's send about as long (propagated), and
		// the two together must stay rare: a delay in a few tenths of a
		// percent of a function's calls is a recurring mode, its behaviour
		// (reported under recurring, docs/detection.md).
		Inject: []instrument.Injection{{Func: "MPI_Send", Prob: 0.0008, Delay: time.Second}},
		Build:  instrument.BuildOptions{CacheDir: t.TempDir()}, Stdout: &out, Stderr: &out,
	}}
	// What the dashboard shows the moment LAMMPS exits: it was live.
	var live pserver.Summary
	setup := func(p *Pipeline, h *testHooks) {
		h.onCommandExit = func() {
			resp, err := http.Get(p.DashboardURL() + "api/summary")
			if err != nil {
				t.Errorf("dashboard: %v", err)
				return
			}
			defer resp.Body.Close()
			if err := json.NewDecoder(resp.Body).Decode(&live); err != nil {
				t.Errorf("dashboard summary: %v", err)
			}
		}
	}
	_, sum := execute(t, cfg, setup, nil)
	if live.Ranks != 2 || live.Totals.Executions == 0 || live.Totals.Anomalies == 0 {
		t.Errorf("dashboard when LAMMPS exited: %+v; want its 2 ranks with executions and anomalies", live)
	}
	l := sum.Live
	if l == nil || l.ExitCode != 0 || l.Processes != 2 || sum.Ranks != 2 {
		t.Fatalf("live report %+v with %d ranks: want LAMMPS's 2 ranks, exit status 0", l, sum.Ranks)
	}
	if got, want := mpitest.LAMMPSThermo(out.String()), mpitest.LAMMPSThermo(string(plain)); got != want || want == "" {
		t.Errorf("thermo output under Kipimo:\n%s\nalone:\n%s", got, want)
	}
	if l.FramesWhileRunning == 0 || l.FramesDropped != 0 || l.EventsDropped != 0 || l.RanksNotEnded != 0 {
		t.Errorf("live report %+v: want frames while running, nothing dropped, every stream ended", l)
	}
	sc := sum.Score
	if sc == nil || sc.Injected < 10 || sc.Precision < 0.8 || sc.Recall < 0.8 {
		t.Fatalf("score %+v: want at least 10 injected delays found with precision and recall >= 0.8", sc)
	}
	if sum.Stored[provenance.KindAnomalies] != int64(sum.Anomalies) || sum.Stored[provenance.KindMetadata] == 0 {
		t.Errorf("stored %v for %d anomalies: want every anomaly and the processes' metadata", sum.Stored, sum.Anomalies)
	}
	profiles, _ := filepath.Glob(filepath.Join(sum.ProfilesDir, "profile.*"))
	if len(profiles) < 2 {
		t.Errorf("%d TAU profiles, want one per rank at least", len(profiles))
	}
	// A real application's profiles read as Hatchet reads them.
	if g, err := hatchetread.Read(sum.ProfilesDir); err != nil {
		t.Errorf("LAMMPS's profiles break Hatchet's rules: %v", err)
	} else if len(g.Unread) > 0 {
		t.Errorf("functions of LAMMPS's profiles Hatchet would not read: %v", g.Unread)
	}
	t.Logf("injected %d, flagged %d (precision %.3f, recall %.3f), %d propagated, %d in other functions; %d of %d frames while running",
		sc.Injected, sc.Flagged, sc.Precision, sc.Recall, sc.Propagated, sc.FlaggedOtherFunctions, l.FramesWhileRunning, sum.FramesProcessed)
}

// A program without MPI, built with -finstrument-functions, that exits with
// status 3: it is monitored, and its status is the run's.
func TestLiveSerialProgramExitStatus(t *testing.T) {
	mpitest.Require(t, "cc")
	dir := t.TempDir()
	opts := instrument.BuildOptions{CacheDir: filepath.Join(dir, "cache")}
	lib, err := instrument.Build(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	prog := filepath.Join(dir, "serial-program")
	cmdArgs := append(append([]string{"-O1"}, strings.Fields(lib.CFlags())...), "../instrument/testdata/serial.c", "-o", prog)
	cmdArgs = append(cmdArgs, strings.Fields(lib.LDFlags())...)
	if b, err := exec.Command("cc", cmdArgs...).CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, b)
	}
	var out bytes.Buffer
	cfg := Config{Out: dir, RunID: "serial", Live: LiveConfig{
		Command: []string{prog, "20000"}, Period: 50 * time.Millisecond, Build: opts, Stdout: &out, Stderr: &out,
	}}
	_, sum := execute(t, cfg, nil, nil)
	if sum.Live.ExitCode != 3 || out.String() != "serial done 0\n" {
		t.Errorf("exit status %d, output %q: want the program's own (3, \"serial done 0\")", sum.Live.ExitCode, out.String())
	}
	// main + 20000 outer + 40000 inner + 2000 marked, streamed or (hot
	// leaves) summarised by the library, none dropped.
	if sum.Executions+sum.SummarisedCalls != 62001 || sum.SourceDroppedCalls != 0 || sum.Ranks != 1 {
		t.Errorf("%d executions and %d summarised calls (%d dropped) on %d ranks, want 62001 calls on 1",
			sum.Executions, sum.SummarisedCalls, sum.SourceDroppedCalls, sum.Ranks)
	}
}

func TestLiveCommandNotFound(t *testing.T) {
	mpitest.Require(t, "cc")
	cfg := Config{Out: t.TempDir(), RunID: "missing", Live: LiveConfig{
		Command: []string{"/nonexistent/app"}, Build: instrument.BuildOptions{CacheDir: t.TempDir()},
	}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := Start(ctx, cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	_, err = p.Execute(ctx, nil)
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/app") || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("error %v: want one naming the missing command", err)
	}
}

// The instrumentation tests' MPI+OpenMP ring program, built with
// -finstrument-functions, with delays injected into one of its own
// functions: the pipeline finds them.
func TestLiveRingInjectedDelays(t *testing.T) {
	mpitest.Require(t, "cc", "mpicc", "mpirun")
	mpitest.Lock(t)
	for _, kv := range mpitest.Env([]string{"OMP_NUM_THREADS=2"}) {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	dir := t.TempDir()
	opts := instrument.BuildOptions{CacheDir: filepath.Join(dir, "cache")}
	lib, err := instrument.Build(context.Background(), instrument.BuildOptions{CacheDir: opts.CacheDir, MPI: true})
	if err != nil {
		t.Fatal(err)
	}
	prog := filepath.Join(dir, "ring-program")
	args := append(append([]string{"-O1", "-fopenmp"}, strings.Fields(lib.CFlags())...), "../instrument/testdata/ring.c", "-o", prog)
	if b, err := exec.Command("mpicc", args...).CombinedOutput(); err != nil {
		t.Fatalf("mpicc: %v\n%s", err, b)
	}
	ring := func(t *testing.T, id string, iters int, inj instrument.Injection) (*Summary, string) {
		t.Helper()
		var out bytes.Buffer
		cfg := Config{Out: dir, RunID: id, Live: LiveConfig{
			Command: []string{"mpirun", "-np", "2", prog, strconv.Itoa(iters), "20", "2048", "1000"}, Period: 200 * time.Millisecond, Seed: 3,
			Inject: []instrument.Injection{inj},
			Build:  opts, Stdout: &out, Stderr: &out,
		}}
		_, sum := execute(t, cfg, nil, nil)
		if sum.Live.ExitCode != 0 || sum.Ranks != 2 {
			t.Fatalf("exit %d, %d ranks\n%s", sum.Live.ExitCode, sum.Ranks, out.String())
		}
		return sum, out.String()
	}
	t.Run("rare", func(t *testing.T) {
		// 0.1% of the calls, the rare stalls a run must flag one by one.
		sum, _ := ring(t, "ring-rare", 10000, instrument.Injection{Func: "compute", Prob: 0.001, Delay: 60 * time.Millisecond})
		sc := sum.Score
		if sc == nil || sc.Injected < 10 || sc.Precision < 0.8 || sc.Recall < 0.8 {
			t.Fatalf("score %+v: want at least 10 injected delays found with precision and recall >= 0.8", sc)
		}
		t.Logf("injected %d, flagged %d (precision %.3f, recall %.3f), %d propagated, %d in other functions",
			sc.Injected, sc.Flagged, sc.Precision, sc.Recall, sc.Propagated, sc.FlaggedOtherFunctions)
	})
	t.Run("recurring", func(t *testing.T) {
		// 1% of the calls, a stall that keeps coming back: a recurring
		// mode of the function, reported with its share of the calls.
		const iters = 3000
		sum, _ := ring(t, "ring-recurring", iters, instrument.Injection{Func: "compute", Prob: 0.01, Delay: 20 * time.Millisecond})
		sc := sum.Score
		if sc == nil || sc.Injected < 20 {
			t.Fatalf("score %+v: want at least 20 injected delays", sc)
		}
		want := float64(sc.Injected) / (2 * iters)
		for _, r := range sum.Recurring {
			if r.Func != "compute" {
				continue
			}
			if math.Abs(r.CallsFraction-want) > 0.25*want || r.TypicalUs < 20000 {
				t.Errorf("recurring compute: %.4f of its calls at about %.0f µs; injected %.4f at 20 ms", r.CallsFraction, r.TypicalUs, want)
			}
			t.Logf("recurring compute: %.4f of its calls (injected %.4f) at about %.0f µs, %.0f%% of its time, from io_step %d on ranks %v",
				r.CallsFraction, want, r.TypicalUs, 100*r.TimeShare, r.FirstIOStep, r.Ranks)
			return
		}
		t.Fatalf("no recurring mode of compute in %+v (%d delays injected in %d calls)", sum.Recurring, sc.Injected, 2*iters)
	})
}
