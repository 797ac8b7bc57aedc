package pserver

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provstream"
	"github.com/kipimo-hpc/kipimo/internal/stats"
)

// FuncStatsRecords returns the final func_stats records of this shard's model
// keys, in key order, with each key's final natural range when detectors
// send them (the end-of-run relabelling reads it) and its recurring slow
// mode, if any (State.Recurring). FID is the FNV-1a 32 hash of the key, the same on every
// shard, since keys are names (or call paths) rather than per-rank ids.
func (s *Server) FuncStatsRecords() []provenance.GlobalFuncStats {
	var out []provenance.GlobalFuncStats
	s.View(func(st *State) {
		ranges := st.NaturalRanges()
		recurring := map[string]*provenance.RecurringMode{}
		for _, r := range st.Recurring() {
			recurring[r.Func] = &r.RecurringMode
		}
		for _, k := range st.ModelKeys() {
			m := st.Models[k]
			f := provenance.GlobalFuncStats{
				PID: m.PID, FID: keyID(k), Func: k, Stats: finiteStats(m.Moments), Anomalies: m.Anomalies,
			}
			if r, ok := ranges[k]; ok {
				f.NaturalRange = &r
			}
			f.Recurring = recurring[k]
			out = append(out, f)
		}
	})
	return out
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
