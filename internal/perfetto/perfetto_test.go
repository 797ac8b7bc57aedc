package perfetto_test

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/perfetto"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/replay/chrome"
	"github.com/kipimo-hpc/kipimo/internal/replay/steps"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata")

type rec struct {
	kind provenance.Kind
	e    provenance.Exec
}

func we(id, parent, fn string, entry, exit uint64) provenance.WindowExec {
	return provenance.WindowExec{EventID: id, ParentEventID: parent, Func: fn, Entry: entry, Exit: exit}
}

func cf(id, fn string, entry, exit uint64) provenance.CallFrame {
	return provenance.CallFrame{EventID: id, Func: fn, Entry: entry, Exit: exit}
}

func comm(typ string, rank, src, tar, tag uint32, bytes, ts uint64, exec string) provenance.CommRecord {
	return provenance.CommRecord{Type: typ, RID: rank, Src: src, Tar: tar, Tag: tag, Bytes: bytes, Timestamp: ts, ExecdataKey: exec}
}

// synthetic is a small run of two ranks whose records' windows overlap:
// rank 0 sends to rank 1 and back, one send has no receive, rank 1 has a
// GPU queue whose kernel one of its calls launched, a caller's exit is
// known only from a later record and rank 1's main never exits in any.
func synthetic() []rec {
	const b = 1_750_000_000_000_000
	r0 := []provenance.WindowExec{
		we("0:1:2", "0:1:1", "MPI_Send", b+200, b+210),
		we("0:1:3", "0:1:1", "MPI_Send", b+210, b+212),
		we("0:1:4", "0:1:1", "compute", b+300, b+800),
		we("0:1:10", "0:1:4", "inner", b+300, b+500), // enters with its caller
		we("0:1:5", "0:1:10", "kernel_a", b+310, b+310),
		we("0:1:6", "0:1:1", "MPI_Recv", b+850, b+880),
	}
	r0[2].IsAnomaly = true
	a := provenance.Exec{
		PID: 0, RID: 0, TID: 0, EventID: "0:1:4", Func: "compute", Entry: b + 300, Exit: b + 800, IOStep: 1, OutlierScore: 12.5,
		Explanation: &provenance.Explanation{Text: "500 µs, 5x the natural maximum"},
		CallStack:   []provenance.CallFrame{cf("0:1:4", "compute", b+300, b+800), cf("0:1:1", "solve", b+100, 0), cf("0:1:0", "main", b+50, 0)},
		EventWindow: provenance.EventWindow{ExecWindow: r0[:6], CommWindow: []provenance.CommRecord{
			comm("SEND", 0, 0, 1, 5, 64, b+205, "0:1:2"),
			comm("SEND", 0, 0, 3, 5, 64, b+211, "0:1:3"),
			comm("RECV", 0, 1, 0, 6, 32, b+870, "0:1:6"),
		}},
		CounterEvents: []provenance.CounterEvent{
			{CounterName: "PAPI_TOT_CYC", CounterValue: 1000, RID: 0, TID: 0, TS: b + 300},
			{CounterName: "PAPI_TOT_CYC", CounterValue: 9000, RID: 0, TID: 0, TS: b + 800},
			{CounterName: steps.CorrelationCounter, CounterValue: 7, RID: 0, TID: 0, TS: b + 300},
		},
	}
	a.CallStack[0].IsAnomaly = true
	// A normal execution later on rank 0: its window repeats part of a's
	// and its call stack says when solve and main exited.
	n := provenance.Exec{
		PID: 0, RID: 0, TID: 0, EventID: "0:1:6", Func: "MPI_Recv", Entry: b + 850, Exit: b + 880, IOStep: 1,
		CallStack: []provenance.CallFrame{cf("0:1:6", "MPI_Recv", b+850, b+880), cf("0:1:1", "solve", b+100, b+900), cf("0:1:0", "main", b+50, b+1000)},
		EventWindow: provenance.EventWindow{ExecWindow: append(slices.Clone(r0[2:]), we("0:1:7", "0:1:0", "MPI_Barrier", b+950, b+990)),
			CommWindow: []provenance.CommRecord{comm("RECV", 0, 1, 0, 6, 32, b+870, "0:1:6")}},
		CounterEvents: []provenance.CounterEvent{{CounterName: "PAPI_TOT_CYC", CounterValue: 9000, RID: 0, TID: 0, TS: b + 800}},
	}
	// Rank 1: a receive that waits, then the send back; a launch.
	c := provenance.Exec{
		PID: 0, RID: 1, TID: 0, EventID: "1:1:2", Func: "MPI_Recv", Entry: b + 190, Exit: b + 260, IOStep: 1, OutlierScore: 8,
		CallStack: []provenance.CallFrame{cf("1:1:2", "MPI_Recv", b+190, b+260), cf("1:1:0", "main", b+40, 0)},
		EventWindow: provenance.EventWindow{ExecWindow: []provenance.WindowExec{
			we("1:1:1", "1:1:0", "setup", b+60, b+180),
			we("1:1:2", "1:1:0", "MPI_Recv", b+190, b+260),
			we("1:1:3", "1:1:0", "cudaLaunchKernel", b+390, b+395),
			we("1:1:5", "1:1:0", "MPI_Irecv", b+860, b+860), // takes no time, then the send enters
			we("1:1:6", "1:1:0", "MPI_Send", b+860, b+865),
		}, CommWindow: []provenance.CommRecord{
			comm("RECV", 1, 0, 1, 5, 64, b+255, "1:1:2"),
			comm("SEND", 1, 1, 0, 6, 32, b+862, "1:1:6"),
		}},
	}
	c.CallStack[0].IsAnomaly = true
	c.EventWindow.ExecWindow[1].IsAnomaly = true
	g := provenance.Exec{
		PID: 0, RID: 1, TID: 7, EventID: "1:1:9", Func: "gemm_kernel", Entry: b + 400, Exit: b + 600, IOStep: 1,
		IsGPUEvent: true, GPULocation: &provenance.GPULocation{Device: 0, Stream: 7, Context: 1, Thread: 7},
		GPUParent: &provenance.GPUParent{EventID: "1:1:3", TID: 0},
		CallStack: []provenance.CallFrame{cf("1:1:9", "gemm_kernel", b+400, b+600)},
		EventWindow: provenance.EventWindow{ExecWindow: []provenance.WindowExec{
			we("1:1:8", "root", "Memcpy HtoD", b+396, b+399),
			we("1:1:9", "root", "gemm_kernel", b+400, b+600),
		}},
	}
	return []rec{{provenance.KindAnomalies, a}, {provenance.KindNormalExecs, n}, {provenance.KindAnomalies, c}, {provenance.KindNormalExecs, g}}
}

