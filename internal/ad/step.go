package ad

import (
	"context"
	"math"
	"sort"
	"strconv"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/psync"
	"github.com/kipimo-hpc/kipimo/internal/stats"
)

// pendingRec is a record waiting for its "after" window.
type pendingRec struct {
	rec      *provenance.Exec
	t        *thread
	seq      uint64
	step     uint64
	anomaly  bool
	ew       provenance.EventWindow // the "before" half and the execution itself, then the rest
	pinnedTo uint64                 // executions seq..pinnedTo are pinned for the window
}

// endStep closes the current step: deltas, sync, labelling, records,
// release of memory, call-stack snapshot, profiles.
func (d *Detector) endStep(ctx context.Context, final bool) {
	// 1. this step's deltas
	for _, m := range d.models {
		if !m.touched {
			continue
		}
		m.accum.Merge(m.step)
		if len(m.values) > 0 {
			h := stats.BuildHistogram(m.values, d.cfg.Bins)
			if err := m.hAccum.Merge(h); err != nil {
				d.stats.modelErrors.Add(1)
			}
		}
	}
	// 2. sync (bounded wait, or in lockstep with the other detectors) and
	// detection models
	if d.cfg.Barrier != nil && d.cfg.Syncer != nil {
		d.sync.lockstep(ctx)
	} else {
		d.sync.step(ctx, final)
	}
	for _, m := range d.models {
		if m.touched || !m.detReady || m.inFlight {
			d.prepare(m)
		}
	}
	// 3. label
	sum := psync.StepSummary{Step: d.step, Events: d.stepEvents, BadFrames: d.stepBad, MinTS: math.MaxUint64}
	d.stepBad = 0
	funcs := map[int32]*psync.FuncAnomalyMetrics{}
	for _, t := range d.threads {
		for i := range t.ring {
			e := &t.ring[i]
			if e.flags&flagDone == 0 || e.label != labelNone {
				continue
			}
			d.label(t, t.base+uint64(i), e, final, &sum, funcs)
		}
		for seq, e := range t.detached {
			if e.flags&flagDone == 0 || e.label != labelNone {
				continue
			}
			d.label(t, seq, e, final, &sum, funcs)
		}
	}
	if sum.MinTS == math.MaxUint64 {
		sum.MinTS = 0
	}
	// Chimbuko's rule: one lowest-score normal execution per key that had an
	// anomaly in this step.
	for _, m := range d.models {
		if m.stepAnoms > 0 && m.best.ok {
			if e := m.best.t.rec(m.best.seq); e != nil && e.label == labelNormal {
				d.addRecord(m.best.t, m.best.seq, e, false)
			}
		}
	}
	for k, fm := range funcs {
		m := d.models[k]
		m.accumAnoms += fm.Count
		if sum.FuncAnomalies == nil {
			sum.FuncAnomalies = map[string]uint64{}
		}
		sum.FuncAnomalies[m.name] += fm.Count
		sum.Funcs = append(sum.Funcs, *fm)
	}
	d.sync.addSummary(sum)
	d.sync.addCounters(d.counterStep)
	// 4. records whose window is complete
	d.finishPending(final)
	// 5. release memory no window can reach
	d.release()
	// 6. snapshot, profiles, reset
	d.snapshot()
	if final || (d.cfg.ProfileEvery > 0 && (d.processed+1)%uint64(d.cfg.ProfileEvery) == 0) || d.requestProfiles.Swap(false) {
		d.batch.Profiles = append(d.batch.Profiles, d.Profiles(final)...)
	}
	for _, m := range d.models {
		m.touched = false
		m.step = stats.Moments{}
		m.values = m.values[:0]
		m.stepAnoms = 0
		m.best = bestNormal{}
	}
	d.emit(ctx)
}

