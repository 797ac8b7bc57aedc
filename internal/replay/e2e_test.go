package replay_test

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/ad"
	"github.com/kipimo-hpc/kipimo/internal/adnode"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/replay"
	"github.com/kipimo-hpc/kipimo/internal/replay/publish"
	"github.com/kipimo-hpc/kipimo/internal/replay/steps"
)

// memSink keeps every record the detectors publish.
type memSink struct {
	mu    sync.Mutex
	execs []provenance.Exec
}

func (s *memSink) Publish(_ context.Context, b *ad.Batch) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.execs = append(s.execs, b.Anomalies...)
	s.execs = append(s.execs, b.Normal...)
	return nil
}

func (s *memSink) Flush(context.Context) error { return nil }

// TestChromeGPUThroughDetector replays a PyTorch trace with CUDA kernels
// through embedded NATS into a detector: its records of GPU executions carry
// gpu_location (device, stream) and gpu_parent (the launching CPU call).
func TestChromeGPUThroughDetector(t *testing.T) {
	srv, err := natsx.StartServer(natsx.DefaultServerConfig(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nc, err := natsx.Connect(ctx, srv.ClientURL(), "e2e")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	const run = "e2e"
	sink := &memSink{}
	ready := make(chan struct{})
	served := make(chan error, 1)
	go func() {
		_, err := adnode.Serve(ctx, adnode.ServeConfig{
			Conn: nc, Run: run, PID: 0, Ranks: []uint32{0},
			Detector:      ad.Config{NormalRate: 1, Sink: sink},
			PendingFrames: 1 << 16, // the replay below runs at full speed
			Ready:         func() { close(ready) },
		})
		served <- err
	}()
	select {
	case <-ready:
	case err := <-served:
		t.Fatalf("detector stopped before it was ready: %v", err)
	case <-ctx.Done():
		t.Fatal("detector not ready")
	}

	trace := filepath.Join("chrome", "testdata", "benchmark_result_493459_1694039959_trace.json.gz")
	src, err := replay.Open(replay.FormatChrome, []string{trace}, steps.Config{Step: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	subj := natsx.Subjects{Run: run}
	c, st, err := publish.Frames(ctx, nc, subj, src, publish.Pace{EndOfStream: true})
	if err != nil {
		t.Fatal(err)
	}
	// Streams 7 and 20, and an extra thread for stream 7's seven "Stream
	// Sync" spans that overlap the end of the copies they start in.
	if st.GPUThreads != 3 || st.Losses.Count(steps.LossOverlap) != 7 || c.Frames == 0 {
		t.Fatalf("published %d frames, %d GPU threads", c.Frames, st.GPUThreads)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("detector did not finish")
	}

	sink.mu.Lock()
	defer sink.mu.Unlock()
	var gpu, located, parented int
	streams := map[uint32]bool{}
	for _, e := range sink.execs {
		if !e.IsGPUEvent {
			continue
		}
		gpu++
		if e.GPULocation != nil {
			located++
			streams[e.GPULocation.Stream] = true
		}
		if e.GPUParent != nil && e.GPUParent.EventID != "" && len(e.GPUParent.CallStack) > 0 {
			parented++
		}
	}
	if gpu == 0 {
		t.Fatalf("no GPU execution among %d records", len(sink.execs))
	}
	if located != gpu {
		t.Errorf("%d of %d GPU records have gpu_location", located, gpu)
	}
	if !streams[7] || !streams[20] {
		t.Errorf("GPU streams in records %v, want 7 and 20", streams)
	}
	if parented == 0 {
		t.Errorf("no GPU record has a gpu_parent (of %d)", gpu)
	}
	t.Logf("%d records, %d GPU executions, %d with gpu_parent", len(sink.execs), gpu, parented)
	// Only the runtime's synchronisation records on the streams (no launch)
	// go without a parent; kernels, copies and sets all have theirs.
	for _, e := range sink.execs {
		if e.IsGPUEvent && (e.GPUParent == nil || e.GPUParent.EventID == "") &&
			!strings.Contains(e.Func, "Sync") && !strings.Contains(e.Func, "Wait") {
			t.Errorf("GPU execution %q has no gpu_parent", e.Func)
		}
	}
}
