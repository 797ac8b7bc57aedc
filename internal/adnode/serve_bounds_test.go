package adnode

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/ad"
	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
)

// A rank's queue is bounded in messages and in bytes; what does not fit is
// dropped and counted, and one message larger than the bound still passes
// when the queue is empty.
func TestQueueSourceBounds(t *testing.T) {
	for _, tc := range []struct {
		name        string
		capacity    int
		maxBytes    int64
		sizes       []int
		wantQueued  int
		wantDropped int
	}{
		{"within both bounds", 4, 1000, []int{100, 100, 100}, 3, 0},
		{"count bound", 2, 1000, []int{10, 10, 10, 10}, 2, 2},
		{"byte bound", 10, 250, []int{100, 100, 100, 10}, 3, 1},
		{"one large message into an empty queue", 10, 100, []int{5000, 1}, 1, 1},
		// The defaults under overload: 27 frames of 600 KB fit in 16 MiB.
		{"600 KB frames within the default bounds", 256, DefaultPendingBytes, slices.Repeat([]int{600 << 10}, 40), 27, 13},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := &queueSource{ch: make(chan *nats.Msg, tc.capacity), maxBytes: tc.maxBytes}
			for _, n := range tc.sizes {
				q.push(&nats.Msg{Data: make([]byte, n)})
			}
			if q.pending() != tc.wantQueued || q.dropped() != tc.wantDropped {
				t.Fatalf("queued %d dropped %d, want %d %d", q.pending(), q.dropped(), tc.wantQueued, tc.wantDropped)
			}
			for q.pending() > 0 {
				if _, err := q.next(time.Second); err != nil {
					t.Fatal(err)
				}
			}
			if q.bytes != 0 {
				t.Errorf("%d bytes accounted in an empty queue", q.bytes)
			}
		})
	}
}

// fakeSource yields its messages, then says it dropped n.
type fakeSource struct {
	msgs []*nats.Msg
	n    int
}

