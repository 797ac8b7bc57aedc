// Package caliper reads Caliper event traces (.cali files written with the
// event, recorder, timestamp and trace services) as frames.
//
// A .cali file has one record per line: node records build the context tree
// (attributes are nodes whose attr is 8, cali.attribute.name; values are nodes
// under them) and snapshot records (ctx) reference tree nodes, each standing
// for its whole path, plus immediate attr/data pairs. A snapshot carrying
// event.begin#A=v, event.end#A=v or event.set#A=v opens or closes region v of
// attribute A on the snapshot's thread: regions become functions (named v for
// the attributes function, region, annotation, loop and kernel, else "A=v"),
// begin/end become entry/exit. An attribute of class.iteration, or named
// iteration#<loop> (Caliper's loop iteration numbers), is one function named after the
// attribute, so every iteration of a loop is an execution of the same
// function; the iteration number is sampled as a counter of that name at
// each entry. Times come from time.offset.ns (ns, Caliper 2.10 and later) or
// time.offset (µs) when the snapshot has it; otherwise the timeline is
// rebuilt from the inclusive durations Caliper records at each end
// (time.inclusive.duration.ns or time.inclusive.duration): an end is at its
// region's begin plus that duration, a begin at the thread's clock.
// Each file is a rank (mpi.rank when present, else its position) and
// thread.id, omp.thread.num or pthread.id give the thread. Caliper's
// attribute:value context (globals and the non-region, non-event attributes of
// each snapshot) is kept as metadata of the thread.
package caliper

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/kipimo-hpc/kipimo/internal/format/cali"
	"github.com/kipimo-hpc/kipimo/internal/replay/steps"
)

type regionOpen struct {
	attr  string
	value string
	fid   uint32
	entry uint64
}

type thread struct {
	clock uint64
	open  []regionOpen
}

// reader holds one file's state.
type reader struct {
	name    string
	b       *steps.Builder
	rank    uint32
	tree    *cali.Tree
	regions map[string]bool   // attributes with begin/end/set events
	iters   map[string]bool   // attributes of class.iteration
	iterCID map[string]uint32 // counter of an iteration attribute
	funcs   map[string]uint32
	threads map[string]uint32
	th      []*thread
	maxTS   uint64
	rankSet bool
	started bool         // an event was fed: the rank is fixed
	globals []cali.Entry // run metadata waiting for the first snapshot
}

const maxDepth = 1 << 14

func (r *reader) node(rec cali.Record) error {
	id, n, err := cali.NodeOf(rec)
	if err != nil {
		return err
	}
	r.tree.Add(id, n)
	if n.Attr == cali.AttrName {
		if r.isIteration(n.Parent) {
			r.iters[n.Data] = true
		}
		for _, p := range []string{"event.begin#", "event.end#", "event.set#"} {
			if a, ok := strings.CutPrefix(n.Data, p); ok {
				r.regions[a] = true
				// Caliper may write the first begin of a loop's
				// iterations before the class.iteration attribute
				// itself; its name, iteration#<loop>, says it already.
				if strings.HasPrefix(a, "iteration#") {
					r.iters[a] = true
				}
			}
		}
	}
	return nil
}

// isIteration reports whether the property chain of an attribute, from its
// parent node up, holds class.iteration=true.
func (r *reader) isIteration(parent int64) bool {
	for depth := 0; parent >= 0 && depth < maxDepth; depth++ {
		n, ok := r.tree.Node(uint64(parent))
		if !ok {
			return false
		}
		if a, ok := r.tree.Attribute(n.Attr); ok && n.Data == "true" && a.Name == "class.iteration" {
			return true
		}
		parent = n.Parent
	}
	return false
}

var plainNames = map[string]bool{"function": true, "region": true, "annotation": true, "loop": true, "kernel": true}

