package cli

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/replay"
	"github.com/kipimo-hpc/kipimo/internal/replay/publish"
)

func TestReplayToServer(t *testing.T) {
	srv, err := natsx.StartServer(natsx.DefaultServerConfig(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := natsx.Connect(context.Background(), srv.ClientURL(), "replay-cli-test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var got, bad atomic.Int64
	lastStep := map[uint32]int64{}
	var ends atomic.Int64
	sub, err := nc.Subscribe("kipimo.r1.frames.>", func(m *nats.Msg) {
		if len(m.Data) == 0 {
			ends.Add(1)
			return
		}
		var f frame.Frame
		if _, err := frame.DecodeBinary(m.Data, &f); err != nil {
			bad.Add(1)
			return
		}
		if prev, ok := lastStep[f.Rank]; ok && int64(f.Step) != prev+1 {
			bad.Add(1)
		}
		lastStep[f.Rank] = int64(f.Step)
		got.Add(1)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	nc.Flush()

	dir := t.TempDir()
	in := filepath.Join("..", "replay", "tautrace", "testdata", "hecatoncheir")
	if _, _, err := runCLI(t, "frames", "convert", "--format", "tau", "--step", "100ms", "--out", dir, in); err != nil {
		t.Fatal(err)
	}
	out, _, err := runCLI(t, "replay", "--nats", srv.ClientURL(), "--run", "r1", "--format", "frames", "--json", dir)
	if err != nil {
		t.Fatal(err)
	}
	var s convertSummary
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("summary %q: %v", out, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for (got.Load() < int64(s.Frames) || ends.Load() < 1) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got.Load() != int64(s.Frames) || s.Frames == 0 || bad.Load() != 0 || ends.Load() != 1 {
		t.Errorf("received %d of %d frames, %d bad or out of order, %d end markers (want 1)", got.Load(), s.Frames, bad.Load(), ends.Load())
	}
	if _, err := replay.OpenFrames([]string{dir}); err != nil {
		t.Fatal(err)
	}
}

func TestReplayErrors(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(t.TempDir(), "empty.frames")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// Bytes of no text format, as a binary file named .cali holds.
	binary := filepath.Join(t.TempDir(), "binary.cali")
	junk := make([]byte, 400)
	for i := range junk {
		junk[i] = byte(i*131 + 7)
		if junk[i] == ',' || junk[i] == '=' || junk[i] == '\\' || junk[i] == '\n' {
			junk[i] = 0xff
		}
	}
	if err := os.WriteFile(binary, append(junk, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	in := filepath.Join("..", "replay", "caliper", "testdata", "160809-094411_72298_fuu1NeAHT2US.cali")
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"bad url", []string{"replay", "--nats", "http://127.0.0.1:4222", "--format", "caliper", in}, "scheme"},
		{"unreachable", []string{"replay", "--nats", "nats://127.0.0.1:1", "--format", "caliper", in}, "connect to NATS"},
		{"bad speed", []string{"replay", "--speed", "fast", "--format", "caliper", in}, "--speed"},
		{"bad run", []string{"replay", "--run", "a.b", "--format", "caliper", in}, "--run"},
		{"no frames", []string{"replay", "--format", "frames", dir}, "no *.frames files"},
		{"empty file", []string{"replay", "--format", "frames", empty}, "the input holds no frames"},
		{"binary cali", []string{"replay", "--format", "caliper", binary}, "is this a text .cali file?"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			_, _, err := runCLI(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want %q", err, tc.want)
			}
			if err != nil && len(err.Error()) > 400 {
				t.Errorf("error of %d bytes: %q", len(err.Error()), err)
			}
			if time.Since(start) > 15*time.Second {
				t.Errorf("took %s: an unreachable server must fail fast", time.Since(start))
			}
		})
	}
}

func TestReplayEmbedded(t *testing.T) {
	in := filepath.Join("..", "replay", "chrome", "testdata", "cuda_event_sync__event_sync_trace.json.gz")
	out, errOut, err := runCLI(t, "replay", "--format", "chrome", "--speed", "100x", in)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(errOut, "embedded NATS") || !strings.Contains(out, "published 1 frames") {
		t.Errorf("stdout %q, stderr %q", out, errOut)
	}
}

func TestProgressLine(t *testing.T) {
	cases := []struct {
		name string
		c    struct {
			frames, events int
			done, total    int64
			elapsed        time.Duration
		}
		want []string
	}{
		{"known size", struct {
			frames, events int
			done, total    int64
			elapsed        time.Duration
		}{10, 2_000_000, 50, 100, 2 * time.Second}, []string{"50%", "2.00M events", "10 frames", "1.00M events/s", "ETA 2s"}},
		{"unknown size", struct {
			frames, events int
			done, total    int64
			elapsed        time.Duration
		}{3, 1500, 0, 0, time.Second}, []string{"1.5k events", "3 frames", "ETA --"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			line := progressLineOf(tc.c.frames, tc.c.events, tc.c.done, tc.c.total, tc.c.elapsed)
			for _, w := range tc.want {
				if !strings.Contains(line, w) {
					t.Errorf("%q lacks %q", line, w)
				}
			}
		})
	}
}

func progressLineOf(frames, events int, done, total int64, elapsed time.Duration) string {
	return progressLine(publish.Counts{Frames: frames, Events: events, Done: done, Total: total, Elapsed: elapsed})
}
