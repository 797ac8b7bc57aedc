package ad

import (
	"maps"
	"math"
	"slices"

	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// An execution's record names the io_step it ran in (io_step: the step of
// the frame holding its exit event, with that step's window) apart from the
// one it was labelled in (labelled_io_step), later when its model was too
// young to judge it at once. The exit's step is kept in the execution
// itself (execRec.xstep, in the struct's padding: no memory per execution)
// as 1 + the step mod ranMod, which names it exactly as long as it is
// labelled within ranMod io_steps of its exit (MaxPendingSteps bounds the
// wait); the recorder keeps the windows of the last MaxPendingSteps+1
// io_steps (ranSteps). An execution whose step is unknown (restored from a
// checkpoint of version 2 to 4) or too far back is given the step it is
// labelled in.
const ranMod = math.MaxUint16

// ranMark is io_step step as execRec.xstep.
func ranMark(step uint64) uint16 { return uint16(step%ranMod) + 1 }

// ranSteps is the windows of the last io_steps processed, oldest first.
type ranSteps []stepInfo

// add appends step s, keeping the last n.
func (rs *ranSteps) add(s stepInfo, n int) {
	*rs = append(*rs, s)
	if over := len(*rs) - n; over > 0 {
		*rs = append((*rs)[:0], (*rs)[over:]...)
	}
}

// ranIn is the io_step e ran in, with its window: the current step's when
// e exited in it, or when its step is unknown or no longer kept.
func (rc *recorder) ranIn(e *execRec) stepInfo {
	cur := *rc.cur
	if e.xstep == 0 || e.xstep == ranMark(cur.step) {
		return cur
	}
	back := (uint64(ranMark(cur.step)) + ranMod - uint64(e.xstep)) % ranMod
	if back > cur.step {
		return cur
	}
	step := cur.step - back
	for i := len(rc.wins) - 1; i >= 0; i-- {
		if rc.wins[i].step == step {
			return rc.wins[i]
		}
	}
	return cur
}

// lateSums are the step summaries of the executions labelled in this step
// that ran in an earlier one, by the io_step they ran in: sent before this
// step's summary, they add to that step's counts on the pserver (a summary
// of a step a rank has already reported counts no frame), so that the heat
// map and the series place anomalies in the io_step they ran in. Empty
// between steps.
type lateSums map[uint64]*lateSum

// lateSum is one earlier io_step's summary and its per-key anomaly metrics.
type lateSum struct {
	sum   syncproto.StepSummary
	funcs map[int32]*syncproto.FuncAnomalyMetrics
}

// of returns the summary and per-key metrics an execution that ran in ran
// counts in: those of that io_step when it is before step, otherwise sum
// and funcs.
func (ls *lateSums) of(ran stepInfo, step uint64, sum *syncproto.StepSummary, funcs map[int32]*syncproto.FuncAnomalyMetrics) (*syncproto.StepSummary, map[int32]*syncproto.FuncAnomalyMetrics) {
	if ran.step >= step {
		return sum, funcs
	}
	if *ls == nil {
		*ls = lateSums{}
	}
	l := (*ls)[ran.step]
	if l == nil {
		l = &lateSum{sum: syncproto.StepSummary{Step: ran.step, MinTS: math.MaxUint64}, funcs: map[int32]*syncproto.FuncAnomalyMetrics{}}
		(*ls)[ran.step] = l
	}
	return &l.sum, l.funcs
}

// flush folds the late summaries that counted an execution (foldFuncs),
// earliest io_step first, hands them to add and empties ls.
func (ls *lateSums) flush(d *Detector, add func(syncproto.StepSummary)) {
	for _, step := range slices.Sorted(maps.Keys(*ls)) {
		l := (*ls)[step]
		if l.sum.Executions == 0 {
			continue // every execution it took waits again
		}
		if l.sum.MinTS == math.MaxUint64 {
			l.sum.MinTS = 0
		}
		d.foldFuncs(&l.sum, l.funcs)
		add(l.sum)
	}
	clear(*ls)
}

// foldFuncs adds a step's per-key anomaly metrics to sum and to the
// models' anomaly counts.
func (d *Detector) foldFuncs(sum *syncproto.StepSummary, funcs map[int32]*syncproto.FuncAnomalyMetrics) {
	for k, fm := range funcs {
		m := d.models.list[k]
		if d.cfg.ExactSync {
			m.heldAnoms += fm.Count
		} else {
			m.accum.Anomalies += fm.Count
		}
		if sum.FuncAnomalies == nil {
			sum.FuncAnomalies = map[string]uint64{}
		}
		sum.FuncAnomalies[m.name] += fm.Count
		sum.Funcs = append(sum.Funcs, *fm)
	}
}

// ranSteps writes (from checkpoint version 5) the windows of the last
// io_steps and the exit step of every completed execution still waiting
// for a label, by thread index and seq.
func (w *ckWriter) ranSteps(d *Detector) {
	w.Uvarint(uint64(len(d.rec.wins)))
	for _, s := range d.rec.wins {
		w.Uvarint(s.step)
		w.Uvarint(s.tstart)
		w.Uvarint(s.tend)
	}
	type waiter struct {
		ti    int
		seq   uint64
		xstep uint16
	}
	var ws []waiter
	for ti, t := range d.stacks.threads {
		for i := range t.ring {
			if e := &t.ring[i]; waiting(e) {
				ws = append(ws, waiter{ti, t.base + uint64(i), e.xstep})
			}
		}
		for _, seq := range slices.Sorted(maps.Keys(t.detached)) {
			if e := t.detached[seq]; waiting(e) {
				ws = append(ws, waiter{ti, seq, e.xstep})
			}
		}
	}
	w.Uvarint(uint64(len(ws)))
	for _, x := range ws {
		w.Uvarint(uint64(x.ti))
		w.Uvarint(x.seq)
		w.Uvarint(uint64(x.xstep))
	}
}

// waiting says whether e is a completed execution without a label whose
// exit step is known.
func waiting(e *execRec) bool {
	return e != nil && e.flags&flagDone != 0 && e.label == labelNone && e.xstep != 0
}

// ranSteps reads what ckWriter.ranSteps wrote. A checkpoint of version 2
// to 4 has none: executions waiting for a label there are given the step
// they are labelled in.
func (r *ckReader) ranSteps(d *Detector) {
	n := r.Count(3)
	if r.Err == nil && n > d.cfg.MaxPendingSteps+1 {
		r.Fail("windows of %d io_steps, more than %d", n, d.cfg.MaxPendingSteps+1)
		return
	}
	for range n {
		s := stepInfo{step: r.Uvarint(), tstart: r.Uvarint(), tend: r.Uvarint()}
		if r.Err != nil {
			return
		}
		if k := len(d.rec.wins); s.step > d.cur.step || (k > 0 && s.step <= d.rec.wins[k-1].step) {
			r.Fail("window of io_step %d out of order (last io_step %d)", s.step, d.cur.step)
			return
		}
		d.rec.wins = append(d.rec.wins, s)
	}
	n = r.Count(3)
	for range n {
		ti := r.below(uint64(len(d.stacks.threads)), "thread index")
		seq := r.Uvarint()
		x := r.below(ranMod+1, "exit step")
		if r.Err != nil {
			return
		}
		t := d.stacks.threads[ti]
		e := t.rec(seq)
		if e == nil || e.flags&flagDone == 0 || e.label != labelNone || x == 0 {
			r.Fail("execution %d of thread %d: exit step of an execution that does not wait for a label", seq, t.tid)
			return
		}
		e.xstep = uint16(x)
	}
}
