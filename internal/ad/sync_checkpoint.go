package ad

import (
	"fmt"
	"maps"
	"slices"

	"github.com/kipimo-hpc/kipimo/internal/stats"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// The pserver protocol's part of a checkpoint: the incarnation, per shard
// its Seq, the request in flight (only the detector's own requests: a
// node's merged ones are refused) and the model keys it carries; the step
// summaries not yet sent and the counters' moments.

// summary writes a step summary.
func (w *ckWriter) summary(s *syncproto.StepSummary) {
	w.Uvarint(s.Step)
	w.Uvarint(s.Anomalies)
	w.Uvarint(s.Executions)
	w.Uvarint(s.MinTS)
	w.Uvarint(s.MaxTS)
	w.moments(&s.Scores)
	w.moments(&s.Severity)
	if s.FuncAnomalies == nil {
		w.Uvarint(0)
	} else {
		w.Uvarint(uint64(len(s.FuncAnomalies)) + 1)
		for _, k := range slices.Sorted(maps.Keys(s.FuncAnomalies)) {
			w.Str(k)
			w.Uvarint(s.FuncAnomalies[k])
		}
	}
	w.Uvarint(s.Events)
	w.Uvarint(s.BadFrames)
	w.Uvarint(s.MissingSteps)
	w.Uvarint(s.SummarisedCalls)
	w.Uvarint(s.DroppedCalls)
	w.Uvarint(s.DroppedEvents)
	optLen(w, s.Funcs)
	for i := range s.Funcs {
		f := &s.Funcs[i]
		w.Str(f.Func)
		w.Uvarint(f.Count)
		w.moments(&f.Score)
		w.moments(&f.Severity)
		w.Uvarint(f.FirstTS)
		w.Uvarint(f.LastTS)
	}
	w.peer(s.Peer)
}

// request writes the detector's own sync request in flight.
func (w *ckWriter) request(q *syncproto.SyncRequest) error {
	if q.Node != "" || q.Ranks != nil {
		return fmt.Errorf("sync request %d in flight is a node's request, not the detector's own", q.Seq)
	}
	w.U32(q.PID)
	w.U32(q.Rank)
	w.Uvarint(q.Seq)
	w.Uvarint(q.Step)
	w.Str(q.Algorithm)
	w.Str(q.Hostname)
	w.Bool(q.TailRule != nil)
	if r := q.TailRule; r != nil {
		w.F64(r.Ratio)
		w.Uvarint(r.Recur)
		w.F64(r.RecurFrac)
		w.F64(r.Resolution)
		w.F64(r.Alpha)
	}
	optLen(w, q.Models)
	for i := range q.Models {
		m := &q.Models[i]
		if m.More != nil {
			return fmt.Errorf("sync request %d in flight merges other ranks' deltas", q.Seq)
		}
		w.Str(m.Key)
		s := m.Summary()
		w.summ(&s)
	}
	optLen(w, q.Counters)
	for i := range q.Counters {
		w.Str(q.Counters[i].Name)
		w.moments(&q.Counters[i].Moments)
	}
	optLen(w, q.Steps)
	for i := range q.Steps {
		w.summary(&q.Steps[i])
	}
	return nil
}

// sync writes the pserver protocol state.
func (w *ckWriter) sync(s *syncState) error {
	w.Uvarint(s.incarnation)
	w.Uvarint(uint64(len(s.shards)))
	for _, sh := range s.shards {
		w.Uvarint(sh.seq)
		w.Bool(sh.inflight != nil)
		if sh.inflight != nil {
			if sh.inflight.Incarnation != s.incarnation {
				return fmt.Errorf("sync request %d in flight is of incarnation %x, the detector's is %x", sh.inflight.Seq, sh.inflight.Incarnation, s.incarnation)
			}
			if err := w.request(sh.inflight); err != nil {
				return err
			}
		}
		if sh.inflight == nil {
			w.Uvarint(0) // keys of the last answered request: not state
			continue
		}
		w.Uvarint(uint64(len(sh.keys)))
		for _, k := range sh.keys {
			w.U32(uint32(k))
		}
	}
	optLen(w, s.summaries)
	for i := range s.summaries {
		w.summary(&s.summaries[i])
	}
	names := slices.Sorted(maps.Keys(s.counters))
	w.Uvarint(uint64(len(names)))
	for _, n := range names {
		w.Str(n)
		w.moments(s.counters[n])
	}
	return nil
}

// summary reads what ckWriter.summary wrote.
func (r *ckReader) summary(s *syncproto.StepSummary) {
	s.Step = r.Uvarint()
	s.Anomalies = r.Uvarint()
	s.Executions = r.Uvarint()
	s.MinTS = r.Uvarint()
	s.MaxTS = r.Uvarint()
	r.moments(&s.Scores)
	r.moments(&s.Severity)
	if n := r.optCount(2); n >= 0 {
		s.FuncAnomalies = make(map[string]uint64, n)
		for range n {
			k := r.Str()
			s.FuncAnomalies[k] = r.Uvarint()
		}
	}
	s.Events = r.Uvarint()
	s.BadFrames = r.Uvarint()
	s.MissingSteps = r.Uvarint()
	if r.version >= 8 {
		s.SummarisedCalls = r.Uvarint()
		s.DroppedCalls = r.Uvarint()
		s.DroppedEvents = r.Uvarint()
	}
	s.Funcs = optMake[syncproto.FuncAnomalyMetrics](r.optCount(5))
	for i := range s.Funcs {
		f := &s.Funcs[i]
		f.Func = r.Str()
		f.Count = r.Uvarint()
		r.moments(&f.Score)
		r.moments(&f.Severity)
		f.FirstTS = r.Uvarint()
		f.LastTS = r.Uvarint()
	}
	if r.version >= 6 {
		s.Peer = r.peer()
	}
}

// request reads what ckWriter.request wrote.
func (r *ckReader) request() *syncproto.SyncRequest {
	q := &syncproto.SyncRequest{PID: r.U32(), Rank: r.U32(), Seq: r.Uvarint(), Step: r.Uvarint(), Algorithm: r.Str(), Hostname: r.Str()}
	if r.Bool() {
		q.TailRule = &stats.TailRule{Ratio: r.F64(), Recur: r.Uvarint(), RecurFrac: r.F64(), Resolution: r.F64()}
		if r.version >= 3 {
			q.TailRule.Alpha = r.F64()
		}
	}
	q.Models = optMake[syncproto.ModelDelta](r.optCount(5))
	for i := range q.Models {
		key := r.Str()
		var s stats.Summary
		if r.version >= 7 {
			r.decode(&s)
		} else {
			r.Decode(s.DecodeOptionalBinary) // each histogram behind a presence byte
		}
		q.Models[i] = syncproto.NewModelDelta(key, &s, true)
	}
	q.Counters = optMake[syncproto.CounterDelta](r.optCount(2))
	for i := range q.Counters {
		q.Counters[i].Name = r.Str()
		r.moments(&q.Counters[i].Moments)
	}
	q.Steps = optMake[syncproto.StepSummary](r.optCount(10))
	for i := range q.Steps {
		r.summary(&q.Steps[i])
	}
	return q
}

// sync reads what ckWriter.sync wrote and checks each shard's request
// and keys against the models in flight.
func (r *ckReader) sync(s *syncState) {
	s.incarnation = r.Uvarint()
	if r.Err == nil && s.incarnation == 0 {
		r.Fail("sync incarnation 0")
	}
	if n := r.Count(2); r.Err == nil && n != len(s.shards) {
		r.Fail("%d shards, the configuration has %d", n, len(s.shards))
	}
	inShard := make([]int, len(s.models.list))
	for i, sh := range s.shards {
		if r.Err != nil {
			return
		}
		sh.seq = r.Uvarint()
		if r.Bool() {
			sh.inflight = r.request()
			sh.inflight.Incarnation = s.incarnation // written once for the shards
			if r.Err == nil && (sh.inflight.Seq != sh.seq || sh.inflight.PID != s.cfg.PID || sh.inflight.Rank != s.cfg.Rank) {
				r.Fail("request in flight on shard %d is seq %d of rank %d, the shard is at seq %d of rank %d",
					i, sh.inflight.Seq, sh.inflight.Rank, sh.seq, s.cfg.Rank)
			}
		}
		nk := r.Count(1)
		if r.Err == nil && nk > 0 && sh.inflight == nil {
			r.Fail("shard %d has %d keys in flight and no request", i, nk)
		}
		for range nk {
			k := r.below(uint64(len(s.models.list)), "model key")
			if r.Err != nil {
				return
			}
			m := s.models.list[k]
			if m.shard != i || !m.inFlight || inShard[k] != 0 {
				r.Fail("model %q in flight on shard %d is of shard %d (in flight %v)", m.name, i, m.shard, m.inFlight)
				return
			}
			inShard[k] = i + 1
			sh.keys = append(sh.keys, int32(k))
		}
	}
	for k, m := range s.models.list {
		if r.Err == nil && m.inFlight && inShard[k] == 0 {
			r.Fail("model %q is in flight in no request", m.name)
		}
	}
	if n := r.optCount(10); n >= 0 {
		s.summaries = make([]syncproto.StepSummary, n)
		for i := range s.summaries {
			r.summary(&s.summaries[i])
		}
	}
	nc := r.Count(2)
	for range nc {
		name := r.Str()
		m := &stats.Moments{}
		r.moments(m)
		s.counters[name] = m
	}
}
