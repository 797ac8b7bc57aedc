package adnode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/ad"
	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

// encodedFrames generates a workload's frames, binary encoded, by rank.
func encodedFrames(tb testing.TB, wcfg workload.Config) ([][][]byte, uint64) {
	return encodedFramesNamed(tb, wcfg, false)
}

// encodedFramesNamed is encodedFrames, with every name known so far sent
// again in every frame when everyFrame is set (as publishers re-send them).
func encodedFramesNamed(tb testing.TB, wcfg workload.Config, everyFrame bool) ([][][]byte, uint64) {
	tb.Helper()
	w, err := workload.New(wcfg)
	if err != nil {
		tb.Fatal(err)
	}
	out := make([][][]byte, wcfg.Ranks)
	var events uint64
	for r := range out {
		g := w.Rank(uint32(r))
		var funcs, ctrs []frame.Name
		for {
			var f frame.Frame
			if _, err := g.Next(&f); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				tb.Fatal(err)
			}
			if everyFrame {
				funcs, ctrs = append(funcs, f.Funcs...), append(ctrs, f.Counters...)
				f.Funcs, f.Counters = funcs, ctrs
			}
			events += uint64(len(f.Events) + len(f.CounterEvents) + len(f.Comms))
			out[r] = append(out[r], frame.AppendBinary(nil, &f))
		}
	}
	return out, events
}

// publishFrames publishes frames [from, to) of every rank, rank after rank
// per step, and with end the end-of-stream messages.
func publishFrames(tb testing.TB, nc *nats.Conn, run string, byRank [][][]byte, from, to int, end bool) {
	tb.Helper()
	subj := natsx.Subjects{Run: run}
	for s := from; s < to; s++ {
		for r := range byRank {
			if s < len(byRank[r]) {
				if err := nc.Publish(subj.Frames(0, uint32(r)), byRank[r][s]); err != nil {
					tb.Fatal(err)
				}
			}
		}
	}
	if end {
		for r := range byRank {
			if err := nc.Publish(subj.Frames(0, uint32(r)), nil); err != nil {
				tb.Fatal(err)
			}
		}
	}
	if err := nc.Flush(); err != nil {
		tb.Fatal(err)
	}
}

type serveResult struct {
	stats []ad.Stats
	err   error
}

// serveDurable starts Serve on ranks with durable frames (every when > 0,
// file storage) or core ones, and returns once it listens.
func serveDurable(tb testing.TB, ctx context.Context, nc *nats.Conn, run string, ranks []uint32, every int, sink ad.Sink) <-chan serveResult {
	tb.Helper()
	return serveWith(tb, ctx, nc, run, ranks, every, false, sink)
}

