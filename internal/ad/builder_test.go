package ad

import (
	"context"
	"fmt"
	"reflect"
	"sort"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// ev builds a function event.
func en(tid, fid uint32, ts uint64) frame.FuncEvent {
	return frame.FuncEvent{Tid: tid, Kind: frame.Entry, FID: fid, TS: ts}
}

func ex(tid, fid uint32, ts uint64) frame.FuncEvent {
	return frame.FuncEvent{Tid: tid, Kind: frame.Exit, FID: fid, TS: ts}
}

// gotExec is the observable form of an execution.
type gotExec struct {
	TID         uint32
	FID         uint32
	Entry, Exit uint64
	Incl, Excl  uint64
	Parent      string // parent event id, "root" at the root
	Children    uint32
	EventID     string
	Repaired    bool
}

// executions lists every execution the detector still holds, by thread and
// entry order.
func executions(d *Detector) []gotExec {
	var out []gotExec
	ths := append([]*thread(nil), d.stacks.threads...)
	sort.Slice(ths, func(i, j int) bool { return ths[i].tid < ths[j].tid })
	for _, t := range ths {
		var seqs []uint64
		for seq := range t.detached {
			seqs = append(seqs, seq)
		}
		for i := range t.ring {
			seqs = append(seqs, t.base+uint64(i))
		}
		sort.Slice(seqs, func(i, j int) bool { return seqs[i] < seqs[j] })
		for _, s := range seqs {
			e := t.rec(s)
			g := gotExec{TID: t.tid, FID: e.fid, Entry: e.entry, Children: e.nchild,
				EventID: d.stacks.eventID(e.step, e.idx), Parent: "root", Repaired: e.flags&flagRepaired != 0}
			if e.flags&flagDone != 0 {
				g.Exit, g.Incl, g.Excl = e.exit, e.incl(), e.excl()
			}
			if e.parent != 0 {
				g.Parent = d.stacks.eventID(e.pstep, e.pidx)
			}
			out = append(out, g)
		}
	}
	return out
}

func deepStack(n int) ([]frame.FuncEvent, []gotExec) {
	var evs []frame.FuncEvent
	var want []gotExec
	for i := 0; i < n; i++ {
		evs = append(evs, en(0, uint32(i), uint64(100+i)))
	}
	for i := n - 1; i >= 0; i-- {
		evs = append(evs, ex(0, uint32(i), uint64(100+2*n-1-i)))
	}
	for i := 0; i < n; i++ {
		parent := "root"
		if i > 0 {
			parent = fmt.Sprintf("0:0:%d", i-1)
		}
		var children uint32
		excl := uint64(2)
		if i < n-1 {
			children = 1
		} else {
			excl = 1
		}
		entry, exit := uint64(100+i), uint64(100+2*n-1-i)
		want = append(want, gotExec{FID: uint32(i), Entry: entry, Exit: exit, Incl: exit - entry, Excl: excl,
			Parent: parent, Children: children, EventID: fmt.Sprintf("0:0:%d", i)})
	}
	return evs, want
}

func TestBuilder(t *testing.T) {
	deepEvents, deepWant := deepStack(200)
	tests := []struct {
		name  string
		steps [][]frame.FuncEvent
		close bool
		want  []gotExec
		stats Stats // only the builder's counts are compared
	}{
		{
			name: "nesting",
			steps: [][]frame.FuncEvent{{
				en(0, 1, 10), en(0, 2, 12), ex(0, 2, 20), en(0, 3, 25), en(0, 4, 26), ex(0, 4, 30), ex(0, 3, 40), ex(0, 1, 50),
			}},
			want: []gotExec{
				{FID: 1, Entry: 10, Exit: 50, Incl: 40, Excl: 40 - 8 - 15, Parent: "root", Children: 2, EventID: "0:0:0"},
				{FID: 2, Entry: 12, Exit: 20, Incl: 8, Excl: 8, Parent: "0:0:0", EventID: "0:0:1"},
				{FID: 3, Entry: 25, Exit: 40, Incl: 15, Excl: 11, Parent: "0:0:0", Children: 1, EventID: "0:0:3"},
				{FID: 4, Entry: 26, Exit: 30, Incl: 4, Excl: 4, Parent: "0:0:3", EventID: "0:0:4"},
			},
			stats: Stats{Executions: 4},
		},
		{
			name:  "deep stack without recursion",
			steps: [][]frame.FuncEvent{deepEvents},
			want:  deepWant,
			stats: Stats{Executions: 200},
		},
		{
			name: "threads are independent",
			steps: [][]frame.FuncEvent{{
				en(0, 1, 10), en(1, 1, 11), en(1, 2, 12), ex(0, 1, 13), ex(1, 2, 14), ex(1, 1, 15),
			}},
			want: []gotExec{
				{TID: 0, FID: 1, Entry: 10, Exit: 13, Incl: 3, Excl: 3, Parent: "root", EventID: "0:0:0"},
				{TID: 1, FID: 1, Entry: 11, Exit: 15, Incl: 4, Excl: 2, Parent: "root", Children: 1, EventID: "0:0:1"},
				{TID: 1, FID: 2, Entry: 12, Exit: 14, Incl: 2, Excl: 2, Parent: "0:0:1", EventID: "0:0:2"},
			},
			stats: Stats{Executions: 3},
		},
		{
			name: "executions spanning steps keep their entry's event id",
			steps: [][]frame.FuncEvent{
				{en(0, 1, 10), en(0, 2, 11)},
				{ex(0, 2, 30), en(0, 3, 31)},
				{ex(0, 3, 40), ex(0, 1, 50)},
			},
			want: []gotExec{
				{FID: 1, Entry: 10, Exit: 50, Incl: 40, Excl: 40 - 19 - 9, Parent: "root", Children: 2, EventID: "0:0:0"},
				{FID: 2, Entry: 11, Exit: 30, Incl: 19, Excl: 19, Parent: "0:0:0", EventID: "0:0:1"},
				{FID: 3, Entry: 31, Exit: 40, Incl: 9, Excl: 9, Parent: "0:0:0", EventID: "0:1:1"},
			},
			stats: Stats{Executions: 3},
		},
		{
			name: "exit on an empty stack is counted and dropped",
			steps: [][]frame.FuncEvent{{
				ex(0, 7, 5), en(0, 1, 10), ex(0, 1, 20), ex(0, 1, 21),
			}},
			want: []gotExec{
				{FID: 1, Entry: 10, Exit: 20, Incl: 10, Excl: 10, Parent: "root", EventID: "0:0:1"},
			},
			stats: Stats{Executions: 1, UnmatchedExits: 2},
		},
		{
			name: "exit of an outer call closes the calls left open inside it",
			steps: [][]frame.FuncEvent{{
				en(0, 1, 10), en(0, 2, 12), en(0, 3, 14), ex(0, 1, 30),
			}},
			want: []gotExec{
				{FID: 1, Entry: 10, Exit: 30, Incl: 20, Excl: 2, Parent: "root", Children: 1, EventID: "0:0:0"},
				{FID: 2, Entry: 12, Exit: 30, Incl: 18, Excl: 2, Parent: "0:0:0", Children: 1, EventID: "0:0:1", Repaired: true},
				{FID: 3, Entry: 14, Exit: 30, Incl: 16, Excl: 16, Parent: "0:0:1", EventID: "0:0:2", Repaired: true},
			},
			stats: Stats{Executions: 3, MismatchedExits: 1, RepairedOpen: 2},
		},
		{
			name: "exit of a function that is not open is counted, the stack is kept",
			steps: [][]frame.FuncEvent{{
				en(0, 1, 10), ex(0, 9, 12), ex(0, 1, 20),
			}},
			want: []gotExec{
				{FID: 1, Entry: 10, Exit: 20, Incl: 10, Excl: 10, Parent: "root", EventID: "0:0:0"},
			},
			stats: Stats{Executions: 1, UnmatchedExits: 1},
		},
		{
			name:  "entries open at the end are closed at the thread's last timestamp",
			steps: [][]frame.FuncEvent{{en(0, 1, 10), en(0, 2, 12), en(0, 3, 13), ex(0, 3, 15)}},
			close: true,
			want: []gotExec{
				{FID: 1, Entry: 10, Exit: 15, Incl: 5, Excl: 2, Parent: "root", Children: 1, EventID: "0:0:0", Repaired: true},
				{FID: 2, Entry: 12, Exit: 15, Incl: 3, Excl: 1, Parent: "0:0:0", Children: 1, EventID: "0:0:1", Repaired: true},
				{FID: 3, Entry: 13, Exit: 15, Incl: 2, Excl: 2, Parent: "0:0:1", EventID: "0:0:2"},
			},
			stats: Stats{Executions: 3, OpenAtEnd: 2},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, err := New(Config{Algorithm: SSTD, Window: 1000, MaxPendingSteps: 1000})
			if err != nil {
				t.Fatal(err)
			}
			for i, evs := range tc.steps {
				f := &frame.Frame{Step: uint64(i), Events: evs}
				nameAll(f)
				if err := d.Process(context.Background(), f); err != nil {
					t.Fatal(err)
				}
			}
			if tc.close {
				if err := d.Close(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			got := executions(d)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("executions:\n got  %+v\n want %+v", got, tc.want)
			}
			s := d.Stats()
			gs := Stats{Executions: s.Executions, UnmatchedExits: s.UnmatchedExits, MismatchedExits: s.MismatchedExits,
				RepairedOpen: s.RepairedOpen, OpenAtEnd: s.OpenAtEnd}
			if gs != tc.stats {
				t.Errorf("counts %+v, want %+v", gs, tc.stats)
			}
		})
	}
}

// anomalyFrames is a step with many normal executions of fid 1 on thread 0
// and, at the end, one very slow one, so that SSTD flags exactly that one.
func slowTail(f *frame.Frame, tid uint32, fid uint32, start uint64, n int, slow uint64) uint64 {
	ts := start
	for i := 0; i < n; i++ {
		f.Events = append(f.Events, en(tid, fid, ts), ex(tid, fid, ts+10))
		ts += 20
	}
	f.Events = append(f.Events, en(tid, fid, ts), ex(tid, fid, ts+slow))
	return ts + slow + 10
}

func TestCountersAndCommAttached(t *testing.T) {
	f := &frame.Frame{Step: 0, Rank: 3,
		Funcs:    []frame.Name{{ID: 1, Name: "work"}, {ID: 2, Name: "MPI_Send"}, {ID: 9, Name: "main"}},
		Counters: []frame.Name{{ID: 0, Name: "PAPI_TOT_INS"}},
		Metadata: []frame.Meta{{Tid: 0, Key: "Hostname", Value: "node7"}},
	}
	f.Events = append(f.Events, en(0, 9, 1))
	end := slowTail(f, 0, 1, 10, 40, 5000)
	// the slow call is the last "work": give it a child MPI_Send with a comm
	// event, and a counter sample at its exit timestamp.
	last := len(f.Events) - 1
	slowEntry := f.Events[last-1].TS
	slowExit := f.Events[last].TS
	f.Events = append(f.Events[:last], en(0, 2, slowEntry+100), ex(0, 2, slowEntry+110), f.Events[last])
	_ = end // main stays open: it is closed by Close, after detection
	f.CounterEvents = []frame.CounterEvent{
		{Tid: 0, CID: 0, Value: 111, TS: slowEntry},     // at the entry: belongs to the slow call
		{Tid: 0, CID: 0, Value: 222, TS: slowExit},      // at the exit: belongs to the slow call
		{Tid: 0, CID: 0, Value: 333, TS: slowEntry - 1}, // before: the previous call's or main's
	}
	sort.Slice(f.CounterEvents, func(i, j int) bool { return f.CounterEvents[i].TS < f.CounterEvents[j].TS })
	f.Comms = []frame.CommEvent{{Tid: 0, Kind: frame.Send, Tag: 5, Partner: 4, Bytes: 64, TS: slowEntry + 105}}
	sink := &MemorySink{}
	d, err := New(Config{Rank: 3, Algorithm: SSTD, Sigma: 3, Window: 2, SettleCount: -1, Sink: sink})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Process(context.Background(), f); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	all := sink.All()
	var rec *provenance.Exec
	for i := range all.Anomalies {
		if all.Anomalies[i].Func == "work" {
			rec = &all.Anomalies[i]
		}
	}
	if rec == nil {
		t.Fatalf("slow call not flagged; anomalies %+v", all.Anomalies)
	}
	if rec.Entry != slowEntry || rec.Exit != slowExit || rec.RuntimeExclusive != 5000-10 || rec.OutlierSeverity != 5000-10 {
		t.Errorf("record entry/exit/exclusive/severity %d/%d/%d/%v", rec.Entry, rec.Exit, rec.RuntimeExclusive, rec.OutlierSeverity)
	}
	if rec.Hostname != "node7" || rec.Algorithm != SSTD || rec.RID != 3 || rec.IOStep != 0 {
		t.Errorf("record hostname %q algorithm %q rid %d step %d", rec.Hostname, rec.Algorithm, rec.RID, rec.IOStep)
	}
	var vals []uint64
	for _, c := range rec.CounterEvents {
		vals = append(vals, c.CounterValue)
		if c.CounterName != "PAPI_TOT_INS" || c.RID != 3 {
			t.Errorf("counter event %+v", c)
		}
	}
	if !reflect.DeepEqual(vals, []uint64{111, 222}) {
		t.Errorf("counter values attached %v, want [111 222]", vals)
	}
	if len(rec.CallStack) != 2 || rec.CallStack[0].Func != "work" || rec.CallStack[1].Func != "main" || !rec.CallStack[0].IsAnomaly {
		t.Errorf("call stack %+v", rec.CallStack)
	}
	if rec.CallStack[1].Exit != 0 {
		t.Errorf("main was open at detection: exit %d, want 0", rec.CallStack[1].Exit)
	}
	// window: 2 before (two "work"), itself, 2 after (MPI_Send, and nothing else on the thread).
	var names []string
	for _, w := range rec.EventWindow.ExecWindow {
		names = append(names, w.Func)
	}
	if !reflect.DeepEqual(names, []string{"work", "work", "work", "MPI_Send"}) {
		t.Errorf("exec window %v", names)
	}
	if got := rec.EventWindow.ExecWindow[3].ParentEventID; got != rec.EventID {
		t.Errorf("MPI_Send's parent %q, want %q", got, rec.EventID)
	}
	if len(rec.EventWindow.CommWindow) != 1 {
		t.Fatalf("comm window %+v", rec.EventWindow.CommWindow)
	}
	c := rec.EventWindow.CommWindow[0]
	if c.Type != "SEND" || c.Src != 3 || c.Tar != 4 || c.Bytes != 64 || c.Tag != 5 || c.ExecdataKey != rec.EventWindow.ExecWindow[3].EventID {
		t.Errorf("comm record %+v", c)
	}
	if rec.FuncStats.Count != 41 || rec.FuncStats.Maximum != 4990 {
		t.Errorf("func stats %+v", rec.FuncStats)
	}
	// Chimbuko's normal-execution rule: one lowest-score normal "work".
	if len(all.Normal) != 1 || all.Normal[0].Func != "work" {
		t.Errorf("normal executions %+v", all.Normal)
	}
	if len(all.Metadata) != 1 || all.Metadata[0].Descr != "Hostname" || all.Metadata[0].Value != "node7" {
		t.Errorf("metadata %+v", all.Metadata)
	}
}

func TestGPUCorrelation(t *testing.T) {
	const gpuTid = 5
	f := &frame.Frame{Step: 0,
		Funcs:    []frame.Name{{ID: 1, Name: "main"}, {ID: 2, Name: "cudaLaunchKernel"}, {ID: 3, Name: "kernel"}},
		Counters: []frame.Name{{ID: 4, Name: CorrelationCounter}},
		Metadata: []frame.Meta{{Tid: gpuTid, Key: "CUDA Context", Value: "1"}, {Tid: gpuTid, Key: "CUDA Device", Value: "0"}, {Tid: gpuTid, Key: "CUDA Stream", Value: "7"}},
	}
	f.Events = append(f.Events, en(0, 1, 1))
	var cpu, gpu []frame.FuncEvent
	var ctr []frame.CounterEvent
	ts := uint64(10)
	for i := 0; i < 30; i++ {
		cpu = append(cpu, en(0, 2, ts), ex(0, 2, ts+2))
		ctr = append(ctr, frame.CounterEvent{Tid: 0, CID: 4, Value: uint64(1000 + i), TS: ts + 1})
		dur := uint64(10)
		if i == 29 {
			dur = 10000
		}
		gpu = append(gpu, en(gpuTid, 3, ts+5), ex(gpuTid, 3, ts+5+dur))
		ctr = append(ctr, frame.CounterEvent{Tid: gpuTid, CID: 4, Value: uint64(1000 + i), TS: ts + 5})
		ts += 20
	}
	f.Events = append(f.Events, cpu...)
	f.Events = append(f.Events, ex(0, 1, ts+20000))
	f.Events = append(f.Events, gpu...)
	f.CounterEvents = ctr
	sink := &MemorySink{}
	d, err := New(Config{Algorithm: SSTD, Sigma: 3, Sink: sink})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Process(context.Background(), f); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	all := sink.All()
	var rec *provenance.Exec
	for i := range all.Anomalies {
		if all.Anomalies[i].Func == "kernel" {
			rec = &all.Anomalies[i]
		}
	}
	if rec == nil {
		t.Fatalf("slow kernel not flagged: %+v", all.Anomalies)
	}
	if !rec.IsGPUEvent || rec.TID != gpuTid {
		t.Errorf("is_gpu_event %v tid %d", rec.IsGPUEvent, rec.TID)
	}
	if want := (provenance.GPULocation{Context: 1, Device: 0, Stream: 7, Thread: gpuTid}); rec.GPULocation == nil || *rec.GPULocation != want {
		t.Errorf("gpu_location %+v, want %+v", rec.GPULocation, want)
	}
	// The 30th launch is cpu event index 1+2*29 in the frame.
	wantParent := fmt.Sprintf("0:0:%d", 1+2*29)
	if rec.GPUParent == nil || rec.GPUParent.EventID != wantParent || rec.GPUParent.TID != 0 {
		t.Fatalf("gpu_parent %+v, want event %s on tid 0", rec.GPUParent, wantParent)
	}
	cs := rec.GPUParent.CallStack
	if len(cs) != 2 || cs[0].Func != "cudaLaunchKernel" || cs[1].Func != "main" || cs[1].EventID != "0:0:0" {
		t.Errorf("gpu_parent call stack %+v", cs)
	}
}

// TestAttachedEventsBounded runs many steps whose counter and comm events
// fall partly outside every execution (before the first entry, between
// calls, on a thread with no function at all) and checks that what a thread
// keeps of them stays bounded by what the event windows can still need,
// instead of growing with the steps.
func TestAttachedEventsBounded(t *testing.T) {
	const steps, calls = 200, 20
	d, err := New(Config{Rank: 0, Algorithm: SSTD, Window: 2, SettleCount: -1, Sink: &MemorySink{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	maxKept := 0
	for s := uint64(0); s < steps; s++ {
		base := 1000 + s*10000
		f := &frame.Frame{Step: s, TStart: base, TEnd: base + 9999}
		if s == 0 {
			f.Funcs = []frame.Name{{ID: 1, Name: "work"}}
			f.Counters = []frame.Name{{ID: 0, Name: "PAPI_TOT_INS"}}
		}
		for c := uint64(0); c < calls; c++ {
			ts := base + 10 + c*400
			f.Events = append(f.Events, en(0, 1, ts), ex(0, 1, ts+100+c))
			f.CounterEvents = append(f.CounterEvents,
				frame.CounterEvent{Tid: 0, CID: 0, Value: c, TS: ts - 5},  // between calls: no execution
				frame.CounterEvent{Tid: 0, CID: 0, Value: c, TS: ts + 50}, // inside the call
				frame.CounterEvent{Tid: 7, CID: 0, Value: c, TS: ts + 50}) // a thread with no function
			f.Comms = append(f.Comms,
				frame.CommEvent{Tid: 0, Kind: frame.Send, Partner: 1, Bytes: 8, TS: ts - 5},
				frame.CommEvent{Tid: 0, Kind: frame.Send, Partner: 1, Bytes: 8, TS: ts + 60})
		}
		sort.Slice(f.CounterEvents, func(i, j int) bool { return f.CounterEvents[i].TS < f.CounterEvents[j].TS })
		if err := d.Process(ctx, f); err != nil {
			t.Fatal(err)
		}
		for _, th := range d.stacks.threads {
			maxKept = max(maxKept, len(th.counters), len(th.comms))
		}
	}
	// A step adds calls counter and comm events attached to executions;
	// what is kept after a step is at most that step's and the window's.
	if limit := 2 * calls; maxKept > limit {
		t.Errorf("a thread kept up to %d attached events after %d steps, want at most %d", maxKept, steps, limit)
	}
	if err := d.Close(ctx); err != nil {
		t.Fatal(err)
	}
}
