// Package chrome reads Chrome trace event format / Perfetto JSON traces, plain
// or gzipped (what PyTorch's profiler, Chrome and many tools export), as frames.
//
// The JSON is walked token by token: events are decoded one at a time from the
// traceEvents array into compact spans (names interned), so a trace costs a few
// dozen bytes per event in memory, not a tree of Go maps. Each file is one rank
// (its distributedInfo.rank when every file has a distinct one, else its
// position on the command line); each (pid, tid) of the file is one thread.
//
// Complete events ("X") and matched begin/end pairs ("B"/"E") become function
// entry/exit pairs; a span that overlaps its parent's end is cut at that end so
// every thread's calls nest. GPU events (cat kernel, gpu_memcpy, gpu_memset,
// gpu_user_annotation) put their (pid, tid) on a GPU virtual thread with
// metadata "<API> Context", "<API> Device" and "<API> Stream" (API is ROCm when
// the trace launches with hip*, else CUDA; values from args.context,
// args.device, args.stream, else 0, pid and tid). A GPU event and its CPU
// launch share a correlation id (args.correlation, or the id of the ac2g flow
// whose "f" end binds to the GPU event and whose "s" start lies inside the
// launch; flows without a start are tolerated): both get a "Correlation ID"
// counter sample at their entry, the detector's link. Only launches whose GPU
// side is in the trace get one.
package chrome

import (
	"bufio"
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/kipimo-hpc/kipimo/internal/replay/steps"
)

type args struct {
	Correlation json.RawMessage `json:"correlation"`
	Device      json.RawMessage `json:"device"`
	Stream      json.RawMessage `json:"stream"`
	Context     json.RawMessage `json:"context"`
	Name        json.RawMessage `json:"name"`
}

type event struct {
	Ph   string          `json:"ph"`
	Cat  string          `json:"cat"`
	Name string          `json:"name"`
	Pid  json.RawMessage `json:"pid"`
	Tid  json.RawMessage `json:"tid"`
	Ts   float64         `json:"ts"`
	Dur  float64         `json:"dur"`
	ID   json.RawMessage `json:"id"`
	Bp   string          `json:"bp"`
	Args args            `json:"args"`
	// rawArgs is the args object as read (valid while the event is added).
	rawArgs []byte
	// badTime describes a ts or dur that is not a number.
	badTime string
}

// span is one completed call.
type span struct {
	start, end float64 // µs
	name       uint32
	thread     uint32
	order      uint32
	corr       int64
	hasCorr    bool
	launch     bool // a CPU runtime call that may launch GPU work
	device     bool // a GPU execution (kernel, copy, set, annotation)
}

type flow struct {
	thread uint32
	ts     float64
	id     int64
}

type threadInfo struct {
	pid, tid                string
	gpu                     bool
	api                     string // GPU API of a device thread; "" for the file's CUDA or ROCm
	accel                   string // the accelerator of an API "GPU" thread (MTIA)
	device, stream, context string
	name                    string
}

// edge is a begin or end event (B/E, async b/e, S/F), matched once the
// whole file is read, in time order per thread as Chrome does.
type edge struct {
	ts     float64
	thread uint32
	name   uint32
	order  uint32
	end    bool
	named  bool // an end event that names what it ends
}

// sample is one counter value (a "C" event's numeric arg).
type sample struct {
	ts     float64
	thread uint32
	cid    uint32
	value  uint64
}

// File is one parsed trace.
type File struct {
	Name     string
	Rank     int // distributedInfo.rank, or -1
	names    []string
	nameIdx  map[string]uint32
	cnames   []string
	cnameIdx map[string]uint32
	threads  []*threadInfo
	thIdx    map[string]uint32
	spans    []span
	edges    []edge
	samples  []sample
	flowS    []flow
	flowF    []flow
	procName string
	hip      bool
	maxStart float64
	minTS    float64
	hasTS    bool
	events   int // trace event objects read
	settled  bool
	losses   steps.Losses
	// Err is set when the file was damaged; the spans before it are kept.
	Err error
}

