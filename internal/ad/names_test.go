package ad

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/frame"
)

// nameAll gives every function and counter id f's events use a name in f
// itself ("fn<id>", "ctr<id>"), as the first frame that uses an id does.
func nameAll(f *frame.Frame) {
	fn := map[uint32]bool{}
	for _, n := range f.Funcs {
		fn[n.ID] = true
	}
	for _, e := range f.Events {
		if !fn[e.FID] {
			fn[e.FID] = true
			f.Funcs = append(f.Funcs, frame.Name{ID: e.FID, Name: "fn" + strconv.Itoa(int(e.FID))})
		}
	}
	ctr := map[uint32]bool{}
	for _, n := range f.Counters {
		ctr[n.ID] = true
	}
	for _, c := range f.CounterEvents {
		if !ctr[c.CID] {
			ctr[c.CID] = true
			f.Counters = append(f.Counters, frame.Name{ID: c.CID, Name: "ctr" + strconv.Itoa(int(c.CID))})
		}
	}
}

// call is one execution of fid on thread 0 in the step: entry at step*100+at,
// exit 5 µs later.
func call(step uint64, fid uint32, at uint64) []frame.FuncEvent {
	ts := step*100 + at
	return []frame.FuncEvent{en(0, fid, ts), ex(0, fid, ts+5)}
}

// nameStep is a test frame: calls of fids, names given, and counter samples
// of cids.
type nameStep struct {
	fids  []uint32
	names []frame.Name
	ctrs  []frame.Name
	cids  []uint32
}

func (s nameStep) frame(step uint64) *frame.Frame {
	f := &frame.Frame{Step: step, TStart: step * 100, TEnd: step*100 + 99, Funcs: s.names, Counters: s.ctrs}
	for i, fid := range s.fids {
		f.Events = append(f.Events, call(step, fid, uint64(10*i))...)
	}
	for _, cid := range s.cids {
		f.CounterEvents = append(f.CounterEvents, frame.CounterEvent{Tid: 0, CID: cid, Value: 7, TS: step*100 + 1})
	}
	return f
}

func names(kv ...any) []frame.Name {
	var out []frame.Name
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, frame.Name{ID: uint32(kv[i].(int)), Name: kv[i+1].(string)})
	}
	return out
}

