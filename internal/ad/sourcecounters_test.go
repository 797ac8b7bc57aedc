package ad

import (
	"context"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// What the event library summarised goes into the profile under its path,
// out of its caller's exclusive time; what it dropped is counted; neither
// is attached to an execution nor sent to the pserver as a counter.
func TestSourceSummariesAndDrops(t *testing.T) {
	sy := &recordingSyncer{ps: newFakePServer()}
	d, err := New(Config{Syncer: sy})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	f := &frame.Frame{
		TStart: 0, TEnd: 1000,
		Funcs: []frame.Name{{ID: 1, Name: "main"}, {ID: 2, Name: "poll"}},
		Counters: []frame.Name{
			{ID: 1, Name: summaryCallsPrefix + "main => poll"},
			{ID: 2, Name: summaryTimePrefix + "main => poll"},
			{ID: 3, Name: droppedCallsPrefix + "work"},
			{ID: 4, Name: summaryMinPrefix + "main => poll"},
			{ID: 5, Name: "PAPI_TOT_CYC"},
		},
		Events: []frame.FuncEvent{en(0, 1, 0), en(0, 2, 10), ex(0, 2, 12), ex(0, 1, 1000)},
		CounterEvents: []frame.CounterEvent{
			{Tid: 0, CID: 5, Value: 77, TS: 11},
			{Tid: 0, CID: 1, Value: 500, TS: 1000},
			{Tid: 0, CID: 2, Value: 400_000, TS: 1000},
			{Tid: 0, CID: 3, Value: 3, TS: 1000},
			{Tid: 0, CID: 4, Value: 700, TS: 1000},
		},
	}
	if err := d.Process(ctx, f); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(ctx); err != nil {
		t.Fatal(err)
	}
	st := d.Stats()
	if st.SummarisedCalls != 500 || st.SourceDroppedCalls != 3 {
		t.Errorf("summarised %d, dropped %d; want 500, 3", st.SummarisedCalls, st.SourceDroppedCalls)
	}
	profs := d.Profiles(true)
	if len(profs) != 1 {
		t.Fatalf("%d profiles", len(profs))
	}
	timers := map[string]provenance.TimerProfile{}
	for _, tm := range profs[0].Timers {
		timers[tm.Name] = tm
	}
	for name, want := range map[string]provenance.TimerProfile{
		"poll":         {Calls: 501, Inclusive: 402, Exclusive: 402},
		"main => poll": {Calls: 501, Inclusive: 402, Exclusive: 402},
		"main":         {Calls: 1, Subrs: 501, Inclusive: 1000, Exclusive: 598},
	} {
		got := timers[name]
		if got.Calls != want.Calls || got.Subrs != want.Subrs || got.Inclusive != want.Inclusive || got.Exclusive != want.Exclusive {
			t.Errorf("%s: calls %d subrs %d incl %v excl %v; want %d %d %v %v", name, got.Calls, got.Subrs, got.Inclusive, got.Exclusive,
				want.Calls, want.Subrs, want.Inclusive, want.Exclusive)
		}
	}
	var ctrs []string
	for _, c := range profs[0].Counters {
		ctrs = append(ctrs, c.Name)
	}
	if strings.Join(ctrs, ",") != droppedCallsPrefix+"work,PAPI_TOT_CYC" {
		t.Errorf("profile counters %q; want the dropped calls and PAPI_TOT_CYC only", ctrs)
	}
	for _, req := range sy.reqs {
		for _, c := range req.Counters {
			if strings.HasPrefix(c.Name, "Kipimo ") {
				t.Errorf("reserved counter %q sent to the pserver", c.Name)
			}
		}
	}
}

// Each step summary carries what the event library reported in that step
// (since the previous summary): summarised calls, calls dropped whole and
// comm and counter events dropped, so that the pserver's totals are exact.
func TestSourceCountsInStepSummaries(t *testing.T) {
	type step struct{ summarised, droppedCalls, droppedComms, droppedCtrs uint64 }
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"none", []step{{}, {}}},
		{"one step", []step{{0, 7, 0, 0}}},
		{"every kind over steps", []step{{500, 3, 2, 1}, {0, 0, 0, 0}, {40, 9, 0, 5}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sy := &recordingSyncer{ps: newFakePServer()}
			d, err := New(Config{Syncer: sy})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			for i, s := range tc.steps {
				ts := uint64(i) * 1000
				f := &frame.Frame{
					Step: uint64(i), TStart: ts, TEnd: ts + 1000,
					Funcs: []frame.Name{{ID: 1, Name: "main"}},
					Counters: []frame.Name{
						{ID: 1, Name: summaryCallsPrefix + "main => poll"},
						{ID: 2, Name: droppedCallsPrefix + "work"},
						{ID: 3, Name: droppedComms},
						{ID: 4, Name: droppedCounters},
					},
					Events: []frame.FuncEvent{en(0, 1, ts), ex(0, 1, ts+999)},
				}
				for cid, v := range []uint64{s.summarised, s.droppedCalls, s.droppedComms, s.droppedCtrs} {
					if v > 0 {
						f.CounterEvents = append(f.CounterEvents, frame.CounterEvent{Tid: 0, CID: uint32(cid + 1), Value: v, TS: ts + 999})
					}
				}
				if err := d.Process(ctx, f); err != nil {
					t.Fatal(err)
				}
			}
			if err := d.Close(ctx); err != nil {
				t.Fatal(err)
			}
			got := map[uint64]step{}
			for _, req := range sy.reqs {
				for _, s := range req.Steps {
					g := got[s.Step]
					g.summarised += s.SummarisedCalls
					g.droppedCalls += s.DroppedCalls
					g.droppedComms += s.DroppedEvents
					got[s.Step] = g
				}
			}
			for i, s := range tc.steps {
				want := step{s.summarised, s.droppedCalls, s.droppedComms + s.droppedCtrs, 0}
				if g := got[uint64(i)]; g != want {
					t.Errorf("io_step %d: summaries carry %d summarised, %d calls and %d events dropped; want %d, %d, %d",
						i, g.summarised, g.droppedCalls, g.droppedComms, want.summarised, want.droppedCalls, want.droppedComms)
				}
			}
		})
	}
}
