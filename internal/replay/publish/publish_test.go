package publish

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/replay"
	"github.com/kipimo-hpc/kipimo/internal/replay/steps"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

func startServer(t *testing.T) *nats.Conn {
	t.Helper()
	srv, err := natsx.StartServer(natsx.DefaultServerConfig(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, err := natsx.Connect(ctx, srv.ClientURL(), "replay-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// writeGenerated writes a generated run's frames, one file per rank, and
// returns each rank's frames as encoded bytes.
func writeGenerated(t testing.TB, dir string, cfg workload.Config) map[uint32][][]byte {
	w, err := workload.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := map[uint32][][]byte{}
	for r := 0; r < cfg.Ranks; r++ {
		g := w.Rank(uint32(r))
		fh, err := os.Create(replay.RankFile(dir, uint32(r)))
		if err != nil {
			t.Fatal(err)
		}
		fw := frame.NewWriter(fh)
		var f frame.Frame
		for {
			if _, err := g.Next(&f); err == io.EOF {
				break
			} else if err != nil {
				t.Fatal(err)
			}
			if err := fw.Write(&f); err != nil {
				t.Fatal(err)
			}
			want[uint32(r)] = append(want[uint32(r)], frame.AppendBinary(nil, &f))
		}
		if err := fw.Flush(); err != nil {
			t.Fatal(err)
		}
		fh.Close()
	}
	return want
}

// ends counts the end-of-stream messages per subject.
var ends map[string]int

// receive subscribes to every frame of run and returns a function that waits
// for n messages (frames and end markers) and returns the frames by rank, in
// arrival order.
func receive(t *testing.T, nc *nats.Conn, run string) func(n int) map[uint32][][]byte {
	t.Helper()
	var mu sync.Mutex
	got := map[uint32][][]byte{}
	ends = map[string]int{}
	count := 0
	done := make(chan struct{})
	want := -1
	sub, err := nc.Subscribe(natsx.Subjects{Run: run}.AllFrames(), func(m *nats.Msg) {
		if len(m.Data) == 0 {
			mu.Lock()
			ends[m.Subject]++
			count++
			if count == want {
				close(done)
			}
			mu.Unlock()
			return
		}
		var f frame.Frame
		if _, err := frame.DecodeBinary(m.Data, &f); err != nil {
			t.Errorf("received a bad frame on %s: %v", m.Subject, err)
			return
		}
		if m.Subject != (natsx.Subjects{Run: run}).Frames(f.PID, f.Rank) {
			t.Errorf("frame of rank %d on subject %s", f.Rank, m.Subject)
		}
		mu.Lock()
		defer mu.Unlock()
		got[f.Rank] = append(got[f.Rank], append([]byte(nil), m.Data...))
		count++
		if count == want {
			close(done)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return func(n int) map[uint32][][]byte {
		mu.Lock()
		want = n
		if count == n {
			close(done)
		}
		mu.Unlock()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			mu.Lock()
			t.Fatalf("received %d of %d frames", count, n)
			mu.Unlock()
		}
		sub.Unsubscribe()
		mu.Lock()
		defer mu.Unlock()
		return got
	}
}

func TestPublishGeneratedRun(t *testing.T) {
	nc := startServer(t)
	dir := t.TempDir()
	cfg := workload.DefaultConfig()
	cfg.Ranks, cfg.Steps, cfg.EventsPerStep, cfg.GPU = 4, 12, 2000, true
	want := writeGenerated(t, dir, cfg)
	wait := receive(t, nc, "gen1")
	src, err := replay.Open(replay.FormatFrames, []string{dir}, steps.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var reports int
	c, st, err := Frames(context.Background(), nc, natsx.Subjects{Run: "gen1"}, src, Pace{FlushEvery: 5, EndOfStream: true, Progress: func(Counts) { reports++ }})
	if err != nil {
		t.Fatal(err)
	}
	total := cfg.Ranks * cfg.Steps
	if c.Frames != total || st.Frames != total {
		t.Fatalf("published %d frames (source %d), want %d", c.Frames, st.Frames, total)
	}
	if reports == 0 {
		t.Error("no progress report")
	}
	got := wait(total + cfg.Ranks) // every frame and one end marker per rank
	for r := range want {
		if n := ends[natsx.Subjects{Run: "gen1"}.Frames(0, r)]; n != 1 {
			t.Errorf("rank %d: %d end-of-stream messages, want 1", r, n)
		}
	}
	for r, frames := range want {
		if len(got[r]) != len(frames) {
			t.Fatalf("rank %d: received %d frames, want %d", r, len(got[r]), len(frames))
		}
		for i := range frames {
			if !bytes.Equal(got[r][i], frames[i]) {
				t.Fatalf("rank %d: frame %d differs from the file's (out of order or damaged)", r, i)
			}
		}
	}
}

func TestPublishConvertedTrace(t *testing.T) {
	nc := startServer(t)
	trace := filepath.Join("..", "chrome", "testdata", "benchmark_result_493459_1694039959_trace.json.gz")
	cfg := steps.Config{Step: 50 * time.Millisecond}
	src, err := replay.Open(replay.FormatChrome, []string{trace}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var want [][]byte
	st, err := src.Frames(context.Background(), func(f *frame.Frame) error {
		want = append(want, frame.AppendBinary(nil, f))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	wait := receive(t, nc, "chrome1")
	src, _ = replay.Open(replay.FormatChrome, []string{trace}, cfg)
	// Without the dictionary's re-sends (names_test.go), the frames are the
	// source's, byte for byte.
	c, _, err := Frames(context.Background(), nc, natsx.Subjects{Run: "chrome1"}, src, Pace{NamesEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	if c.Frames != st.Frames || c.Frames != len(want) {
		t.Fatalf("published %d frames, source has %d", c.Frames, len(want))
	}
	got := wait(len(want))[0]
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("frame %d differs", i)
		}
	}
}

func TestPublishPacedStopsOnCancel(t *testing.T) {
	nc := startServer(t)
	dir := t.TempDir()
	cfg := workload.DefaultConfig()
	cfg.Ranks, cfg.Steps, cfg.EventsPerStep = 1, 5, 200
	writeGenerated(t, dir, cfg)
	src, err := replay.Open(replay.FormatFrames, []string{dir}, steps.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	// At a millionth of real time the second frame is due in a very long
	// time: cancelling must end the wait.
	c, _, err := Frames(ctx, nc, natsx.Subjects{Run: "paced"}, src, Pace{Speed: 1e-6, Progress: func(c Counts) {
		if c.Frames >= 1 {
			cancel()
		}
	}, ProgressEvery: time.Nanosecond})
	if err == nil || ctx.Err() == nil {
		t.Fatalf("err = %v, want the cancellation", err)
	}
	if c.Frames != 1 {
		t.Errorf("published %d frames before the cancel, want 1", c.Frames)
	}
}

func TestParseSpeed(t *testing.T) {
	cases := []struct {
		in   string
		want float64
		bad  bool
	}{
		{"max", 0, false}, {"realtime", 1, false}, {"10x", 10, false}, {"0.5x", 0.5, false},
		{"fast", 0, true}, {"0x", 0, true}, {"-2x", 0, true}, {"x", 0, true},
	}
	for _, tc := range cases {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseSpeed(tc.in)
			if (err != nil) != tc.bad || got != tc.want {
				t.Errorf("ParseSpeed(%q) = %v, %v", tc.in, got, err)
			}
		})
	}
}