// want is what the records hold, gathered here on their own terms: each
// execution (by track and event id) with its times and its parent in the
// records, and each message once.
type want struct {
	execs map[string]wantExec
	msgs  map[string]bool // "<track>|SEND|src|tar|tag|bytes|ts"
}

type wantExec struct {
	fn          string
	entry, exit uint64 // exit 0: no record saw it
	parent      string // "<track>|<event id>", "" when none
	anomaly     bool
}

func trackName(rank, tid uint32, gpu *provenance.GPULocation) string {
	if gpu != nil {
		return fmt.Sprintf("rank %d/GPU %d stream %d (thread %d)", rank, gpu.Device, gpu.Stream, tid)
	}
	return fmt.Sprintf("rank %d/thread %d", rank, tid)
}

func expected(rs []rec) want {
	w := want{execs: map[string]wantExec{}, msgs: map[string]bool{}}
	gpu := map[[2]uint32]*provenance.GPULocation{}
	for _, r := range rs {
		if r.e.GPULocation != nil {
			gpu[[2]uint32{r.e.RID, r.e.TID}] = r.e.GPULocation
		}
	}
	for _, r := range rs {
		tr := trackName(r.e.RID, r.e.TID, gpu[[2]uint32{r.e.RID, r.e.TID}])
		add := func(id, fn string, entry, exit uint64, parent string, anomaly bool) {
			k := tr + "|" + id
			x := w.execs[k]
			x.fn, x.entry = fn, entry
			if exit != 0 {
				x.exit = exit
			}
			if parent != "" && parent != "root" {
				x.parent = tr + "|" + parent
			}
			x.anomaly = x.anomaly || anomaly
			w.execs[k] = x
		}
		for i, f := range r.e.CallStack {
			p := ""
			if i+1 < len(r.e.CallStack) {
				p = r.e.CallStack[i+1].EventID
			}
			add(f.EventID, f.Func, f.Entry, f.Exit, p, f.IsAnomaly)
		}
		for _, x := range r.e.EventWindow.ExecWindow {
			add(x.EventID, x.Func, x.Entry, x.Exit, x.ParentEventID, x.IsAnomaly)
		}
		add(r.e.EventID, r.e.Func, r.e.Entry, r.e.Exit, "", r.kind == provenance.KindAnomalies)
		for _, c := range r.e.EventWindow.CommWindow {
			w.msgs[fmt.Sprintf("%s|%s|%d|%d|%d|%d|%d", trackName(c.RID, c.TID, nil), c.Type, c.Src, c.Tar, c.Tag, c.Bytes, c.Timestamp)] = true
		}
	}
	return w
}