// TestHeldUntilNamed feeds frames one by one and checks, after each, how
// many frames were processed and held, then what reached the models and
// the records.
func TestHeldUntilNamed(t *testing.T) {
	tests := []struct {
		name    string
		maxHeld int
		barrier bool
		steps   []nameStep
		close   bool
		// after each frame: frames processed, frames held; a frame whose
		// Process must fail has a non-nil err
		processed []uint64
		held      []int
		errs      []error
		// at the end
		unnamed, bad, missing uint64
		models                []string // model keys, sorted
		execSteps             []string // io_steps of the executions kept, in processing order
	}{
		{
			name: "names arrive in a later frame: held frames run in order, then the new one",
			steps: []nameStep{
				{fids: []uint32{1}, names: names(1, "a")},
				{fids: []uint32{1, 2}},                            // 2 unnamed
				{fids: []uint32{1}},                               // named, waits behind step 1
				{fids: []uint32{3}, names: names(2, "b", 3, "c")}, // brings 2
			},
			processed: []uint64{1, 1, 1, 4},
			held:      []int{0, 1, 2, 0},
			models:    []string{"a", "b", "c"},
			execSteps: []string{"0", "1", "1", "2", "3"},
		},
		{
			name: "a counter without a name holds the frame too",
			steps: []nameStep{
				{fids: []uint32{1}, names: names(1, "a"), cids: []uint32{4}},
				{fids: []uint32{1}, ctrs: names(4, "cycles")},
			},
			processed: []uint64{0, 2},
			held:      []int{1, 0},
			models:    []string{"a"},
			execSteps: []string{"0", "1"},
		},
		{
			name: "a repeat of the same name is accepted",
			steps: []nameStep{
				{fids: []uint32{1}, names: names(1, "a"), ctrs: names(2, "cycles"), cids: []uint32{2}},
				{fids: []uint32{1}, names: names(1, "a"), ctrs: names(2, "cycles"), cids: []uint32{2}},
				{fids: []uint32{1, 5}, names: names(1, "a", 5, "e", 1, "a")},
			},
			processed: []uint64{1, 2, 3},
			held:      []int{0, 0, 0},
			models:    []string{"a", "e"},
			execSteps: []string{"0", "1", "2", "2"},
		},
		{
			name: "a conflicting name rejects the frame and keeps the first name",
			steps: []nameStep{
				{fids: []uint32{1}, names: names(1, "a")},
				{fids: []uint32{1}, names: names(1, "z")},
				{fids: []uint32{1}},
			},
			processed: []uint64{1, 1, 2},
			held:      []int{0, 0, 0},
			errs:      []error{nil, ErrNameConflict, nil},
			bad:       1,
			missing:   1,
			models:    []string{"a"},
			execSteps: []string{"0", "2"},
		},
		{
			name: "a conflicting counter name rejects the frame",
			steps: []nameStep{
				{fids: []uint32{1}, names: names(1, "a"), ctrs: names(2, "cycles")},
				{fids: []uint32{1}, ctrs: names(2, "bytes")},
			},
			processed: []uint64{1, 1},
			held:      []int{0, 0},
			errs:      []error{nil, ErrNameConflict},
			bad:       1,
			models:    []string{"a"},
			execSteps: []string{"0"},
		},
		{
			name: "one frame naming an id twice, differently, is rejected",
			steps: []nameStep{
				{fids: []uint32{1}, names: names(1, "a", 1, "b")},
			},
			processed: []uint64{0},
			held:      []int{0},
			errs:      []error{ErrNameConflict},
			bad:       1,
		},
		{
			name:    "beyond the bound the oldest held frame is dropped and the rest run",
			maxHeld: 2,
			steps: []nameStep{
				{fids: []uint32{1}, names: names(1, "a")},
				{fids: []uint32{9}}, // 9 is never named
				{fids: []uint32{1}},
				{fids: []uint32{1}},
				{fids: []uint32{1}},
			},
			processed: []uint64{1, 1, 1, 3, 4},
			held:      []int{0, 1, 2, 0, 0},
			unnamed:   1,
			missing:   1,
			models:    []string{"a"},
			execSteps: []string{"0", "2", "3", "4"},
		},
		{
			name: "frames still held at Close are dropped and counted",
			steps: []nameStep{
				{fids: []uint32{1}, names: names(1, "a")},
				{fids: []uint32{2}},
				{fids: []uint32{1}},
			},
			close:     true,
			processed: []uint64{1, 1, 1},
			held:      []int{0, 1, 2},
			unnamed:   2,
			models:    []string{"a"},
			execSteps: []string{"0"},
		},
		{
			// (files are read from their start: a name comes late only
			// in a malformed stream, and the model's key is then made up)
			name:    "with a Barrier nothing is held",
			barrier: true,
			steps: []nameStep{
				{fids: []uint32{2}},
				{fids: []uint32{2}, names: names(2, "b")},
			},
			processed: []uint64{1, 2},
			held:      []int{0, 0},
			execSteps: []string{"0", "1"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sink := &MemorySink{}
			cfg := Config{Algorithm: SSTD, Window: 1000, MaxPendingSteps: 1000, MaxHeldFrames: tc.maxHeld, Sink: sink}
			if tc.barrier {
				cfg.Barrier = NewBarrier()
				cfg.Barrier.Join(0)
			}
			d, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			for i, st := range tc.steps {
				f := st.frame(uint64(i))
				err := d.Process(ctx, f)
				var want error
				if tc.errs != nil {
					want = tc.errs[i]
				}
				if (want == nil) != (err == nil) || (want != nil && !errors.Is(err, want)) {
					t.Fatalf("frame %d: error %v, want %v", i, err, want)
				}
				// The caller reuses its frame: held copies must not change.
				for j := range f.Events {
					f.Events[j].FID = 1 << 20
				}
				if got := d.Stats().Frames; got != tc.processed[i] {
					t.Errorf("after frame %d: %d frames processed, want %d", i, got, tc.processed[i])
				}
				if len(d.held) != tc.held[i] {
					t.Errorf("after frame %d: %d frames held, want %d", i, len(d.held), tc.held[i])
				}
			}
			var steps []string
			for _, e := range executions(d) {
				steps = append(steps, strings.Split(e.EventID, ":")[1])
			}
			if tc.close {
				if err := d.Close(ctx); err != nil {
					t.Fatal(err)
				}
				if len(d.held) != 0 {
					t.Errorf("%d frames held after Close", len(d.held))
				}
			}
			s := d.Stats()
			if s.UnnamedFrames != tc.unnamed || s.BadFrames != tc.bad || s.MissingSteps != tc.missing {
				t.Errorf("unnamed %d, bad %d, missing %d frames; want %d, %d, %d", s.UnnamedFrames, s.BadFrames, s.MissingSteps, tc.unnamed, tc.bad, tc.missing)
			}
			var keys []string
			for _, m := range d.models.list {
				keys = append(keys, m.name)
			}
			slices.Sort(keys)
			if !tc.barrier && !slices.Equal(keys, tc.models) {
				t.Errorf("models %q, want %q", keys, tc.models)
			}
			if !slices.Equal(steps, tc.execSteps) {
				t.Errorf("executions of io_steps %q in processing order, want %q", steps, tc.execSteps)
			}
			if !tc.barrier {
				if err := d.Close(ctx); err != nil {
					t.Fatal(err)
				}
				for _, p := range sink.All().Profiles {
					for _, tm := range p.Timers {
						if strings.Contains(tm.Name, "fid_") {
							t.Errorf("profile timer %q", tm.Name)
						}
					}
				}
			}
		})
	}
}

