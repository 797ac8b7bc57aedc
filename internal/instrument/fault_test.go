package instrument

import (
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/mpitest"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
)

// The consumer goes away mid-run: the application is never held back (it
// finishes with its own output and status), the frames that could not wait
// within the queue bound are dropped and counted, and when a server comes
// back the count reaches the consumer with the stream's end.
func TestConsumerKilledMidRun(t *testing.T) {
	requireMPI(t)
	lib := library(t)
	prog := compileProgram(t, lib, "ring.c", true)
	tests := []struct {
		name    string
		restart bool
	}{
		{"server restarts", true},
		{"server gone for good", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := natsx.DefaultServerConfig(t.TempDir())
			cfg.JetStream = false
			first, err := natsx.StartServer(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer first.Shutdown()
			u, err := url.Parse(first.ClientURL())
			if err != nil {
				t.Fatal(err)
			}
			port, _ := strconv.Atoi(u.Port())
			run := strings.ReplaceAll(tc.name, " ", "-")
			c := collect(t, connect(t, first), run)
			status := t.TempDir()
			base := mpitest.Env(append(os.Environ(), "OMP_NUM_THREADS=1"))
			// 150 iterations of 10 ms: 1.5 s; frames of 20 ms; a queue that
			// holds only a few frames.
			args := []string{"-np", "2", prog, "150", "2", "512", "10000"}
			plain, _ := runProgram(t, base, "mpirun", args...)
			env := lib.Environ(Env{NATSURL: first.ClientURL(), Run: run, Period: 20 * time.Millisecond, StatusDir: status, QueueBytes: 512}, base)
			cmd := exec.Command("mpirun", args...)
			cmd.Env = env
			var out strings.Builder
			cmd.Stdout = &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			// Both ranks stream before the server goes.
			deadline := time.Now().Add(20 * time.Second)
			for {
				c.mu.Lock()
				n := len(c.ranks)
				c.mu.Unlock()
				if n == 2 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d of 2 ranks streamed within 20s", n)
				}
				time.Sleep(5 * time.Millisecond)
			}
			first.Shutdown()
			var c2 *collector
			if tc.restart {
				time.Sleep(400 * time.Millisecond)
				cfg.Port = port
				second, err := natsx.StartServer(cfg)
				if err != nil {
					t.Fatal(err)
				}
				defer second.Shutdown()
				c2 = collect(t, connect(t, second), run)
			}
			if err := cmd.Wait(); err != nil {
				t.Fatalf("the application failed with its consumer gone: %v", err)
			}
			if sortedLines(out.String()) != sortedLines(plain) {
				t.Errorf("output %q, alone %q", out.String(), plain)
			}
			st, err := ReadStatus(status)
			if err != nil || len(st) != 2 {
				t.Fatalf("status files: %v %v", st, err)
			}
			for _, s := range st {
				if s.FramesDropped == 0 || s.FramesSent+s.FramesDropped != s.Frames {
					t.Errorf("rank %d: %d frames cut, %d sent, %d dropped: want some dropped and every frame either sent or dropped", s.Rank, s.Frames, s.FramesSent, s.FramesDropped)
				}
				if s.LastError == "" {
					t.Errorf("rank %d: no error reported for the lost server", s.Rank)
				}
				if !tc.restart {
					continue
				}
				if s.Connects < 2 {
					t.Errorf("rank %d: %d connections; want a reconnect to the restarted server", s.Rank, s.Connects)
				}
				c2.waitEOS(t, 2)
				c2.mu.Lock()
				got := c2.ranks[s.Rank].dropped
				c2.mu.Unlock()
				if got != fmt.Sprint(s.FramesDropped) {
					t.Errorf("rank %d: the stream's end says %s frames dropped, the process counted %d", s.Rank, got, s.FramesDropped)
				}
				// The first frame after the reconnect names every function
				// again, so a consumer that joined late knows them all.
				c2.mu.Lock()
				for fid := range c2.ranks[s.Rank].used {
					if _, ok := c2.ranks[s.Rank].names[fid]; !ok {
						t.Errorf("rank %d: function id %d never named to the new server's consumer", s.Rank, fid)
					}
				}
				c2.mu.Unlock()
			}
		})
	}
}
