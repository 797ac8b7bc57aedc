package ad

import (
	"github.com/kipimo-hpc/kipimo/internal/stats"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// The models' part of a checkpoint: per model its name, the accumulated,
// in-flight and global statistics (stats.Summary's binary form from version
// 4 on), the natural range and detection state, the algorithm's state; then
// the function and call-path keys.

// models writes every model in key order, then the function and
// call-path keys.
func (w *ckWriter) models(ms *modelSet) {
	w.Uvarint(uint64(len(ms.list)))
	for _, m := range ms.list {
		w.Str(m.name)
		w.Bool(m.ignored)
		w.summ(&m.accum)
		w.summ(&m.inflight)
		w.summ(&m.global)
		w.Bool(m.inFlight)
		for _, v := range [...]float64{m.natMin, m.natMax, m.natLowThr, m.natThr, m.p99, m.logMean, m.logStd} {
			w.F64(v)
		}
		w.moments(&m.det)
		w.Bool(m.detReady)
		w.scoreState(m.state)
	}
	for _, ks := range [][]int32{ms.fidKey, ms.pathKey} {
		w.Uvarint(uint64(len(ks)))
		for _, k := range ks {
			w.Varint(int64(k))
		}
	}
}

// scoreState writes a model's state of the algorithm: SSTD's σ and
// bounds, the histogram HBOS and COPOD score with, nothing for the tail
// scorer.
func (w *ckWriter) scoreState(st scoreState) {
	switch st := st.(type) {
	case *sstdState:
		w.F64(st.std)
		w.F64(st.lo)
		w.F64(st.hi)
	case *hbosState:
		h := st.s.Histogram()
		w.hist(&h)
	case *copodState:
		h := st.s.Histogram()
		w.hist(&h)
	}
}

// scoreState reads m's state of the algorithm (ckWriter.scoreState), m's
// merged moments read.
func (r *ckReader) scoreState(m *model) {
	switch st := m.state.(type) {
	case *sstdState:
		st.std, st.lo, st.hi = r.F64(), r.F64(), r.F64()
	case *hbosState, *copodState:
		var h stats.Histogram
		r.hist(&h)
		if r.Err == nil {
			st.reset(m, h)
		}
	}
}

// modelV3 reads the statistics and detection state of model m as versions
// 2 and 3 wrote them: the three summaries' parts interleaved, and every
// algorithm's state.
func (r *ckReader) modelV3(m *model) {
	for _, s := range []*stats.Summary{&m.accum, &m.inflight, &m.global} {
		r.moments(&s.Moments)
	}
	for _, s := range []*stats.Summary{&m.accum, &m.inflight, &m.global} {
		r.hist(&s.Histogram)
	}
	m.inFlight = r.Bool()
	m.accum.Anomalies = r.Uvarint()
	m.inflight.Anomalies = r.Uvarint()
	for _, s := range []*stats.Summary{&m.accum, &m.inflight, &m.global} {
		r.tail(&s.Tail)
	}
	var lo, hi, std float64
	for _, p := range [...]*float64{&m.natMin, &m.natMax, &m.natLowThr, &m.natThr, &m.p99, &m.logMean, &m.logStd, &lo, &hi, &std} {
		*p = r.F64()
	}
	r.moments(&m.det)
	m.detReady = r.Bool()
	var h stats.Histogram
	r.hist(&h)
	if r.Err != nil {
		return
	}
	switch st := m.state.(type) {
	case *sstdState:
		st.std, st.lo, st.hi = std, lo, hi
	default:
		st.reset(m, h)
	}
}

// models reads what ckWriter.models wrote (versions 2 and 3 through
// modelV3) and checks that the keys and the held executions name models.
func (r *ckReader) models(ms *modelSet) {
	n := r.Count(64)
	for k := range n {
		if r.Err != nil {
			return
		}
		name := r.Str()
		if _, dup := ms.keyByName[name]; dup && r.Err == nil {
			r.Fail("model %q twice", name)
		}
		m := &model{name: name, shard: syncproto.Shard(name, ms.cfg.Shards), ignored: r.Bool(), state: ms.scorer.newState()}
		if r.version < 4 {
			r.modelV3(m)
		} else {
			r.decode(&m.accum)
			r.decode(&m.inflight)
			r.decode(&m.global)
			m.inFlight = r.Bool()
			for _, p := range [...]*float64{&m.natMin, &m.natMax, &m.natLowThr, &m.natThr, &m.p99, &m.logMean, &m.logStd} {
				*p = r.F64()
			}
			r.moments(&m.det)
			m.detReady = r.Bool()
			r.scoreState(m)
		}
		if r.Err != nil {
			return
		}
		ms.list = append(ms.list, m)
		ms.keyByName[name] = int32(k)
	}
	for _, ks := range []*[]int32{&ms.fidKey, &ms.pathKey} {
		n := r.Count(1)
		if r.Err == nil && n > maxFID {
			r.Fail("%d model keys, more than %d", n, maxFID)
		}
		if r.Err != nil || n == 0 {
			continue
		}
		*ks = make([]int32, n)
		for i := range *ks {
			v := r.Varint()
			if r.Err == nil && (v < -1 || v >= int64(len(ms.list))) {
				r.Fail("model key %d out of range (%d)", v, len(ms.list))
			}
			(*ks)[i] = int32(v)
		}
	}
	if r.Err != nil {
		return
	}
	// executions that know their key must name a model
	for _, t := range ms.stacks.threads {
		check := func(e *execRec) {
			if r.Err == nil && (e.key < 0 || e.key > int32(len(ms.list))) {
				r.Fail("execution of thread %d has model key %d, there are %d models", t.tid, e.key-1, len(ms.list))
			}
		}
		for i := range t.ring {
			check(&t.ring[i])
		}
		for _, e := range t.detached {
			check(e)
		}
	}
}
