package perfetto_test

// An independent reader of the Chrome trace event format, written from its
// published specification ("Trace Event Format", Google, the document
// chrome://tracing and Perfetto follow) and Perfetto's documented JSON
// extensions (bind_id with flow_in / flow_out on slices), sharing nothing
// with the writer: it checks every event's phase and fields, then rebuilds
// what a viewer shows, per process and thread.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"testing"
)

// traceEvent is one event as the specification lists its fields.
type traceEvent struct {
	Name string
	Cat  string
	Ph   string
	Ts   float64 // µs
	Dur  float64 // µs, X only
	Pid  int64
	Tid  int64
	S    string // instant scope
	Args map[string]any
	// Flow binding (Perfetto's JSON extension).
	BindID  string
	FlowIn  bool
	FlowOut bool
	hasTs   bool
}

// slice is a complete event on its track, with the parent a viewer nests
// it under.
type slice struct {
	ev     *traceEvent
	end    float64
	parent *slice
	depth  int
}

type decoded struct {
	events    []*traceEvent
	procName  map[int64]string
	thName    map[[2]int64]string
	slices    map[[2]int64][]*slice // per (pid, tid), in start order
	instants  []*traceEvent
	counters  []*traceEvent
	flowsOut  map[string][]*traceEvent
	flowsIn   map[string][]*traceEvent
	metaNames map[string]int
}

// track names a thread as "<process name>/<thread name>".
func (d *decoded) track(pid, tid int64) string {
	return d.procName[pid] + "/" + d.thName[[2]int64{pid, tid}]
}

func num(v any) (float64, bool) {
	f, ok := v.(float64)
	return f, ok && !math.IsNaN(f) && !math.IsInf(f, 0)
}

func integer(v any) (int64, bool) {
	f, ok := num(v)
	if !ok || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
		return 0, false
	}
	return int64(f), true
}