func export(t *testing.T, opt perfetto.Options, rs []rec) ([]byte, perfetto.Stats) {
	t.Helper()
	tl := perfetto.New(opt)
	for i := range rs {
		tl.Add(rs[i].kind, &rs[i].e)
	}
	var buf bytes.Buffer
	st, err := tl.Write(&buf)
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), st
}

// checkTimeline checks a decoded timeline against what the records hold:
// every execution once, at its times, nested under its parent when the
// parent is in the timeline; every message once; flows joining a send to a
// receive of the same sender, receiver, tag and size.
func checkTimeline(t *testing.T, d *decoded, w want) {
	t.Helper()
	got := d.execSlices(t)
	for k, x := range w.execs {
		s, ok := got[k]
		if !ok {
			t.Errorf("execution %s (%s) missing", k, x.fn)
			continue
		}
		if s.ev.Name != x.fn || s.ev.Ts != float64(x.entry) {
			t.Errorf("execution %s: %q at %v, want %q at %d", k, s.ev.Name, s.ev.Ts, x.fn, x.entry)
		}
		if x.exit != 0 && s.end != float64(x.exit) {
			t.Errorf("execution %s ends at %v, want %d", k, s.end, x.exit)
		}
		if x.exit == 0 && s.ev.Args["exit_recorded"] != false {
			t.Errorf("execution %s: no record saw its exit, and args.exit_recorded is not false", k)
		}
		if an, _ := s.ev.Args["anomaly"].(bool); an != x.anomaly {
			t.Errorf("execution %s: anomaly %v, want %v", k, an, x.anomaly)
		}
		if x.parent != "" {
			if _, in := w.execs[x.parent]; in {
				p := execParent(s)
				if p == nil || p != got[x.parent] {
					pn := "none"
					if p != nil {
						pn = p.ev.Name + " " + argString(p.ev, "event_id")
					}
					t.Errorf("execution %s (%s) nests under %s, want %s", k, x.fn, pn, x.parent)
				}
			}
		}
	}
	for k := range got {
		if _, ok := w.execs[k]; !ok {
			t.Errorf("execution %s is in no record", k)
		}
	}
	// Messages.
	seen := map[string]int{}
	for k, ss := range d.slices {
		for _, s := range ss {
			if s.ev.Cat != "message" {
				continue
			}
			if s.ev.Dur != 0 {
				t.Errorf("message %v has a duration", *s.ev)
			}
			tr := d.track(k[0], k[1])
			key := fmt.Sprintf("%s|%s|%d|%d|%d|%d|%d", tr, argString(s.ev, "type"), argInt(t, s.ev, "src"), argInt(t, s.ev, "tar"),
				argInt(t, s.ev, "tag"), argInt(t, s.ev, "bytes"), int64(s.ev.Ts))
			seen[key]++
			// At its time, inside its execution.
			x, ok := got[tr+"|"+argString(s.ev, "exec")]
			if !ok || s.ev.Ts < x.ev.Ts || s.ev.Ts > x.end {
				t.Errorf("message %s is not inside its execution %s", key, argString(s.ev, "exec"))
			}
			if (s.ev.BindID == "") != (s.ev.Args["paired"] == false) {
				t.Errorf("message %s: bound %v but args.paired %v", key, s.ev.BindID != "", s.ev.Args["paired"])
			}
		}
	}
	for k, n := range seen {
		if n != 1 || !w.msgs[k] {
			t.Errorf("message %s written %d times (in the records: %v)", k, n, w.msgs[k])
		}
	}
	for k := range w.msgs {
		if seen[k] == 0 {
			t.Errorf("message %s missing", k)
		}
	}
	// Flows: one start and one end each; a message flow goes from a send
	// to a receive that matches it, a launch flow from a CPU execution to
	// a GPU one.
	for id, outs := range d.flowsOut {
		ins := d.flowsIn[id]
		if len(outs) != 1 || len(ins) != 1 {
			t.Errorf("flow %s: %d starts and %d ends", id, len(outs), len(ins))
			continue
		}
		o, in := outs[0], ins[0]
		switch {
		case o.Cat == "message":
			if argString(o, "type") != "SEND" || argString(in, "type") != "RECV" || in.Cat != "message" {
				t.Errorf("flow %s does not go from a send to a receive", id)
			}
			for _, k := range []string{"src", "tar", "tag", "bytes"} {
				if argInt(t, o, k) != argInt(t, in, k) {
					t.Errorf("flow %s: %s %d sent, %d received", id, k, argInt(t, o, k), argInt(t, in, k))
				}
			}
			if in.Ts < o.Ts {
				t.Errorf("flow %s received before it was sent", id)
			}
		default:
			if in.Cat == "message" || in.Cat == "function" {
				t.Errorf("launch flow %s ends on %q, not a GPU execution", id, in.Cat)
			}
		}
	}
	for id := range d.flowsIn {
		if len(d.flowsOut[id]) == 0 {
			t.Errorf("flow %s ends without a start", id)
		}
	}
}

