package instrument

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/mpitest"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
)

// rawFrames keeps every frame of rank 0 of a run, in arrival order, until
// the end of its stream.
type rawFrames struct {
	mu     sync.Mutex
	frames []*frame.Frame
	bad    []error
	eos    chan struct{}
	// tenth is closed when the 10th frame has arrived
	tenth chan struct{}
}

// subscribeFrames subscribes to rank 0's frames of run until the test ends;
// safe to call from any goroutine.
func subscribeFrames(t *testing.T, nc *nats.Conn, run string) (*rawFrames, error) {
	r := &rawFrames{eos: make(chan struct{}), tenth: make(chan struct{})}
	sub, err := nc.Subscribe(natsx.Subjects{Run: run}.Frames(0, 0), func(m *nats.Msg) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if m.Header.Get("Kipimo-End-Of-Stream") != "" {
			close(r.eos)
			return
		}
		f := &frame.Frame{}
		if n, err := frame.DecodeBinary(m.Data, f); err != nil || n != len(m.Data) {
			r.bad = append(r.bad, fmt.Errorf("frame: %d of %d bytes: %v", n, len(m.Data), err))
			return
		}
		r.frames = append(r.frames, f)
		if len(r.frames) == 10 {
			close(r.tenth)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe to %s's frames: %w", run, err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return nil, err
	}
	if err := nc.Flush(); err != nil {
		return nil, fmt.Errorf("subscribe to %s's frames: %w", run, err)
	}
	return r, nil
}

// dictEntries is a stream's dictionary: "func <id>", "counter <id>",
// "metadata <tid> <key>" to the name or value.
type dictEntries map[string]string

func (d dictEntries) add(f *frame.Frame) {
	for _, n := range f.Funcs {
		d[fmt.Sprint("func ", n.ID)] = n.Name
	}
	for _, n := range f.Counters {
		d[fmt.Sprint("counter ", n.ID)] = n.Name
	}
	for _, m := range f.Metadata {
		d[fmt.Sprint("metadata ", m.Tid, " ", m.Key)] = m.Value
	}
}

// A consumer that starts at any frame (the 10th, or any other with n frames
// after it) has every function, counter and metadata name the library has
// sent so far within n frames: KIPIMO_NAMES_EVERY, 16 by default.
func TestLateConsumerLearnsEveryName(t *testing.T) {
	lib := library(t)
	prog := compileProgram(t, lib, "names.c", false)
	const steps = 90
	tests := []struct {
		name  string
		every int // Env.NamesEvery
		n     int // frames within which every name arrives
		late  bool
	}{
		{"default interval", 0, 16, false},
		{"every 5 frames", 5, 5, false},
		{"never re-sent", -1, 16, true},
	}
	bytesPerFrame := map[string]float64{}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ns := startNATS(t)
			nc := connect(t, ns)
			run := fmt.Sprintf("names%d", tc.every+1)
			got, err := subscribeFrames(t, nc, run)
			if err != nil {
				t.Fatal(err)
			}
			// A second consumer subscribes once ten frames have gone by.
			nc2 := connect(t, ns)
			type subscribed struct {
				r   *rawFrames
				err error
			}
			lateSub := make(chan subscribed, 1)
			go func() {
				select {
				case <-got.tenth:
					r, err := subscribeFrames(t, nc2, run)
					lateSub <- subscribed{r, err}
				case <-time.After(30 * time.Second):
					lateSub <- subscribed{err: fmt.Errorf("ten frames did not arrive within 30 s")}
				}
			}()
			status := t.TempDir()
			env := lib.Environ(Env{NATSURL: ns.ClientURL(), Run: run, Period: time.Second, StatusDir: status, NamesEvery: tc.every}, os.Environ())
			if out, code := runProgram(t, env, prog, fmt.Sprint(steps)); code != 0 || out != fmt.Sprintf("names done %d\n", steps) {
				t.Fatalf("program: status %d, output %q", code, out)
			}
			select {
			case <-got.eos:
			case <-time.After(20 * time.Second):
				t.Fatal("the stream did not end within 20 s")
			}
			got.mu.Lock()
			defer got.mu.Unlock()
			if len(got.bad) > 0 {
				t.Fatal(got.bad)
			}
			frames := got.frames
			if len(frames) < 3*tc.n {
				t.Fatalf("%d frames; the test needs at least %d", len(frames), 3*tc.n)
			}
			// Every name the program registers reached the consumer.
			all := dictEntries{}
			for _, f := range frames {
				all.add(f)
			}
			byName := map[string]bool{}
			for _, v := range all {
				byName[v] = true
			}
			want := []string{"step", "early_0", "early_4", "progress", "names-test", "on"}
			for s := 0; s < steps; s += 10 {
				want = append(want, fmt.Sprint("late_", s/10))
			}
			for s := 0; s < steps; s += 20 {
				want = append(want, fmt.Sprint("ctr_", s/20))
			}
			for _, w := range want {
				if !byName[w] {
					t.Errorf("name or value %q never sent", w)
				}
			}
			// The consumer that subscribed after frame 10.
			ls := <-lateSub
			if ls.err != nil {
				t.Fatal(ls.err)
			}
			lateGot := ls.r
			select {
			case <-lateGot.eos:
			case <-time.After(20 * time.Second):
				t.Fatal("the late consumer did not see the stream end within 20 s")
			}
			lateGot.mu.Lock()
			lf := lateGot.frames
			lateGot.mu.Unlock()
			if len(lf) < tc.n {
				t.Fatalf("the late consumer got %d frames; the test needs %d", len(lf), tc.n)
			}
			k := slices.IndexFunc(frames, func(f *frame.Frame) bool { return f.Step == lf[0].Step })
			if k < 10 || frames[len(frames)-1].Step != lf[len(lf)-1].Step {
				t.Fatalf("the late consumer got io_steps %d..%d, the first %d..%d", lf[0].Step, lf[len(lf)-1].Step, frames[0].Step, frames[len(frames)-1].Step)
			}
			if k+tc.n <= len(frames) {
				sent, have := dictEntries{}, dictEntries{}
				for _, f := range frames[:k+tc.n] {
					sent.add(f)
				}
				for _, f := range lf[:tc.n] {
					have.add(f)
				}
				var lost []string
				for key := range sent {
					if _, ok := have[key]; !ok {
						lost = append(lost, key)
					}
				}
				if !tc.late && len(lost) > 0 {
					t.Errorf("the consumer that started at frame %d lacks %d names after %d frames: %v", k, len(lost), tc.n, lost)
				}
				if tc.late && len(lost) == 0 {
					t.Errorf("without re-sends the consumer that started at frame %d lacks no name", k)
				}
			}
			// A consumer starting at any frame k.
			var missing, wrong int
			example := ""
			for k := 1; k+tc.n <= len(frames); k++ {
				sent, have := dictEntries{}, dictEntries{}
				for _, f := range frames[:k+tc.n] {
					sent.add(f)
				}
				for _, f := range frames[k : k+tc.n] {
					have.add(f)
				}
				for key, v := range sent {
					h, ok := have[key]
					if !ok {
						missing++
						if example == "" {
							example = fmt.Sprintf("from frame %d: %s (%q) not received by frame %d", k, key, v, k+tc.n-1)
						}
					} else if h != v {
						wrong++
					}
				}
			}
			if wrong > 0 {
				t.Errorf("%d entries sent again with another name or value", wrong)
			}
			if tc.late && missing == 0 {
				t.Errorf("without re-sends a late consumer missed no name: the program does not test the re-send")
			}
			if !tc.late && missing > 0 {
				t.Errorf("%d names missed by late consumers; e.g. %s", missing, example)
			}
			st, err := ReadStatus(status)
			if err != nil || len(st) != 1 {
				t.Fatalf("status: %v %v", st, err)
			}
			if st[0].FramesDropped != 0 || st[0].FramesSent != uint64(len(frames)) {
				t.Errorf("status %+v: want %d frames sent, none dropped", st[0], len(frames))
			}
			bytesPerFrame[tc.name] = float64(st[0].BytesSent) / float64(st[0].FramesSent)
		})
	}
	t.Logf("bytes per frame sent: %v", bytesPerFrame)
}