// Categories of accelerator work (PyTorch profiler / Kineto activity
// types): device-side events, with the API their threads are marked with
// ("" is the file's CUDA or ROCm), and the host-side runtime calls that
// launch them.
var (
	deviceCats = map[string]string{
		"kernel": "", "gpu_memcpy": "", "gpu_memset": "", "gpu_user_annotation": "", "cuda_profiler_range": "",
		"mtia_ccp_events": "GPU", "mtia_insight": "GPU",
	}
	launchCats = map[string]bool{
		"cuda_runtime": true, "cuda_driver": true, "mtia_runtime": true, "xpu_runtime": true,
		"privateuse1_runtime": true, "privateuse1_driver": true,
	}
)

// accelerator names the device of an API "GPU" thread by its category.
func accelerator(cat string) string {
	if strings.HasPrefix(cat, "mtia_") {
		return "MTIA"
	}
	return "accelerator"
}

func (f *File) intern(s string) uint32 {
	if i, ok := f.nameIdx[s]; ok {
		return i
	}
	i := uint32(len(f.names))
	f.names = append(f.names, strings.ToValidUTF8(s, "\uFFFD"))
	f.nameIdx[s] = i
	return i
}

func (f *File) internCounter(s string) uint32 {
	if i, ok := f.cnameIdx[s]; ok {
		return i
	}
	i := uint32(len(f.cnames))
	f.cnames = append(f.cnames, strings.ToValidUTF8(s, "\uFFFD"))
	f.cnameIdx[s] = i
	return i
}

func rawString(r json.RawMessage) string {
	r = bytes.TrimSpace(r)
	if len(r) > 0 && r[0] == '"' {
		var s string
		if json.Unmarshal(r, &s) == nil {
			return s
		}
	}
	return string(r)
}

func rawInt(r json.RawMessage) (int64, bool) {
	s := rawString(r)
	if s == "" {
		return 0, false
	}
	if v, err := strconv.ParseInt(s, 10, 64); err == nil {
		return v, true
	}
	if v, err := strconv.ParseFloat(s, 64); err == nil && v == math.Trunc(v) && math.Abs(v) < 1<<62 {
		return int64(v), true
	}
	return 0, false
}

func (f *File) threadKey(p, t string) uint32 {
	k := p + "\x00" + t
	if i, ok := f.thIdx[k]; ok {
		return i
	}
	i := uint32(len(f.threads))
	f.threads = append(f.threads, &threadInfo{pid: p, tid: t})
	f.thIdx[k] = i
	return i
}

func (f *File) thread(pid, tid json.RawMessage) uint32 {
	return f.threadKey(rawString(pid), rawString(tid))
}

// asyncThread is the virtual thread of the async spans of one id: async
// spans of an id nest among themselves but not with the thread's calls.
func (f *File) asyncThread(e *event) uint32 {
	pid, id := rawString(e.Pid), rawString(e.ID)
	th := f.threadKey(pid, "async "+e.Cat+" "+id)
	if ti := f.threads[th]; ti.name == "" {
		ti.name = "async " + e.Cat + " " + id
	}
	return th
}

func (f *File) note(ts float64) {
	if !f.hasTS || ts < f.minTS {
		f.minTS, f.hasTS = ts, true
	}
	if ts > f.maxStart {
		f.maxStart = ts
	}
}

// lose counts one loss of kind, describing e when it is the first.
func (f *File) lose(kind string, e *event, why string) {
	ex := ""
	if f.losses.Count(kind) == 0 {
		ex = fmt.Sprintf("ph %q %q at ts %s on pid %s tid %s", e.Ph, e.Name, fmtTS(e.Ts), rawString(e.Pid), rawString(e.Tid))
		if why != "" {
			ex += " (" + why + ")"
		}
	}
	f.losses.Add(kind, 1, ex)
}

// maxTime bounds timestamps and durations (µs): about 3,000 years.
const maxTime = 1e17

