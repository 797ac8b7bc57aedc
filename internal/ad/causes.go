package ad

import (
	"slices"

	"github.com/kipimo-hpc/kipimo/internal/stats"
)

// Causes a flagged execution's explanation names when the data shows them
// (see explainCauses): the rank preempted far more than usual in the
// io_step(s) the execution ran in, or one of the first calls of its function
// on its thread. Both are kept off the per-event path: the preemption count
// is read once per step from the step's counter totals, and a thread's call
// count per function is one slice increment per exit, which stops at
// warmupCalls.
const (
	// preemptCounter is the process counter the event library samples at
	// each io_step's end (docs/instrumentation.md).
	preemptCounter = "Involuntary Context Switches"
	// preemptSteps is how many of the rank's last io_steps are kept.
	preemptSteps = 64
	// preemptMinHistory is how many other io_steps the usual value needs.
	preemptMinHistory = 4
	// A count is clearly above usual when it is at least preemptFactor
	// times the usual count and at least preemptMinExtra more.
	preemptFactor   = 4
	preemptMinExtra = 20
	// warmupCalls is how many first calls of a function on a thread are its
	// warm-up.
	warmupCalls = 10
)

// stepCount is one io_step's total of a counter.
type stepCount struct {
	step         uint64
	tstart, tend uint64
	value        float64
}

// preemptLog keeps the rank's involuntary context switches of its last
// preemptSteps io_steps (those whose frames carried the counter).
type preemptLog struct {
	steps   []stepCount // oldest first
	scratch []float64
}

// observe records the current step's total, m being the step's values of
// preemptCounter (nil or empty when the frame had none).
func (p *preemptLog) observe(cur stepInfo, m *stats.Moments) {
	if m == nil || m.N == 0 {
		return
	}
	if len(p.steps) == preemptSteps {
		p.steps = append(p.steps[:0], p.steps[1:]...)
	}
	p.steps = append(p.steps, stepCount{step: cur.step, tstart: cur.tstart, tend: cur.tend, value: m.N * m.Mean})
}

// preemption is an execution's count in the io_steps it ran in (entered in
// step, exited at exit, as of step cur), over how many steps, and the
// median per step of the other kept steps. ok is false when there is too
// little to compare.
func (p *preemptLog) preemption(step uint32, exit, cur uint64) (value float64, steps int, usual float64, ok bool) {
	others := p.scratch[:0]
	for _, s := range p.steps {
		in := s.step == uint64(step) || (s.step > uint64(step) && s.step <= cur && s.tstart < exit)
		if in {
			value += s.value
			steps++
		} else {
			others = append(others, s.value)
		}
	}
	p.scratch = others
	if steps == 0 || len(others) < preemptMinHistory {
		return 0, 0, 0, false
	}
	slices.Sort(others)
	n := len(others)
	usual = others[n/2]
	if n%2 == 0 {
		usual = (others[n/2-1] + others[n/2]) / 2
	}
	return value, steps, usual, true
}

// clearlyAbove says whether value over steps io_steps is clearly above
// usual per step.
func clearlyAbove(value float64, steps int, usual float64) bool {
	base := usual * float64(steps)
	return value >= preemptFactor*base && value-base >= preemptMinExtra
}

// countCall counts completed execution e among its function's calls on t
// and marks it flagWarmup when it is one of the first warmupCalls. After a
// restore the counts start from the restored profile.
func (cs *callStacks) countCall(t *thread, e *execRec) {
	if !t.fcallsSet {
		t.fcallsSet = true
		add := func(fid uint32, calls uint64) {
			if calls == 0 {
				return
			}
			t.growCalls(fid)
			t.fcalls[fid] = uint8(min(calls, warmupCalls+1))
		}
		for n := range t.paths {
			if n < len(cs.nodes) {
				add(cs.nodes[n].fid, t.paths[n].calls+uint64(t.fcallsOf(cs.nodes[n].fid)))
			}
		}
		for fid := range t.over {
			add(uint32(fid), t.over[fid].calls+uint64(t.fcallsOf(uint32(fid))))
		}
	}
	if int(e.fid) >= len(t.fcalls) {
		t.growCalls(e.fid)
	}
	if c := t.fcalls[e.fid]; c <= warmupCalls {
		t.fcalls[e.fid] = c + 1
		if c < warmupCalls {
			e.flags |= flagWarmup
		}
	}
}

// fcallsOf is t's count of calls of fid so far.
func (t *thread) fcallsOf(fid uint32) uint8 {
	if int(fid) < len(t.fcalls) {
		return t.fcalls[fid]
	}
	return 0
}

// growCalls makes room for fid in t.fcalls.
func (t *thread) growCalls(fid uint32) {
	if int(fid) < len(t.fcalls) {
		return
	}
	if int(fid) < cap(t.fcalls) {
		t.fcalls = t.fcalls[:fid+1]
		return
	}
	n := make([]uint8, fid+1, max(int(fid)+1, 2*cap(t.fcalls)))
	copy(n, t.fcalls)
	t.fcalls = n
}