// BenchmarkLAMMPSNamesBytes reports what the dictionary costs on the wire
// for LAMMPS (Debian's lmp, 2 ranks, its MPI calls only), re-sent every 16
// frames (the default) and never, at a 100 ms period: B/record is the bytes
// of function, counter and metadata entries per frame received (the rest of
// a frame does not depend on the setting; the whole frame's mean is
// logged). The re-send adds about the dictionary's size / 16 per frame
// whatever the period; a longer period only makes frames larger. Run with
// -benchtime 1x.
func BenchmarkLAMMPSNamesBytes(b *testing.B) {
	lmp := requireLAMMPS(b)
	lib := library(b)
	input, err := filepath.Abs(filepath.Join("testdata", "lj.in"))
	if err != nil {
		b.Fatal(err)
	}
	ns := startNATS(b)
	nc := connect(b, ns)
	base := mpitest.Env(os.Environ())
	runs := 0
	for _, period := range []time.Duration{100 * time.Millisecond} {
		for _, every := range []int{-1, 16} {
			b.Run(fmt.Sprintf("period=%s/every=%d", period, every), func(b *testing.B) {
				var dict, total, frames int
				for b.Loop() {
					runs++
					run := fmt.Sprint("lmpnames", runs)
					var mu sync.Mutex
					dict, total, frames = 0, 0, 0
					sub, err := nc.Subscribe(natsx.Subjects{Run: run}.AllFrames(), func(m *nats.Msg) {
						var f frame.Frame
						if len(m.Data) == 0 {
							return
						}
						if _, err := frame.DecodeBinary(m.Data, &f); err != nil {
							b.Errorf("frame: %v", err)
							return
						}
						bare := f
						bare.Funcs, bare.Counters, bare.Metadata = nil, nil, nil
						mu.Lock()
						dict += len(m.Data) - len(frame.AppendBinary(nil, &bare))
						total += len(m.Data)
						frames++
						mu.Unlock()
					})
					if err != nil {
						b.Fatal(err)
					}
					if err := sub.SetPendingLimits(-1, -1); err != nil {
						b.Fatal(err)
					}
					env := lib.Environ(Env{NATSURL: ns.ClientURL(), Run: run, Period: period, NamesEvery: every}, base)
					if _, code := runProgram(b, env, "mpirun", "-np", "2", lmp, "-in", input, "-log", "none", "-var", "steps", "3000"); code != 0 {
						b.Fatalf("lmp: status %d", code)
					}
					if err := nc.Flush(); err != nil {
						b.Fatal(err)
					}
					time.Sleep(200 * time.Millisecond) // the last frames' handlers
					if err := sub.Unsubscribe(); err != nil {
						b.Fatal(err)
					}
				}
				mu := float64(frames)
				b.ReportMetric(float64(dict)/mu, "B/record")
				b.ReportMetric(0, "ns/op")
				b.Logf("%d frames, %.0f B per frame, %.1f of them the dictionary's", frames, float64(total)/mu, float64(dict)/mu)
			})
		}
	}
}