func (f *File) add(e *event) error {
	f.events++
	if e.Ph == "M" {
		f.meta(e)
		return nil
	}
	if e.badTime != "" {
		f.lose(steps.LossBadTime, e, e.badTime+" is not a number")
		return nil
	}
	if math.IsNaN(e.Ts) || e.Ts < 0 || e.Ts > maxTime || math.IsNaN(e.Dur) || e.Dur < 0 || e.Dur > maxTime {
		f.lose(steps.LossBadTime, e, fmt.Sprintf("dur %v", e.Dur))
		return nil
	}
	switch e.Ph {
	case "X":
		th := f.thread(e.Pid, e.Tid)
		s := span{start: e.Ts, end: e.Ts + e.Dur, name: f.intern(e.Name), thread: th, order: uint32(len(f.spans))}
		s.corr, s.hasCorr = rawInt(e.Args.Correlation)
		if api, ok := deviceCats[e.Cat]; ok {
			s.device = true
			ti := f.threads[th]
			if !ti.gpu {
				ti.gpu, ti.api = true, api
				ti.device, ti.stream, ti.context = rawString(e.Args.Device), rawString(e.Args.Stream), rawString(e.Args.Context)
				if ti.device == "" {
					ti.device = ti.pid
				}
				if ti.stream == "" {
					ti.stream = ti.tid
				}
				if ti.context == "" {
					ti.context = "0"
				}
				if api != "" {
					ti.accel = accelerator(e.Cat)
				}
			}
		} else if launchCats[e.Cat] {
			s.launch = true
			if strings.HasPrefix(e.Name, "hip") {
				f.hip = true
			}
		}
		f.note(e.Ts)
		f.spans = append(f.spans, s)
	case "B", "E":
		f.note(e.Ts)
		f.edges = append(f.edges, edge{ts: e.Ts, thread: f.thread(e.Pid, e.Tid), name: f.intern(e.Name), order: uint32(len(f.edges)), end: e.Ph == "E"})
	case "b", "e", "S", "F":
		if e.ID == nil {
			f.lose(steps.LossUnsupported, e, "async event without an id")
			return nil
		}
		f.note(e.Ts)
		end := e.Ph == "e" || e.Ph == "F"
		f.edges = append(f.edges, edge{ts: e.Ts, thread: f.asyncThread(e), name: f.intern(e.Name), order: uint32(len(f.edges)), end: end, named: end && e.Name != ""})
	case "T", "p":
		f.lose(steps.LossAsyncStep, e, "")
	case "C":
		f.counter(e)
	case "i", "I", "n", "R":
		f.lose(steps.LossInstant, e, "")
	case "s", "t", "f":
		id, ok := rawInt(e.ID)
		if e.Cat != "ac2g" || !ok || e.Ph == "t" {
			f.lose(steps.LossFlow, e, "cat "+e.Cat)
			return nil
		}
		fl := flow{thread: f.thread(e.Pid, e.Tid), ts: e.Ts, id: id}
		if e.Ph == "s" {
			f.flowS = append(f.flowS, fl)
		} else {
			f.flowF = append(f.flowF, fl)
		}
	default:
		f.lose(steps.LossUnsupported, e, "")
	}
	return nil
}

func (f *File) meta(e *event) {
	switch e.Name {
	case "thread_name":
		f.threads[f.thread(e.Pid, e.Tid)].name = rawString(e.Args.Name)
	case "process_name":
		if f.procName == "" {
			f.procName = rawString(e.Args.Name)
		}
	}
}

// counter turns the numeric args of a "C" event into samples of counters
// named "<name> <arg>" (as Perfetto names them), on the event's thread, or
// the process's main thread (tid = pid) when it has no tid.
func (f *File) counter(e *event) {
	tid := e.Tid
	if len(bytes.TrimSpace(tid)) == 0 {
		tid = e.Pid
	}
	th := f.thread(e.Pid, tid)
	if len(e.rawArgs) == 0 {
		f.lose(steps.LossCounterValue, e, "no args")
		return
	}
	_ = fields(e.rawArgs, func(k, v []byte) error {
		x, ok := num(v)
		if !ok || math.IsNaN(x) || x < 0 || x >= 1<<63 {
			f.lose(steps.LossCounterValue, e, fmt.Sprintf("%s = %.20s", k, v))
			return nil
		}
		f.note(e.Ts)
		f.samples = append(f.samples, sample{ts: e.Ts, thread: th, cid: f.internCounter(e.Name + " " + string(k)), value: uint64(math.Round(x))})
		return nil
	})
}

