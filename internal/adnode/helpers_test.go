package adnode

import (
	"slices"
	"strconv"

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

// cloneFrame is a deep copy of f (held frames outlive the caller's).
func cloneFrame(f *frame.Frame) *frame.Frame {
	c := *f
	c.Funcs = slices.Clone(f.Funcs)
	c.Counters = slices.Clone(f.Counters)
	c.Metadata = slices.Clone(f.Metadata)
	c.Events = slices.Clone(f.Events)
	c.CounterEvents = slices.Clone(f.CounterEvents)
	c.Comms = slices.Clone(f.Comms)
	return &c
}
