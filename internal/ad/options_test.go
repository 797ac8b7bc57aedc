package ad

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/frame"
)

// optionFrame: fid 3 ("f") is called 200 times from "a" (fid 1) taking
// 100±1µs and 200 times from "b" (fid 2) taking 1000±10µs; then once from
// "a" taking slowA µs and once from "a" taking fast µs.
func optionFrame(slowA, fast uint64) *frame.Frame {
	f := &frame.Frame{Funcs: []frame.Name{{ID: 1, Name: "a"}, {ID: 2, Name: "b"}, {ID: 3, Name: "f"}}}
	ts := uint64(1)
	call := func(parent uint32, dur uint64) {
		f.Events = append(f.Events, en(0, parent, ts), en(0, 3, ts+1), ex(0, 3, ts+1+dur), ex(0, parent, ts+2+dur))
		ts += dur + 10
	}
	for i := 0; i < 200; i++ {
		call(1, 99+uint64(i%3))
		call(2, 990+uint64(i%21))
	}
	call(1, slowA)
	call(1, fast)
	return f
}

func TestDetectionOptions(t *testing.T) {
	tests := []struct {
		name      string
		cfg       Config
		slowA     uint64
		fast      uint64
		wantFlags []uint64 // exclusive runtimes of the flagged "f" calls
	}{
		{"per function: a slow call of one path hides in the other path", Config{Algorithm: SSTD}, 1000, 99, nil},
		{"per call path: the same call is anomalous for its path", Config{Algorithm: SSTD, ByCallPath: true}, 1000, 99, []uint64{1000}},
		{"two-sided flags a very fast call with Chimbuko's rules", Config{Algorithm: SSTD, ByCallPath: true, Sigma: 4, Chimbuko: true}, 100, 5, []uint64{5}},
		{"slow-only does not", Config{Algorithm: SSTD, ByCallPath: true, Sigma: 4, SlowOnly: true, Chimbuko: true}, 100, 5, nil},
		{"below the natural range is flagged too", Config{Algorithm: SSTD, ByCallPath: true, Sigma: 4}, 100, 5, []uint64{5}},
		{"slow-only with the natural range", Config{ByCallPath: true, SlowOnly: true}, 100, 5, nil},
		{"tail per call path", Config{ByCallPath: true}, 1000, 99, []uint64{1000}},
		{"tail per function: the slow path's calls are natural", Config{}, 1000, 99, nil},
		{"minimum runtime floor", Config{Algorithm: SSTD, ByCallPath: true, MinRuntime: 2000}, 1000, 99, nil},
		{"ignored function", Config{Algorithm: SSTD, ByCallPath: true, Ignore: []string{"f"}}, 1000, 99, nil},
		{"hbos isolation per call path", Config{Algorithm: HBOS, ByCallPath: true, Isolation: 3, MaxMass: 0.01}, 3000, 99, []uint64{3000}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sink := &MemorySink{}
			tc.cfg.Sink = sink
			d, err := New(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := d.Process(context.Background(), optionFrame(tc.slowA, tc.fast)); err != nil {
				t.Fatal(err)
			}
			if err := d.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			var got []uint64
			for _, a := range sink.All().Anomalies {
				if a.Func == "f" {
					got = append(got, a.RuntimeExclusive)
				}
			}
			if len(got) != len(tc.wantFlags) || (len(got) > 0 && got[0] != tc.wantFlags[0]) {
				t.Errorf("flagged %v, want %v", got, tc.wantFlags)
			}
		})
	}
}

// The "after" half of an exec_window is completed when those executions
// finish, even in a later step.
func TestWindowCompletedInLaterStep(t *testing.T) {
	sink := &MemorySink{}
	d, err := New(Config{Algorithm: SSTD, Sigma: 3, Window: 2, SettleCount: -1, Sink: sink})
	if err != nil {
		t.Fatal(err)
	}
	f0 := &frame.Frame{Step: 0}
	ts := slowTail(f0, 0, 1, 10, 40, 5000)
	// after the slow call: g enters and stays open into the next step
	f0.Events = append(f0.Events, en(0, 2, ts), en(0, 3, ts+1))
	nameAll(f0)
	if err := d.Process(context.Background(), f0); err != nil {
		t.Fatal(err)
	}
	if n := len(sink.All().Anomalies); n != 0 {
		t.Fatalf("%d anomaly records published before their window finished", n)
	}
	f1 := &frame.Frame{Step: 1, Events: []frame.FuncEvent{ex(0, 3, ts+7), ex(0, 2, ts+9)}}
	if err := d.Process(context.Background(), f1); err != nil {
		t.Fatal(err)
	}
	all := sink.All()
	if len(all.Anomalies) != 1 {
		t.Fatalf("anomalies %d, want 1", len(all.Anomalies))
	}
	w := all.Anomalies[0].EventWindow.ExecWindow
	if len(w) != 5 || w[3].FID != 2 || w[3].Exit != ts+9 || w[4].FID != 3 || w[4].Exit != ts+7 {
		t.Fatalf("exec window %+v", w)
	}
	if w[4].ParentEventID != w[3].EventID {
		t.Errorf("parent of the inner call %q, want %q", w[4].ParentEventID, w[3].EventID)
	}
	if all.Anomalies[0].IOStep != 0 {
		t.Errorf("io_step %d, want the step of detection 0", all.Anomalies[0].IOStep)
	}
}