// recordKeys lists the anomalies of a sink's records.
func recordKeys(s *MemorySink) []string {
	var out []string
	for _, e := range s.All().Anomalies {
		out = append(out, fmt.Sprintf("%d/%d/%s/%d", e.RID, e.TID, e.Func, e.Entry))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// TestDurableStopAndResume stops a node's detectors with durable frames
// mid-stream (they checkpoint and stay open), publishes more frames while
// nothing reads them, starts the node again and checks that it resumes from
// the checkpoints: every frame processed once, and the anomalies stored
// (records) and counted (step summaries at the pserver) agree. With one rank
// the global model depends on that rank's frames alone, so the resumed run
// must also find exactly the anomalies of a run that never stopped; with
// several, the ranks' relative progress after the restart shapes the
// global model, as in any live run, and may move borderline labels.
func TestDurableStopAndResume(t *testing.T) {
	_, nc := startNATS(t)
	tests := []struct {
		name  string
		ranks int
		exact bool
	}{
		{"one rank, same anomalies as uninterrupted", 1, true},
		{"three ranks on one node syncer", 3, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			wcfg := workload.DefaultConfig()
			wcfg.Ranks, wcfg.Steps, wcfg.EventsPerStep = tc.ranks, 24, 3000
			byRank, _ := encodedFrames(t, wcfg)
			var ranks []uint32
			for r := range uint32(tc.ranks) {
				ranks = append(ranks, r)
			}
			run := func(name string, stopAt int) ([]string, *fakePServer, []ad.Stats) {
				double := &natsDouble{ps: newFakePServer(), nc: nc, subj: natsx.Subjects{Run: name}}
				double.start(t)
				defer double.stop(t)
				sink := &MemorySink{}
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				if stopAt > 0 {
					sctx, stop := context.WithCancel(ctx)
					done := serveDurable(t, sctx, nc, name, ranks, 4, sink)
					publishFrames(t, nc, name, byRank, 0, stopAt, false)
					// Summaries leave with the request after the checkpoint
					// that covers them: those of steps 0-7 (every 4 steps).
					waitFor(t, "the step summaries before the stop", func() bool {
						return double.ps.stepCount() >= len(ranks)*8
					})
					stop()
					if r := <-done; r.err != nil {
						t.Fatalf("stop: %v", r.err)
					}
				}
				done := serveDurable(t, ctx, nc, name, ranks, 4, sink)
				publishFrames(t, nc, name, byRank, stopAt, len(byRank[0]), true)
				r := <-done
				if r.err != nil {
					t.Fatal(r.err)
				}
				return recordKeys(sink), double.ps, r.stats
			}
			name := strings.ReplaceAll(tc.name[:8], " ", "-")
			want, wantPS, wantStats := run(name+"-once", 0)
			got, gotPS, stats := run(name+"-resumed", 11)
			if len(want) == 0 {
				t.Fatal("no anomaly found")
			}
			if n := gotPS.anomalies(); n != uint64(len(got)) {
				t.Errorf("resumed: %d anomalies stored, %d counted in the step summaries", len(got), n)
			}
			for i, s := range stats {
				w := wantStats[i]
				if s.Events != w.Events || s.Executions != w.Executions || s.OpenAtEnd != w.OpenAtEnd {
					t.Errorf("rank %d: resumed %d events, %d executions (%d open at the end); uninterrupted %d, %d (%d)",
						s.Rank, s.Events, s.Executions, s.OpenAtEnd, w.Events, w.Executions, w.OpenAtEnd)
				}
				if s.MissingSteps != 0 || s.BadFrames != 0 {
					t.Errorf("rank %d: %d missing steps, %d bad frames", s.Rank, s.MissingSteps, s.BadFrames)
				}
			}
			if !tc.exact {
				return
			}
			if !slices.Equal(got, want) {
				t.Errorf("resumed: %d anomalies, uninterrupted: %d", len(got), len(want))
			}
			if a, b := wantPS.summaryString(), gotPS.summaryString(); a != b {
				t.Errorf("the pserver's step summaries differ:\nuninterrupted %s\nresumed       %s", a, b)
			}
		})
	}
}

// BenchmarkServeFrames measures a node's detectors end to end on an
// embedded NATS server: frames published, read (as core NATS messages or
// from the durable frame stream, checkpointing every few steps), detected,
// synced with a pserver double over NATS, until every rank's stream ends.
// It is the price of durable frames: compare the events/s of the cases.
func BenchmarkServeFrames(b *testing.B) {
	wcfg := workload.DefaultConfig()
	wcfg.Ranks, wcfg.Steps, wcfg.EventsPerStep = 4, 20, 20000
	byRank, events := encodedFrames(b, wcfg)
	ranks := []uint32{0, 1, 2, 3}
	cases := []struct {
		name   string
		every  int
		memory bool
	}{
		{"core", 0, false},
		{"durable-file-every-1", 1, false},
		{"durable-file-every-10", 10, false},
		{"durable-memory-every-10", 10, true},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			_, nc := startNATS(b)
			var total time.Duration
			for i := 0; b.Loop(); i++ {
				run := fmt.Sprintf("bench%d", i)
				double := &natsDouble{ps: newFakePServer(), nc: nc, subj: natsx.Subjects{Run: run}}
				double.start(b)
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				done := serveWith(b, ctx, nc, run, ranks, tc.every, tc.memory, &MemorySink{})
				t0 := time.Now()
				publishFrames(b, nc, run, byRank, 0, len(byRank[0]), true)
				r := <-done
				total += time.Since(t0)
				cancel()
				if r.err != nil {
					b.Fatal(r.err)
				}
				double.stop(b)
			}
			b.ReportMetric(float64(events)*float64(b.N)/total.Seconds(), "events/s")
		})
	}
}

// serveWith starts Serve on ranks with durable frames (every when > 0,
// in memory or files) or core ones, and returns once it listens.
func serveWith(tb testing.TB, ctx context.Context, nc *nats.Conn, run string, ranks []uint32, every int, memory bool, sink ad.Sink) <-chan serveResult {
	tb.Helper()
	subj := natsx.Subjects{Run: run}
	var dur *Durable
	if every > 0 {
		js, err := jetstream.New(nc)
		if err != nil {
			tb.Fatal(err)
		}
		dur = &Durable{JS: js, CheckpointEvery: every, Stream: FrameStreamConfig{Memory: memory}}
	}
	ready := make(chan struct{})
	done := make(chan serveResult, 1)
	go func() {
		st, err := Serve(ctx, ServeConfig{
			Conn: nc, Run: run, Ranks: ranks, Logger: zerolog.Nop(), Ready: func() { close(ready) }, Durable: dur,
			PendingFrames: 1024,
			Detector:      ad.Config{Sink: sink, Syncer: &NATSSyncer{Conn: nc, Subjects: subj}, SyncTimeout: 5 * time.Second},
		})
		done <- serveResult{st, err}
	}()
	select {
	case <-ready:
	case r := <-done:
		tb.Fatalf("serve ended before it was ready: %v", r.err)
	}
	return done
}

