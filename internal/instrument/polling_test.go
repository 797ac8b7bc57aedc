package instrument

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// The library without the MPI wrappers, for the tests of programs without
// MPI, built once per test binary.
var (
	coreOnce  sync.Once
	coreBuilt *Library
	coreErr   error
)

// coreLibrary builds the event library without the MPI wrappers, or skips
// the test when there is no C compiler (failing with KIPIMO_REQUIRE_MPI set).
func coreLibrary(t testing.TB) *Library {
	t.Helper()
	coreOnce.Do(func() {
		coreBuilt, coreErr = Build(context.Background(), BuildOptions{CacheDir: libCache})
	})
	if errors.Is(coreErr, ErrNoCompiler) {
		if os.Getenv("KIPIMO_REQUIRE_MPI") != "" {
			t.Fatal(coreErr)
		}
		t.Skip(coreErr)
	}
	if coreErr != nil {
		t.Fatal(coreErr)
	}
	return coreBuilt
}

// programCalls reads the "calls NAME N" lines and the "rate R" line of
// testdata/polling.c's output.
func programCalls(t *testing.T, out string) (calls map[string]int, rate float64) {
	t.Helper()
	calls = map[string]int{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var name string
		var n int
		if _, err := fmt.Sscanf(sc.Text(), "calls %s %d", &name, &n); err == nil {
			calls[name] = n
			continue
		}
		if _, err := fmt.Sscanf(sc.Text(), "rate %g", &rate); err != nil {
			t.Fatalf("polling printed %q", sc.Text())
		}
	}
	if len(calls) != 7 {
		t.Fatalf("polling printed %q: want the calls of 7 functions", out)
	}
	return calls, rate
}

// TestPollingExact runs a polling loop of millions of calls per second per
// thread with normal calls around it, and replays every frame's function
// events per thread through a stack, as a detector does: no exit comes
// without its entry, no entry stays without its exit, every call is on the
// path the program made it on, and the calls streamed, summarised and
// dropped add up to the calls the program counted itself, function by
// function, with or without summaries and with rings full or not.
func TestPollingExact(t *testing.T) {
	lib := coreLibrary(t)
	prog := compileProgram(t, lib, "polling.c", false)
	ns := startNATS(t)
	nc := connect(t, ns)
	parents := map[string][]string{
		"poll_loop": {""}, "step": {""}, "test_flag": {"poll_loop", "progress"},
		"rare": {"test_flag"}, "progress": {"poll_loop"}, "work": {"step"}, "inner": {"work"},
	}
	for i, tc := range []struct {
		name    string
		env     []string
		threads int
		// summarised: whether the run must summarise calls (or must not);
		// drops: "none", "some", or "any" where it depends on how soon the
		// background thread empties the rings.
		summarised bool
		drops      string
	}{
		{name: "summaries", threads: 2, summarised: true, drops: "none"},
		{name: "full rings without summaries", env: []string{"KIPIMO_SUMMARY_RATE=0", "KIPIMO_BUFFER_EVENTS=4096"}, threads: 2, drops: "some"},
		{name: "summaries and small rings", env: []string{"KIPIMO_SUMMARY_RATE=5000", "KIPIMO_BUFFER_EVENTS=1024"}, threads: 1, summarised: true, drops: "any"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := fmt.Sprintf("polling%d", i)
			c := collect(t, nc, run)
			status := t.TempDir()
			env := lib.Environ(Env{NATSURL: ns.ClientURL(), Run: run, Period: 100 * time.Millisecond, StatusDir: status}, os.Environ())
			env = append(env, tc.env...)
			out, code := runProgram(t, env, prog, fmt.Sprint(tc.threads), "1")
			if code != 0 {
				t.Fatalf("polling exited with status %d", code)
			}
			want, rate := programCalls(t, out)
			t.Logf("test_flag: %.1fM calls/s per thread, %d calls in all", rate/1e6, want["test_flag"])
			c.waitEOS(t, 1)
			c.mu.Lock()
			defer c.mu.Unlock()
			if len(c.bad) > 0 {
				t.Fatal(c.bad)
			}
			s := c.ranks[0]
			if s.mismatch != 0 || s.unnamed != 0 {
				t.Errorf("%d exits without their entry on top of their thread's stack; %d events before their function's name", s.mismatch, s.unnamed)
			}
			for tid, st := range s.open {
				for _, o := range st {
					t.Errorf("thread %d: %s entered at %d never exits", tid, s.names[o.fid], o.entry)
				}
			}
			summarised, dropped := 0, 0
			for fn, n := range want {
				streamed := s.calls[fn] - s.summarised[fn]
				if got := s.calls[fn] + s.droppedCalls[fn]; got != n {
					t.Errorf("%s: %d calls streamed + %d summarised + %d dropped = %d, the program made %d",
						fn, streamed, s.summarised[fn], s.droppedCalls[fn], got, n)
				}
				summarised += s.summarised[fn]
				dropped += s.droppedCalls[fn]
				for p := range s.parents[fn] {
					if !strings.Contains(" "+strings.Join(parents[fn], " ")+" ", " "+p+" ") {
						t.Errorf("%s called from %q (%d times): the program calls it from %q only", fn, p, s.parents[fn][p], parents[fn])
					}
				}
			}
			for fn := range s.droppedCalls {
				if _, ok := want[fn]; !ok {
					t.Errorf("dropped calls of %q, a function the program does not have", fn)
				}
			}
			t.Logf("%d calls summarised, %d dropped whole", summarised, dropped)
			if tc.summarised != (summarised > 0) || tc.drops == "none" && dropped > 0 || tc.drops == "some" && dropped == 0 {
				t.Errorf("%d calls summarised, %d dropped (%v): want summarised %v, drops %s", summarised, dropped, s.droppedCalls, tc.summarised, tc.drops)
			}
			if s.summarised["inner"] != 0 || s.summarised["progress"] != 0 || s.summarised["poll_loop"] != 0 {
				t.Errorf("summarised %v: only test_flag is called fast enough", s.summarised)
			}
			for name, calls := range s.values {
				path, ok := strings.CutPrefix(name, "Kipimo Summary Calls: ")
				if !ok {
					continue
				}
				total, lo, hi := s.values["Kipimo Summary Time (ns): "+path], s.values["Kipimo Summary Min (ns): "+path], s.values["Kipimo Summary Max (ns): "+path]
				if len(total) != len(calls) || len(lo) != len(calls) || len(hi) != len(calls) {
					t.Fatalf("%s: %d counts, %d times, %d minima, %d maxima: want one of each per frame", path, len(calls), len(total), len(lo), len(hi))
				}
				for i := range calls {
					if calls[i] == 0 || lo[i] > hi[i] {
						t.Errorf("%s, summary %d: %d calls, %d ns in all, min %d, max %d", path, i, calls[i], total[i], lo[i], hi[i])
					}
				}
			}
			st, err := ReadStatus(status)
			if err != nil || len(st) != 1 {
				t.Fatalf("status %v: %v", st, err)
			}
			if st[0].CallsSummarised != uint64(summarised) || st[0].CallsDropped != uint64(dropped) {
				t.Errorf("status: %d calls summarised, %d dropped; the frames said %d and %d", st[0].CallsSummarised, st[0].CallsDropped, summarised, dropped)
			}
		})
	}
}