// settle matches begin and end events into spans, per thread in time order
// (file order among equal times), as Chrome's importer does: an end closes
// the innermost open begin (for async ends that name a span, the innermost
// of that name, dropping the unclosed begins inside it).
func (f *File) settle() {
	if f.settled {
		return
	}
	f.settled = true
	slices.SortStableFunc(f.edges, func(x, y edge) int {
		if x.thread != y.thread {
			return cmp.Compare(x.thread, y.thread)
		}
		return cmp.Compare(x.ts, y.ts)
	})
	var open []edge
	unclosed := func(o edge) {
		ex := ""
		if f.losses.Count(steps.LossUnclosed) == 0 {
			ti := f.threads[o.thread]
			ex = fmt.Sprintf("begin of %q at ts %s on pid %s tid %s (dropped)", f.names[o.name], fmtTS(o.ts), ti.pid, ti.tid)
		}
		f.losses.Add(steps.LossUnclosed, 1, ex)
	}
	for i := 0; i < len(f.edges); {
		th := f.edges[i].thread
		open = open[:0]
		for ; i < len(f.edges) && f.edges[i].thread == th; i++ {
			e := f.edges[i]
			if !e.end {
				open = append(open, e)
				continue
			}
			j := len(open) - 1
			if e.named {
				for j >= 0 && open[j].name != e.name {
					j--
				}
			}
			if j < 0 {
				ex := ""
				if f.losses.Count(steps.LossEndWithoutBegin) == 0 {
					ti := f.threads[th]
					ex = fmt.Sprintf("end of %q at ts %s on pid %s tid %s (dropped)", f.names[e.name], fmtTS(e.ts), ti.pid, ti.tid)
				}
				f.losses.Add(steps.LossEndWithoutBegin, 1, ex)
				continue
			}
			for _, o := range open[j+1:] {
				unclosed(o)
			}
			o := open[j]
			open = open[:j]
			f.spans = append(f.spans, span{start: o.ts, end: max(e.ts, o.ts), name: o.name, thread: th, order: uint32(len(f.spans))})
		}
		for _, o := range open {
			unclosed(o)
		}
	}
	f.edges = nil
}

// Parse reads one trace from r (plain or gzipped JSON; an object with
// traceEvents or a bare array). On damage it returns the File with what was
// read before it and f.Err set; err is only for input that is not a trace.
func Parse(r io.Reader, name string) (*File, error) {
	br := bufio.NewReaderSize(r, 256<<10)
	var in io.Reader = br
	gz := false
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		z, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("%s: gzip header: %w", name, err)
		}
		in, gz = z, true
	}
	f := &File{Name: name, Rank: -1, nameIdx: map[string]uint32{}, cnameIdx: map[string]uint32{}, thIdx: map[string]uint32{}}
	dec := json.NewDecoder(in)
	where := func(err error) error {
		unit := "byte offset"
		if gz {
			unit = "decompressed byte offset"
		}
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			err = fmt.Errorf("unexpected end of input (truncated): %w", err)
		}
		return fmt.Errorf("%s: %s %d: %w", name, unit, dec.InputOffset(), err)
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, where(fmt.Errorf("not a JSON trace: %w", err))
	}
	events := func(bare bool) error {
		var e event
		var raw json.RawMessage
		for dec.More() {
			e = event{}
			if err := dec.Decode(&raw); err != nil {
				if bare && errors.Is(err, io.EOF) {
					// "...},\n" and nothing more: an array left open after a
					// comma, as TAU's exporter writes and Chrome accepts.
					return nil
				}
				return where(err)
			}
			if len(raw) == 0 || raw[0] != '{' {
				return where(fmt.Errorf("trace event is not an object: %.20s", raw))
			}
			if err := parseEvent(raw, &e); err != nil {
				return where(err)
			}
			if err := f.add(&e); err != nil {
				return where(err)
			}
		}
		if _, err := dec.Token(); err != nil {
			if bare && errors.Is(err, io.EOF) {
				return nil // the array format may omit its closing bracket
			}
			return where(err)
		}
		return nil
	}
	switch tok {
	case json.Delim('['):
		f.Err = events(true)
		return f, nil
	case json.Delim('{'):
	default:
		return nil, where(fmt.Errorf("not a JSON trace: starts with %v, want an object or an array", tok))
	}
	seen := false
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			f.Err = where(err)
			return f, nil
		}
		key, _ := tok.(string)
		switch key {
		case "traceEvents":
			t, err := dec.Token()
			if err != nil {
				f.Err = where(err)
				return f, nil
			}
			if t != json.Delim('[') {
				return nil, where(errors.New("traceEvents is not an array"))
			}
			seen = true
			if err := events(false); err != nil {
				f.Err = err
				return f, nil
			}
		case "distributedInfo":
			var di struct {
				Rank *int `json:"rank"`
			}
			if err := dec.Decode(&di); err != nil {
				f.Err = where(err)
				return f, nil
			}
			if di.Rank != nil && *di.Rank >= 0 {
				f.Rank = *di.Rank
			}
		default:
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				f.Err = where(err)
				return f, nil
			}
		}
	}
	if _, err := dec.Token(); err != nil {
		f.Err = where(err)
		return f, nil
	}
	if !seen {
		return nil, where(errors.New("no traceEvents array"))
	}
	return f, nil
}

