package run

import (
	"context"
	"fmt"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// standingAnomalies counts the stored anomalies that stand after the
// end-of-run relabelling (those the final models still flag: what kipimo
// query count and list count by default). ok is false when there is
// nothing to relabel with (Chimbuko's rules).
func (p *Pipeline) standingAnomalies(ctx context.Context) (n uint64, ok bool, err error) {
	final := p.finalLabel()
	if final == nil {
		return 0, false, nil
	}
	q := provenance.Query{Kind: provenance.KindAnomalies, Limit: provenance.NoLimit}
	if err := p.store.Each(ctx, q, func(e provenance.Exec) error {
		if final(&e) {
			n++
		}
		return nil
	}); err != nil {
		return 0, false, fmt.Errorf("count the anomalies that stand: %w", err)
	}
	return n, true, nil
}
