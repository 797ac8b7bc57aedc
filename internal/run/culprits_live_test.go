package run

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/instrument"
	"github.com/kipimo-hpc/kipimo/internal/mpitest"
	"github.com/kipimo-hpc/kipimo/internal/pserver"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

// The halo-exchange proxy (4 ranks in a ring, MPI_Waitall on both
// neighbours and an MPI_Allreduce per iteration) with delays injected into
// one rank's compute: that rank is the top culprit of the bursts its
// delays cause, and the waits of its neighbours and at the reduction are
// attributed to it.
//
// With KIPIMO_LIVE_SLOWDOWN=1 (a machine quiet enough that one rank's slowdown
// is not lost in the load of others) a second run slows one rank for real,
// stopping and continuing its process (a CPU quota of 25%) for 10 io_steps:
// it must stand out as the outlier rank in 8 of them, no other rank in more
// than 1.
func TestLiveHaloCulprits(t *testing.T) {
	mpitest.Require(t, "cc", "mpicc", "mpirun")
	mpitest.Lock(t)
	for _, kv := range mpitest.Env(nil) {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	dir := t.TempDir()
	opts := instrument.BuildOptions{CacheDir: filepath.Join(dir, "cache")}
	lib, err := instrument.Build(context.Background(), instrument.BuildOptions{CacheDir: opts.CacheDir, MPI: true})
	if err != nil {
		t.Fatal(err)
	}
	prog := filepath.Join(dir, "halo")
	args := append(append([]string{"-O1"}, strings.Fields(lib.CFlags())...), "../instrument/testdata/halo.c", "-o", prog)
	if b, err := exec.Command("mpicc", args...).CombinedOutput(); err != nil {
		t.Fatalf("mpicc: %v\n%s", err, b)
	}
	halo := func(t *testing.T, id string, inj []instrument.Injection, haloArgs ...string) (*Summary, pserver.Culprits) {
		t.Helper()
		var out bytes.Buffer
		cfg := Config{Out: dir, RunID: id, Live: LiveConfig{
			Command: append([]string{"mpirun", "-np", "4", prog}, haloArgs...), Period: time.Second, Seed: 5,
			Inject: inj, Build: opts, Stdout: &out, Stderr: &out,
		}}
		_, sum := executeApp(t, cfg)
		if sum.Live.ExitCode != 0 || sum.Ranks != 4 {
			t.Fatalf("exit %d, %d ranks\n%s", sum.Live.ExitCode, sum.Ranks, out.String())
		}
		var c pserver.Culprits
		data, err := os.ReadFile(filepath.Join(dir, id, CulpritsFile))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(data, &c); err != nil {
			t.Fatal(err)
		}
		if len(c.Bursts) == 0 {
			t.Fatalf("no burst in %d steps analysed", c.Steps)
		}
		return sum, c
	}

	t.Run("injected", func(t *testing.T) {
		const delayed = 2
		sum, c := halo(t, "halo-injected", []instrument.Injection{{Func: "compute", Prob: 0.005, Delay: 300 * time.Millisecond, Ranks: []instrument.RankRange{{First: delayed, Last: delayed}}}},
			"1500", "200", "4096")
		f, err := os.Open(sum.Truth)
		if err != nil {
			t.Fatal(err)
		}
		truth, err := workload.ReadTruth(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(truth) < 4 {
			t.Fatalf("%d delays injected, want at least 4", len(truth))
		}
		grid := bucketGrid(c)
		steps := map[uint64]bool{}
		for _, tr := range truth {
			if tr.Rank != delayed {
				t.Fatalf("a delay injected on rank %d, not only on rank %d: %+v", tr.Rank, delayed, tr)
			}
			steps[grid(tr.Entry)] = true
		}
		byStep := map[uint64]*pserver.Burst{}
		for i := range c.Bursts {
			byStep[c.Bursts[i].IOStep] = &c.Bursts[i]
		}
		top := func(s uint64) (uint32, bool) {
			if b := byStep[s]; b != nil && len(b.Culprits) > 0 {
				return b.Culprits[0].Rank, true
			}
			return 0, false
		}
		// each delay's burst, within 2 io_steps, has the delayed rank on top
		caught := 0
		near := map[uint64]bool{}
		for s := range steps {
			ok := false
			for k := range uint64(3) {
				near[s+k] = true
				if r, has := top(s + k); has && r == delayed {
					ok = true
				}
			}
			if ok {
				caught++
			}
		}
		// precision: the bursts within 2 io_steps of a delay whose top
		// culprit is the delayed rank, among those with a culprit
		right, named := 0, 0
		for s := range near {
			if r, has := top(s); has {
				named++
				if r == delayed {
					right++
				}
			}
		}
		recall, precision := float64(caught)/float64(len(steps)), float64(right)/float64(max(named, 1))
		t.Logf("%d delays in %d io_steps; delayed rank the top culprit within 2 io_steps of %d (%.2f); precision %d/%d (%.2f); %d bursts in %d steps analysed, top culprits %v",
			len(truth), len(steps), caught, recall, right, named, precision, len(c.Bursts), c.Steps, topRows(c))
		if recall < 0.9 || precision < 0.9 {
			t.Errorf("recall %.2f, precision %.2f: want both >= 0.9", recall, precision)
		}
		if len(sum.Culprits) == 0 || sum.Culprits[0].Rank != delayed || sum.Culprits[0].Func != "compute" {
			t.Errorf("the summary's top culprit is %+v, want rank %d in compute", sum.Culprits, delayed)
		}
	})

	t.Run("slowed", func(t *testing.T) {
		if os.Getenv("KIPIMO_LIVE_SLOWDOWN") != "1" {
			t.Skip("set KIPIMO_LIVE_SLOWDOWN=1 on a quiet machine: slowing one rank down is lost in other jobs' load")
		}
		const slowed = 1
		pids := filepath.Join(dir, "pids")
		if err := os.MkdirAll(pids, 0o755); err != nil {
			t.Fatal(err)
		}
		// the harness slows the rank once it is up: 10 s of 60 ms stopped,
		// 20 ms running, from 5 s on
		var from, to uint64
		done := make(chan struct{})
		stop := make(chan struct{})
		go func() {
			defer close(done)
			pidFile := filepath.Join(pids, "rank"+strconv.Itoa(slowed)+".pid")
			var pid int
			for pid == 0 {
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Millisecond):
				}
				if b, err := os.ReadFile(pidFile); err == nil {
					pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
				}
			}
			time.Sleep(5 * time.Second)
			from = uint64(time.Now().UnixMicro())
			for end := time.Now().Add(10 * time.Second); time.Now().Before(end); {
				_ = syscall.Kill(pid, syscall.SIGSTOP)
				time.Sleep(60 * time.Millisecond)
				_ = syscall.Kill(pid, syscall.SIGCONT)
				time.Sleep(20 * time.Millisecond)
			}
			to = uint64(time.Now().UnixMicro())
		}()
		_, c := halo(t, "halo-slowed", nil, "600", "2000", "4096", pids)
		close(stop)
		<-done
		if from == 0 {
			t.Fatal("the slowed rank never wrote its pid")
		}
		grid := bucketGrid(c)
		inside := map[uint64]bool{}
		for s := grid(from) + 1; s < grid(to); s++ {
			inside[s] = true // io_steps wholly slowed
		}
		flagged := map[uint32]map[uint64]bool{}
		for _, b := range c.Bursts {
			for _, o := range b.Outliers {
				if flagged[o.Rank] == nil {
					flagged[o.Rank] = map[uint64]bool{}
				}
				flagged[o.Rank][b.IOStep] = true
			}
		}
		hits := 0
		for s := range inside {
			if flagged[slowed][s] {
				hits++
			}
		}
		t.Logf("rank %d slowed in io_steps %v: outlier in %d; outliers by rank %v", slowed, inside, hits, flagged)
		if hits < len(inside)*8/10 {
			t.Errorf("the slowed rank stood out in %d of its %d io_steps, want 8 in 10", hits, len(inside))
		}
		for r, steps := range flagged {
			if r != slowed && len(steps) > 1 {
				t.Errorf("rank %d, not slowed, stood out in io_steps %v", r, steps)
			}
		}
	})
}

// bucketGrid maps a time (µs) to the analysis io_step of c's time buckets.
func bucketGrid(c pserver.Culprits) func(uint64) uint64 {
	b := c.Bursts[0]
	period := b.EndTS - b.StartTS
	origin := b.StartTS - b.IOStep*period
	return func(ts uint64) uint64 {
		if ts < origin || period == 0 {
			return 0
		}
		return (ts - origin) / period
	}
}

func topRows(c pserver.Culprits) []string {
	var out []string
	for _, r := range c.Culprits[:min(5, len(c.Culprits))] {
		out = append(out, strconv.Itoa(int(r.Rank))+":"+r.Func+":"+strconv.Itoa(r.Top))
	}
	return out
}
