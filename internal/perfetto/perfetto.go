// Package perfetto turns provenance records into a timeline Perfetto (and
// chrome://tracing) opens: the Chrome trace event format, JSON.
//
// Each record holds its execution's call stack and an event window of the
// executions and messages around it on its thread, with entry and exit
// timestamps on the run's clock (µs). A Timeline gathers the records given
// to it and writes, once each, every execution their windows and call
// stacks hold:
//
//   - one process per rank, named "rank N" (pid N+1: Perfetto keeps pid 0
//     for the idle process), one thread per thread and per GPU queue of the
//     rank;
//   - an execution is a complete event ("X") on its thread; executions nest
//     as their call stacks do, an execution whose exit no record saw ending
//     with the last of its children (args.exit_recorded false);
//   - a message is a zero-length slice (cat "message") at its timestamp on
//     the thread whose execution sent or received it; a send and the
//     receive it pairs with are joined by a flow (bind_id, flow_out on the
//     send, flow_in on the receive);
//   - an anomaly is its execution's slice (args.anomaly, the score and the
//     explanation) and an instant event ("i", thread scope) at its entry;
//   - a counter sample is a counter event ("C"), one track per counter and
//     thread of a rank;
//   - a GPU execution is on its queue's thread (cat kernel, gpu_memcpy or
//     gpu_memset, with args.device, stream and context), joined to the CPU
//     execution that launched it by a flow when both are in the timeline.
//
// The output is ordered (by thread, then by time, longer slices first) and
// deterministic: the same records give the same bytes.
package perfetto

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/replay/steps"
)

// Categories of the slices written.
const (
	CatFunction = "function" // a CPU execution
	CatMessage  = "message"  // a message sent or received
	CatAnomaly  = "anomaly"  // the instant marking an anomaly
	CatCounter  = "counter"  // a counter sample
)

// Options choose what a Timeline keeps of the records given to it.
type Options struct {
	// From and To, when To is not 0, keep only the executions that overlap
	// [From, To] (µs), with their callers, and the messages and counter
	// samples inside it.
	From, To uint64
}

// Stats counts what a timeline holds.
type Stats struct {
	Records    int // records given (anomalies and normal executions)
	Anomalies  int // executions written flagged as anomalies
	Executions int // executions written
	NoExit     int // executions whose exit no record saw
	Messages   int // messages written (sends and receives)
	Flows      int // sends paired with their receive
	Launches   int // GPU executions joined to their launch
	Counters   int // counter samples written
	Ranks      int // processes
	Threads    int // threads and GPU queues
	Events     int // trace events written, metadata included
	// Conflicts counts executions that two records give different times or
	// functions (the first one given is kept).
	Conflicts int
}

type threadKey struct {
	pid, rank, tid uint32
}

type execKey struct {
	th threadKey
	id string
}

type gpuLoc struct {
	device, stream, context uint32
}

type record struct {
	kind        provenance.Kind
	score       float64
	step        uint64
	explanation string
}

type exec struct {
	th          threadKey
	id          string
	parent      string // "" when unknown
	entry, exit uint64 // exit 0: not seen
	end         uint64 // the slice's end
	fid         uint32
	fn          string
	anomaly     bool
	rec         *record
	keep        bool
	depth       int
	step, idx   uint64 // from the event id, when idOK
	idOK        bool
	launch      *execKey // the CPU execution that launched this GPU one
	flow        uint64   // bind id of the launch flow
	flowOut     bool
}

type message struct {
	th            threadKey
	send          bool
	src, tar, tag uint32
	bytes, ts     uint64
	exec          string
	flow          uint64
}

type counter struct {
	th    threadKey
	name  string
	ts    uint64
	value uint64
}

// Timeline gathers records and writes them as a trace. Not safe for
// concurrent use.
type Timeline struct {
	opt      Options
	execs    map[execKey]*exec
	msgs     map[message]bool
	ctrs     map[counter]bool
	gpu      map[threadKey]gpuLoc
	stats    Stats
	programs map[uint32]bool
}

// New returns an empty timeline.
func New(opt Options) *Timeline {
	return &Timeline{opt: opt, execs: map[execKey]*exec{}, msgs: map[message]bool{}, ctrs: map[counter]bool{},
		gpu: map[threadKey]gpuLoc{}, programs: map[uint32]bool{}}
}

