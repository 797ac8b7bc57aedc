package adnode

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

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
	if err := serveRank(ctx, d, src, make(chan struct{}), time.Second, nil); err != nil {
		t.Fatal(err)
	}
	st := d.Stats()
	if st.DroppedFrames != 3 || st.BadFrames != 0 || st.MissingSteps != 3 || st.Frames != 2 {
		t.Errorf("dropped %d bad %d missing %d processed %d; want 3 0 3 2", st.DroppedFrames, st.BadFrames, st.MissingSteps, st.Frames)
	}
}

// Discovery starts detectors for at most MaxRanks ranks; frames of further
// ranks are dropped and counted, and the served ranks are unharmed.
func TestDiscoveryBoundsRanks(t *testing.T) {
	_, nc := startNATS(t)
	const run = "bounded"
	subj := natsx.Subjects{Run: run}
	coll := NewCollector(8, nil)
	end := serveDiscovering(t, nc, ServeConfig{Run: run, MaxRanks: 2, Collector: coll, Detector: ad.Config{Sink: &MemorySink{}}})
	const ranks, steps = 50, 3
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
}