func us(t float64) uint64 { return uint64(math.Round(t)) }

type point struct {
	ts    uint64
	tid   uint32
	seq   uint32
	kind  uint8 // 0 entry, 1 exit, 2 counter
	id    uint32
	value uint64
}

// numeric sort key of a pid/tid string: numbers first, in order.
func numKey(s string) (bool, int64) {
	v, err := strconv.ParseInt(s, 10, 64)
	return err != nil, v
}

// Feed gives the file's events to b as rank, with events only before cutoff
// (µs; 0 for all), and counts what the file held that frames do not carry.
func (f *File) Feed(b *steps.Builder, rank uint32, cutoff uint64) (int, error) {
	f.settle()
	b.Read(f.events)
	for _, l := range f.losses {
		b.Lose(l.Kind, l.Count, func() string { return f.Name + ": " + l.Example })
	}
	// Thread numbering: CPU threads (the one whose tid is its pid first), then
	// GPU streams by device and stream; extra threads for overlapping spans
	// come after all of them.
	order := make([]uint32, len(f.threads))
	for i := range order {
		order[i] = uint32(i)
	}
	sort.SliceStable(order, func(a, c int) bool {
		x, y := f.threads[order[a]], f.threads[order[c]]
		if x.gpu != y.gpu {
			return !x.gpu
		}
		if x.gpu {
			if x.device != y.device {
				return less(x.device, y.device)
			}
			return less(x.stream, y.stream)
		}
		xm, ym := x.pid == x.tid, y.pid == y.tid
		if x.pid != y.pid {
			return less(x.pid, y.pid)
		}
		if xm != ym {
			return xm
		}
		return less(x.tid, y.tid)
	})
	tidOf := make([]uint32, len(f.threads))
	for newTid, old := range order {
		tidOf[old] = uint32(newTid)
	}
	nextTid := uint32(len(f.threads))
	fileAPI := "CUDA"
	if f.hip {
		fileAPI = "ROCm"
	}
	if f.procName != "" {
		b.Meta(rank, 0, "Process Name", f.procName)
	}
	for old, ti := range f.threads {
		tid := tidOf[old]
		if ti.name != "" {
			b.Meta(rank, tid, "Thread Name", ti.name)
		}
	}
	for i, n := range f.names {
		b.FuncName(rank, uint32(i), n)
	}
	const corrCID = 0
	b.CounterName(rank, corrCID, steps.CorrelationCounter)
	for i, n := range f.cnames {
		b.CounterName(rank, uint32(i)+1, n)
	}
	markGPU := func(th, tid uint32) error {
		ti := f.threads[th]
		api := ti.api
		if api == "" {
			api = fileAPI
		}
		if ti.accel != "" {
			b.Meta(rank, tid, "Accelerator", ti.accel)
		}
		return b.GPU(rank, tid, api, ti.context, ti.device, ti.stream)
	}

	// Correlation ids: from args, else from ac2g flows.
	type tkey struct {
		thread uint32
		ts     float64
	}
	fEnd := map[tkey]int64{}
	for _, fl := range f.flowF {
		fEnd[tkey{fl.thread, fl.ts}] = fl.id
	}
	sByThread := map[uint32][]flow{}
	for _, fl := range f.flowS {
		sByThread[fl.thread] = append(sByThread[fl.thread], fl)
	}
	gpuCorr := map[int64]bool{}
	for i := range f.spans {
		s := &f.spans[i]
		if !s.device {
			continue
		}
		if !s.hasCorr {
			s.corr, s.hasCorr = fEnd[tkey{s.thread, s.start}]
		}
		if s.hasCorr {
			gpuCorr[s.corr] = true
		}
	}
	for i := range f.spans {
		s := &f.spans[i]
		if !s.launch || s.hasCorr {
			continue
		}
		for _, fl := range sByThread[s.thread] {
			if fl.ts >= s.start && fl.ts <= s.end {
				s.corr, s.hasCorr = fl.id, true
				break
			}
		}
	}

	// Spans per thread, sorted so parents come before children.
	slices.SortFunc(f.spans, func(x, y span) int {
		switch {
		case x.thread != y.thread:
			return cmp.Compare(x.thread, y.thread)
		case x.start != y.start:
			return cmp.Compare(x.start, y.start)
		case x.end != y.end:
			return cmp.Compare(y.end, x.end)
		}
		return cmp.Compare(x.order, y.order)
	})
	pts := make([]point, 0, 2*len(f.spans)+len(f.samples))
	for _, c := range f.samples {
		pts = append(pts, point{ts: us(c.ts), tid: tidOf[c.thread], kind: 2, id: c.cid + 1, value: c.value})
	}
	type open struct {
		end  uint64
		id   uint32
		span int
	}
	// A lane is a stack of nested calls on one frame thread: lane 0 is the
	// trace's thread, the others extra threads for the spans that overlap
	// the end of their parent.
	type lane struct {
		tid   uint32
		stack []open
	}
	var lanes []lane
	var seq uint32
	pop := func(l *lane, upTo uint64) {
		for len(l.stack) > 0 && l.stack[len(l.stack)-1].end <= upTo {
			o := l.stack[len(l.stack)-1]
			pts = append(pts, point{ts: o.end, tid: l.tid, seq: seq, kind: 1, id: o.id})
			seq++
			l.stack = l.stack[:len(l.stack)-1]
		}
	}
	for i := 0; i < len(f.spans); {
		th := f.spans[i].thread
		ti := f.threads[th]
		lanes = append(lanes[:0], lane{tid: tidOf[th]})
		if ti.gpu {
			if err := markGPU(th, tidOf[th]); err != nil {
				return 0, err
			}
		}
		for ; i < len(f.spans) && f.spans[i].thread == th; i++ {
			s := &f.spans[i]
			start, end := us(s.start), us(s.end)
			k := 0
			for ; k < len(lanes); k++ {
				l := &lanes[k]
				pop(l, start)
				if n := len(l.stack); n == 0 || end <= l.stack[n-1].end {
					break
				}
			}
			if k > 0 {
				if n := len(lanes[0].stack); n > 0 {
					parent := f.spans[lanes[0].stack[n-1].span]
					b.Lose(steps.LossOverlap, 1, func() string {
						return fmt.Sprintf("%s: %q (%.0f µs from ts %.0f) ends %.0f µs after its parent %q on pid %s tid %s",
							f.Name, f.names[s.name], s.end-s.start, s.start, s.end-parent.end, f.names[parent.name], ti.pid, ti.tid)
					})
				}
			}
			if k == len(lanes) {
				tid := nextTid
				nextTid++
				lanes = append(lanes, lane{tid: tid})
				name := ti.name
				if name == "" {
					name = "pid " + ti.pid + " tid " + ti.tid
				}
				b.Meta(rank, tid, "Thread Name", fmt.Sprintf("%s (overlapping spans %d)", name, k))
				if ti.gpu {
					if err := markGPU(th, tid); err != nil {
						return 0, err
					}
				}
			}
			l := &lanes[k]
			pts = append(pts, point{ts: start, tid: l.tid, seq: seq, kind: 0, id: s.name})
			seq++
			if s.hasCorr && (s.device || s.launch) && gpuCorr[s.corr] {
				pts = append(pts, point{ts: start, tid: l.tid, seq: seq, kind: 2, id: corrCID, value: uint64(s.corr)})
				seq++
			}
			l.stack = append(l.stack, open{end, s.name, i})
		}
		for k := range lanes {
			pop(&lanes[k], math.MaxUint64)
		}
	}
	slices.SortStableFunc(pts, func(x, y point) int {
		if x.ts != y.ts {
			return cmp.Compare(x.ts, y.ts)
		}
		return cmp.Compare(x.seq, y.seq)
	})
	n := 0
	for _, p := range pts {
		if cutoff != 0 && p.ts >= cutoff {
			break
		}
		var err error
		switch p.kind {
		case 0:
			err = b.Enter(rank, p.tid, p.id, p.ts)
		case 1:
			err = b.Exit(rank, p.tid, p.id, p.ts)
		default:
			err = b.Counter(rank, p.tid, p.id, p.value, p.ts)
		}
		if err != nil {
			return n, fmt.Errorf("%s: %w", f.Name, err)
		}
		n++
	}
	return n, nil
}

