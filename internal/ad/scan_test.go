package ad

import (
	"context"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/frame"
)

// check's single pass over a frame's events says whether every event's
// thread is known (and then counts each thread's entries for reserve) and
// whether every function id was named before the frame; a frame it cannot
// vouch for is read again by the stages after it, and gives the same
// executions either way.
func TestCheckScan(t *testing.T) {
	names := []frame.Name{{ID: 1, Name: "a"}, {ID: 2, Name: "b"}}
	tests := []struct {
		name    string
		funcs   []frame.Name
		events  []frame.FuncEvent
		want    frameScan
		entries map[uint32]int // entries counted per thread, when counted
	}{
		{"the first frame: threads and names new", names,
			[]frame.FuncEvent{en(0, 1, 10), en(1, 2, 11), ex(0, 1, 20), ex(1, 2, 21)}, frameScan{}, nil},
		{"known threads and names", nil,
			[]frame.FuncEvent{en(0, 1, 30), en(0, 2, 31), en(1, 2, 32), ex(0, 2, 40), ex(0, 1, 41), ex(1, 2, 42)},
			frameScan{counted: true, named: true}, map[uint32]int{0: 2, 1: 1}},
		{"a new thread", nil,
			[]frame.FuncEvent{en(0, 1, 50), en(7, 2, 51), ex(0, 1, 60), ex(7, 2, 61)}, frameScan{named: true}, nil},
		{"a function named in the frame itself", []frame.Name{{ID: 3, Name: "c"}},
			[]frame.FuncEvent{en(0, 3, 70), ex(0, 3, 80), en(1, 1, 81), ex(1, 1, 90)},
			frameScan{counted: true}, map[uint32]int{0: 1, 1: 1, 7: 0}},
	}
	d, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	var executions uint64
	for step, tc := range tests {
		f := &frame.Frame{Step: uint64(step), Funcs: tc.funcs, Events: tc.events}
		f.TStart, f.TEnd = tc.events[0].TS, tc.events[len(tc.events)-1].TS
		got, err := d.check(f)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got != tc.want {
			t.Errorf("%s: scan %+v, want %+v", tc.name, got, tc.want)
		}
		for tid, n := range tc.entries {
			if th := d.stacks.lookup(tid); th == nil || th.entries != n {
				t.Errorf("%s: thread %d entries counted wrong (want %d)", tc.name, tid, n)
			}
		}
		if err := d.Process(context.Background(), f); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		for _, ev := range tc.events {
			if ev.Kind == frame.Exit {
				executions++
			}
		}
		if got := d.Stats().Executions; got != executions {
			t.Errorf("%s: %d executions completed, want %d", tc.name, got, executions)
		}
	}
}
