package publish

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/replay"
	"github.com/kipimo-hpc/kipimo/internal/replay/steps"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

// kanika is a 12-rank TAU trace from the field, read by the tautrace tests.
const kanika = "../tautrace/testdata/kanika_phase1"

func kanikaFiles(t testing.TB) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(kanika, "tautrace.*.0.0.trc"))
	if err != nil || len(files) == 0 {
		t.Fatalf("kanika trace: %v (%d files)", err, len(files))
	}
	return files
}

// sourceFrames reads every frame of a source, by rank, in order.
func sourceFrames(t testing.TB, open func() replay.Source) map[uint32][]*frame.Frame {
	t.Helper()
	out := map[uint32][]*frame.Frame{}
	_, err := open().Frames(context.Background(), func(f *frame.Frame) error {
		b := frame.AppendBinary(nil, f)
		var c frame.Frame
		if _, err := frame.DecodeBinary(b, &c); err != nil {
			return err
		}
		out[f.Rank] = append(out[f.Rank], &c)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// nameSet is the names of a stream's dictionary entries.
type nameSet map[string]string

func (s nameSet) add(f *frame.Frame) {
	for _, n := range f.Funcs {
		s[fmt.Sprint("func ", n.ID)] = n.Name
	}
	for _, n := range f.Counters {
		s[fmt.Sprint("counter ", n.ID)] = n.Name
	}
	for _, m := range f.Metadata {
		s[fmt.Sprint("metadata ", m.Tid, " ", m.Key)] = m.Value
	}
}

// lateMisses counts, for every rank and every frame k a subscriber could
// start at with at least every frames left, the entries the source declared
// in frames 0..k+every-1 that the subscriber has not received by frame
// k+every-1, and the entries it received with another name or value than
// the source's.
func lateMisses(src map[uint32][]*frame.Frame, got map[uint32][]*frame.Frame, every int) (starts, missing, wrong int, example string) {
	for r, frames := range src {
		for k := 1; k+every <= len(frames); k++ {
			starts++
			end := k + every
			want, have := nameSet{}, nameSet{}
			for _, f := range frames[:end] {
				want.add(f)
			}
			for _, f := range got[r][k:end] {
				have.add(f)
			}
			for key, v := range want {
				h, ok := have[key]
				switch {
				case !ok:
					missing++
					if example == "" {
						example = fmt.Sprintf("rank %d from frame %d: %s (%q) not received by frame %d", r, k, key, v, end-1)
					}
				case h != v:
					wrong++
				}
			}
		}
	}
	return starts, missing, wrong, example
}

// A subscriber that starts at any frame of a rank receives every name the
// rank's frames declared so far within NamesEvery frames, with the names
// and values the source gave them; the events are the source's.
func TestLateSubscriberLearnsEveryName(t *testing.T) {
	nc := startServer(t)
	genDir := t.TempDir()
	gen := workload.DefaultConfig()
	gen.Ranks, gen.Steps, gen.EventsPerStep, gen.GPU = 2, 60, 2000, true
	writeGenerated(t, genDir, gen)
	openGen := func() replay.Source {
		src, err := replay.Open(replay.FormatFrames, []string{genDir}, steps.Config{})
		if err != nil {
			t.Fatal(err)
		}
		return src
	}
	openKanika := func() replay.Source {
		src, err := replay.Open(replay.FormatTAU, kanikaFiles(t), steps.Config{Step: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return src
	}
	tests := []struct {
		name  string
		open  func() replay.Source
		every int // Pace.NamesEvery
		n     int // frames within which every name arrives
		late  bool
	}{
		{"generated, default interval", openGen, 0, DefaultNamesEvery, false},
		{"generated, every 4 frames", openGen, 4, 4, false},
		{"generated, never re-sent", openGen, -1, DefaultNamesEvery, true},
		{"TAU trace of 12 ranks, default interval", openKanika, 0, DefaultNamesEvery, false},
		{"TAU trace of 12 ranks, never re-sent", openKanika, -1, DefaultNamesEvery, true},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src := sourceFrames(t, tc.open)
			total := 0
			for _, fs := range src {
				total += len(fs)
			}
			run := fmt.Sprint("names", i)
			wait := receive(t, nc, run)
			c, _, err := Frames(context.Background(), nc, natsx.Subjects{Run: run}, tc.open(), Pace{NamesEvery: tc.every})
			if err != nil {
				t.Fatal(err)
			}
			if c.Frames != total {
				t.Fatalf("published %d frames, the source has %d", c.Frames, total)
			}
			raw := wait(total)
			got := map[uint32][]*frame.Frame{}
			for r, msgs := range raw {
				for j, b := range msgs {
					var f frame.Frame
					if _, err := frame.DecodeBinary(b, &f); err != nil {
						t.Fatal(err)
					}
					s := src[r][j]
					if f.Step != s.Step || !slices.Equal(f.Events, s.Events) || !slices.Equal(f.CounterEvents, s.CounterEvents) || !slices.Equal(f.Comms, s.Comms) {
						t.Fatalf("rank %d frame %d: events differ from the source's", r, j)
					}
					got[r] = append(got[r], &f)
				}
			}
			starts, missing, wrong, example := lateMisses(src, got, tc.n)
			if starts < 10*len(src) {
				t.Fatalf("%d frames in %d ranks: only %d starting points with %d frames after them", total, len(src), starts, tc.n)
			}
			if wrong > 0 {
				t.Errorf("%d entries received with another name or value than the source's", wrong)
			}
			if tc.late && missing == 0 {
				t.Errorf("without re-sending, a late subscriber missed no name: the stream does not test the re-send")
			}
			if !tc.late && missing > 0 {
				t.Errorf("%d names missed by late subscribers; e.g. %s", missing, example)
			}
		})
	}
}

// The full dictionary goes with every rank's next frame after the
// connection reconnected, whatever the interval.
func TestNamesAfterReconnect(t *testing.T) {
	d := newDictionary()
	f0 := &frame.Frame{Step: 0, Funcs: []frame.Name{{ID: 1, Name: "a"}}, Counters: []frame.Name{{ID: 2, Name: "c"}},
		Metadata: []frame.Meta{{Tid: 0, Key: "Hostname", Value: "n1"}}}
	f1 := &frame.Frame{Step: 1, Funcs: []frame.Name{{ID: 3, Name: "b"}}}
	f2 := &frame.Frame{Step: 2}
	var dec frame.Frame
	decode := func(b []byte) *frame.Frame {
		t.Helper()
		if _, err := frame.DecodeBinary(b, &dec); err != nil {
			t.Fatal(err)
		}
		return &dec
	}
	for _, f := range []*frame.Frame{f0, f1} {
		if g := decode(d.encode(nil, f, -1, 1<<20)); len(g.Funcs) != len(f.Funcs) || len(g.Metadata) != len(f.Metadata) {
			t.Fatalf("frame %d sent with %d names and %d metadata entries, want its own %d and %d", f.Step, len(g.Funcs), len(g.Metadata), len(f.Funcs), len(f.Metadata))
		}
	}
	d.resend = true
	g := decode(d.encode(nil, f2, -1, 1<<20))
	if !slices.Equal(g.Funcs, []frame.Name{{ID: 1, Name: "a"}, {ID: 3, Name: "b"}}) || !slices.Equal(g.Counters, f0.Counters) || !slices.Equal(g.Metadata, f0.Metadata) {
		t.Fatalf("frame after a reconnect: funcs %v counters %v metadata %v, want every entry so far", g.Funcs, g.Counters, g.Metadata)
	}
	if len(f2.Funcs) != 0 {
		t.Errorf("the caller's frame was changed: %v", f2.Funcs)
	}
	// a dictionary that would pass the server's max payload waits for the
	// next frame
	d.resend = true
	small := len(frame.AppendBinary(nil, f2))
	if g := decode(d.encode(nil, f2, -1, int64(small))); len(g.Funcs) != 0 || !d.resend {
		t.Errorf("oversize dictionary: sent %d names, resend pending %v", len(g.Funcs), d.resend)
	}
}

// BenchmarkNamesResend reports the bytes per frame published with and
// without the periodic re-send of the dictionary, for a 12-rank TAU trace
// from the field and a generated workload.
func BenchmarkNamesResend(b *testing.B) {
	genDir := b.TempDir()
	gen := workload.DefaultConfig()
	gen.Ranks, gen.Steps, gen.EventsPerStep = 4, 64, 20000
	writeGenerated(b, genDir, gen)
	sources := []struct {
		name string
		open func() replay.Source
	}{
		{"tau-kanika-20ms", func() replay.Source {
			src, err := replay.Open(replay.FormatTAU, kanikaFiles(b), steps.Config{Step: 20 * time.Millisecond})
			if err != nil {
				b.Fatal(err)
			}
			return src
		}},
		{"generated", func() replay.Source {
			src, err := replay.Open(replay.FormatFrames, []string{genDir}, steps.Config{})
			if err != nil {
				b.Fatal(err)
			}
			return src
		}},
	}
	for _, s := range sources {
		frames := sourceFrames(b, s.open)
		for _, every := range []int{-1, DefaultNamesEvery} {
			b.Run(fmt.Sprintf("%s/every=%d", s.name, every), func(b *testing.B) {
				var bytes, n int
				var buf []byte
				for b.Loop() {
					bytes, n = 0, 0
					for _, fs := range frames {
						d := newDictionary()
						for _, f := range fs {
							buf = d.encode(buf[:0], f, every, 1<<30)
							bytes += len(buf)
							n++
						}
					}
				}
				b.ReportMetric(float64(bytes)/float64(n), "B/record")
				b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "records/s")
			})
		}
	}
}