// Add gathers record e of kind (anomalies or normal executions): its call
// stack, its event window and its counter samples. Executions and
// messages already gathered from another record are kept once.
func (t *Timeline) Add(kind provenance.Kind, e *provenance.Exec) {
	t.stats.Records++
	th := threadKey{e.PID, e.RID, e.TID}
	t.programs[e.PID] = true
	if e.IsGPUEvent && e.GPULocation != nil {
		t.gpu[th] = gpuLoc{e.GPULocation.Device, e.GPULocation.Stream, e.GPULocation.Context}
	}
	for i, f := range e.CallStack {
		parent := ""
		if i+1 < len(e.CallStack) {
			parent = e.CallStack[i+1].EventID
		}
		t.exec(th, f.EventID, parent, f.Entry, f.Exit, f.FID, f.Func, f.IsAnomaly)
	}
	for _, w := range e.EventWindow.ExecWindow {
		parent := w.ParentEventID
		if parent == "root" {
			parent = ""
		}
		t.exec(th, w.EventID, parent, w.Entry, w.Exit, w.FID, w.Func, w.IsAnomaly)
	}
	x := t.exec(th, e.EventID, "", e.Entry, e.Exit, e.FID, e.Func, kind == provenance.KindAnomalies)
	if x.rec == nil || kind == provenance.KindAnomalies {
		r := &record{kind: kind, score: e.OutlierScore, step: e.IOStep}
		if e.Explanation != nil {
			r.explanation = e.Explanation.Text
		}
		x.rec = r
	}
	if e.GPUParent != nil && e.GPUParent.EventID != "" {
		x.launch = &execKey{threadKey{e.PID, e.RID, e.GPUParent.TID}, e.GPUParent.EventID}
	}
	for _, c := range e.EventWindow.CommWindow {
		m := message{th: threadKey{c.PID, c.RID, c.TID}, send: c.Type == "SEND", src: c.Src, tar: c.Tar, tag: c.Tag,
			bytes: c.Bytes, ts: c.Timestamp, exec: c.ExecdataKey}
		t.msgs[m] = true
	}
	for _, c := range e.CounterEvents {
		if c.CounterName == steps.CorrelationCounter {
			continue // a link between a launch and its GPU execution, not a measurement
		}
		t.ctrs[counter{th: threadKey{c.PID, c.RID, c.TID}, name: c.CounterName, ts: c.TS, value: c.CounterValue}] = true
	}
}

// exec records one execution, merging it with what other records said.
func (t *Timeline) exec(th threadKey, id, parent string, entry, exit uint64, fid uint32, fn string, anomaly bool) *exec {
	k := execKey{th, id}
	x := t.execs[k]
	if x == nil {
		x = &exec{th: th, id: id, parent: parent, entry: entry, exit: exit, fid: fid, fn: fn, anomaly: anomaly}
		_, step, idx, err := provenance.ParseEventID(id)
		x.step, x.idx, x.idOK = step, idx, err == nil
		t.execs[k] = x
		return x
	}
	if x.entry != entry || x.fn != fn || (exit != 0 && x.exit != 0 && x.exit != exit) {
		t.stats.Conflicts++
		return x
	}
	if x.exit == 0 {
		x.exit = exit
	}
	if x.parent == "" {
		x.parent = parent
	}
	x.anomaly = x.anomaly || anomaly
	return x
}

// settle chooses the executions kept, their ends and depths.
func (t *Timeline) settle() []*exec {
	all := slices.Collect(maps.Values(t.execs))
	// Children before parents: a parent enters no later than its child.
	slices.SortFunc(all, func(a, b *exec) int {
		return cmp.Or(cmp.Compare(b.entry, a.entry), strings.Compare(a.id, b.id))
	})
	parentOf := func(x *exec) *exec {
		if x.parent == "" {
			return nil
		}
		p := t.execs[execKey{x.th, x.parent}]
		if p == x {
			return nil
		}
		return p
	}
	ranged := t.opt.To != 0
	for _, x := range all {
		x.keep = !ranged || (x.entry <= t.opt.To && (x.exit == 0 || x.exit >= t.opt.From))
	}
	// Callers of kept executions are kept; ends of unknown exits reach the
	// last end among their children. Propagated up the stacks to a fixed
	// point (parents and children can share an entry).
	for _, x := range all {
		x.end = max(x.entry, x.exit)
	}
	for changed := true; changed; {
		changed = false
		for _, x := range all {
			p := parentOf(x)
			if p == nil {
				continue
			}
			if x.keep && !p.keep {
				p.keep, changed = true, true
			}
			if p.exit == 0 && x.end > p.end {
				p.end, changed = x.end, true
			}
		}
	}
	var out []*exec
	for _, x := range all {
		if x.keep {
			out = append(out, x)
		}
	}
	// Depths and clamping, parents first.
	slices.Reverse(out)
	for _, x := range out {
		if p := parentOf(x); p != nil {
			x.depth = p.depth + 1
			if x.exit == 0 && x.end > p.end {
				x.end = max(x.entry, p.end)
			}
		}
	}
	return out
}