// A frame naming a function with an unnamed call held behind it: the names
// the held frame brought are known when it runs (they were learnt when it
// came), and the anomaly record of the late frame has its function's name.
func TestHeldFramesRecordNames(t *testing.T) {
	sink := &MemorySink{}
	d, err := New(Config{Algorithm: SSTD, Sigma: 3, Window: 2, SettleCount: -1, Sink: sink})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// step 0: many calls of 1 (not named yet) and one slow one
	f0 := &frame.Frame{Step: 0}
	slowTail(f0, 0, 1, 10, 40, 5000)
	if err := d.Process(ctx, f0); err != nil {
		t.Fatal(err)
	}
	if d.Stats().Frames != 0 || len(sink.All().Anomalies) != 0 {
		t.Fatalf("a frame with an unnamed function was processed: %+v", d.Stats())
	}
	f1 := &frame.Frame{Step: 1, Funcs: []frame.Name{{ID: 1, Name: "solve"}}}
	if err := d.Process(ctx, f1); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(ctx); err != nil {
		t.Fatal(err)
	}
	an := sink.All().Anomalies
	if len(an) != 1 || an[0].Func != "solve" {
		var fs []string
		for _, a := range an {
			fs = append(fs, a.Func)
		}
		t.Fatalf("anomalies of %q, want one of solve", fs)
	}
}

// A frame decoded from the wire with an entry repeated (same id, same name)
// is accepted.
func TestRepeatedEntryFromTheWire(t *testing.T) {
	d, err := New(Config{Algorithm: SSTD})
	if err != nil {
		t.Fatal(err)
	}
	f := &frame.Frame{Funcs: names(1, "a", 1, "a"), Counters: names(2, "c", 2, "c"),
		Metadata: []frame.Meta{{Key: "Hostname", Value: "n1"}, {Key: "Hostname", Value: "n1"}},
		Events:   call(0, 1, 0), CounterEvents: []frame.CounterEvent{{CID: 2, Value: 1, TS: 1}}}
	var got frame.Frame
	if err := frame.DecodeMessage(frame.AppendBinary(nil, f), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Funcs) != 2 || len(got.Counters) != 2 || len(got.Metadata) != 2 {
		t.Fatalf("decoded %d funcs, %d counters, %d metadata entries; want the 2 of each sent", len(got.Funcs), len(got.Counters), len(got.Metadata))
	}
	if err := d.Process(context.Background(), &got); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s := d.Stats(); s.Frames != 1 || s.Executions != 1 {
		t.Errorf("stats %+v: want the frame and its execution", s)
	}
}

