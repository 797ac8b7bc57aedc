package pserver

import (
	"fmt"

	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// checkHistograms validates every histogram of a request before anything is
// merged, so that a bad delta rejects the whole request instead of leaving it
// half applied.
func checkHistograms(deltas []syncproto.ModelDelta) error {
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
