package tautrace

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Kind is what a trace event id means.
type Kind uint8

// Event kinds, from the event definition file.
const (
	KindUnknown   Kind = iota
	KindEntryExit      // function entry (par > 0) or exit (par < 0)
	KindTrigger        // user event (counter): three records, 0, value, 0
	KindMeta           // user event named "key | value": metadata
	KindIgnore         // EV_INIT, flush, close, wall clock, continuation, one-sided ids
	KindSend           // MPI message send, packed parameter
	KindRecv           // MPI message receive, packed parameter
	KindOneSend        // one-sided (GPU) transfer sent; par is the size or -1
	KindOneRecv        // one-sided (GPU) transfer received
)

// Def is one event definition.
type Def struct {
	ID    int32
	Group string
	Name  string
	Kind  Kind
	// Key and Value split a KindMeta name "key | value".
	Key, Value string
	// Correlation is set for the "Correlation ID" user event.
	Correlation bool
}

// EDF holds the event definitions of one events.N.edf (or the merged tau.edf).
// It is read-only once parsed and safe for concurrent use.
type EDF struct {
	Name  string // file name, for messages
	small []int32
	kinds []Kind // kind by id, for ids below smallMax
	defs  []Def
	big   map[int32]int32
	// API is the GPU programming interface the definitions suggest
	// ("OpenCL", "ROCm" or "CUDA"); it names GPU thread metadata.
	API string
}

const smallMax = 1 << 17

// Lookup returns the definition of id, or nil.
func (e *EDF) Lookup(id int32) *Def {
	if id >= 0 && id < smallMax {
		if int(id) < len(e.small) {
			if i := e.small[id]; i > 0 {
				return &e.defs[i-1]
			}
		}
		return nil
	}
	if i, ok := e.big[id]; ok {
		return &e.defs[i-1]
	}
	return nil
}

// KindOf returns the kind of id cheaply when id is small, else KindUnknown
// (then use Lookup).
func (e *EDF) KindOf(id int32) Kind {
	if uint32(id) < uint32(len(e.kinds)) {
		return e.kinds[id]
	}
	return KindUnknown
}

// Defs returns every definition, in file order.
func (e *EDF) Defs() []Def { return e.defs }

func (e *EDF) add(d Def) {
	if e.Lookup(d.ID) != nil {
		return // first definition wins
	}
	e.defs = append(e.defs, d)
	i := int32(len(e.defs))
	if d.ID >= 0 && d.ID < smallMax {
		if int(d.ID) >= len(e.small) {
			e.small = append(e.small, make([]int32, int(d.ID)+1-len(e.small))...)
		}
		e.small[d.ID] = i
		for int(d.ID) >= len(e.kinds) {
			e.kinds = append(e.kinds, KindUnknown)
		}
		e.kinds[d.ID] = d.Kind
		return
	}
	if e.big == nil {
		e.big = map[int32]int32{}
	}
	e.big[d.ID] = i
}

// special names TAU gives its tracer and one-sided events, in per-node files
// under fixed ids (60000..., 70000...) and in merged files under new ids.
var special = map[string]Kind{
	"EV_INIT":                            KindIgnore,
	"FLUSH_EXIT":                         KindIgnore,
	"FLUSH_ENTER":                        KindIgnore,
	"FLUSH_CLOSE":                        KindIgnore,
	"FLUSH_INITM":                        KindIgnore,
	"WALL_CLOCK":                         KindIgnore,
	"CONT_EVENT":                         KindIgnore,
	"MESSAGE_SEND":                       KindSend,
	"MESSAGE_RECV":                       KindRecv,
	"ONESIDED_MESSAGE_SEND":              KindOneSend,
	"ONESIDED_MESSAGE_RECV":              KindOneRecv,
	"ONESIDED_MESSAGE_RECIPROCAL_SEND":   KindOneSend,
	"ONESIDED_MESSAGE_RECIPROCAL_RECV":   KindOneRecv,
	"ONESIDED_MESSAGE":                   KindIgnore,
	"ONESIDED_MESSAGE_ID_TriggerValueT1": KindIgnore,
	"ONESIDED_MESSAGE_ID_TriggerValueT2": KindIgnore,
}

