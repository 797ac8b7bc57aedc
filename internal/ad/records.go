package ad

import (
	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// stepInfo is the io_step being processed.
type stepInfo struct {
	step, tstart, tend uint64
}

// recorder is the detector's last stage: it builds the provenance record of
// a labelled execution (call stack, counters, GPU context, model statistics
// and explanation), waits for the "after" half of its event window (at most
// MaxPendingSteps steps) and moves finished records to the step's batch.
// Not safe for concurrent use: the detector's goroutine owns it.
type recorder struct {
	cfg     *Config
	stats   *counters
	stacks  *callStacks
	models  *modelSet
	cur     *stepInfo
	batch   *Batch // the detector's current batch
	pending []*pendingRec
	wins    ranSteps   // the windows of the last io_steps, for records of executions labelled late
	late    lateSums   // this step's summaries of earlier io_steps
	preempt preemptLog // the rank's involuntary context switches per step
	scratch struct {
		ctr  []attachedCounter
		comm []attachedComm
	}
}

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

// sample maps (tid, seq) to a uniform number in [0, 1), deterministically.
func sample(tid uint32, seq uint64) float64 {
	z := seq*0x9E3779B97F4A7C15 + uint64(tid)*0xD1B54A32D192ED03
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	z ^= z >> 31
	return float64(z>>11) / (1 << 53)
}

// add creates the provenance record of an execution labelled in this
// step; its "after" window is filled in by finish. Its io_step is the one
// it ran in (ranSteps).
func (rc *recorder) add(t *thread, seq uint64, e *execRec, anomaly bool) {
	m := rc.models.list[rc.models.keyOf(t, e)]
	ran := rc.ranIn(e)
	r := &provenance.Exec{
		Entry:            e.entry,
		Exit:             e.exit,
		EventID:          rc.stacks.eventID(e.step, e.idx),
		FID:              e.fid,
		Func:             rc.stacks.funcName(e.fid),
		FuncStats:        provenance.FuncStatsOf(m.det),
		IsGPUEvent:       t.gpu,
		PID:              rc.cfg.PID,
		RID:              rc.cfg.Rank,
		TID:              t.tid,
		RuntimeExclusive: e.excl(),
		RuntimeTotal:     e.incl(),
		IOStep:           ran.step,
		IOStepTStart:     ran.tstart,
		IOStepTEnd:       ran.tend,
		OutlierScore:     rc.models.exactScore(m, e),
		OutlierSeverity:  float64(e.excl()),
		Hostname:         rc.cfg.Hostname,
		Algorithm:        rc.cfg.Algorithm,
		CounterEvents:    []provenance.CounterEvent{},
	}
	if rc.models.gated && m.detReady {
		r.Explanation = explain(m, rc.models.value(e))
		if anomaly && r.Explanation.Value > m.natThr {
			rc.explainCauses(r.Explanation, t, e)
		}
	}
	r.CallStack = rc.callStack(t, seq)
	rc.scratch.ctr = t.countersOf(seq, e, rc.scratch.ctr[:0])
	for _, c := range rc.scratch.ctr {
		r.CounterEvents = append(r.CounterEvents, provenance.CounterEvent{
			CounterIdx: c.ev.CID, CounterName: rc.stacks.ctrNames[c.ev.CID], CounterValue: c.ev.Value,
			PID: rc.cfg.PID, RID: rc.cfg.Rank, TID: t.tid, TS: c.ev.TS,
		})
	}
	if t.gpu {
		r.GPULocation = &provenance.GPULocation{Context: t.loc.context, Device: t.loc.device, Stream: t.loc.stream, Thread: t.tid}
	}
	p := &pendingRec{rec: r, t: t, seq: seq, step: rc.cur.step, anomaly: anomaly, pinnedTo: seq,
		ew: provenance.EventWindow{ExecWindow: []provenance.WindowExec{}, CommWindow: []provenance.CommRecord{}}}
	w := uint64(rc.cfg.Window)
	lo := uint64(0)
	if seq > w {
		lo = seq - w
	}
	for s := lo; s <= seq; s++ {
		rc.windowEntry(&p.ew, t, s)
	}
	t.pin(seq)
	rc.pending = append(rc.pending, p)
}

// callStack is the execution and its ancestors, the execution first.
func (rc *recorder) callStack(t *thread, seq uint64) []provenance.CallFrame {
	var cs []provenance.CallFrame
	for s := seq + 1; s != 0; {
		e := t.rec(s - 1)
		if e == nil {
			break
		}
		var exit uint64
		if e.flags&(flagDone|flagLost) == flagDone {
			exit = e.exit
		}
		cs = append(cs, provenance.CallFrame{
			Entry: e.entry, Exit: exit, FID: e.fid, Func: rc.stacks.funcName(e.fid),
			EventID: rc.stacks.eventID(e.step, e.idx), IsAnomaly: e.label == labelAnomaly,
		})
		s = e.parent
	}
	return cs
}

// finish completes the windows of pending records whose "after" side
// has finished (or that waited MaxPendingSteps, or at the end of the stream)
// and moves them to the batch.
func (rc *recorder) finish(final bool) {
	rc.wins.add(*rc.cur, rc.cfg.MaxPendingSteps+1)
	w := uint64(rc.cfg.Window)
	keep := rc.pending[:0]
	for _, p := range rc.pending {
		t := p.t
		// Pin the "after" executions as they appear, so that releasing the
		// ring never drops them before the record is complete.
		for s := p.pinnedTo + 1; s <= p.seq+w && s < t.next(); s++ {
			t.pin(s)
			p.pinnedTo = s
		}
		ready := final || rc.cur.step-p.step >= uint64(rc.cfg.MaxPendingSteps)
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
		rc.fillWindow(p)
		for s := p.seq; s <= p.pinnedTo; s++ {
			t.unpin(s)
		}
		p.rec.LabelledIOStep = p.step
		if p.anomaly {
			rc.batch.Anomalies = append(rc.batch.Anomalies, *p.rec)
		} else {
			rc.batch.Normal = append(rc.batch.Normal, *p.rec)
		}
	}
	for i := len(keep); i < len(rc.pending); i++ {
		rc.pending[i] = nil
	}
	rc.pending = keep
}

// windowEntry appends execution s of t, and its comm events, to ew.
func (rc *recorder) windowEntry(ew *provenance.EventWindow, t *thread, s uint64) {
	e := t.rec(s)
	if e == nil {
		return
	}
	var exit uint64
	if e.flags&(flagDone|flagLost) == flagDone {
		exit = e.exit
	}
	id := rc.stacks.eventID(e.step, e.idx)
	parent := "root"
	if e.parent != 0 {
		parent = rc.stacks.eventID(e.pstep, e.pidx)
	}
	ew.ExecWindow = append(ew.ExecWindow, provenance.WindowExec{
		Entry: e.entry, Exit: exit, FID: e.fid, Func: rc.stacks.funcName(e.fid),
		EventID: id, ParentEventID: parent, IsAnomaly: e.label == labelAnomaly,
	})
	rc.scratch.comm = t.commsOf(s, e, rc.scratch.comm[:0])
	for _, c := range rc.scratch.comm {
		cr := provenance.CommRecord{
			PID: rc.cfg.PID, RID: rc.cfg.Rank, TID: t.tid, Bytes: c.ev.Bytes, Tag: c.ev.Tag,
			Timestamp: c.ev.TS, ExecdataKey: id,
		}
		if c.ev.Kind == frame.Send {
			cr.Type, cr.Src, cr.Tar = "SEND", rc.cfg.Rank, c.ev.Partner
		} else {
			cr.Type, cr.Src, cr.Tar = "RECV", c.ev.Partner, rc.cfg.Rank
		}
		ew.CommWindow = append(ew.CommWindow, cr)
	}
}

// fillWindow completes the record's event window with the "after" half and
// sets its GPU parent.
func (rc *recorder) fillWindow(p *pendingRec) {
	t, r := p.t, p.rec
	for s := p.seq + 1; s <= p.seq+uint64(rc.cfg.Window); s++ {
		rc.windowEntry(&p.ew, t, s)
	}
	ew := p.ew
	r.EventWindow = ew
	if t.gpu && rc.stacks.corrCID >= 0 {
		for _, c := range r.CounterEvents {
			if int64(c.CounterIdx) != rc.stacks.corrCID {
				continue
			}
			if l, ok := rc.stacks.launches[c.CounterValue]; ok {
				gp := &provenance.GPUParent{EventID: rc.stacks.eventID(l.step, l.idx), TID: l.tid}
				for _, fr := range l.stack {
					gp.CallStack = append(gp.CallStack, provenance.CallFrame{
						Entry: fr.entry, FID: fr.fid, Func: rc.stacks.funcName(fr.fid),
						EventID: rc.stacks.eventID(fr.step, fr.idx),
					})
				}
				r.GPUParent = gp
			} else {
				rc.stats.unmatchedCorrelations.Add(1)
			}
			break
		}
	}
}
