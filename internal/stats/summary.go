package stats

import (
	"errors"
	"slices"
)

// Summary is everything a detector learns about one model key over a set of
// executions, and what the parameter server merges from every rank: the
// runtimes' moments, their HBOS histogram (HBOS and COPOD runs; empty
// otherwise), their natural-range histogram (empty with Chimbuko's rules)
// and the number of those executions labelled anomalies. The detector keeps
// three of them per key (its unsent deltas, the deltas in flight, the last
// global model); the sync protocol sends the first and answers with the
// last. The zero value is an empty summary.
type Summary struct {
	Moments   Moments
	Histogram Histogram
	Tail      TailHist
	Anomalies uint64
}

// Merge adds o into s. What is exact and independent of order and what is
// not:
//
//   - Tail and Anomalies: exact, in any order (counts add, bounds take min
//     and max).
//   - Moments: exact in value but not to the bit: a.Merge(b) and b.Merge(a)
//     may differ in the last bits, so every merge of one model (detector,
//     node syncer, pserver) keeps one order: the older summary first.
//   - Histogram: re-binned over the union of both ranges (Histogram.Merge),
//     so the bins depend on the order; counts and total stay exact.
//
// A malformed histogram of o is not merged and neither is a malformed tail;
// the rest is. The error joins one error per part that failed (errors.Join),
// and s is whole whatever it says.
func (s *Summary) Merge(o Summary) error {
	s.Moments.Merge(o.Moments)
	var errs []error
	if err := s.Histogram.Merge(o.Histogram); err != nil {
		errs = append(errs, err)
	}
	if err := s.Tail.Merge(o.Tail); err != nil {
		errs = append(errs, err)
	}
	s.Anomalies += o.Anomalies
	return errors.Join(errs...)
}

// Reset empties s, keeping the storage of its histograms (which must then
// not be shared with another summary).
func (s *Summary) Reset() {
	s.Moments = Moments{}
	s.Histogram = Histogram{Counts: s.Histogram.Counts[:0]}
	s.Tail.Reset()
	s.Anomalies = 0
}

// Clone returns a deep copy of s: it shares no memory with s.
func (s *Summary) Clone() Summary {
	c := *s
	c.Histogram.Counts = slices.Clone(s.Histogram.Counts)
	c.Tail = s.Tail.Clone()
	return c
}

// Empty reports whether s holds nothing to send: no runtime and no anomaly.
func (s *Summary) Empty() bool { return s.Moments.N == 0 && s.Anomalies == 0 }