// prepare builds m's detection model: the last global model merged with
// every local delta it does not include yet.
func (d *Detector) prepare(m *model) {
	m.det = m.global
	m.det.Merge(m.inflight)
	m.det.Merge(m.accum)
	m.std = m.det.Stddev()
	m.lo = m.det.Mean - d.cfg.Sigma*m.std
	m.hi = m.det.Mean + d.cfg.Sigma*m.std
	m.detReady = m.det.N >= d.cfg.MinCount
	if d.gated {
		d.tmp.Reset()
		for _, src := range []*stats.TailHist{&m.tGlobal, &m.tInflight, &m.tAccum} {
			if err := d.tmp.Merge(*src); err != nil {
				d.stats.modelErrors.Add(1)
			}
		}
		m.natMin, m.natMax = d.tmp.NaturalRange(d.rule)
		m.natLowThr, m.natThr = d.rule.LowThreshold(m.natMin), d.rule.Threshold(m.natMax)
		m.p99 = d.tmp.Quantile(0.99)
		m.logMean, m.logStd = d.tmp.LogMoments()
	}
	if d.cfg.Algorithm == SSTD || d.cfg.Algorithm == Tail {
		return
	}
	var h stats.Histogram
	for _, src := range []*stats.Histogram{&m.hGlobal, &m.hInflight, &m.hAccum} {
		if err := h.Merge(*src); err != nil {
			d.stats.modelErrors.Add(1)
		}
	}
	if d.cfg.Algorithm == HBOS {
		m.hbos.Reset(h, d.cfg.Threshold)
	} else {
		m.copod.Reset(h, m.det.Skewness(), d.cfg.Threshold)
	}
}