func (r *reader) fid(attr, value string) uint32 {
	name := attr + "=" + value
	switch {
	case plainNames[attr]:
		name = value
	case r.iters[attr]:
		name = attr
	}
	if id, ok := r.funcs[name]; ok {
		return id
	}
	id := uint32(len(r.funcs))
	r.funcs[name] = id
	r.b.FuncName(r.rank, id, name)
	return id
}

func skipMeta(a string) bool {
	for _, p := range []string{"event.", "cali.snapshot.", "cali.lvl.", "offs.", "time.", "cali.event."} {
		if strings.HasPrefix(a, p) {
			return true
		}
	}
	return false
}

func (r *reader) snapshot(rec cali.Record, globals bool) error {
	es, err := r.tree.Entries(rec, nil)
	if err != nil {
		return err
	}
	// Rank, thread, time.
	tkey := ""
	var offset, incl uint64
	hasOffset, hasIncl := false, false
	for _, e := range es {
		switch e.Attr {
		case "mpi.rank":
			if !r.rankSet && !r.started {
				if v, err := strconv.ParseUint(e.Value, 10, 32); err == nil {
					r.rank, r.rankSet = uint32(v), true
				}
			}
		case "thread.id", "omp.thread.num", "pthread.id":
			if tkey == "" {
				tkey = e.Value
			}
		case "time.offset":
			if v, ok := num(e.Value); ok {
				offset, hasOffset = v, true
			}
		case "time.offset.ns":
			if v, ok := num(e.Value); ok {
				offset, hasOffset = (v+500)/1000, true
			}
		case "time.inclusive.duration":
			if v, ok := num(e.Value); ok {
				incl, hasIncl = v, true
			}
		case "time.inclusive.duration.ns":
			if v, ok := num(e.Value); ok {
				incl, hasIncl = (v+500)/1000, true
			}
		}
	}
	if globals {
		// Kept for the first snapshot, which fixes the rank.
		r.globals = append(r.globals, es...)
		return nil
	}
	r.b.Read(1)
	tid, ok := r.threads[tkey]
	if !ok {
		tid = uint32(len(r.threads))
		r.threads[tkey] = tid
		r.th = append(r.th, &thread{})
	}
	th := r.th[tid]
	for _, e := range r.globals {
		r.b.Meta(r.rank, 0, e.Attr, e.Value)
	}
	r.globals = r.globals[:0]
	for _, e := range es {
		if !skipMeta(e.Attr) && !r.regions[e.Attr] {
			r.b.Meta(r.rank, tid, e.Attr, e.Value)
		}
	}
	now := th.clock
	if hasOffset {
		now = offset
	}
	for _, e := range es {
		var op string
		var attr string
		for _, p := range []string{"event.begin#", "event.end#", "event.set#"} {
			if a, ok := strings.CutPrefix(e.Attr, p); ok {
				op, attr = p, a
			}
		}
		switch op {
		case "event.begin#":
			if err := r.begin(th, tid, attr, e.Value, now); err != nil {
				return err
			}
		case "event.end#":
			if err := r.end(th, tid, attr, e.Value, now, hasOffset, incl, hasIncl, true); err != nil {
				return err
			}
		case "event.set#":
			if err := r.end(th, tid, attr, e.Value, now, hasOffset, incl, hasIncl, false); err != nil {
				return err
			}
			if err := r.begin(th, tid, attr, e.Value, th.clock); err != nil {
				return err
			}
		}
	}
	return nil
}

func num(s string) (uint64, bool) {
	if v, err := strconv.ParseUint(s, 10, 64); err == nil {
		return v, true
	}
	if v, err := strconv.ParseFloat(s, 64); err == nil && v >= 0 && v < 1e18 {
		return uint64(v + 0.5), true
	}
	return 0, false
}