// FuzzHeldFrames feeds frames that name their ids late, never, twice or
// differently: every frame given is processed, rejected or dropped unnamed,
// exactly once, and no made-up name reaches a model or a profile.
func FuzzHeldFrames(f *testing.F) {
	f.Add([]byte{2, 0, 1, 0, 1, 3, 1, 1, 0, 3, 0, 1, 0, 2, 1})
	f.Add([]byte{0, 0, 4, 0, 3, 1, 5, 4, 0, 3, 1, 1, 4, 9, 3, 0, 1, 9, 0, 7, 2, 0, 2, 3, 0, 2, 1, 4, 0x80})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		d, err := New(Config{Algorithm: SSTD, MaxHeldFrames: 1 + int(data[0]%4), Window: 2, MaxPendingSteps: 2})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		var fr frame.Frame
		var given, step, ts uint64
		flush := func() {
			fr.Step = step
			step++
			given++
			if err := d.Process(ctx, &fr); err != nil && !errors.Is(err, ErrNameConflict) {
				t.Fatalf("frame %d: %v", fr.Step, err)
			}
			fr.Reset()
		}
		for i := 1; i+2 < len(data); i += 3 {
			op, a, b := data[i]%4, uint32(data[i+1]), data[i+2]
			ts += uint64(b%16) + 1
			switch op {
			case 0:
				fr.Events = append(fr.Events, en(0, a%6, ts), ex(0, a%6, ts+1))
				ts++
			case 1:
				name := "f" + strconv.Itoa(int(a%6))
				if b&0x80 != 0 {
					name = "g" + name
				}
				fr.Funcs = append(fr.Funcs, frame.Name{ID: a % 6, Name: name})
			case 2:
				fr.CounterEvents = append(fr.CounterEvents, frame.CounterEvent{CID: a % 3, Value: uint64(b), TS: ts})
				if b&1 != 0 {
					fr.Counters = append(fr.Counters, frame.Name{ID: a % 3, Name: "c" + strconv.Itoa(int(a%3))})
				}
			default:
				flush()
			}
		}
		flush()
		if err := d.Close(ctx); err != nil {
			t.Fatal(err)
		}
		s := d.Stats()
		if s.Frames+s.BadFrames+s.UnnamedFrames != given || len(d.held) != 0 {
			t.Fatalf("%d frames given: %d processed, %d rejected, %d dropped unnamed, %d still held", given, s.Frames, s.BadFrames, s.UnnamedFrames, len(d.held))
		}
		for _, m := range d.models.list {
			if strings.Contains(m.name, "fid_") {
				t.Fatalf("model %q", m.name)
			}
		}
		for _, p := range d.Profiles(true) {
			for _, tm := range p.Timers {
				if strings.Contains(tm.Name, "fid_") {
					t.Fatalf("profile timer %q", tm.Name)
				}
			}
			for _, c := range p.Counters {
				if strings.Contains(c.Name, "cid_") {
					t.Fatalf("profile counter %q", c.Name)
				}
			}
		}
	})
}