// label scores one completed execution against its model.
func (d *Detector) label(t *thread, seq uint64, e *execRec, final bool, sum *psync.StepSummary, funcs map[int32]*psync.FuncAnomalyMetrics) {
	key := d.keyOf(t, e)
	m := d.models[key]
	x := d.value(e)
	sum.Executions++
	sum.MinTS = min(sum.MinTS, e.entry)
	sum.MaxTS = max(sum.MaxTS, e.exit)
	var score float64
	anom := false
	switch {
	case m.ignored || x < d.cfg.MinRuntime:
	case !m.detReady:
		if !final && d.step-uint64(e.step) < uint64(d.cfg.MaxPendingSteps) {
			// Too little data yet: retry at the next step.
			sum.Executions--
			return
		}
		d.stats.unscored.Add(1)
	default:
		score, anom = d.judge(m, x)
		if anom && d.gated && m.det.N < d.cfg.SettleCount && !final && d.step-uint64(e.step) < uint64(d.cfg.MaxPendingSteps) {
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
			d.addRecord(t, seq, e, false)
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
		fm = &psync.FuncAnomalyMetrics{Func: m.name, FirstTS: e.entry}
		funcs[key] = fm
	}
	fm.Count++
	fm.Score.Push(score)
	fm.Severity.Push(sev)
	fm.FirstTS = min(fm.FirstTS, e.entry)
	fm.LastTS = max(fm.LastTS, e.exit)
	d.addRecord(t, seq, e, true)
}

// judge scores value x against model m and says whether it is an anomaly.
func (d *Detector) judge(m *model, x float64) (score float64, anom bool) {
	switch {
	case d.cfg.Algorithm == Tail:
		if x < m.natLowThr && !d.cfg.SlowOnly {
			return m.natMin / max(x, d.cfg.Resolution), true
		}
		return x / max(m.natMax, d.cfg.Resolution), x > m.natThr
	case d.cfg.Algorithm == SSTD:
		std := m.std
		if std == 0 {
			std = 1e-10
		}
		score = math.Abs(x-m.det.Mean) / std
		anom = x > m.hi || (!d.cfg.SlowOnly && x < m.lo)
	case d.cfg.Algorithm == HBOS && d.cfg.Isolation > 0:
		mass := m.hbos.WindowMass(x, d.cfg.Isolation)
		score = -math.Log2(mass + stats.HBOSAlpha)
		anom = mass < d.cfg.MaxMass && (!d.cfg.SlowOnly || x > m.det.Mean)
	case d.cfg.Algorithm == HBOS:
		score = m.hbos.Score(x)
		anom = score >= m.hbos.Threshold && (!d.cfg.SlowOnly || x > m.det.Mean)
	default:
		score, _ = m.copod.ScoreFast(x)
		anom = score >= m.copod.Threshold && (!d.cfg.SlowOnly || x > m.det.Mean)
		if anom && d.cfg.Isolation > 0 {
			anom = m.copod.WindowMass(x, d.cfg.Isolation) < d.cfg.MaxMass
		}
	}
	if d.gated && x <= m.natThr && (x >= m.natLowThr || d.cfg.SlowOnly) {
		anom = false // inside the natural range, whatever the algorithm says
	}
	return score, anom
}

// sample maps (tid, seq) to a uniform number in [0, 1), deterministically.
func sample(tid uint32, seq uint64) float64 {
	z := seq*0x9E3779B97F4A7C15 + uint64(tid)*0xD1B54A32D192ED03
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	z ^= z >> 31
	return float64(z>>11) / (1 << 53)
}

// addRecord creates the provenance record of an execution labelled in this
// step; its "after" window is filled in by finishPending.
func (d *Detector) addRecord(t *thread, seq uint64, e *execRec, anomaly bool) {
	m := d.models[d.keyOf(t, e)]
	r := &provenance.Exec{
		Entry:            e.entry,
		Exit:             e.exit,
		EventID:          d.eventID(e.step, e.idx),
		FID:              e.fid,
		Func:             d.funcName(e.fid),
		FuncStats:        provenance.FuncStatsOf(m.det),
		IsGPUEvent:       t.gpu,
		PID:              d.cfg.PID,
		RID:              d.cfg.Rank,
		TID:              t.tid,
		RuntimeExclusive: e.excl(),
		RuntimeTotal:     e.incl(),
		IOStep:           d.step,
		IOStepTStart:     d.tstart,
		IOStepTEnd:       d.tend,
		OutlierScore:     d.exactScore(m, e),
		OutlierSeverity:  float64(e.excl()),
		Hostname:         d.cfg.Hostname,
		Algorithm:        d.cfg.Algorithm,
		CounterEvents:    []provenance.CounterEvent{},
	}
	if d.gated && m.detReady {
		r.Explanation = explain(m, d.value(e))
	}
	r.CallStack = d.callStack(t, seq)
	d.scratch.ctr = t.countersOf(seq, e, d.scratch.ctr[:0])
	for _, c := range d.scratch.ctr {
		r.CounterEvents = append(r.CounterEvents, provenance.CounterEvent{
			CounterIdx: c.ev.CID, CounterName: d.ctrNames[c.ev.CID], CounterValue: c.ev.Value,
			PID: d.cfg.PID, RID: d.cfg.Rank, TID: t.tid, TS: c.ev.TS,
		})
	}
	if t.gpu {
		r.GPULocation = &provenance.GPULocation{Context: t.loc.context, Device: t.loc.device, Stream: t.loc.stream, Thread: t.tid}
	}
	p := &pendingRec{rec: r, t: t, seq: seq, step: d.step, anomaly: anomaly, pinnedTo: seq,
		ew: provenance.EventWindow{ExecWindow: []provenance.WindowExec{}, CommWindow: []provenance.CommRecord{}}}
	w := uint64(d.cfg.Window)
	lo := uint64(0)
	if seq > w {
		lo = seq - w
	}
	for s := lo; s <= seq; s++ {
		d.windowEntry(&p.ew, t, s)
	}
	t.pin(seq)
	d.pending = append(d.pending, p)
}

// exactScore is e's outlier score (recomputed where labelling used a bin's
// score as a shortcut).
func (d *Detector) exactScore(m *model, e *execRec) float64 {
	if d.cfg.Algorithm == COPOD && d.cfg.Isolation == 0 && m.detReady {
		return m.copod.Score(d.value(e))
	}
	return float64(e.score)
}

// callStack is the execution and its ancestors, the execution first.
func (d *Detector) callStack(t *thread, seq uint64) []provenance.CallFrame {
	var cs []provenance.CallFrame
	for s := seq + 1; s != 0; {
		e := t.rec(s - 1)
		if e == nil {
			break
		}
		var exit uint64
		if e.flags&flagDone != 0 {
			exit = e.exit
		}
		cs = append(cs, provenance.CallFrame{
			Entry: e.entry, Exit: exit, FID: e.fid, Func: d.funcName(e.fid),
			EventID: d.eventID(e.step, e.idx), IsAnomaly: e.label == labelAnomaly,
		})
		s = e.parent
	}
	return cs
}

// finishPending completes the windows of pending records whose "after" side
// has finished (or that waited MaxPendingSteps, or at the end of the stream)
// and moves them to the batch.
func (d *Detector) finishPending(final bool) {
	w := uint64(d.cfg.Window)
	keep := d.pending[:0]
	for _, p := range d.pending {
		t := p.t
		// Pin the "after" executions as they appear, so that releasing the
		// ring never drops them before the record is complete.
		for s := p.pinnedTo + 1; s <= p.seq+w && s < t.next(); s++ {
			t.pin(s)
			p.pinnedTo = s
		}
		ready := final || d.step-p.step >= uint64(d.cfg.MaxPendingSteps)
		if !ready && t.next() > p.seq+w {
			ready = true
			for s := p.seq + 1; s <= p.seq+w; s++ {
				if e := t.rec(s); e != nil && e.flags&flagDone == 0 {
					ready = false
					break
				}
			}
		}
		if !ready {
			keep = append(keep, p)
			continue
		}
		d.fillWindow(p)
		for s := p.seq; s <= p.pinnedTo; s++ {
			t.unpin(s)
		}
		if p.anomaly {
			d.batch.Anomalies = append(d.batch.Anomalies, *p.rec)
		} else {
			d.batch.Normal = append(d.batch.Normal, *p.rec)
		}
	}
	for i := len(keep); i < len(d.pending); i++ {
		d.pending[i] = nil
	}
	d.pending = keep
}

// windowEntry appends execution s of t, and its comm events, to ew.
func (d *Detector) windowEntry(ew *provenance.EventWindow, t *thread, s uint64) {
	e := t.rec(s)
	if e == nil {
		return
	}
	var exit uint64
	if e.flags&flagDone != 0 {
		exit = e.exit
	}
	id := d.eventID(e.step, e.idx)
	parent := "root"
	if e.parent != 0 {
		parent = d.eventID(e.pstep, e.pidx)
	}
	ew.ExecWindow = append(ew.ExecWindow, provenance.WindowExec{
		Entry: e.entry, Exit: exit, FID: e.fid, Func: d.funcName(e.fid),
		EventID: id, ParentEventID: parent, IsAnomaly: e.label == labelAnomaly,
	})
	d.scratch.comm = t.commsOf(s, e, d.scratch.comm[:0])
	for _, c := range d.scratch.comm {
		cr := provenance.CommRecord{
			PID: d.cfg.PID, RID: d.cfg.Rank, TID: t.tid, Bytes: c.ev.Bytes, Tag: c.ev.Tag,
			Timestamp: c.ev.TS, ExecdataKey: id,
		}
		if c.ev.Kind == frame.Send {
			cr.Type, cr.Src, cr.Tar = "SEND", d.cfg.Rank, c.ev.Partner
		} else {
			cr.Type, cr.Src, cr.Tar = "RECV", c.ev.Partner, d.cfg.Rank
		}
		ew.CommWindow = append(ew.CommWindow, cr)
	}
}

// fillWindow completes the record's event window with the "after" half and
// sets its GPU parent.
func (d *Detector) fillWindow(p *pendingRec) {
	t, r := p.t, p.rec
	for s := p.seq + 1; s <= p.seq+uint64(d.cfg.Window); s++ {
		d.windowEntry(&p.ew, t, s)
	}
	ew := p.ew
	r.EventWindow = ew
	if t.gpu && d.corrCID >= 0 {
		for _, c := range r.CounterEvents {
			if int64(c.CounterIdx) != d.corrCID {
				continue
			}
			if l, ok := d.launches[c.CounterValue]; ok {
				gp := &provenance.GPUParent{EventID: d.eventID(l.step, l.idx), TID: l.tid}
				for _, fr := range l.stack {
					gp.CallStack = append(gp.CallStack, provenance.CallFrame{
						Entry: fr.entry, FID: fr.fid, Func: d.funcName(fr.fid),
						EventID: d.eventID(fr.step, fr.idx),
					})
				}
				r.GPUParent = gp
			} else {
				d.stats.unmatchedCorrelations.Add(1)
			}
			break
		}
	}
}

// release drops what no window can reach any more: per thread, everything
// before the last Window executions (the next anomaly's "before" half) and
// before the first execution still waiting for a label; open executions and
// those pinned by pending records survive the release (see thread.release).
func (d *Detector) release() {
	w := uint64(d.cfg.Window)
	for _, t := range d.threads {
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

// snapshot publishes the open call stacks for the live probe.
func (d *Detector) snapshot() {
	rep := &psync.CallstackReply{PID: d.cfg.PID, Rank: d.cfg.Rank, IOStep: d.step, Threads: make([]psync.ThreadStack, 0, len(d.threads))}
	for _, t := range d.threads {
		ts := psync.ThreadStack{TID: t.tid, GPU: t.gpu, Frames: make([]psync.OpenFrame, 0, len(t.stack))}
		for _, s := range t.stack {
			e := t.rec(s)
			if e == nil {
				continue
			}
			ts.Frames = append(ts.Frames, psync.OpenFrame{FID: e.fid, Func: d.funcName(e.fid), Entry: e.entry, EventID: d.eventID(e.step, e.idx)})
		}
		rep.Threads = append(rep.Threads, ts)
	}
	d.snap.Store(rep)
}

// Callstacks returns every thread's open call stack as of the end of the last
// processed step. It never blocks processing; safe for concurrent use. The
// reply is shared: callers must not modify it.
func (d *Detector) Callstacks() *psync.CallstackReply { return d.snap.Load() }

// Profiles returns the per-thread profiles accumulated so far.
func (d *Detector) Profiles(final bool) []provenance.ThreadProfile {
	out := make([]provenance.ThreadProfile, 0, len(d.threads))
	for _, t := range d.threads {
		p := provenance.ThreadProfile{PID: d.cfg.PID, Rank: d.cfg.Rank, TID: t.tid, Step: d.step, Final: final,
			Timers: []provenance.TimerProfile{}, Counters: []provenance.CounterProfile{}}
		// Every execution is counted in exactly one call-path node, or past
		// the table's bound in its function's overflow, so a function's flat
		// timer is the sum of those.
		flat := map[uint32]*timerAcc{}
		var fids []uint32
		addFlat := func(fid uint32, a *timerAcc) {
			if a.calls == 0 {
				return
			}
			f := flat[fid]
			if f == nil {
				f = &timerAcc{}
				flat[fid] = f
				fids = append(fids, fid)
			}
			f.calls += a.calls
			f.subrs += a.subrs
			f.incl += a.incl
			f.excl += a.excl
			f.sqIncl += a.sqIncl
			f.sqExcl += a.sqExcl
		}
		for n := range t.paths {
			addFlat(d.nodes[n].fid, &t.paths[n])
		}
		for fid := range t.over {
			addFlat(uint32(fid), &t.over[fid])
		}
		sort.Slice(fids, func(i, j int) bool { return fids[i] < fids[j] })
		for _, fid := range fids {
			p.Timers = append(p.Timers, timerProfile(d.funcName(fid), flat[fid]))
		}
		for n, a := range t.paths {
			if a.calls > 0 && d.nodes[n].depth > 1 {
				p.Timers = append(p.Timers, timerProfile(d.pathName(uint32(n)), &a))
			}
		}
		for cid, a := range t.ctrs {
			name := d.ctrNames[cid]
			if name == "" {
				name = "cid_" + strconv.FormatUint(uint64(cid), 10)
			}
			p.Counters = append(p.Counters, provenance.CounterProfile{Name: name, Count: a.n, Min: a.min, Max: a.max, Mean: a.sum / float64(a.n), SumSqr: a.sumsq})
		}
		sort.Slice(p.Counters, func(i, j int) bool { return p.Counters[i].Name < p.Counters[j].Name })
		if len(t.meta) > 0 {
			p.Metadata = map[string]string{}
			for k, v := range t.meta {
				p.Metadata[k] = v
			}
		}
		out = append(out, p)
	}
	return out
}

func timerProfile(name string, a *timerAcc) provenance.TimerProfile {
	return provenance.TimerProfile{Name: name, Group: "TAU_DEFAULT", Calls: a.calls, Subrs: a.subrs,
		Inclusive: float64(a.incl), Exclusive: float64(a.excl), SumSqInclusive: a.sqIncl, SumSqExclusive: a.sqExcl}
}
