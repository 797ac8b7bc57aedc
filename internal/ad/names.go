package ad

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"unsafe"

	"github.com/kipimo-hpc/kipimo/internal/frame"
)

// DefaultMaxHeldFrames is Config.MaxHeldFrames's default: four times the
// publishers' default interval between two frames that carry the whole
// dictionary (publish.DefaultNamesEvery, KIPIMO_NAMES_EVERY), so a detector
// that starts at any point of a rank's stream learns every name before it
// has to drop anything, with room for frames lost on the way.
const DefaultMaxHeldFrames = 64

// DefaultMaxHeldBytes is Config.MaxHeldBytes's default: 64 MiB of frames
// per rank (64 frames of 1 MiB).
const DefaultMaxHeldBytes = 64 << 20

// ErrNameConflict is wrapped by Process's error for a frame that names a
// function or counter id differently from the name the id already has (in
// an earlier frame or in the same frame): ids are the rank's, so one of the
// two names is wrong and the frame is rejected (Stats.BadFrames).
var ErrNameConflict = errors.New("conflicting name")

// Names never invented.
//
// Publishers send a name with the first frame that uses its id and again,
// with every other name, every few frames and after a reconnect. A detector
// that starts after a rank's first frame therefore meets events whose ids
// have no name yet. Such a frame is held (a copy, in Detector.held, in
// arrival order), and so is every later frame of the rank, so that the
// order of steps is kept; once the names arrive the held frames are
// processed in order. When a whole dictionary arrives (a frame naming every
// id the detector knows), the held frames whose ids are still unnamed can
// never be processed: they are dropped at once and counted
// (Stats.UnnamedFrames), and the frames behind them go on. Beyond
// Config.MaxHeldFrames the oldest held frame is dropped and counted the same
// way. A dropped frame's step is then missing downstream like any lost
// frame. At Close the frames still held are
// dropped and counted the same way.
//
// With a Barrier (detection on files, whose streams are read from their
// start) nothing is held: a detector waiting for names would stop every
// other detector of the process at the step boundary.

// checkNames reports a dictionary entry of f that names its id differently
// from the name the id has (or is given earlier in f). It changes nothing.
func (cs *callStacks) checkNames(f *frame.Frame) error {
	for i := range f.Funcs {
		n := &f.Funcs[i]
		if int(n.ID) < len(cs.funcKnown) && cs.funcKnown[n.ID] && cs.funcNames[n.ID] != n.Name {
			return fmt.Errorf("frame step %d: funcs[%d]: %w: function id %d is named %q, and was %q", f.Step, i, ErrNameConflict, n.ID, n.Name, cs.funcNames[n.ID])
		}
	}
	for i := range f.Counters {
		n := &f.Counters[i]
		if old, ok := cs.ctrNames[n.ID]; ok && old != n.Name {
			return fmt.Errorf("frame step %d: counters[%d]: %w: counter id %d is named %q, and was %q", f.Step, i, ErrNameConflict, n.ID, n.Name, old)
		}
	}
	if err := dupNames(f.Step, "funcs", "function", f.Funcs); err != nil {
		return err
	}
	return dupNames(f.Step, "counters", "counter", f.Counters)
}

// dupNames reports an id that names holds twice with different names.
func dupNames(step uint64, field, what string, names []frame.Name) error {
	if len(names) < 2 {
		return nil
	}
	seen := make(map[uint32]string, len(names))
	for i := range names {
		n := &names[i]
		if old, ok := seen[n.ID]; ok && old != n.Name {
			return fmt.Errorf("frame step %d: %s[%d]: %w: %s id %d is named %q, and %q earlier in the frame", step, field, i, ErrNameConflict, what, n.ID, n.Name, old)
		}
		seen[n.ID] = n.Name
	}
	return nil
}

// named reports whether every function and counter id f's events use has
// a name.
func (cs *callStacks) named(f *frame.Frame) bool { return cs.namedScan(f, frameScan{}) }

// namedScan is named, reading f's function events only when check did not
// find them all named already (names are never taken back).
func (cs *callStacks) namedScan(f *frame.Frame, sc frameScan) bool {
	known := cs.funcKnown
	if !sc.named {
		for i := range f.Events {
			if fid := f.Events[i].FID; int(fid) >= len(known) || !known[fid] {
				return false
			}
		}
	}
	last, lastOK := uint32(0), false
	for i := range f.CounterEvents {
		cid := f.CounterEvents[i].CID
		if lastOK && cid == last {
			continue
		}
		if _, ok := cs.ctrNames[cid]; !ok {
			return false
		}
		last, lastOK = cid, true
	}
	return true
}

// admit takes a frame that passed check and checkNames: its names are
// learnt, then it is processed at once, or held behind the frames already
// held or until its names arrive. Held frames that have their names are
// processed, oldest first.
func (d *Detector) admit(ctx context.Context, f *frame.Frame, sc frameScan) {
	whole := len(d.held) > 0 && d.stacks.wholeDictionary(f)
	d.stacks.names(f)
	if whole {
		d.dropHopeless()
	}
	if d.cfg.Barrier != nil || (len(d.held) == 0 && d.stacks.namedScan(f, sc)) {
		d.process(ctx, f, sc)
		return
	}
	if !d.heldOnce {
		d.heldOnce = true
		d.cfg.Logger.Info().Uint32("rank", d.cfg.Rank).Uint64("io_step", f.Step).
			Msg("frames use function or counter ids whose names have not arrived yet: held until they do")
	}
	d.held = append(d.held, cloneFrame(f))
	d.returnLent(f)
	d.releaseHeld(ctx)
	for len(d.held) > d.cfg.MaxHeldFrames || heldBytes(d.held) > d.cfg.MaxHeldBytes {
		d.dropHeld(1)
		d.releaseHeld(ctx)
	}
}