// TestDurableStreamBoundCountsLoss publishes a rank's frames into a frame
// stream bounded far below their size before any detector reads them: the
// oldest are dropped (the publisher is never held back), and the detector
// that then reads the rest counts the dropped io_steps as missing.
func TestDurableStreamBoundCountsLoss(t *testing.T) {
	_, nc := startNATS(t)
	const run = "bounded"
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	bound := FrameStreamConfig{MaxBytes: 1 << 20}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := EnsureFrameStream(ctx, js, run, bound); err != nil {
		t.Fatal(err)
	}
	wcfg := workload.DefaultConfig()
	wcfg.Ranks, wcfg.Steps, wcfg.EventsPerStep = 1, 30, 20000
	byRank, _ := encodedFramesNamed(t, wcfg, true)
	var total int
	for _, b := range byRank[0] {
		total += len(b)
	}
	if total < 3*int(bound.MaxBytes)/2 {
		t.Fatalf("the frames are %d bytes: too few to overflow the bound", total)
	}
	publishFrames(t, nc, run, byRank, 0, len(byRank[0]), true)
	double := &natsDouble{ps: newFakePServer(), nc: nc, subj: natsx.Subjects{Run: run}}
	double.start(t)
	stats, err := Serve(ctx, ServeConfig{
		Conn: nc, Run: run, Ranks: []uint32{0}, Logger: zerolog.Nop(),
		Durable:  &Durable{JS: js, Stream: bound},
		Detector: ad.Config{Sink: &MemorySink{}, Syncer: &NATSSyncer{Conn: nc, Subjects: natsx.Subjects{Run: run}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, natsx.FrameStream(run))
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kept := int(info.State.Msgs) - 1 // and the end-of-stream message
	s := stats[0]
	dropped := uint64(len(byRank[0]) - kept)
	if kept <= 0 || dropped == 0 || s.Frames != uint64(kept) || s.MissingSteps != dropped {
		t.Errorf("detector: %d frames, %d missing steps; the stream kept %d of %d frames", s.Frames, s.MissingSteps, kept, len(byRank[0]))
	}
}

// A rank with durable frames keeps the frames it has read in memory until
// its next checkpoint acknowledges them: with a checkpoint due only every
// 1,000 io_steps, large frames make it checkpoint as soon as they hold the
// rank's byte bound, so its step summaries reach the pserver while the
// stream is still open, and once it has read every frame, fewer than the
// bound's worth of them wait for an acknowledgement.
func TestDurableCheckpointsWithinByteBound(t *testing.T) {
	_, nc := startNATS(t)
	const run, bound, every = "unacked", 256 << 10, 1000
	wcfg := workload.DefaultConfig()
	wcfg.Ranks, wcfg.Steps, wcfg.EventsPerStep = 1, 24, 20000
	byRank, _ := encodedFrames(t, wcfg)
	frameSize := len(byRank[0][len(byRank[0])/2])
	if frameSize*4 > bound*3 || frameSize*24 < 4*bound {
		t.Fatalf("frames of %d bytes do not suit a bound of %d", frameSize, bound)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	double := &natsDouble{ps: newFakePServer(), nc: nc, subj: natsx.Subjects{Run: run}}
	double.start(t)
	defer double.stop(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := Serve(ctx, ServeConfig{
			Conn: nc, Run: run, Ranks: []uint32{0}, Logger: zerolog.Nop(), Ready: func() { close(ready) },
			Durable:       &Durable{JS: js, CheckpointEvery: every},
			PendingFrames: 1024, PendingBytes: bound,
			Detector: ad.Config{Sink: &MemorySink{}, Syncer: &NATSSyncer{Conn: nc, Subjects: double.subj}, SyncTimeout: 5 * time.Second},
		})
		done <- err
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("serve ended before it was ready: %v", err)
	}
	// Every frame but the end of the stream: without the byte bound the
	// rank would hold them all, unacknowledged, waiting for step 1,000.
	publishFrames(t, nc, run, byRank, 0, len(byRank[0]), false)
	waitFor(t, "step summaries released by a checkpoint before the end", func() bool { return double.ps.stepCount() > 0 })
	cons, err := js.Consumer(ctx, natsx.FrameStream(run), consumerName(0, []uint32{0}))
	if err != nil {
		t.Fatal(err)
	}
	// Once every frame is processed, what is read and not acknowledged is
	// less than the bound: the frames since the last checkpoint.
	limit := bound/frameSize + 1
	waitFor(t, "every frame processed and all but the bound's worth acknowledged", func() bool {
		info, err := cons.Info(ctx)
		if err != nil {
			return false
		}
		return info.NumPending == 0 && info.Delivered.Stream >= uint64(len(byRank[0])) && info.NumAckPending <= limit
	})
	publishFrames(t, nc, run, byRank, len(byRank[0]), len(byRank[0]), true)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := double.ps.stepCount(); n != len(byRank[0]) {
		t.Errorf("%d step summaries, want %d", n, len(byRank[0]))
	}
}
