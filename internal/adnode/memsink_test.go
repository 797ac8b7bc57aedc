package adnode

import (
	"context"
	"sync"

	"github.com/kipimo-hpc/kipimo/internal/ad"
)

// MemorySink keeps every batch in memory, for this package's tests. Safe
// for concurrent use.
type MemorySink struct {
	mu      sync.Mutex
	Batches []*ad.Batch
}

// Publish implements Sink.
func (s *MemorySink) Publish(_ context.Context, b *ad.Batch) error {
	s.mu.Lock()
	s.Batches = append(s.Batches, b)
	s.mu.Unlock()
	return nil
}

// Flush implements Sink.
func (s *MemorySink) Flush(context.Context) error { return nil }

// All returns the records received so far, merged.
func (s *MemorySink) All() ad.Batch {
	s.mu.Lock()
	defer s.mu.Unlock()
	var all ad.Batch
	for _, b := range s.Batches {
		all.Anomalies = append(all.Anomalies, b.Anomalies...)
		all.Normal = append(all.Normal, b.Normal...)
		all.Metadata = append(all.Metadata, b.Metadata...)
		all.Profiles = append(all.Profiles, b.Profiles...)
	}
	return all
}
