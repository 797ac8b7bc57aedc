package pserver

import (
	"fmt"

	"github.com/kipimo-hpc/kipimo/internal/psync"
	"github.com/kipimo-hpc/kipimo/internal/stats"
)

// mergeHistogram merges a detector's delta d into the global histogram g (nil
// when the key has none yet) with stats.Histogram.Merge, the detector's own
// merge, and returns the result. The result never aliases d.
func mergeHistogram(g, d *stats.Histogram) (*stats.Histogram, error) {
	if g == nil {
		g = &stats.Histogram{}
	}
	if err := g.Merge(*d); err != nil {
		return g, err
	}
	return g, nil
}

// checkHistograms validates every histogram of a request before anything is
// merged, so that a bad delta rejects the whole request instead of leaving it
// half applied.
func checkHistograms(deltas []psync.ModelDelta) error {
	for i := range deltas {
		if h := deltas[i].Histogram; h != nil {
			if err := h.Validate(); err != nil {
				return fmt.Errorf("model %q: %w", deltas[i].Key, err)
			}
		}
		for j := range deltas[i].More {
			if h := deltas[i].More[j].Histogram; h != nil {
				if err := h.Validate(); err != nil {
					return fmt.Errorf("model %q, further rank %d: %w", deltas[i].Key, j+1, err)
				}
			}
		}
		if t := deltas[i].Tail; t != nil {
			if err := t.Validate(); err != nil {
				return fmt.Errorf("model %q: %w", deltas[i].Key, err)
			}
		}
	}
	return nil
}
