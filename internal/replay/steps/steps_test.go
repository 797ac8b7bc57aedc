package steps

import (
	"strings"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/frame"
)

type ev struct {
	rank, tid, fid uint32
	exit           bool
	ts             uint64
}

func run(t *testing.T, cfg Config, evs []ev) ([]frame.Frame, Stats, error) {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var out []frame.Frame
	b := New(cfg, func(f *frame.Frame) error {
		c := *f
		c.Funcs = append([]frame.Name(nil), f.Funcs...)
		c.Events = append([]frame.FuncEvent(nil), f.Events...)
		out = append(out, c)
		return nil
	})
	b.FuncName(0, 1, "main")
	b.FuncName(0, 2, "work")
	b.FuncName(1, 1, "main")
	for _, e := range evs {
		var err error
		if e.exit {
			err = b.Exit(e.rank, e.tid, e.fid, e.ts)
		} else {
			err = b.Enter(e.rank, e.tid, e.fid, e.ts)
		}
		if err != nil {
			return out, b.Stats(), err
		}
	}
	err := b.Finish()
	return out, b.Stats(), err
}

func TestFixedSteps(t *testing.T) {
	evs := []ev{
		{0, 0, 1, false, 1000}, {0, 0, 2, false, 1100}, {0, 0, 2, true, 1200},
		{1, 0, 1, false, 1300},
		{0, 0, 2, false, 3500}, {0, 0, 2, true, 3600}, {0, 0, 1, true, 3700},
		{1, 0, 1, true, 1900},
	}
	frames, st, err := run(t, Config{Step: time.Millisecond}, evs)
	if err != nil {
		t.Fatal(err)
	}
	// Rank 0 spans steps 0..2 (origin 1000 µs, 1 ms steps); rank 1 only step
	// 0 but is padded to the same steps.
	steps := map[uint32][]uint64{}
	for _, f := range frames {
		steps[f.Rank] = append(steps[f.Rank], f.Step)
		for _, e := range f.Events {
			if e.TS < f.TStart || e.TS > f.TEnd {
				t.Errorf("rank %d step %d [%d,%d]: event at %d", f.Rank, f.Step, f.TStart, f.TEnd, e.TS)
			}
		}
	}
	if len(steps[0]) != 3 || len(steps[1]) != 3 {
		t.Errorf("steps per rank %v, want 3 each", steps)
	}
	if st.Executions != 4 || st.Threads != 2 || st.Frames != 6 {
		t.Errorf("stats %+v", st)
	}
	// "work" is named once, in rank 0's first frame.
	var named int
	for _, f := range frames {
		for _, n := range f.Funcs {
			if n.ID == 2 {
				named++
			}
		}
	}
	if named != 1 {
		t.Errorf("function 2 named %d times", named)
	}
}

func TestMarkerSteps(t *testing.T) {
	evs := []ev{
		{0, 0, 1, false, 10}, {0, 0, 2, false, 20}, {0, 0, 2, true, 30},
		{0, 0, 2, false, 40}, {0, 0, 2, true, 50},
		{0, 0, 2, false, 60}, {0, 0, 2, true, 70}, {0, 0, 1, true, 80},
	}
	frames, st, err := run(t, Config{Marker: "work"}, evs)
	if err != nil {
		t.Fatal(err)
	}
	// Step 0 holds what precedes the first marker, then one step per entry
	// of work.
	if len(frames) != 4 {
		t.Fatalf("%d frames, want 4", len(frames))
	}
	for i, f := range frames {
		if f.Step != uint64(i) {
			t.Errorf("frame %d has step %d", i, f.Step)
		}
		if i > 0 && (f.Events[0].FID != 2 || f.Events[0].Kind != frame.Entry || f.TStart != f.Events[0].TS) {
			t.Errorf("step %d does not start at the marker: %+v", i, f.Events[0])
		}
	}
	if st.Executions != 4 {
		t.Errorf("executions %d", st.Executions)
	}
}

func TestUnmatchedAndClamped(t *testing.T) {
	evs := []ev{
		{0, 0, 1, false, 100}, {0, 0, 2, true, 90}, // exit without entry, and time going back
		{0, 0, 1, true, 200},
	}
	frames, st, err := run(t, Config{}, evs)
	if err != nil {
		t.Fatal(err)
	}
	if st.Unmatched != 1 || st.Executions != 1 {
		t.Errorf("stats %+v, want 1 execution and 1 unmatched exit", st)
	}
	if e := frames[0].Events; e[1].TS != 100 {
		t.Errorf("a timestamp going back is clamped to the thread's last: %+v", e)
	}
}

func TestGapLimit(t *testing.T) {
	_, _, err := run(t, Config{Step: time.Millisecond, MaxGap: 10}, []ev{{0, 0, 1, false, 0}, {0, 0, 1, true, 1_000_000}})
	if err == nil || !strings.Contains(err.Error(), "jumps") {
		t.Errorf("err = %v, want a time jump error", err)
	}
}

func TestConfigValidate(t *testing.T) {
	c := Config{}
	if err := c.Validate(); err != nil || c.Step != DefaultStep || c.MaxGap != DefaultMaxGap {
		t.Errorf("defaults: %+v, %v", c, err)
	}
	c = Config{Step: time.Nanosecond}
	if err := c.Validate(); err == nil {
		t.Error("a step under a microsecond is accepted")
	}
}
