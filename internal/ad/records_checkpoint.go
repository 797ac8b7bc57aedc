package ad

import (
	"fmt"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// The recorder's part of a checkpoint: the records waiting for the "after"
// half of their window, each with its thread (an index into the call
// stacks' threads), the executions it pins, the whole provenance record and
// the window gathered so far.

// pending writes the records waiting for their window; each names its
// thread by its index in the call stacks.
func (w *ckWriter) pending(d *Detector) error {
	idx := make(map[*thread]int, len(d.stacks.threads))
	for i, t := range d.stacks.threads {
		idx[t] = i
	}
	w.Uvarint(uint64(len(d.rec.pending)))
	for _, p := range d.rec.pending {
		ti, ok := idx[p.t]
		if !ok {
			return fmt.Errorf("record of %s waits on a thread the detector does not hold", p.rec.EventID)
		}
		w.Uvarint(uint64(ti))
		w.Uvarint(p.seq)
		w.Uvarint(p.step)
		w.Bool(p.anomaly)
		w.Uvarint(p.pinnedTo)
		w.record(p.rec)
		w.window(&p.ew)
	}
	return nil
}

// frames1 writes an optional list of call frames.
func (w *ckWriter) frames1(fs []provenance.CallFrame) {
	optLen(w, fs)
	for _, f := range fs {
		w.Uvarint(f.Entry)
		w.Uvarint(f.Exit)
		w.U32(f.FID)
		w.Str(f.Func)
		w.Str(f.EventID)
		w.Bool(f.IsAnomaly)
	}
}

// window writes an event window's executions and communications.
func (w *ckWriter) window(ew *provenance.EventWindow) {
	optLen(w, ew.ExecWindow)
	for _, x := range ew.ExecWindow {
		w.Uvarint(x.Entry)
		w.Uvarint(x.Exit)
		w.U32(x.FID)
		w.Str(x.Func)
		w.Str(x.EventID)
		w.Str(x.ParentEventID)
		w.Bool(x.IsAnomaly)
	}
	optLen(w, ew.CommWindow)
	for _, c := range ew.CommWindow {
		w.Str(c.Type)
		w.U32(c.PID)
		w.U32(c.RID)
		w.U32(c.TID)
		w.U32(c.Src)
		w.U32(c.Tar)
		w.Uvarint(c.Bytes)
		w.U32(c.Tag)
		w.Uvarint(c.Timestamp)
		w.Str(c.ExecdataKey)
	}
}

// record writes every field of a provenance record (checkpoint_test.go's
// TestCheckpointCoversRecordFields fails when the record gains one).
func (w *ckWriter) record(r *provenance.Exec) {
	w.frames1(r.CallStack)
	optLen(w, r.CounterEvents)
	for _, c := range r.CounterEvents {
		w.U32(c.CounterIdx)
		w.Str(c.CounterName)
		w.Uvarint(c.CounterValue)
		w.U32(c.PID)
		w.U32(c.RID)
		w.U32(c.TID)
		w.Uvarint(c.TS)
	}
	w.Uvarint(r.Entry)
	w.Uvarint(r.Exit)
	w.Str(r.EventID)
	w.U32(r.FID)
	w.Str(r.Func)
	fs := r.FuncStats
	for _, v := range [...]float64{fs.Accumulate, fs.Count, fs.Kurtosis, fs.Maximum, fs.Mean, fs.Minimum, fs.Skewness, fs.Stddev} {
		w.F64(v)
	}
	w.Bool(r.IsGPUEvent)
	w.Bool(r.GPULocation != nil)
	if g := r.GPULocation; g != nil {
		w.U32(g.Context)
		w.U32(g.Device)
		w.U32(g.Stream)
		w.U32(g.Thread)
	}
	w.Bool(r.GPUParent != nil)
	if g := r.GPUParent; g != nil {
		w.Str(g.EventID)
		w.U32(g.TID)
		w.frames1(g.CallStack)
	}
	w.U32(r.PID)
	w.U32(r.RID)
	w.U32(r.TID)
	w.Uvarint(r.RuntimeExclusive)
	w.Uvarint(r.RuntimeTotal)
	w.Uvarint(r.IOStep)
	w.Uvarint(r.IOStepTStart)
	w.Uvarint(r.IOStepTEnd)
	w.window(&r.EventWindow)
	w.F64(r.OutlierScore)
	w.F64(r.OutlierSeverity)
	w.Str(r.Hostname)
	w.Str(r.Algorithm)
	w.Bool(r.Explanation != nil)
	if x := r.Explanation; x != nil {
		w.Str(x.Key)
		for _, v := range [...]float64{x.Value, x.NaturalMin, x.NaturalMax, x.LowThreshold, x.Threshold, x.Ratio, x.P99, x.LogSigmas, x.Excess} {
			w.F64(v)
		}
		w.Str(x.Text)
		w.evidence(x.Baseline)
	}
	w.Str(r.FinalLabel)
}

// callFrames reads what ckWriter.frames1 wrote.
func (r *ckReader) callFrames() []provenance.CallFrame {
	fs := optMake[provenance.CallFrame](r.optCount(6))
	for i := range fs {
		fs[i] = provenance.CallFrame{Entry: r.Uvarint(), Exit: r.Uvarint(), FID: r.U32(), Func: r.Str(), EventID: r.Str(), IsAnomaly: r.Bool()}
	}
	return fs
}

// window reads what ckWriter.window wrote.
func (r *ckReader) window(ew *provenance.EventWindow) {
	ew.ExecWindow = optMake[provenance.WindowExec](r.optCount(7))
	for i := range ew.ExecWindow {
		ew.ExecWindow[i] = provenance.WindowExec{Entry: r.Uvarint(), Exit: r.Uvarint(), FID: r.U32(), Func: r.Str(),
			EventID: r.Str(), ParentEventID: r.Str(), IsAnomaly: r.Bool()}
	}
	ew.CommWindow = optMake[provenance.CommRecord](r.optCount(10))
	for i := range ew.CommWindow {
		ew.CommWindow[i] = provenance.CommRecord{Type: r.Str(), PID: r.U32(), RID: r.U32(), TID: r.U32(), Src: r.U32(), Tar: r.U32(),
			Bytes: r.Uvarint(), Tag: r.U32(), Timestamp: r.Uvarint(), ExecdataKey: r.Str()}
	}
}

// record reads what ckWriter.record wrote.
func (r *ckReader) record() *provenance.Exec {
	x := &provenance.Exec{}
	x.CallStack = r.callFrames()
	x.CounterEvents = optMake[provenance.CounterEvent](r.optCount(7))
	for i := range x.CounterEvents {
		x.CounterEvents[i] = provenance.CounterEvent{CounterIdx: r.U32(), CounterName: r.Str(), CounterValue: r.Uvarint(),
			PID: r.U32(), RID: r.U32(), TID: r.U32(), TS: r.Uvarint()}
	}
	x.Entry = r.Uvarint()
	x.Exit = r.Uvarint()
	x.EventID = r.Str()
	x.FID = r.U32()
	x.Func = r.Str()
	x.FuncStats = provenance.FuncStats{Accumulate: r.F64(), Count: r.F64(), Kurtosis: r.F64(), Maximum: r.F64(),
		Mean: r.F64(), Minimum: r.F64(), Skewness: r.F64(), Stddev: r.F64()}
	x.IsGPUEvent = r.Bool()
	if r.Bool() {
		x.GPULocation = &provenance.GPULocation{Context: r.U32(), Device: r.U32(), Stream: r.U32(), Thread: r.U32()}
	}
	if r.Bool() {
		x.GPUParent = &provenance.GPUParent{EventID: r.Str(), TID: r.U32()}
		x.GPUParent.CallStack = r.callFrames()
	}
	x.PID = r.U32()
	x.RID = r.U32()
	x.TID = r.U32()
	x.RuntimeExclusive = r.Uvarint()
	x.RuntimeTotal = r.Uvarint()
	x.IOStep = r.Uvarint()
	x.IOStepTStart = r.Uvarint()
	x.IOStepTEnd = r.Uvarint()
	r.window(&x.EventWindow)
	x.OutlierScore = r.F64()
	x.OutlierSeverity = r.F64()
	x.Hostname = r.Str()
	x.Algorithm = r.Str()
	if r.Bool() {
		x.Explanation = &provenance.Explanation{Key: r.Str(), Value: r.F64(), NaturalMin: r.F64(), NaturalMax: r.F64(),
			LowThreshold: r.F64(), Threshold: r.F64(), Ratio: r.F64(), P99: r.F64(), LogSigmas: r.F64(), Excess: r.F64()}
		x.Explanation.Text = r.Str()
		if r.version >= 6 {
			x.Explanation.Baseline = r.evidence()
		}
	}
	x.FinalLabel = r.Str()
	return x
}

// pending reads what ckWriter.pending wrote and checks each record's
// thread and the executions it pins.
func (r *ckReader) pending(d *Detector) {
	n := r.Count(8)
	for range n {
		if r.Err != nil {
			return
		}
		ti := r.below(uint64(len(d.stacks.threads)), "thread index")
		p := &pendingRec{seq: r.Uvarint(), step: r.Uvarint(), anomaly: r.Bool(), pinnedTo: r.Uvarint()}
		p.rec = r.record()
		r.window(&p.ew)
		if r.Err != nil {
			return
		}
		p.t = d.stacks.threads[ti]
		if p.pinnedTo < p.seq || p.pinnedTo-p.seq > uint64(d.cfg.Window) || p.pinnedTo >= p.t.next() {
			r.Fail("record %s pins executions %d..%d (window %d)", p.rec.EventID, p.seq, p.pinnedTo, d.cfg.Window)
			return
		}
		d.rec.pending = append(d.rec.pending, p)
	}
}
