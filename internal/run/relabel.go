package run

import (
	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// finalLabel returns the end-of-run relabelling: an anomaly stays one when
// its value lies beyond its model's natural range in the final global model
// (Chimbuko v7's post-pruning, with the natural range as the rule). Records
// without an explanation (Chimbuko's rules) and of keys the final model does
// not know stay anomalies; so do those beyond a baseline's bound in a new
// slow mode against it (pserver.Server.FinalRanges). It returns nil when
// there is nothing to relabel with.
func (p *Pipeline) finalLabel() func(*provenance.Exec) bool {
	if p.ps == nil {
		return nil
	}
	ranges := p.ps.FinalRanges()
	if len(ranges) == 0 {
		return nil
	}
	return func(e *provenance.Exec) bool { return provenance.FinalAnomaly(e, ranges) }
}