func (f *fakeSource) nextContext(ctx context.Context) (*nats.Msg, error) {
	if len(f.msgs) == 0 {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	m := f.msgs[0]
	f.msgs = f.msgs[1:]
	return m, nil
}
func (f *fakeSource) next(time.Duration) (*nats.Msg, error) {
	return f.nextContext(context.Background())
}
func (f *fakeSource) pending() int { return len(f.msgs) }
func (f *fakeSource) dropped() int { return f.n }

// Frames the input dropped because the detector was behind are counted as
// dropped frames (their steps as missing steps), never as bad frames.
func TestDroppedFramesAreNotBad(t *testing.T) {
	d, err := ad.New(ad.Config{Sink: &MemorySink{}})
	if err != nil {
		t.Fatal(err)
	}
	src := &fakeSource{n: 3}
	for _, s := range []uint64{0, 4} { // steps 1-3 dropped
		f := nameStep{fids: []uint32{1}, names: []frame.Name{{ID: 1, Name: "f"}}}.frame(s)
		src.msgs = append(src.msgs, &nats.Msg{Data: frame.AppendBinary(nil, f)})
	}
	src.msgs = append(src.msgs, &nats.Msg{Header: nats.Header{EndOfStreamHeader: []string{"1"}}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := serveRank(ctx, d, src, make(chan struct{}), &dropLog{every: time.Minute}, time.Second, nil); err != nil {
		t.Fatal(err)
	}
	st := d.Stats()
	if st.DroppedFrames != 3 || st.BadFrames != 0 || st.MissingSteps != 3 || st.Frames != 2 {
		t.Errorf("dropped %d bad %d missing %d processed %d; want 3 0 3 2", st.DroppedFrames, st.BadFrames, st.MissingSteps, st.Frames)
	}
}

// Discovery starts detectors for at most MaxRanks ranks: frames of 20,000
// rank names reach two detectors; the others' are dropped and counted
// (kipimo_ad_refused_rank_frames_total), logged in a line or two, and the
// served ranks are unharmed.
func TestDiscoveryBoundsRanks(t *testing.T) {
	_, nc := startNATS(t)
	const run = "bounded"
	subj := natsx.Subjects{Run: run}
	coll := NewCollector(8, nil)
	var logs syncLog
	end := serveDiscovering(t, nc, ServeConfig{Run: run, MaxRanks: 2, Collector: coll, Detector: ad.Config{Sink: &MemorySink{}},
		Logger: zerolog.New(&logs)})
	const ranks, steps = 20000, 2
	for r := range uint32(ranks) {
		for s := range uint64(steps) {
			f := nameStep{fids: []uint32{1}, names: []frame.Name{{ID: 1, Name: "f"}}}.frame(s)
			f.Rank = r
			if err := nc.Publish(subj.Frames(0, r), frame.AppendBinary(nil, f)); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitFor(t, "the served ranks' frames and the refusals", func() bool {
		var n uint64
		for _, s := range coll.Stats() {
			n += s.Frames
		}
		return n == 2*steps && coll.refusedRanks.Load() == (ranks-2)*steps
	})
	if stats := end(); len(stats) != 2 {
		t.Errorf("%d detectors, want 2", len(stats))
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(coll)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	refused := -1.0
	for _, mf := range mfs {
		if mf.GetName() == "kipimo_ad_refused_rank_frames_total" {
			refused = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	if refused != (ranks-2)*steps {
		t.Errorf("kipimo_ad_refused_rank_frames_total %v, want %d", refused, (ranks-2)*steps)
	}
	// The first refusal, then one line per interval, then the rest at the
	// end: all of them counted in the lines.
	out := logs.String()
	lines := strings.Count(out, "frames of new ranks dropped")
	var logged uint64
	for _, l := range strings.Split(out, "\n") {
		var e struct {
			Refused uint64 `json:"refused_frames"`
		}
		if strings.Contains(l, "frames of new ranks dropped") && json.Unmarshal([]byte(l), &e) == nil {
			logged += e.Refused
		}
	}
	if lines < 1 || lines > 8 || logged != (ranks-2)*steps {
		t.Errorf("%d log lines counting %d refused frames, want a few counting %d:\n%.2000s", lines, logged, (ranks-2)*steps, out)
	}
}

// syncLog is a log buffer written from several goroutines.
type syncLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncLog) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncLog) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A rank's durable source bounds its queue in bytes as well as in frames:
// with 600 KB frames waiting in the stream, a rank that does not read holds
// at most PendingBytes of them (the consumer waits; nothing is dropped),
// and reading it gets every frame in order.
func TestDurableSourceBoundsBytes(t *testing.T) {
	_, nc := startNATS(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const run, frames, size, bound = "bytes", 20, 600 << 10, 2 << 20
	cfg := ServeConfig{Conn: nc, Run: run, Ranks: []uint32{0}, PendingFrames: 256, PendingBytes: bound, Durable: &Durable{JS: js}}
	dn, err := openDurable(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := dn.openConsumer(ctx, cfg, 1); err != nil {
		t.Fatal(err)
	}
	subj := natsx.Subjects{Run: run}.Frames(0, 0)
	for i := range frames {
		data := bytes.Repeat([]byte{byte(i)}, size)
		if _, err := js.Publish(ctx, subj, data); err != nil {
			t.Fatal(err)
		}
	}
	src := newDurableSource(cfg.PendingFrames, bound, 0)
	cctx, stop := context.WithCancel(ctx)
	consumed := make(chan error, 1)
	go func() {
		consumed <- dn.consume(cctx, run, map[uint32]*durableSource{0: src}, 68, max(bound, int(nc.MaxPayload())))
	}()
	defer func() {
		stop()
		if err := <-consumed; err != nil {
			t.Error(err)
		}
	}()
	waitFor(t, "frames queued", func() bool { return len(src.ch) >= bound/size })
	// Without a byte bound the consumer would queue all the frames, and the
	// server would have delivered them: give it that chance.
	for range 40 {
		info, err := dn.cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumPending == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n, b := len(src.ch), src.queuedBytes(); n > bound/size || b > bound {
		t.Fatalf("%d frames, %d bytes queued; want at most %d bytes", n, b, bound)
	}
	for i := range frames {
		m, err := src.next(10 * time.Second)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if len(m.Data) != size || m.Data[0] != byte(i) {
			t.Fatalf("frame %d: %d bytes of %d, want %d of %d", i, len(m.Data), m.Data[0], size, i)
		}
		if b := src.queuedBytes(); b > bound {
			t.Fatalf("after frame %d, %d bytes queued; want at most %d", i, b, bound)
		}
	}
}