func TestTimelineHoldsTheRecords(t *testing.T) {
	rs := synthetic()
	data, st := export(t, perfetto.Options{}, rs)
	d := decodeTrace(t, data)
	w := expected(rs)
	checkTimeline(t, d, w)
	if st.Executions != len(w.execs) || st.Messages != len(w.msgs) || st.Conflicts != 0 {
		t.Errorf("stats %+v: want %d executions, %d messages", st, len(w.execs), len(w.msgs))
	}
	// Two messages pair up (0→1 tag 5, 1→0 tag 6); the send to rank 3 has
	// no receive. One launch flow.
	if len(d.flowsOut) != 3 || st.Flows != 2 || st.Launches != 1 {
		t.Errorf("%d flows (stats %+v), want 2 message flows and 1 launch flow", len(d.flowsOut), st)
	}
	// main of rank 0 exits when the later record says; main of rank 1
	// ends with its last child.
	ex := d.execSlices(t)
	if m := ex["rank 1/thread 0|1:1:0"]; m == nil || m.end != 1_750_000_000_000_865 {
		t.Errorf("rank 1's main, whose exit no record saw, does not end with its last child: %+v", m)
	}
	// Anomalies: marked on the slice and by an instant on its thread.
	marks := map[string]bool{}
	for _, i := range d.instants {
		if i.Cat == "anomaly" && i.S == "t" {
			marks[d.track(i.Pid, i.Tid)+"|"+argString(i, "event_id")] = true
		}
	}
	for k, x := range w.execs {
		if x.anomaly != marks[k] {
			t.Errorf("execution %s: anomaly %v, instant mark %v", k, x.anomaly, marks[k])
		}
	}
	if s := ex["rank 0/thread 0|0:1:4"]; s == nil || s.ev.Args["explanation"] != "500 µs, 5x the natural maximum" || s.ev.Args["outlier_score"] != 12.5 {
		t.Errorf("the anomaly's slice lacks its score and explanation: %+v", s)
	}
	// Counters: one track per counter and thread, the correlation link
	// left out, each sample once.
	var ctr []string
	for _, c := range d.counters {
		for k, v := range c.Args {
			ctr = append(ctr, fmt.Sprintf("%s %s %s=%v@%d", d.procName[c.Pid], c.Name, k, v, int64(c.Ts)))
		}
	}
	sort.Strings(ctr)
	if want := []string{"rank 0 PAPI_TOT_CYC thread 0=1000@1750000000000300", "rank 0 PAPI_TOT_CYC thread 0=9000@1750000000000800"}; !slices.Equal(ctr, want) {
		t.Errorf("counters %q, want %q", ctr, want)
	}
	// The GPU queue is its own thread, after the CPU thread.
	if s := ex["rank 1/GPU 0 stream 7 (thread 7)|1:1:9"]; s == nil || s.ev.Cat != "kernel" || !s.ev.FlowIn {
		t.Errorf("kernel on the GPU queue: %+v", s)
	}
	if s := ex["rank 1/GPU 0 stream 7 (thread 7)|1:1:8"]; s == nil || s.ev.Cat != "gpu_memcpy" {
		t.Errorf("copy on the GPU queue: %+v", s)
	}
}

// Records given in any order make the same bytes.
func TestTimelineDeterministic(t *testing.T) {
	rs := synthetic()
	a, _ := export(t, perfetto.Options{}, rs)
	slices.Reverse(rs)
	b, _ := export(t, perfetto.Options{}, rs)
	if !bytes.Equal(a, b) {
		t.Error("the timeline depends on the order of the records")
	}
}

