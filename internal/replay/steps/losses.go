package steps

import (
	"fmt"
	"strings"
)

// Kinds of input a reader reads but does not turn into frames as they are.
// Every reader reports each such event under one of these kinds, so the
// commands can say what an input held that the frames do not.
const (
	// LossUnclosed: a begin (Chrome B/b/S, a TAU entry, a Caliper begin)
	// whose end never came.
	LossUnclosed = "unclosed"
	// LossEndWithoutBegin: an end (Chrome E/e/F, a TAU exit, a Caliper end)
	// with no open begin on its thread.
	LossEndWithoutBegin = "end-without-begin"
	// LossOverlap: a span that started inside another on its thread and
	// ended after it (overlapping, not nested); it is moved, whole, to an
	// extra thread of the same process, since a thread's calls must nest.
	LossOverlap = "overlap"
	// LossInstant: an instant or mark event (Chrome i/I/n/R): no duration.
	LossInstant = "instant"
	// LossFlow: a flow event (Chrome s/t/f) other than the ac2g flows that
	// link GPU work to its launch.
	LossFlow = "flow"
	// LossAsyncStep: a step of a legacy async span (Chrome T/p).
	LossAsyncStep = "async-step"
	// LossBadTime: an event with a negative, not-a-number or absurd time or
	// duration; it is skipped.
	LossBadTime = "bad-timestamp"
	// LossCounterValue: a counter sample that is not a number or is
	// negative (frame counters are unsigned).
	LossCounterValue = "counter-value"
	// LossUnsupported: an event kind with no frame form (Chrome samples,
	// objects, memory dumps, clock syncs, context events).
	LossUnsupported = "unsupported"
	// LossDuplicateInput: an input file skipped because it repeats others
	// (TAU's merged tau.trc given with the per-thread files it was made of).
	LossDuplicateInput = "duplicate-input"
	// LossUnknownEvent: a record whose event id the definitions do not name.
	LossUnknownEvent = "unknown-event"
)

var lossText = map[string]string{
	LossUnclosed:        "begins never ended",
	LossEndWithoutBegin: "ends with no begin open on their thread",
	LossOverlap:         "spans overlapping the end of their parent, moved whole to an extra thread",
	LossInstant:         "instant events (no duration, dropped)",
	LossFlow:            "flow events (no frame form, dropped)",
	LossAsyncStep:       "async step events (dropped)",
	LossBadTime:         "events with a negative or out-of-range time (dropped)",
	LossCounterValue:    "counter samples that are not non-negative numbers (dropped)",
	LossUnsupported:     "events of kinds frames cannot hold (dropped)",
	LossDuplicateInput:  "input files repeating other inputs (skipped)",
	LossUnknownEvent:    "records of undefined event ids (dropped)",
}

// LossText says in a few words what a loss kind is and what was done with it.
func LossText(kind string) string {
	if t, ok := lossText[kind]; ok {
		return t
	}
	return kind
}

// Loss is the count of one kind of loss and its first example.
type Loss struct {
	Kind    string `json:"kind"`
	Count   int    `json:"count"`
	Example string `json:"example"`
}

// Losses counts, per kind, what an input held that the reader did not turn
// into frames as it was, in the order the kinds were first met.
type Losses []Loss

// Add counts n losses of kind; example describes the first one.
func (l *Losses) Add(kind string, n int, example string) {
	if n <= 0 {
		return
	}
	for i := range *l {
		if (*l)[i].Kind == kind {
			(*l)[i].Count += n
			return
		}
	}
	*l = append(*l, Loss{Kind: kind, Count: n, Example: example})
}

// Merge adds the counts of o to l.
func (l *Losses) Merge(o Losses) {
	for _, x := range o {
		l.Add(x.Kind, x.Count, x.Example)
	}
}

// Count is the number of losses of kind.
func (l Losses) Count(kind string) int {
	for _, x := range l {
		if x.Kind == kind {
			return x.Count
		}
	}
	return 0
}

// Lines renders one line per kind: count, what it is, an example.
func (l Losses) Lines() []string {
	out := make([]string, 0, len(l))
	for _, x := range l {
		out = append(out, fmt.Sprintf("%d %s (%s); e.g. %s", x.Count, x.Kind, LossText(x.Kind), x.Example))
	}
	return out
}

// String is Lines joined by newlines.
func (l Losses) String() string { return strings.Join(l.Lines(), "\n") }