// Write writes the timeline as a Chrome JSON trace to w.
func (t *Timeline) Write(w io.Writer) (Stats, error) {
	st := t.stats
	execs := t.settle()
	threads := map[threadKey]bool{}
	for _, x := range execs {
		threads[x.th] = true
	}
	kept := func(k execKey) *exec {
		if x := t.execs[k]; x != nil && x.keep {
			return x
		}
		return nil
	}
	inRange := func(ts uint64) bool { return t.opt.To == 0 || (ts >= t.opt.From && ts <= t.opt.To) }
	// Messages of kept executions, sends paired with receives.
	var msgs []*message
	for m := range t.msgs {
		if kept(execKey{m.th, m.exec}) == nil || !inRange(m.ts) {
			continue
		}
		c := m
		msgs = append(msgs, &c)
		threads[m.th] = true
	}
	slices.SortFunc(msgs, func(a, b *message) int {
		return cmp.Or(cmp.Compare(a.ts, b.ts), cmpThread(a.th, b.th), cmpBool(a.send, b.send),
			cmp.Compare(a.src, b.src), cmp.Compare(a.tar, b.tar), cmp.Compare(a.tag, b.tag),
			cmp.Compare(a.bytes, b.bytes), strings.Compare(a.exec, b.exec))
	})
	var flow uint64
	st.Flows = pair(msgs, &flow)
	st.Messages = len(msgs)
	// Launch flows.
	for _, x := range execs {
		if x.launch == nil {
			continue
		}
		// A slice binds one flow: a launch (or GPU execution) already
		// joined to another keeps that one.
		if l := kept(*x.launch); l != nil && l != x && l.flow == 0 && x.flow == 0 {
			flow++
			l.flow, l.flowOut, x.flow = flow, true, flow
			st.Launches++
		}
	}
	var ctrs []counter
	for c := range t.ctrs {
		if inRange(c.ts) {
			ctrs = append(ctrs, c)
			threads[c.th] = true
		}
	}
	slices.SortFunc(ctrs, func(a, b counter) int {
		return cmp.Or(cmpThread(a.th, b.th), strings.Compare(a.name, b.name), cmp.Compare(a.ts, b.ts), cmp.Compare(a.value, b.value))
	})
	st.Counters = len(ctrs)

	ids, err := t.assignIDs(threads)
	if err != nil {
		return st, err
	}
	ew := &eventWriter{w: bufio.NewWriterSize(w, 1<<20)}
	ew.raw(`{"otherData":{"producer":"kipimo export perfetto","clock":"trace time, µs, common to all ranks"},"traceEvents":[`)
	// Metadata: process and thread names and their order.
	procs := map[uint32]bool{}
	for _, th := range slices.SortedFunc(maps.Keys(threads), cmpThread) {
		id := ids[th]
		if !procs[id.pid] {
			procs[id.pid] = true
			st.Ranks++
			ew.event(event{Ph: "M", Name: "process_name", Pid: id.pid, Tid: id.tid0, Args: map[string]any{"name": t.procName(th)}})
			ew.event(event{Ph: "M", Name: "process_sort_index", Pid: id.pid, Tid: id.tid0, Args: map[string]any{"sort_index": id.pid}})
		}
		st.Threads++
		ew.event(event{Ph: "M", Name: "thread_name", Pid: id.pid, Tid: id.tid, Args: map[string]any{"name": t.threadName(th)}})
		ew.event(event{Ph: "M", Name: "thread_sort_index", Pid: id.pid, Tid: id.tid, Args: map[string]any{"sort_index": id.tid}})
	}
	// Slices, thread by thread in time order, longer (outer) ones first.
	type item struct {
		ts, dur uint64
		depth   int
		x       *exec
		m       *message
	}
	byThread := map[threadKey][]item{}
	for _, x := range execs {
		byThread[x.th] = append(byThread[x.th], item{ts: x.entry, dur: x.end - x.entry, depth: x.depth, x: x})
	}
	for _, m := range msgs {
		byThread[m.th] = append(byThread[m.th], item{ts: m.ts, m: m})
	}
	for _, th := range slices.SortedFunc(maps.Keys(byThread), cmpThread) {
		items := byThread[th]
		// At equal times executions go in the order they entered (a
		// caller before its callee, a call that took no time before the
		// next one), then messages.
		slices.SortFunc(items, func(a, b item) int {
			if r := cmp.Compare(a.ts, b.ts); r != 0 {
				return r
			}
			switch {
			case a.x != nil && b.x != nil:
				return cmp.Or(cmpEntered(a.x, b.x), cmp.Compare(b.dur, a.dur), cmp.Compare(a.depth, b.depth), strings.Compare(a.x.id, b.x.id))
			case a.m != nil && b.m != nil:
				return cmp.Or(cmpBool(a.m.send, b.m.send), cmp.Compare(a.m.flow, b.m.flow), cmp.Compare(a.m.src, b.m.src), cmp.Compare(a.m.tar, b.m.tar))
			case a.x != nil:
				return -1
			}
			return 1
		})
		id := ids[th]
		gl, gpu := t.gpu[th]
		for _, it := range items {
			if it.m != nil {
				ew.event(messageEvent(it.m, id))
				continue
			}
			x := it.x
			st.Executions++
			ev := event{Ph: "X", Name: x.fn, Cat: CatFunction, Pid: id.pid, Tid: id.tid, Ts: ptr(x.entry), Dur: ptr(it.dur)}
			args := map[string]any{"event_id": x.id, "fid": x.fid}
			if x.parent != "" {
				args["parent"] = x.parent
			}
			if x.exit == 0 {
				args["exit_recorded"] = false
				st.NoExit++
			}
			if gpu {
				ev.Cat = gpuCat(x.fn)
				args["device"], args["stream"], args["context"] = gl.device, gl.stream, gl.context
			}
			if x.anomaly {
				args["anomaly"] = true
				st.Anomalies++
			}
			if r := x.rec; r != nil {
				args["record"] = string(r.kind)
				args["io_step"] = r.step
				args["outlier_score"] = r.score
				if r.explanation != "" {
					args["explanation"] = r.explanation
				}
			}
			if x.flow != 0 {
				ev.BindID = strconv.FormatUint(x.flow, 16)
				if x.flowOut {
					ev.FlowOut = true
				} else {
					ev.FlowIn = true
				}
			}
			ev.Args = args
			ew.event(ev)
			if x.anomaly {
				a := map[string]any{"event_id": x.id}
				if r := x.rec; r != nil {
					a["outlier_score"] = r.score
					if r.explanation != "" {
						a["explanation"] = r.explanation
					}
				}
				ew.event(event{Ph: "i", S: "t", Name: "anomaly: " + x.fn, Cat: CatAnomaly, Pid: id.pid, Tid: id.tid, Ts: ptr(x.entry), Args: a})
			}
		}
	}
	for _, c := range ctrs {
		id := ids[c.th]
		ew.event(event{Ph: "C", Name: c.name, Cat: CatCounter, Pid: id.pid, Tid: id.tid, Ts: ptr(c.ts),
			Args: map[string]any{t.threadName(c.th): c.value}})
	}
	ew.raw("]}\n")
	st.Events = ew.n
	if ew.err != nil {
		return st, ew.err
	}
	return st, ew.w.Flush()
}

