// Package frame defines the unit of Kipimo's input stream: one rank's events for
// one io_step, and its two encodings (a compact binary form and JSON).
//
// A Frame is plain data. Decoders fill a caller-owned Frame, reusing the capacity
// of its slices, so a long-lived Frame decoded into step after step does not
// allocate per event. A Frame is not safe for concurrent mutation.
//
// The JSON form has a hand-written codec (AppendJSON, DecodeJSON), not a
// library. It was measured against github.com/go-json-experiment/json and
// encoding/json/v2 set up to write the same bytes and to reject unknown,
// duplicate and case-folded keys and invalid UTF-8 (they still accept null and
// missing fields, which DecodeJSON rejects, and give no byte offsets); a
// library was to replace it within 1.5× of its speed, and none comes near.
// Medians of 6 interleaved runs with -cpu 1, per second of the process's CPU
// time, one frame of 100,000 function events (4 threads, 51.3 B per event),
// Go 1.26.8 with GOEXPERIMENT=jsonv2, a 2-vCPU AMD VM ("Oxide Virtual
// Turin-like") shared with other jobs, 2026-11-25:
//
//	events/cpu-s         encode          decode          decode allocs/frame
//	hand-written         32.7M           20.3M           0
//	go-json-experiment   6.38M (5.1×)    3.45M (5.9×)    50
//	encoding/json/v2     6.28M (5.2×)    3.34M (6.1×)    50
//	encoding/json        4.90M (6.7×)    1.47M (13.8×)   74
//
// Wall-clock medians, noisier on the loaded machine, rank them the same
// (hand-written 15.1M and 7.1M events/s, go-json-experiment 2.4M and 1.3M).
// Re-run with (without GOEXPERIMENT the encoding/json/v2 row is left out)
//
//	GOEXPERIMENT=jsonv2 go test -run '^$' -bench FrameJSON -cpu 1 -count 6 ./internal/frame/ >new.txt
//	benchstat new.txt
package frame

// EventKind says whether a function event enters or leaves a function.
type EventKind uint8

// Function event kinds, numbered as TAU's ADIOS2 stream numbers them.
const (
	Entry EventKind = 0
	Exit  EventKind = 1
)

// CommKind says whether a communication event sends or receives.
type CommKind uint8

// Communication event kinds.
const (
	Send CommKind = 0
	Recv CommKind = 1
)

// Name is one dictionary entry: an id, local to a (pid, rank), and its name.
// An entry goes with the first frame that uses the id; publishers send the
// whole dictionary again every few frames, for consumers that start late
// (an entry repeated names the id as before).
type Name struct {
	ID   uint32 `json:"id"`
	Name string `json:"name"`
}

// Meta is one metadata entry (TAU's MetaData:<rank>:<tid>:<key>). GPU virtual
// threads are marked by keys such as "CUDA Context", "CUDA Device" and
// "CUDA Stream" on their tid.
type Meta struct {
	Tid   uint32 `json:"tid"`
	Key   string `json:"key"`
	Value string `json:"value"`
}

// FuncEvent is a function entry or exit on a thread. TS is in microseconds.
type FuncEvent struct {
	Tid  uint32    `json:"tid"`
	Kind EventKind `json:"kind"`
	FID  uint32    `json:"fid"`
	TS   uint64    `json:"ts"`
}

// CounterEvent is a counter sample on a thread (hardware counters, user events,
// and the "Correlation ID" counter that links a GPU kernel to its CPU launch).
type CounterEvent struct {
	Tid   uint32 `json:"tid"`
	CID   uint32 `json:"cid"`
	Value uint64 `json:"value"`
	TS    uint64 `json:"ts"`
}

// CommEvent is a point-to-point message sent or received on a thread.
type CommEvent struct {
	Tid     uint32   `json:"tid"`
	Kind    CommKind `json:"kind"`
	Tag     uint32   `json:"tag"`
	Partner uint32   `json:"partner"`
	Bytes   uint64   `json:"bytes"`
	TS      uint64   `json:"ts"`
}

// Frame is one rank's events for one io_step. Events of each kind are in
// timestamp order per thread; across threads they may interleave.
type Frame struct {
	PID    uint32 `json:"pid"`
	Rank   uint32 `json:"rank"`
	Step   uint64 `json:"io_step"`
	TStart uint64 `json:"t_start"` // step start, µs
	TEnd   uint64 `json:"t_end"`   // step end, µs

	Funcs    []Name `json:"funcs,omitempty"`    // function ids new since the previous frame
	Counters []Name `json:"counters,omitempty"` // counter ids new since the previous frame
	Metadata []Meta `json:"metadata,omitempty"`

	Events        []FuncEvent    `json:"events,omitempty"`
	CounterEvents []CounterEvent `json:"counter_events,omitempty"`
	Comms         []CommEvent    `json:"comms,omitempty"`
}

// Reset empties f, keeping the capacity of its slices for reuse.
func (f *Frame) Reset() {
	*f = Frame{
		Funcs:         f.Funcs[:0],
		Counters:      f.Counters[:0],
		Metadata:      f.Metadata[:0],
		Events:        f.Events[:0],
		CounterEvents: f.CounterEvents[:0],
		Comms:         f.Comms[:0],
	}
}

// NumEvents is the number of events of all kinds in f.
func (f *Frame) NumEvents() int {
	return len(f.Events) + len(f.CounterEvents) + len(f.Comms)
}