// heldBytes is the memory the held frames take, as their slices' elements
// and names' bytes (what cloneFrame copies).
func heldBytes(held []*frame.Frame) int64 {
	var n int64
	for _, f := range held {
		n += int64(unsafe.Sizeof(*f)) +
			int64(len(f.Events))*int64(unsafe.Sizeof(frame.FuncEvent{})) +
			int64(len(f.CounterEvents))*int64(unsafe.Sizeof(frame.CounterEvent{})) +
			int64(len(f.Comms))*int64(unsafe.Sizeof(frame.CommEvent{}))
		for _, l := range [][]frame.Name{f.Funcs, f.Counters} {
			for _, x := range l {
				n += int64(unsafe.Sizeof(x)) + int64(len(x.Name))
			}
		}
		for _, m := range f.Metadata {
			n += int64(unsafe.Sizeof(m)) + int64(len(m.Key)+len(m.Value))
		}
	}
	return n
}

// releaseHeld processes the held frames whose names have arrived, oldest
// first, up to the first one still missing a name.
func (d *Detector) releaseHeld(ctx context.Context) {
	for len(d.held) > 0 && d.stacks.named(d.held[0]) {
		f := d.held[0]
		d.held = slices.Delete(d.held, 0, 1)
		// Threads held frames would add were not counted when they came.
		sc, err := d.check(f)
		if errors.Is(err, ErrStaleFrame) {
			d.stats.staleFrames.Add(1)
			continue
		} else if err != nil {
			d.stats.badFrames.Add(1)
			d.stepBad++
			d.cfg.Logger.Warn().Err(err).Uint64("io_step", f.Step).Msg("held frame rejected")
			continue
		}
		d.process(ctx, f, sc)
	}
}

// dropHeld drops the n oldest held frames, counting them in
// Stats.UnnamedFrames (logged at the 1st, 2nd, 4th... drop).
func (d *Detector) dropHeld(n int) {
	n = min(n, len(d.held))
	if n == 0 {
		return
	}
	step := d.held[n-1].Step
	d.held = slices.Delete(d.held, 0, n)
	total := d.stats.unnamedFrames.Add(uint64(n))
	if bits.Len64(total-uint64(n)) != bits.Len64(total) {
		d.cfg.Logger.Warn().Uint32("rank", d.cfg.Rank).Uint64("io_step", step).Uint64("unnamed_frames", total).
			Msg("frames dropped: their function or counter ids never got a name")
	}
}

// wholeDictionary reports whether f re-sends every function and counter name
// the detector has learnt, as publishers do every few frames and after a
// reconnect: after such a frame, an id used by an earlier frame and still
// unnamed will never be named. A detector that has learnt no name yet
// cannot tell a whole dictionary from a frame naming its first ids, and
// answers false.
func (cs *callStacks) wholeDictionary(f *frame.Frame) bool {
	var known int
	for _, k := range cs.funcKnown {
		if k {
			known++
		}
	}
	if known+len(cs.ctrNames) == 0 || len(f.Funcs) < known || len(f.Counters) < len(cs.ctrNames) {
		return false
	}
	named := make(map[uint32]bool, len(f.Funcs))
	for i := range f.Funcs {
		named[f.Funcs[i].ID] = true
	}
	for id, k := range cs.funcKnown {
		if k && !named[uint32(id)] {
			return false
		}
	}
	clear(named)
	for i := range f.Counters {
		named[f.Counters[i].ID] = true
	}
	for id := range cs.ctrNames {
		if !named[id] {
			return false
		}
	}
	return true
}

// dropHopeless drops the held frames that still use an unnamed id once a
// whole dictionary has arrived (their names were never sent, or were lost
// with every dictionary since), counting them in Stats.UnnamedFrames, and
// keeps the others in order: one bad frame stalls its rank until the next
// dictionary at most, never to the end of the run.
func (d *Detector) dropHopeless() {
	kept := d.held[:0]
	var dropped int
	for _, h := range d.held {
		if d.stacks.named(h) {
			kept = append(kept, h)
			continue
		}
		dropped++
	}
	clear(d.held[len(kept):])
	d.held = kept
	if dropped == 0 {
		return
	}
	total := d.stats.unnamedFrames.Add(uint64(dropped))
	if bits.Len64(total-uint64(dropped)) != bits.Len64(total) {
		d.cfg.Logger.Warn().Uint32("rank", d.cfg.Rank).Uint64("unnamed_frames", total).
			Msg("frames dropped: a whole dictionary of names came and their function or counter ids are not in it")
	}
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

// WaitedForNames reports whether a frame of the detector ever waited for
// the names of ids its events used. Call it from the detector's goroutine,
// or once it is closed.
func (d *Detector) WaitedForNames() bool { return d.heldOnce }
