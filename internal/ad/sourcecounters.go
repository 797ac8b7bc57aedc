package ad

import (
	"maps"
	"slices"
	"strings"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// The event library reports what it did not stream as counter events with
// reserved names, each at its frame's end on the thread concerned and
// covering that io_step only (docs/wire-formats.md):
//
//	Kipimo Summary Calls: <path>       leaf calls of <path> it summarised
//	Kipimo Summary Time (ns): <path>   their total time
//	Kipimo Summary Min (ns): <path>    (not kept: profiles have no minimum)
//	Kipimo Summary Max (ns): <path>    (not kept: profiles have no maximum)
//	Kipimo Dropped Calls: <function>   calls dropped whole (full ring)
//	Kipimo Dropped Comm Events         comm events dropped
//	Kipimo Dropped Counter Events      counter events dropped
//
// <path> is "a => b => leaf" from the thread's outermost open call. The
// detector never attaches these to an execution nor sends them to the
// pserver as counters: summarised calls go into the thread's profile under
// their path (their time out of their caller's exclusive time), so that
// counts in the profiles are the program's calls; drops are counted
// (Stats.SourceDroppedCalls, SourceDroppedEvents) and kept as the profile's
// counters of those names.
const (
	summaryCallsPrefix = "Kipimo Summary Calls: "
	summaryTimePrefix  = "Kipimo Summary Time (ns): "
	summaryMinPrefix   = "Kipimo Summary Min (ns): "
	summaryMaxPrefix   = "Kipimo Summary Max (ns): "
	droppedCallsPrefix = "Kipimo Dropped Calls: "
	droppedComms       = "Kipimo Dropped Comm Events"
	droppedCounters    = "Kipimo Dropped Counter Events"
)

// Kinds of a source counter.
const (
	srcSummaryCalls uint8 = iota + 1
	srcSummaryTime
	srcSummaryIgnored
	srcDroppedCalls
	srcDroppedEvents
)

// sourceCounter is a counter id the event library reserved: its kind and
// the path (summaries) it is about.
type sourceCounter struct {
	kind uint8
	path string
}

// classifySourceCounter says whether name is a reserved counter name.
func classifySourceCounter(name string) (sourceCounter, bool) {
	if !strings.HasPrefix(name, "Kipimo ") {
		return sourceCounter{}, false
	}
	for _, p := range []struct {
		prefix string
		kind   uint8
	}{
		{summaryCallsPrefix, srcSummaryCalls}, {summaryTimePrefix, srcSummaryTime},
		{summaryMinPrefix, srcSummaryIgnored}, {summaryMaxPrefix, srcSummaryIgnored},
		{droppedCallsPrefix, srcDroppedCalls},
	} {
		if path, ok := strings.CutPrefix(name, p.prefix); ok {
			return sourceCounter{kind: p.kind, path: path}, true
		}
	}
	if name == droppedComms || name == droppedCounters {
		return sourceCounter{kind: srcDroppedEvents}, true
	}
	return sourceCounter{}, false
}

// nameCounter gives counter id its name.
func (cs *callStacks) nameCounter(id uint32, name string) {
	cs.ctrNames[id] = name
	if name == CorrelationCounter {
		cs.corrCID = int64(id)
	}
	if sc, ok := classifySourceCounter(name); ok {
		if cs.srcCtr == nil {
			cs.srcCtr = map[uint32]sourceCounter{}
		}
		cs.srcCtr[id] = sc
	}
}

// sourceEvent takes counter event c of thread t, of a reserved counter.
func (cs *callStacks) sourceEvent(t *thread, sc sourceCounter, c *frame.CounterEvent) {
	switch sc.kind {
	case srcSummaryCalls, srcSummaryTime:
		a := t.summ[sc.path]
		if a == nil {
			a = &summaryAcc{}
			t.summ[sc.path] = a
		}
		if sc.kind == srcSummaryCalls {
			a.calls += c.Value
			cs.stats.summarisedCalls.Add(c.Value)
		} else {
			a.ns += c.Value
		}
	case srcDroppedCalls:
		cs.stats.sourceDroppedCalls.Add(c.Value)
		t.counterAdd(c.CID, float64(c.Value))
	case srcDroppedEvents:
		cs.stats.sourceDroppedEvents.Add(c.Value)
		t.counterAdd(c.CID, float64(c.Value))
	}
}

// addSummaries adds t's summarised calls to profile p: to their path's
// timer and their function's flat timer, and out of their caller's
// exclusive time (and into its subroutine calls).
func (cs *callStacks) addSummaries(t *thread, p *provenance.ThreadProfile) {
	if len(t.summ) == 0 {
		return
	}
	idx := make(map[string]int, len(p.Timers))
	for i := range p.Timers {
		idx[p.Timers[i].Name] = i
	}
	timer := func(name string) *provenance.TimerProfile {
		i, ok := idx[name]
		if !ok {
			i = len(p.Timers)
			idx[name] = i
			p.Timers = append(p.Timers, provenance.TimerProfile{Name: name, Group: "TAU_DEFAULT"})
		}
		return &p.Timers[i]
	}
	for _, path := range slices.Sorted(maps.Keys(t.summ)) {
		a := t.summ[path]
		if a.calls == 0 {
			continue
		}
		us := float64(a.ns) / 1000
		nodes := strings.Split(path, " => ")
		if d := cs.cfg.CallPathDepth; d > 0 && len(nodes) > d {
			nodes = nodes[len(nodes)-d:]
		}
		add := func(tm *provenance.TimerProfile) {
			tm.Calls += a.calls
			tm.Inclusive += us
			tm.Exclusive += us
		}
		add(timer(nodes[len(nodes)-1]))
		if len(nodes) == 1 {
			continue
		}
		add(timer(strings.Join(nodes, " => ")))
		callers := []*provenance.TimerProfile{timer(nodes[len(nodes)-2])}
		if len(nodes) > 2 {
			callers = append(callers, timer(strings.Join(nodes[:len(nodes)-1], " => ")))
		}
		for _, c := range callers {
			c.Subrs += a.calls
			c.Exclusive = max(0, c.Exclusive-us)
		}
	}
}