func less(a, b string) bool {
	an, av := numKey(a)
	bn, bv := numKey(b)
	if an != bn {
		return !an
	}
	if !an {
		return av < bv
	}
	return a < b
}

// Read parses the given files and feeds them to b, one rank per file, then
// finishes b. A damaged file stops the read after the steps before the damage
// have been emitted; the error names the file and the offset.
func Read(ctx context.Context, paths []string, b *steps.Builder) error {
	if len(paths) == 0 {
		return errors.New("chrome trace: no files given")
	}
	files := make([]*File, 0, len(paths))
	var damaged error
	for _, p := range paths {
		if err := ctx.Err(); err != nil {
			return err
		}
		fh, err := os.Open(p)
		if err != nil {
			return fmt.Errorf("chrome trace: %w", err)
		}
		f, err := Parse(fh, p)
		fh.Close()
		if err != nil {
			return err
		}
		files = append(files, f)
		if f.Err != nil {
			damaged = f.Err
			break
		}
	}
	return Feed(files, b, damaged)
}

// clockSpread is how far apart (µs) the first events of two files may be and
// still share one step origin: an hour.
const clockSpread = 3600e6

// Feed gives parsed files to b (one rank each) and finishes b, or, when
// damaged is set, emits the steps before the damage and returns it.
func Feed(files []*File, b *steps.Builder, damaged error) error {
	ranks := make([]uint32, len(files))
	distinct := map[int]bool{}
	for i, f := range files {
		ranks[i] = uint32(i)
		if f.Rank >= 0 {
			distinct[f.Rank] = true
		}
	}
	if len(distinct) == len(files) {
		for i, f := range files {
			ranks[i] = uint32(f.Rank)
		}
	}
	first := true
	var origin float64
	for _, f := range files {
		if f.hasTS && (first || f.minTS < origin) {
			origin, first = f.minTS, false
		}
	}
	if !first {
		b.SetOrigin(us(origin))
	}
	// Files whose clocks are far apart (different machines or runs) each
	// count steps from their own start.
	var hi float64
	for _, f := range files {
		if f.hasTS {
			hi = max(hi, f.minTS)
		}
	}
	if !first && hi-origin > clockSpread {
		for i, f := range files {
			if f.hasTS {
				b.SetRankOrigin(ranks[i], us(f.minTS))
			}
		}
	}
	var cutoff uint64
	if damaged != nil {
		last := files[len(files)-1]
		cutoff = max(us(last.maxStart), 1)
	}
	for i, f := range files {
		c := uint64(0)
		if damaged != nil && i == len(files)-1 {
			c = cutoff
		}
		if _, err := f.Feed(b, ranks[i], c); err != nil {
			return err
		}
	}
	if damaged != nil {
		if err := b.Advance(cutoff); err != nil {
			return err
		}
		return fmt.Errorf("%w (%w; steps before io_step %d were emitted)", damaged, steps.ErrStopped, b.CompleteSteps())
	}
	return b.Finish()
}

// fmtTS writes a trace time (µs) without an exponent.
func fmtTS(ts float64) string { return strconv.FormatFloat(ts, 'f', -1, 64) }