// A value beyond a young model's natural range waits for the model to
// settle: a tail that shows itself later makes it natural, a real outlier
// stays one.
func TestSettle(t *testing.T) {
	call := func(f *frame.Frame, ts *uint64, fid uint32, dur uint64) {
		f.Events = append(f.Events, en(0, fid, *ts), ex(0, fid, *ts+dur))
		*ts += dur + 5
	}
	frames := func() []*frame.Frame {
		ts := uint64(1)
		f0 := &frame.Frame{Step: 0, Funcs: []frame.Name{{ID: 1, Name: "f"}}}
		for i := range 20 {
			call(f0, &ts, 1, 100+uint64(i%5))
		}
		call(f0, &ts, 1, 300)  // the tail, seen early
		call(f0, &ts, 1, 2000) // an outlier
		f1 := &frame.Frame{Step: 1}
		for i := range 200 {
			call(f1, &ts, 1, 100+uint64(i)) // the tail fills in up to 299
		}
		return []*frame.Frame{f0, f1}
	}
	for _, tc := range []struct {
		name   string
		settle float64
		want   map[uint64]uint64 // flagged runtime -> io_step of its record (the one it ran in)
	}{
		{"settling judges the early tail with the settled model", 100, map[uint64]uint64{2000: 0}},
		{"without settling the early tail is flagged", -1, map[uint64]uint64{300: 0, 2000: 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sink := &MemorySink{}
			d, err := New(Config{SettleCount: tc.settle, Sink: sink})
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range frames() {
				if err := d.Process(context.Background(), f); err != nil {
					t.Fatal(err)
				}
			}
			if err := d.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			got := map[uint64]uint64{}
			for _, a := range sink.All().Anomalies {
				got[a.RuntimeExclusive] = a.IOStep
				if tc.settle > 0 && a.LabelledIOStep != 1 {
					t.Errorf("%s labelled in io_step %d, want 1 (once the model settled)", a.EventID, a.LabelledIOStep)
				}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("flagged (runtime: step) %v, want %v", got, tc.want)
			}
		})
	}
}

// Frames that never reach the detector show as gaps in the rank's io_step
// sequence: counted, and carried in the step summary that follows them.
func TestMissingSteps(t *testing.T) {
	for _, tc := range []struct {
		name    string
		steps   []uint64
		missing uint64
	}{
		{"every step", []uint64{0, 1, 2, 3}, 0},
		{"one gap of two", []uint64{0, 1, 4}, 2},
		{"two gaps", []uint64{0, 2, 3, 7}, 4},
		{"a repeated step is no gap (and is dropped as stale)", []uint64{0, 1, 1, 2}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sy := &recordingSyncer{ps: newFakePServer()}
			d, err := New(Config{Syncer: sy})
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range tc.steps {
				f := &frame.Frame{Step: s, Funcs: []frame.Name{{ID: 1, Name: "f"}}, Events: []frame.FuncEvent{en(0, 1, s*100), ex(0, 1, s*100+10)}}
				if err := d.Process(context.Background(), f); err != nil && !errors.Is(err, ErrStaleFrame) {
					t.Fatal(err)
				}
			}
			if err := d.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			if got := d.Stats().MissingSteps; got != tc.missing {
				t.Errorf("MissingSteps = %d, want %d", got, tc.missing)
			}
			var inSummaries uint64
			for _, req := range sy.reqs {
				for _, st := range req.Steps {
					inSummaries += st.MissingSteps
				}
			}
			if inSummaries != tc.missing {
				t.Errorf("step summaries carry %d missing steps, want %d", inSummaries, tc.missing)
			}
		})
	}
}
