package ad

import (
	"context"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/frame"
)

// A flag whose io_step the rank spent preempted says so; a flag among a
// function's first calls on its thread says warm-up; an ordinary flag says
// neither.
func TestExplainCauses(t *testing.T) {
	const (
		steps      = 30
		calls      = 200
		stall      = 5000
		preempted  = 20 // the step whose context switches jump
		ordinary   = 25 // a stall in an ordinary step
		usualIvcsw = 8
	)
	sink := &MemorySink{}
	d, err := New(Config{SettleCount: 100, Sink: sink})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for s := uint64(0); s < steps; s++ {
		f := &frame.Frame{Step: s, TStart: s * 100_000, TEnd: (s + 1) * 100_000}
		if s == 0 {
			f.Funcs = []frame.Name{{ID: 1, Name: "work"}}
			f.Counters = []frame.Name{{ID: 1, Name: preemptCounter}, {ID: 2, Name: "Voluntary Context Switches"}}
		}
		ts := f.TStart + 1
		for i := uint64(0); i < calls; i++ {
			rt := 90 + (i*7+s*13)%21 // 90..110 µs
			switch {
			case s == 0 && i == 0, (s == preempted || s == ordinary) && i == calls-1:
				rt = stall
			}
			f.Events = append(f.Events, en(0, 1, ts), ex(0, 1, ts+rt))
			ts += rt + 50
		}
		ivcsw := uint64(usualIvcsw)
		if s == preempted {
			ivcsw = 412
		}
		f.CounterEvents = []frame.CounterEvent{
			{Tid: 0, CID: 1, Value: ivcsw, TS: f.TEnd},
			{Tid: 0, CID: 2, Value: 5000, TS: f.TEnd},
		}
		if err := d.Process(ctx, f); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Close(ctx); err != nil {
		t.Fatal(err)
	}
	want := map[uint64]struct{ has, lacks []string }{
		0:         {[]string{"; among the first 10 calls of work on this thread (warm-up)"}, []string{"preempted"}},
		preempted: {[]string{"; the rank was preempted 412 times in this io_step, 8 usually"}, []string{"warm-up"}},
		ordinary:  {nil, []string{"preempted", "warm-up"}},
	}
	seen := map[uint64]bool{}
	for _, r := range sink.All().Anomalies {
		if r.Explanation == nil {
			t.Fatalf("anomaly of step %d without explanation", r.IOStep)
		}
		w, ok := want[r.IOStep]
		if !ok {
			t.Errorf("unexpected anomaly in step %d: %s", r.IOStep, r.Explanation.Text)
			continue
		}
		seen[r.IOStep] = true
		for _, s := range w.has {
			if !strings.Contains(r.Explanation.Text, s) {
				t.Errorf("step %d: %q lacks %q", r.IOStep, r.Explanation.Text, s)
			}
		}
		for _, s := range w.lacks {
			if strings.Contains(r.Explanation.Text, s) {
				t.Errorf("step %d: %q says %q", r.IOStep, r.Explanation.Text, s)
			}
		}
	}
	for s := range want {
		if !seen[s] {
			t.Errorf("the stall of step %d was not flagged", s)
		}
	}
}

// A count is clearly above usual only when it is both several times the
// usual count and well beyond it.
func TestPreemptionClearlyAbove(t *testing.T) {
	for _, tc := range []struct {
		value float64
		steps int
		usual float64
		want  bool
	}{
		{412, 1, 8, true},
		{30, 1, 8, false},  // 20 more but under 4×
		{30, 1, 0, true},   // from none
		{10, 1, 0, false},  // too few to matter
		{200, 2, 20, true}, // over two steps
		{200, 3, 20, false},
	} {
		if got := clearlyAbove(tc.value, tc.steps, tc.usual); got != tc.want {
			t.Errorf("clearlyAbove(%v, %d, %v) = %v, want %v", tc.value, tc.steps, tc.usual, got, tc.want)
		}
	}
}