func (r *reader) begin(th *thread, tid uint32, attr, value string, ts uint64) error {
	ts = max(ts, th.clock)
	th.clock = ts
	r.started = true
	fid := r.fid(attr, value)
	th.open = append(th.open, regionOpen{attr, value, fid, ts})
	r.maxTS = max(r.maxTS, ts)
	if err := r.b.Enter(r.rank, tid, fid, ts); err != nil {
		return err
	}
	if r.iters[attr] {
		if v, err := strconv.ParseUint(value, 10, 64); err == nil {
			cid, ok := r.iterCID[attr]
			if !ok {
				cid = uint32(len(r.iterCID))
				r.iterCID[attr] = cid
				r.b.CounterName(r.rank, cid, attr)
			}
			return r.b.Counter(r.rank, tid, cid, v, ts)
		}
	}
	return nil
}

// end closes the innermost open region of attr (if any); an end (not a
// set) that finds none is counted as a loss.
func (r *reader) end(th *thread, tid uint32, attr, value string, now uint64, hasOffset bool, incl uint64, hasIncl bool, isEnd bool) error {
	i := len(th.open) - 1
	for i >= 0 && th.open[i].attr != attr {
		i--
	}
	if i < 0 {
		if isEnd {
			r.b.Lose(steps.LossEndWithoutBegin, 1, func() string {
				return fmt.Sprintf("%s: event.end#%s=%s at %d µs on thread %d with no open %s (dropped)", r.name, attr, value, now, tid, attr)
			})
		}
		return nil
	}
	o := th.open[i]
	th.open = append(th.open[:i], th.open[i+1:]...)
	ts := now
	if !hasOffset && hasIncl {
		ts = o.entry + incl
	}
	ts = max(ts, th.clock)
	th.clock = ts
	r.maxTS = max(r.maxTS, ts)
	return r.b.Exit(r.rank, tid, o.fid, ts)
}

// ReadFile reads one .cali stream as rank into b. It does not finish b.
func ReadFile(ctx context.Context, in io.Reader, name string, rank uint32, b *steps.Builder) error {
	r := &reader{name: name, b: b, rank: rank, tree: cali.NewTree(),
		regions: map[string]bool{}, iters: map[string]bool{}, iterCID: map[string]uint32{}, funcs: map[string]uint32{}, threads: map[string]uint32{}}
	br := bufio.NewReaderSize(in, 64<<10)
	var offset int64
	for line := 1; ; line++ {
		if line&0x3FF == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		s, err := br.ReadString('\n')
		if err == io.EOF && s == "" {
			// Globals written after the last snapshot (Caliper writes them
			// at the end) go into the rank's last frame.
			for _, e := range r.globals {
				b.Meta(r.rank, 0, e.Attr, e.Value)
			}
			return nil
		}
		fail := func(e error) error {
			if r.maxTS > 0 {
				if aerr := b.Advance(r.maxTS); aerr != nil {
					return aerr
				}
			}
			return fmt.Errorf("%s:%d (byte offset %d): %w (%w; steps before io_step %d were emitted)", name, line, offset, e, steps.ErrStopped, b.CompleteSteps())
		}
		if err == io.EOF {
			return fail(errors.New("last line has no newline: the file is truncated"))
		}
		if err != nil {
			return fail(err)
		}
		text := strings.TrimRight(s, "\r\n")
		if text != "" {
			rec, perr := cali.ParseRecord(text)
			if perr == nil {
				switch rec.Kind() {
				case "node":
					perr = r.node(rec)
				case "ctx":
					perr = r.snapshot(rec, false)
				case "globals":
					perr = r.snapshot(rec, true)
				}
			}
			if perr != nil {
				return fail(perr)
			}
		}
		offset += int64(len(s))
	}
}

// Read reads the .cali files, one rank each (mpi.rank when the file has it,
// else its position), and finishes b.
func Read(ctx context.Context, paths []string, b *steps.Builder) error {
	if len(paths) == 0 {
		return errors.New("caliper: no files given")
	}
	b.SetOrigin(0)
	for i, p := range paths {
		fh, err := os.Open(p)
		if err != nil {
			return fmt.Errorf("caliper: %w", err)
		}
		err = ReadFile(ctx, fh, p, uint32(i), b)
		fh.Close()
		if err != nil {
			return err
		}
	}
	return b.Finish()
}