// decodeTrace reads data as the JSON Object Format ({"traceEvents": [...]})
// and checks each event against the specification, failing t on the first
// violation.
func decodeTrace(t *testing.T, data []byte) *decoded {
	t.Helper()
	var top map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := json.Unmarshal(data, &top); err != nil {
		t.Fatalf("not a JSON object: %v", err)
	}
	raw, ok := top["traceEvents"]
	if !ok {
		t.Fatal("no traceEvents array")
	}
	for k := range top {
		switch k {
		case "traceEvents", "otherData", "metadata":
		case "displayTimeUnit":
			t.Errorf("displayTimeUnit is set: Perfetto would read the timestamps in another unit")
		default:
			t.Errorf("unknown top-level key %q", k)
		}
	}
	var objs []map[string]any
	if err := json.Unmarshal(raw, &objs); err != nil {
		t.Fatalf("traceEvents is not an array of objects: %v", err)
	}
	d := &decoded{procName: map[int64]string{}, thName: map[[2]int64]string{}, slices: map[[2]int64][]*slice{},
		flowsOut: map[string][]*traceEvent{}, flowsIn: map[string][]*traceEvent{}, metaNames: map[string]int{}}
	for i, o := range objs {
		bad := func(format string, a ...any) {
			t.Fatalf("event %d %v: %s", i, o, fmt.Sprintf(format, a...))
		}
		e := &traceEvent{}
		ph, ok := o["ph"].(string)
		if !ok || len(ph) != 1 {
			bad("ph is not a one-letter string")
		}
		e.Ph = ph
		if e.Name, ok = o["name"].(string); !ok {
			bad("name is not a string")
		}
		if c, has := o["cat"]; has {
			if e.Cat, ok = c.(string); !ok {
				bad("cat is not a string")
			}
		}
		if e.Pid, ok = integer(o["pid"]); !ok {
			bad("pid is not an integer")
		}
		if e.Tid, ok = integer(o["tid"]); !ok {
			bad("tid is not an integer")
		}
		if v, has := o["ts"]; has {
			if e.Ts, ok = num(v); !ok || e.Ts < 0 {
				bad("ts is not a non-negative number")
			}
			e.hasTs = true
		}
		if a, has := o["args"]; has {
			if e.Args, ok = a.(map[string]any); !ok {
				bad("args is not an object")
			}
		}
		for k := range o {
			switch k {
			case "name", "cat", "ph", "ts", "pid", "tid", "args", "dur", "s", "bind_id", "flow_in", "flow_out":
			default:
				bad("field %q is not one this exporter may write", k)
			}
		}
		flowFields := func() {
			if b, has := o["bind_id"]; has {
				if e.BindID, ok = b.(string); !ok || e.BindID == "" {
					bad("bind_id is not a string")
				}
				e.FlowIn, _ = o["flow_in"].(bool)
				e.FlowOut, _ = o["flow_out"].(bool)
				if e.FlowIn == e.FlowOut {
					bad("a bound slice must have exactly one of flow_in and flow_out")
				}
			} else if _, has := o["flow_in"]; has {
				bad("flow_in without bind_id")
			} else if _, has := o["flow_out"]; has {
				bad("flow_out without bind_id")
			}
		}
		switch ph {
		case "M":
			if e.hasTs {
				bad("metadata event with ts")
			}
			d.metaNames[e.Name]++
			switch e.Name {
			case "process_name":
				n, ok := e.Args["name"].(string)
				if !ok || n == "" {
					bad("process_name without args.name")
				}
				if _, dup := d.procName[e.Pid]; dup {
					bad("process %d named twice", e.Pid)
				}
				d.procName[e.Pid] = n
			case "thread_name":
				n, ok := e.Args["name"].(string)
				if !ok || n == "" {
					bad("thread_name without args.name")
				}
				k := [2]int64{e.Pid, e.Tid}
				if _, dup := d.thName[k]; dup {
					bad("thread %v named twice", k)
				}
				d.thName[k] = n
			case "process_sort_index", "thread_sort_index":
				if _, ok := integer(e.Args["sort_index"]); !ok {
					bad("%s without an integer args.sort_index", e.Name)
				}
			default:
				bad("unknown metadata event %q", e.Name)
			}
		case "X":
			if !e.hasTs {
				bad("complete event without ts")
			}
			if e.Dur, ok = num(o["dur"]); !ok || e.Dur < 0 {
				bad("complete event without a non-negative dur")
			}
			flowFields()
			k := [2]int64{e.Pid, e.Tid}
			d.slices[k] = append(d.slices[k], &slice{ev: e, end: e.Ts + e.Dur})
			if e.FlowOut {
				d.flowsOut[e.BindID] = append(d.flowsOut[e.BindID], e)
			}
			if e.FlowIn {
				d.flowsIn[e.BindID] = append(d.flowsIn[e.BindID], e)
			}
		case "i", "I":
			if !e.hasTs {
				bad("instant event without ts")
			}
			if s, has := o["s"]; has {
				if e.S, ok = s.(string); !ok || (e.S != "g" && e.S != "p" && e.S != "t") {
					bad("instant scope is not g, p or t")
				}
			}
			d.instants = append(d.instants, e)
		case "C":
			if !e.hasTs {
				bad("counter event without ts")
			}
			if len(e.Args) == 0 {
				bad("counter event without values")
			}
			for k, v := range e.Args {
				if _, ok := num(v); !ok {
					bad("counter value %q is not a number", k)
				}
			}
			d.counters = append(d.counters, e)
		default:
			bad("phase %q is not one a timeline of records holds", ph)
		}
		if ph != "X" {
			if _, has := o["dur"]; has {
				bad("dur on a %q event", ph)
			}
			if _, has := o["bind_id"]; has {
				bad("bind_id on a %q event", ph)
			}
		}
		if _, has := o["s"]; has && ph != "i" && ph != "I" {
			bad("s on a %q event", ph)
		}
		d.events = append(d.events, e)
	}
	// Every event is on a named process and thread.
	for _, e := range d.events {
		if e.Ph == "M" && (e.Name == "process_name" || e.Name == "process_sort_index") {
			continue
		}
		if _, ok := d.procName[e.Pid]; !ok {
			t.Fatalf("event %v on process %d without a process_name", *e, e.Pid)
		}
		if e.Ph == "C" {
			continue
		}
		if _, ok := d.thName[[2]int64{e.Pid, e.Tid}]; !ok {
			t.Fatalf("event %v on thread %d/%d without a thread_name", *e, e.Pid, e.Tid)
		}
	}
	// Nesting, as Perfetto stacks complete events on a track: in time
	// order (file order at equal times), a slice first closes the open
	// slices that end at or before its start, then nests under the
	// innermost one left; one that ends after that one is an error.
	for k, ss := range d.slices {
		sort.SliceStable(ss, func(i, j int) bool { return ss[i].ev.Ts < ss[j].ev.Ts })
		var stack []*slice
		for _, s := range ss {
			for len(stack) > 0 && stack[len(stack)-1].end <= s.ev.Ts {
				stack = stack[:len(stack)-1]
			}
			if len(stack) > 0 {
				p := stack[len(stack)-1]
				if s.end > p.end {
					t.Fatalf("track %s: %q [%v, %v] starts inside %q [%v, %v] and ends after it", d.track(k[0], k[1]), s.ev.Name, s.ev.Ts, s.end, p.ev.Name, p.ev.Ts, p.end)
				}
				s.parent, s.depth = p, p.depth+1
			}
			stack = append(stack, s)
		}
	}
	return d
}

// execSlices are the decoded executions (slices that are not messages) by
// "<track>|<event id>", failing t on one written twice.
func (d *decoded) execSlices(t *testing.T) map[string]*slice {
	t.Helper()
	out := map[string]*slice{}
	for k, ss := range d.slices {
		for _, s := range ss {
			if s.ev.Cat == "message" {
				continue
			}
			id, ok := s.ev.Args["event_id"].(string)
			if !ok {
				t.Fatalf("execution slice %v without args.event_id", *s.ev)
			}
			key := d.track(k[0], k[1]) + "|" + id
			if _, dup := out[key]; dup {
				t.Errorf("execution %s written twice", key)
			}
			out[key] = s
		}
	}
	return out
}

// execParent is the nearest enclosing execution slice of s (message
// slices are leaves and never enclose one).
func execParent(s *slice) *slice {
	p := s.parent
	for p != nil && p.ev.Cat == "message" {
		p = p.parent
	}
	return p
}

func argString(e *traceEvent, k string) string {
	s, _ := e.Args[k].(string)
	return s
}

func argInt(t *testing.T, e *traceEvent, k string) int64 {
	t.Helper()
	v, ok := integer(e.Args[k])
	if !ok {
		t.Fatalf("event %v: args.%s is not an integer", *e, k)
	}
	return v
}