// pair joins each receive with the earliest unpaired send of the same
// sender, receiver, tag and size that precedes it (MPI delivers the
// messages of one sender, receiver and tag in order), giving both a flow
// id. msgs is in time order. It returns the number of pairs.
func pair(msgs []*message, flow *uint64) int {
	type key struct {
		src, tar, tag uint32
		bytes         uint64
	}
	sends := map[key][]*message{}
	n := 0
	for _, m := range msgs {
		k := key{m.src, m.tar, m.tag, m.bytes}
		if m.send {
			sends[k] = append(sends[k], m)
			continue
		}
		q := sends[k]
		if len(q) == 0 {
			continue
		}
		s := q[0]
		sends[k] = q[1:]
		*flow++
		s.flow, m.flow = *flow, *flow
		n++
	}
	return n
}

func messageEvent(m *message, id traceIDs) event {
	ev := event{Ph: "X", Cat: CatMessage, Pid: id.pid, Tid: id.tid, Ts: ptr(m.ts), Dur: ptr(uint64(0)),
		Args: map[string]any{"src": m.src, "tar": m.tar, "tag": m.tag, "bytes": m.bytes, "exec": m.exec}}
	if m.send {
		ev.Name = fmt.Sprintf("send to rank %d", m.tar)
		ev.Args["type"] = "SEND"
	} else {
		ev.Name = fmt.Sprintf("receive from rank %d", m.src)
		ev.Args["type"] = "RECV"
	}
	if m.flow != 0 {
		ev.BindID = strconv.FormatUint(m.flow, 16)
		ev.FlowOut, ev.FlowIn = m.send, !m.send
	} else {
		ev.Args["paired"] = false
	}
	return ev
}

