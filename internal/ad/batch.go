package ad

import (
	"context"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// Batch is one detector's records of one step (or of Close).
type Batch struct {
	PID       uint32
	Rank      uint32
	Step      uint64
	Anomalies []provenance.Exec
	Normal    []provenance.Exec
	Metadata  []provenance.Metadata
	Profiles  []provenance.ThreadProfile
}

// Len is the number of records in b.
func (b *Batch) Len() int {
	return len(b.Anomalies) + len(b.Normal) + len(b.Metadata) + len(b.Profiles)
}

// Sink receives the records of detectors. Publish takes ownership of b. A
// Sink shared by several detectors must be safe for concurrent use. Publish
// must not grow without bound: it either blocks (back-pressure) or drops and
// counts; an error means the batch was not accepted (the detector counts its
// records as dropped).
type Sink interface {
	Publish(ctx context.Context, b *Batch) error
	Flush(ctx context.Context) error
}

// emit hands the step's batch to the sink.
func (d *Detector) emit(ctx context.Context) {
	b := d.batch
	d.batch = Batch{}
	b.PID, b.Rank, b.Step = d.cfg.PID, d.cfg.Rank, d.cur.step
	n := b.Len()
	if n == 0 {
		return
	}
	d.stats.records.Add(uint64(n))
	if d.cfg.Sink == nil {
		return
	}
	if err := d.cfg.Sink.Publish(ctx, &b); err != nil {
		d.stats.droppedRecords.Add(uint64(n))
	}
}