// A time range keeps the executions that overlap it with their callers,
// and the messages and counter samples inside it.
func TestTimelineRange(t *testing.T) {
	rs := synthetic()
	const b = 1_750_000_000_000_000
	data, st := export(t, perfetto.Options{From: b + 840, To: b + 870}, rs)
	d := decodeTrace(t, data)
	var names []string
	for k := range d.execSlices(t) {
		names = append(names, k)
	}
	sort.Strings(names)
	want := []string{"rank 0/thread 0|0:1:0", "rank 0/thread 0|0:1:1", "rank 0/thread 0|0:1:6", "rank 1/thread 0|1:1:0", "rank 1/thread 0|1:1:5", "rank 1/thread 0|1:1:6"}
	if !slices.Equal(names, want) {
		t.Errorf("executions %q, want %q", names, want)
	}
	if st.Messages != 2 || st.Flows != 1 || st.Counters != 0 {
		t.Errorf("stats %+v: want the message 1→0 and its flow, no counter sample", st)
	}
}

func TestTimelineGolden(t *testing.T) {
	data, _ := export(t, perfetto.Options{}, synthetic())
	path := filepath.Join("testdata", "synthetic.json")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	golden, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test -run Golden -update writes it)", err)
	}
	if !bytes.Equal(data, golden) {
		t.Errorf("timeline differs from %s (go test -run Golden -update rewrites it after a deliberate change)", path)
	}
}

// readBack reads a timeline with Kipimo's own Chrome trace reader and
// returns its executions as "<thread name>|<func>|<entry>|<exit>", the
// message slices left out.
func readBack(t *testing.T, data []byte) map[string]int {
	t.Helper()
	f, err := chrome.Parse(bytes.NewReader(data), "timeline.json")
	if err != nil || f.Err != nil {
		t.Fatalf("chrome reader: %v %v", err, f.Err)
	}
	cfg := steps.Config{Step: time.Hour}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	names := map[uint32]string{}
	funcs := map[uint32]string{}
	out := map[string]int{}
	type open struct {
		fid uint32
		ts  uint64
	}
	stacks := map[uint32][]open{}
	b := steps.New(cfg, func(fr *frame.Frame) error {
		for _, n := range fr.Funcs {
			funcs[n.ID] = n.Name
		}
		for _, m := range fr.Metadata {
			if m.Key == "Thread Name" {
				names[m.Tid] = m.Value
			}
		}
		for _, e := range fr.Events {
			if e.Kind == frame.Entry {
				stacks[e.Tid] = append(stacks[e.Tid], open{e.FID, e.TS})
				continue
			}
			st := stacks[e.Tid]
			o := st[len(st)-1]
			stacks[e.Tid] = st[:len(st)-1]
			out[fmt.Sprintf("%d|%s|%d|%d", e.Tid, funcs[o.fid], o.ts, e.TS)]++
		}
		return nil
	})
	if err := chrome.Feed([]*chrome.File{f}, b, nil); err != nil {
		t.Fatal(err)
	}
	named := map[string]int{}
	for k, n := range out {
		tid, rest, _ := strings.Cut(k, "|")
		var id uint32
		fmt.Sscan(tid, &id)
		if strings.HasPrefix(rest, "send to rank ") || strings.HasPrefix(rest, "receive from rank ") {
			continue
		}
		named[names[id]+"|"+rest] += n
	}
	return named
}

// Kipimo's own Chrome reader reads the timeline back: the same executions
// on the same threads, at the same times.
func TestTimelineReadBack(t *testing.T) {
	rs := synthetic()
	data, _ := export(t, perfetto.Options{}, rs)
	got := readBack(t, data)
	d := decodeTrace(t, data)
	want := map[string]int{}
	for k, s := range d.execSlices(t) {
		tr, _, _ := strings.Cut(k, "|")
		_, th, _ := strings.Cut(tr, "/")
		want[fmt.Sprintf("%s|%s|%d|%d", th, s.ev.Name, int64(s.ev.Ts), int64(s.end))]++
	}
	// Thread names are per rank: the reader keeps one rank per file, so
	// names repeat; compare counts.
	if len(got) == 0 || !mapsEqual(got, want) {
		t.Errorf("the Chrome reader read\n%v\nwant\n%v", got, want)
	}
	// And they are the records' executions, at the records' times.
	w := expected(rs)
	fromRecords := map[string]int{}
	for k, x := range w.execs {
		if x.exit == 0 {
			continue
		}
		tr, _, _ := strings.Cut(k, "|")
		_, th, _ := strings.Cut(tr, "/")
		fromRecords[fmt.Sprintf("%s|%s|%d|%d", th, x.fn, x.entry, x.exit)]++
	}
	for k, n := range fromRecords {
		if got[k] != n {
			t.Errorf("execution %s: read back %d times, want %d", k, got[k], n)
		}
	}
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
