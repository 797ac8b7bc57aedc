package ad

import (
	"context"
	"maps"
	"math"
	"slices"
	"sync/atomic"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/stats"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// endStep closes the current step: deltas, sync, labelling, records,
// release of memory, call-stack snapshot, profiles.
func (d *Detector) endStep(ctx context.Context, final bool) {
	d.rec.preempt.observe(d.cur, d.stacks.counterStep[preemptCounter])
	// 1. this step's deltas
	for _, m := range d.models.list {
		if !m.touched {
			continue
		}
		m.accum.Moments.Merge(m.step)
		if len(m.values) > 0 {
			h := stats.BuildHistogram(m.values, d.cfg.Bins)
			if err := m.accum.Histogram.Merge(h); err != nil {
				d.stats.modelErrors.Add(1)
			}
		}
	}
	// 2. sync (bounded wait, or in lockstep with the other detectors) and
	// detection models
	switch {
	case d.cfg.Barrier != nil && d.cfg.Syncer != nil:
		d.sync.lockstep(ctx)
	case d.cfg.ExactSync && d.cfg.Syncer != nil:
		d.sync.exact(ctx)
	default:
		d.sync.step(ctx, final)
	}
	for _, m := range d.models.list {
		if m.touched || !m.detReady || m.inFlight {
			d.models.prepare(m)
		}
	}
	// 3. label
	sum := syncproto.StepSummary{Step: d.cur.step, Events: d.stepEvents, BadFrames: d.stepBad, MissingSteps: d.missing, MinTS: math.MaxUint64}
	d.missing = 0
	d.stepBad = 0
	d.stats.sourceDeltas(&sum)
	funcs := map[int32]*syncproto.FuncAnomalyMetrics{}
	for _, t := range d.stacks.threads {
		for i := range t.ring {
			e := &t.ring[i]
			if e.flags&flagDone == 0 || e.label != labelNone {
				continue
			}
			d.label(t, t.base+uint64(i), e, final, &sum, funcs)
		}
		// in seq order, so that labelling (and the records and the normal
		// execution kept per key) does not depend on map order
		for _, seq := range slices.Sorted(maps.Keys(t.detached)) {
			if e := t.detached[seq]; e.flags&flagDone != 0 && e.label == labelNone {
				d.label(t, seq, e, final, &sum, funcs)
			}
		}
	}
	if sum.MinTS == math.MaxUint64 {
		sum.MinTS = 0
	}
	if sum.Peer = d.peers.step(d.stacks); sum.Peer != nil {
		sum.Peer.Start, sum.Peer.End = d.cur.tstart, d.cur.tend
	}
	// Chimbuko's rule: one lowest-score normal execution per key that had an
	// anomaly in this step.
	for _, m := range d.models.list {
		if m.stepAnoms > 0 && m.best.ok {
			if e := m.best.t.rec(m.best.seq); e != nil && e.label == labelNormal {
				d.rec.add(m.best.t, m.best.seq, e, false)
			}
		}
	}
	d.rec.late.flush(d, d.sync.addSummary)
	d.foldFuncs(&sum, funcs)
	d.sync.addSummary(sum)
	d.sync.addCounters(d.stacks.counterStep)
	// 4. records whose window is complete
	d.rec.finish(final)
	// 5. release memory no window can reach
	d.release()
	// 6. snapshot, profiles, reset
	d.snapshot()
	if final || (d.cfg.ProfileEvery > 0 && (d.processed+1)%uint64(d.cfg.ProfileEvery) == 0) || d.requestProfiles.Swap(false) {
		d.batch.Profiles = append(d.batch.Profiles, d.Profiles(final)...)
	}
	for _, m := range d.models.list {
		m.touched = false
		m.step = stats.Moments{}
		m.values = m.values[:0]
		m.stepAnoms = 0
		m.best = bestNormal{}
	}
	d.emit(ctx)
}

// sourceDeltas sets sum's counts of the event library's summarised and
// dropped calls and dropped events to what it reported since the previous
// summary.
func (c *counters) sourceDeltas(sum *syncproto.StepSummary) {
	for _, f := range []struct {
		total, synced *atomic.Uint64
		out           *uint64
	}{
		{&c.summarisedCalls, &c.summarisedSynced, &sum.SummarisedCalls},
		{&c.sourceDroppedCalls, &c.sourceDroppedCallsSynced, &sum.DroppedCalls},
		{&c.sourceDroppedEvents, &c.sourceDroppedEventsSynced, &sum.DroppedEvents},
	} {
		n := f.total.Load()
		*f.out = n - f.synced.Swap(n)
	}
}

// label scores one completed execution against its model.
func (d *Detector) label(t *thread, seq uint64, e *execRec, final bool, sum *syncproto.StepSummary, funcs map[int32]*syncproto.FuncAnomalyMetrics) {
	// counted in the summary of the io_step it ran in (this step's, most
	// often: then ranIn is the current step and late.of gives sum back)
	if e.xstep != 0 && e.xstep != ranMark(d.cur.step) {
		sum, funcs = d.rec.late.of(d.rec.ranIn(e), d.cur.step, sum, funcs)
	}
	key := d.models.keyOf(t, e)
	m := d.models.list[key]
	x := d.models.value(e)
	sum.Executions++
	sum.MinTS = min(sum.MinTS, e.entry)
	sum.MaxTS = max(sum.MaxTS, e.exit)
	var score float64
	anom := false
	bv := baseNone
	if d.base != nil {
		// against the baseline run: a slow mode it did not have
		if bv = d.base.judge(key, m.name, x, e, !final && d.cur.step-uint64(e.step) < uint64(d.cfg.MaxPendingSteps)); bv == baseWait {
			sum.Executions--
			return
		}
	}
	switch {
	case m.ignored || x < d.cfg.MinRuntime:
	case bv == baseFlag:
		score, anom = d.base.score(key, x), true
	case !m.detReady:
		if !final && d.cur.step-uint64(e.step) < uint64(d.cfg.MaxPendingSteps) {
			// Too little data yet: retry at the next step.
			sum.Executions--
			return
		}
		d.stats.unscored.Add(1)
	default:
		score, anom = d.models.judge(m, x)
		if anom && d.models.gated && m.det.N < d.cfg.SettleCount && !final && d.cur.step-uint64(e.step) < uint64(d.cfg.MaxPendingSteps) {
			// Beyond a young model's natural range, whose tail has not
			// shown itself yet: judge again when the model has settled.
			sum.Executions--
			return
		}
	}
	e.score = float32(score)
	if !anom {
		e.label = labelNormal
		if !m.best.ok || score < m.best.score {
			m.best = bestNormal{t: t, seq: seq, score: score, ok: true}
		}
		if d.cfg.NormalRate > 0 && sample(t.tid, seq) < d.cfg.NormalRate && !(m.best.ok && m.best.seq == seq && m.best.t == t) {
			d.rec.add(t, seq, e, false)
		}
		return
	}
	e.label = labelAnomaly
	m.stepAnoms++
	d.stats.anomalies.Add(1)
	sum.Anomalies++
	sev := float64(e.excl())
	sum.Scores.Push(score)
	sum.Severity.Push(sev)
	fm := funcs[key]
	if fm == nil {
		fm = &syncproto.FuncAnomalyMetrics{Func: m.name, FirstTS: e.entry}
		funcs[key] = fm
	}
	fm.Count++
	fm.Score.Push(score)
	fm.Severity.Push(sev)
	fm.FirstTS = min(fm.FirstTS, e.entry)
	fm.LastTS = max(fm.LastTS, e.exit)
	d.rec.add(t, seq, e, true)
	if n := len(d.rec.pending); bv == baseFlag && n > 0 {
		// add's record is the last pending one
		d.base.explain(d.rec.pending[n-1].rec, key, m.name, x)
	}
}

// release drops what no window can reach any more: per thread, everything
// before the last Window executions (the next anomaly's "before" half) and
// before the first execution still waiting for a label; open executions and
// those pinned by pending records survive the release (see thread.release).
func (d *Detector) release() {
	w := uint64(d.cfg.Window)
	for _, t := range d.stacks.threads {
		keep := t.next()
		if keep > w {
			keep -= w
		} else {
			keep = 0
		}
		for i := range t.ring {
			if e := &t.ring[i]; e.flags&flagDone != 0 && e.label == labelNone {
				keep = min(keep, t.base+uint64(i))
				break
			}
		}
		t.release(keep)
	}
}

// Callstacks returns every thread's open call stack as of the end of the last
// processed step. It never blocks processing; safe for concurrent use. The
// reply is shared: callers must not modify it.
func (d *Detector) Callstacks() *syncproto.CallstackReply { return d.snap.Load() }

// snapshot publishes the open call stacks for the live probe.
func (d *Detector) snapshot() {
	rep := &syncproto.CallstackReply{PID: d.cfg.PID, Rank: d.cfg.Rank, IOStep: d.cur.step, Threads: make([]syncproto.ThreadStack, 0, len(d.stacks.threads))}
	for _, t := range d.stacks.threads {
		ts := syncproto.ThreadStack{TID: t.tid, GPU: t.gpu, Frames: make([]syncproto.OpenFrame, 0, len(t.stack))}
		for _, s := range t.stack {
			e := t.rec(s)
			if e == nil {
				continue
			}
			ts.Frames = append(ts.Frames, syncproto.OpenFrame{FID: e.fid, Func: d.stacks.funcName(e.fid), Entry: e.entry, EventID: d.stacks.eventID(e.step, e.idx)})
		}
		rep.Threads = append(rep.Threads, ts)
	}
	d.snap.Store(rep)
}

// Profiles returns the per-thread profiles accumulated so far.
func (d *Detector) Profiles(final bool) []provenance.ThreadProfile {
	return d.stacks.profiles(d.cur.step, final)
}
