package pserver

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kipimo-hpc/kipimo/internal/baseline"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provstream"
	"github.com/kipimo-hpc/kipimo/internal/stats"
)

// FuncStatsRecords returns the final func_stats records of this shard's model
// keys, in key order, with each key's final natural range when detectors
// send them (the end-of-run relabelling reads it) with the histogram it is
// read from (a later run's baseline reads it) and its recurring slow mode,
// if any (State.Recurring), and the run's io_steps so far. FID is the FNV-1a 32 hash of the key, the same on every
// shard, since keys are names (or call paths) rather than per-rank ids.
func (s *Server) FuncStatsRecords() []provenance.GlobalFuncStats {
	var out []provenance.GlobalFuncStats
	s.View(func(st *State) { out = s.funcStatsRecords(st) })
	return out
}

// funcStatsRecords is FuncStatsRecords of st, under the state's lock.
func (s *Server) funcStatsRecords(st *State) []provenance.GlobalFuncStats {
	out := []provenance.GlobalFuncStats{}
	ranges := s.finalRanges(st)
	recurring := map[string]*provenance.RecurringMode{}
	for _, r := range st.Recurring() {
		recurring[r.Func] = &r.RecurringMode
	}
	steps := ioSteps(st)
	for _, k := range st.ModelKeys() {
		m := st.Models[k]
		f := provenance.GlobalFuncStats{
			PID: m.PID, FID: keyID(k), Func: k, Stats: finiteStats(m.Moments), Anomalies: m.Anomalies, IOSteps: steps,
		}
		if r, ok := ranges[k]; ok {
			f.NaturalRange = &r
		}
		if !m.Tail.Empty() && st.TailRule != nil {
			h := m.Tail.Clone()
			f.NaturalHist = &h
		}
		f.Recurring = recurring[k]
		out = append(out, f)
	}
	return out
}

// FinalRanges returns the final natural ranges by model key that the
// end-of-run relabelling reads (State.NaturalRanges): with a baseline
// (Config.Baseline), the range of a key with a new slow mode against it
// ends where the mode starts (baseline.NewMode.FromUs, at or beyond the
// baseline's bound), so that the anomalies in the mode stand although this
// run's own range takes it in.
func (s *Server) FinalRanges() map[string]provenance.Range {
	var out map[string]provenance.Range
	s.View(func(st *State) { out = s.finalRanges(st) })
	return out
}

func (s *Server) finalRanges(st *State) map[string]provenance.Range {
	ranges := st.NaturalRanges()
	ref := referenceFor(s.cfg.Baseline, st)
	if ref == nil || len(ranges) == 0 {
		return ranges
	}
	for _, f := range baseline.Compare(ref, currentModels(st), ioSteps(st), baseline.DefaultAlpha).Functions {
		if r, ok := ranges[f.Func]; ok && f.NewMode != nil && f.NewMode.FromUs < r.High {
			r.High = f.NewMode.FromUs
			ranges[f.Func] = r
		}
	}
	return ranges
}

// currentModels is st's models as a baseline comparison reads them.
func currentModels(st *State) []baseline.Current {
	out := make([]baseline.Current, 0, len(st.Models))
	for _, k := range st.ModelKeys() {
		m := st.Models[k]
		out = append(out, baseline.Current{Name: k, Calls: uint64(m.Moments.N), TotalUs: m.Moments.Mean * m.Moments.N, Hist: m.naturalHist()})
	}
	return out
}

// CompareBaseline returns the run's models against Config.Baseline (nil
// without one).
func (s *Server) CompareBaseline() *baseline.Report {
	if s.cfg.Baseline == nil {
		return nil
	}
	var rep *baseline.Report
	s.View(func(st *State) {
		rep = baseline.Compare(referenceFor(s.cfg.Baseline, st), currentModels(st), ioSteps(st), baseline.DefaultAlpha)
	})
	return rep
}

// referenceFor is the baseline ref (Config.Baseline) with its bounds read
// with the natural-range rule the detectors sent, as they read theirs
// (pserver --baseline loads it before any detector has synced, with the
// detectors' default rule); nil without a baseline.
func referenceFor(ref *baseline.Reference, st *State) *baseline.Reference {
	if ref == nil || st.TailRule == nil {
		return ref
	}
	return ref.WithRule(*st.TailRule)
}

// ioSteps is how many io_steps the run had so far (0 before any summary).
func ioSteps(st *State) uint64 {
	if st.Agg == nil || !st.Agg.HaveStep {
		return 0
	}
	return st.Agg.MaxStep + 1
}

// CounterStatsRecords returns the final counter_stats records of this shard.
func (s *Server) CounterStatsRecords() []provenance.GlobalCounterStats {
	var out []provenance.GlobalCounterStats
	s.View(func(st *State) {
		for _, row := range counterTable(st) {
			out = append(out, provenance.GlobalCounterStats{Counter: row.Counter, Stats: finiteStats(*st.Counters[row.Counter])})
		}
	})
	return out
}

// finiteStats is provenance.FuncStatsOf(m) with the derived statistics
// that do not exist (a division by an underflowed m2) as 0, so that the
// records always encode.
func finiteStats(m stats.Moments) provenance.FuncStats {
	f := provenance.FuncStatsOf(m)
	f.Stddev, f.Skewness, f.Kurtosis = finiteOr0(f.Stddev), finiteOr0(f.Skewness), finiteOr0(f.Kurtosis)
	return f
}

func keyID(k string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(k))
	return h.Sum32()
}

// Finish publishes the run's final func_stats and counter_stats records of
// this shard on the provenance subjects, as JSON-array batches with
// deterministic message ids (so publishing twice stores them once). Shutdown
// calls it unless it already ran.
func (s *Server) Finish(ctx context.Context) error {
	if s.nc == nil {
		return fmt.Errorf("publish final statistics: server not started")
	}
	js, err := jetstream.New(s.nc)
	if err != nil {
		return fmt.Errorf("publish final statistics: JetStream: %w", err)
	}
	if _, err := provstream.EnsureStream(ctx, js, s.cfg.Run); err != nil {
		return fmt.Errorf("publish final statistics: %w", err)
	}
	prefix := "pserver." + strconv.Itoa(s.cfg.Shard)
	pub := func(kind provenance.Kind, add func(p *provstream.Publisher) error) error {
		p, err := provstream.NewPublisher(js, s.cfg.Run, kind, prefix)
		if err != nil {
			return err
		}
		if err := add(p); err != nil {
			return err
		}
		return p.Flush(ctx)
	}
	err = pub(provenance.KindFuncStats, func(p *provstream.Publisher) error {
		for _, r := range s.FuncStatsRecords() {
			if err := p.Add(ctx, r); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		err = pub(provenance.KindCounterStats, func(p *provstream.Publisher) error {
			for _, r := range s.CounterStatsRecords() {
				if err := p.Add(ctx, r); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err != nil {
		return fmt.Errorf("publish final statistics: %w", err)
	}
	s.finished.Store(true)
	s.log.Info().Msg("published final func_stats and counter_stats")
	return nil
}