// BenchmarkNamedCheck is what deciding whether a frame must wait for names
// costs per frame: a check of every event's id, for a frame of 100,000
// function events and 1,000 counter samples.
func BenchmarkNamedCheck(b *testing.B) {
	cs := newCallStacks(&Config{}, &counters{}, nil)
	f := &frame.Frame{}
	for i := range 64 {
		f.Funcs = append(f.Funcs, frame.Name{ID: uint32(i), Name: "f" + strconv.Itoa(i)})
	}
	f.Counters = names(0, "a", 1, "b")
	for i := range 50_000 {
		f.Events = append(f.Events, call(0, uint32(i%64), uint64(i))...)
	}
	for i := range 1000 {
		f.CounterEvents = append(f.CounterEvents, frame.CounterEvent{CID: uint32(i % 2), TS: uint64(i)})
	}
	cs.names(f)
	for b.Loop() {
		if !cs.named(f) {
			b.Fatal("frame not named")
		}
	}
	b.ReportMetric(float64(f.NumEvents())*float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// A frame that uses an id no frame ever names (lost with every name sent
// since, or forged) stalls its rank until the next whole dictionary at
// most: then it alone is dropped, and the frames held behind it are
// processed in order.
func TestUnnamedFrameDroppedAtNextDictionary(t *testing.T) {
	const every, steps, bad = 4, 20, 3
	d, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	dict := []frame.Name{{ID: 1, Name: "solve"}, {ID: 2, Name: "MPI_Send"}}
	for s := range uint64(steps) {
		st := nameStep{fids: []uint32{1, 2}}
		if s == 0 || s%every == 0 {
			st.names = dict
		}
		if s == bad {
			st.fids = []uint32{1, 99} // id 99 is never named
		}
		if err := d.Process(ctx, st.frame(s)); err != nil {
			t.Fatal(err)
		}
		if s == every*(bad/every+1) {
			if got := d.Stats().Frames; got != s {
				t.Errorf("after the dictionary of step %d: %d frames processed, want %d (every one but the unnamed)", s, got, s)
			}
		}
	}
	if err := d.Close(ctx); err != nil {
		t.Fatal(err)
	}
	st := d.Stats()
	if st.UnnamedFrames != 1 || st.MissingSteps != 1 || st.Frames != steps-1 {
		t.Errorf("unnamed %d, missing %d, processed %d; want 1, 1, %d", st.UnnamedFrames, st.MissingSteps, st.Frames, steps-1)
	}
}

// TestHeldFramesBoundedInBytes holds frames of ~400 KB each (their events
// use a function id with no name yet) under a 1 MiB bound and a frame
// bound far above it: the oldest are dropped and counted as unnamed as soon
// as the held frames pass the byte bound, never after.
func TestHeldFramesBoundedInBytes(t *testing.T) {
	const calls = 8000 // 16,000 events of 24 bytes: ~384 KB a frame
	big := func(step uint64) *frame.Frame {
		f := &frame.Frame{Step: step, TStart: step * 1e6, TEnd: step*1e6 + 999_999}
		if step == 0 {
			f.Funcs = names(1, "a")
		}
		fid := uint32(2) // never named
		if step == 0 {
			fid = 1
		}
		for i := range uint64(calls) {
			ts := step*1e6 + 100*i
			f.Events = append(f.Events, frame.FuncEvent{Kind: frame.Entry, FID: fid, TS: ts}, frame.FuncEvent{Kind: frame.Exit, FID: fid, TS: ts + 50})
		}
		return f
	}
	d, err := New(Config{Algorithm: SSTD, MaxHeldFrames: 64, MaxHeldBytes: 1 << 20, Sink: &MemorySink{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for step := range uint64(10) {
		if err := d.Process(ctx, big(step)); err != nil {
			t.Fatal(err)
		}
		if b := heldBytes(d.held); b > 1<<20 {
			t.Fatalf("after frame %d: %d bytes held, over the 1 MiB bound", step, b)
		}
	}
	// 400 KB frames: two fit under 1 MiB, so 9 held frames leave 2.
	if len(d.held) != 2 {
		t.Errorf("%d frames held, want 2", len(d.held))
	}
	if s := d.Stats(); s.UnnamedFrames != 7 {
		t.Errorf("%d unnamed frames counted, want 7", s.UnnamedFrames)
	}
}

func TestMaxHeldBytesOption(t *testing.T) {
	for _, tc := range []struct {
		in   int64
		want int64
		bad  bool
	}{
		{0, DefaultMaxHeldBytes, false},
		{1 << 20, 1 << 20, false},
		{1000, 0, true},
		{1 << 40, 0, true},
	} {
		c := Config{MaxHeldBytes: tc.in}
		err := c.Validate()
		if (err != nil) != tc.bad {
			t.Errorf("MaxHeldBytes %d: err %v, want error %v", tc.in, err, tc.bad)
		}
		if err == nil && c.MaxHeldBytes != tc.want {
			t.Errorf("MaxHeldBytes %d became %d, want %d", tc.in, c.MaxHeldBytes, tc.want)
		}
	}
}