// fixed ids of the tracer's own events when the .edf does not list them.
var fixed = map[int32]Def{
	60000: {Name: "EV_INIT", Kind: KindIgnore},
	60001: {Name: "FLUSH", Kind: KindIgnore},
	60002: {Name: "FLUSH_EXIT", Kind: KindIgnore},
	60003: {Name: "FLUSH_CLOSE", Kind: KindIgnore},
	60004: {Name: "FLUSH_INITM", Kind: KindIgnore},
	60005: {Name: "WALL_CLOCK", Kind: KindIgnore},
	60006: {Name: "CONT_EVENT", Kind: KindIgnore},
	60007: {Name: "MESSAGE_SEND", Kind: KindSend},
	60008: {Name: "MESSAGE_RECV", Kind: KindRecv},
	70000: {Name: "ONESIDED_MESSAGE_SEND", Kind: KindOneSend},
	70001: {Name: "ONESIDED_MESSAGE_RECV", Kind: KindOneRecv},
	70002: {Name: "ONESIDED_MESSAGE_ID_TriggerValueT1", Kind: KindIgnore},
	70003: {Name: "ONESIDED_MESSAGE_ID_TriggerValueT2", Kind: KindIgnore},
	70004: {Name: "ONESIDED_MESSAGE", Kind: KindIgnore},
	70005: {Name: "ONESIDED_MESSAGE_RECIPROCAL_SEND", Kind: KindOneSend},
	70006: {Name: "ONESIDED_MESSAGE_RECIPROCAL_RECV", Kind: KindOneRecv},
}

// maxEDFLine bounds one definition line (TAU names with long call paths and
// template arguments run to tens of kilobytes).
const maxEDFLine = 4 << 20

// ParseEDF reads an event definition file: a first line "<n>
// dynamic_trace_events", comment lines starting with '#', then one line per
// event: id group tag "name" type. The count on the first line is not trusted
// (per-node files count one more than they list); the file is read to its end.
func ParseEDF(r io.Reader, name string) (*EDF, error) {
	e := &EDF{Name: name}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxEDFLine)
	line := 0
	var api struct{ cl, hip, cuda bool }
	for sc.Scan() {
		line++
		s := strings.TrimRight(sc.Text(), "\r")
		if line == 1 {
			f := strings.Fields(s)
			if len(f) != 2 || f[1] != "dynamic_trace_events" {
				return nil, fmt.Errorf("%s:1: not a TAU event definition file: want \"<n> dynamic_trace_events\", got %.60q", name, s)
			}
			if _, err := strconv.Atoi(f[0]); err != nil {
				return nil, fmt.Errorf("%s:1: event count %q is not a number", name, f[0])
			}
			continue
		}
		if strings.TrimSpace(s) == "" || strings.HasPrefix(s, "#") {
			continue
		}
		d, err := parseDef(s)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, line, err)
		}
		switch {
		case strings.Contains(d.Name, "clEnqueue") || strings.Contains(d.Name, "clCreateCommandQueue"):
			api.cl = true
		case strings.Contains(d.Name, "hipLaunch") || strings.Contains(d.Name, "hipMemcpy"):
			api.hip = true
		case strings.Contains(d.Name, "cudaLaunch") || strings.Contains(d.Name, "cuLaunch"):
			api.cuda = true
		}
		e.add(d)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s:%d: %w", name, line+1, err)
	}
	if line == 0 {
		return nil, fmt.Errorf("%s: empty event definition file", name)
	}
	for id, d := range fixed {
		if e.Lookup(id) == nil {
			d.ID = id
			e.add(d)
		}
	}
	switch {
	case api.cl:
		e.API = "OpenCL"
	case api.hip:
		e.API = "ROCm"
	default:
		e.API = "CUDA"
	}
	return e, nil
}

func parseDef(s string) (Def, error) {
	q1 := strings.IndexByte(s, '"')
	q2 := strings.LastIndexByte(s, '"')
	if q1 < 0 || q2 <= q1 {
		return Def{}, fmt.Errorf("event definition without a quoted name: %.80q", s)
	}
	head := strings.Fields(s[:q1])
	if len(head) != 3 {
		return Def{}, fmt.Errorf("want id, group and tag before the name, got %.80q", s[:q1])
	}
	id, err := strconv.ParseInt(head[0], 10, 32)
	if err != nil {
		return Def{}, fmt.Errorf("event id %q is not a 32-bit integer", head[0])
	}
	typ := strings.TrimSpace(s[q2+1:])
	d := Def{ID: int32(id), Group: head[1], Name: strings.TrimRight(s[q1+1:q2], " ")}
	if k, ok := special[d.Name]; ok && (head[1] == "TRACER" || head[1] == "TAU_MESSAGE" || head[1] == "TAUEVENT") {
		d.Kind = k
		return d, nil
	}
	switch typ {
	case "EntryExit":
		d.Kind = KindEntryExit
	case "TriggerValue":
		d.Kind = KindTrigger
		if k, v, ok := strings.Cut(d.Name, " | "); ok {
			d.Kind, d.Key, d.Value = KindMeta, k, v
		}
		d.Correlation = d.Name == "Correlation ID"
	case "none", "par":
		d.Kind = KindIgnore
	default:
		return Def{}, fmt.Errorf("event %d: unknown event type %q (want EntryExit or TriggerValue)", id, typ)
	}
	return d, nil
}
