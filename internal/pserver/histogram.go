package pserver

import (
	"github.com/kipimo-hpc/kipimo/internal/stats"
)

// mergeHistogram returns the merge of the global histogram g (nil when the key
// has none yet) and a detector's delta d. The result never aliases d.
func mergeHistogram(g, d *stats.Histogram) (*stats.Histogram, error) {
	if g == nil {
		h := *d
		h.Counts = append([]uint64(nil), d.Counts...)
		return &h, nil
	}
	return histogramMerge(g, d)
}