// cmpEntered orders executions of a thread by when they entered, as
// their event ids "<rank>:<io_step>:<idx>" number them (idx counts the
// events of the step in time order); 0 when either id is not one.
func cmpEntered(a, b *exec) int {
	if !a.idOK || !b.idOK {
		return 0
	}
	return cmp.Or(cmp.Compare(a.step, b.step), cmp.Compare(a.idx, b.idx))
}

// gpuCat is the category of a GPU execution, as profilers name them.
func gpuCat(fn string) string {
	l := strings.ToLower(fn)
	switch {
	case strings.Contains(l, "memcpy") || strings.Contains(l, "memory copy"):
		return "gpu_memcpy"
	case strings.Contains(l, "memset"):
		return "gpu_memset"
	}
	return "kernel"
}

type traceIDs struct {
	pid, tid, tid0 uint32
}

// assignIDs numbers processes (rank + 1, programs after the first apart by
// 65536) and threads (unique in the trace: process × a power of ten
// above the process's thread count, + the thread's place, CPU threads
// first).
func (t *Timeline) assignIDs(threads map[threadKey]bool) (map[threadKey]traceIDs, error) {
	byProc := map[[2]uint32][]threadKey{}
	for th := range threads {
		p := [2]uint32{th.pid, th.rank}
		byProc[p] = append(byProc[p], th)
	}
	mult := uint64(1000)
	for _, ths := range byProc {
		for uint64(len(ths)) >= mult {
			mult *= 10
		}
	}
	out := map[threadKey]traceIDs{}
	for p, ths := range byProc {
		pid := uint64(p[0])<<16 + uint64(p[1]) + 1
		if pid*mult+mult > 1<<31 {
			return nil, fmt.Errorf("program %d rank %d: too many ranks or threads for one trace; export fewer ranks (--ranks)", p[0], p[1])
		}
		slices.SortFunc(ths, func(a, b threadKey) int {
			_, ga := t.gpu[a]
			_, gb := t.gpu[b]
			return cmp.Or(cmpBool(ga, gb), cmp.Compare(a.tid, b.tid))
		})
		for i, th := range ths {
			out[th] = traceIDs{pid: uint32(pid), tid: uint32(pid*mult + uint64(i)), tid0: uint32(pid * mult)}
		}
	}
	return out, nil
}

func (t *Timeline) procName(th threadKey) string {
	if len(t.programs) > 1 || th.pid != 0 {
		return fmt.Sprintf("program %d rank %d", th.pid, th.rank)
	}
	return fmt.Sprintf("rank %d", th.rank)
}

// threadName names a thread "thread T", a GPU queue "GPU D stream S
// (thread T)".
func (t *Timeline) threadName(th threadKey) string {
	if g, ok := t.gpu[th]; ok {
		return fmt.Sprintf("GPU %d stream %d (thread %d)", g.device, g.stream, th.tid)
	}
	return fmt.Sprintf("thread %d", th.tid)
}

func cmpThread(a, b threadKey) int {
	return cmp.Or(cmp.Compare(a.pid, b.pid), cmp.Compare(a.rank, b.rank), cmp.Compare(a.tid, b.tid))
}

// cmpBool orders false before true.
func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case !a:
		return -1
	}
	return 1
}

func ptr[T any](v T) *T { return &v }

// event is one trace event as the Chrome trace event format spells it.
type event struct {
	Name    string         `json:"name"`
	Cat     string         `json:"cat,omitempty"`
	Ph      string         `json:"ph"`
	Ts      *uint64        `json:"ts,omitempty"`
	Dur     *uint64        `json:"dur,omitempty"`
	Pid     uint32         `json:"pid"`
	Tid     uint32         `json:"tid"`
	S       string         `json:"s,omitempty"`
	BindID  string         `json:"bind_id,omitempty"`
	FlowOut bool           `json:"flow_out,omitempty"`
	FlowIn  bool           `json:"flow_in,omitempty"`
	Args    map[string]any `json:"args,omitempty"`
}

// eventWriter writes events separated by commas, one per line, keeping
// the first error.
type eventWriter struct {
	w   *bufio.Writer
	n   int
	err error
}

func (e *eventWriter) raw(s string) {
	if e.err == nil {
		_, e.err = e.w.WriteString(s)
	}
}

func (e *eventWriter) event(ev event) {
	if e.err != nil {
		return
	}
	b, err := json.Marshal(ev)
	if err != nil {
		e.err = err
		return
	}
	if e.n > 0 {
		e.raw(",")
	}
	e.raw("\n")
	if e.err == nil {
		_, e.err = e.w.Write(b)
	}
	e.n++
}
