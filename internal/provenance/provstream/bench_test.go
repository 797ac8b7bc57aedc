package provstream

import (
	"context"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/storetest"
)

// BenchmarkPublisherEncode measures a producer's cost per record: a
// Publisher adding batches of 250 anomaly records (5+5 event window) and
// finishing each message, without publishing it, in the block encoding
// (wire=blocks: documents encoded and compressed) or as JSON (wire=json).
// It reports records/s on one goroutine and the message's bytes per record
// (wire-B/record).
func BenchmarkPublisherEncode(b *testing.B) {
	const batch = 250
	execs := storetest.Generate(storetest.GenConfig{Seed: 42, N: 10000, Ranks: 64, Steps: 400, Window: 5, Anomaly: true})
	for _, wire := range []string{"json", "blocks"} {
		b.Run("wire="+wire, func(b *testing.B) {
			ctx := context.Background()
			p := &Publisher{kind: provenance.KindAnomalies, JSON: wire == "json"}
			records, bytes := 0, 0
			for i := 0; b.Loop(); i++ {
				lo := (i * batch) % len(execs)
				for j := range execs[lo : lo+batch] {
					if err := p.Add(ctx, &execs[lo+j]); err != nil {
						b.Fatal(err)
					}
				}
				if p.JSON {
					bytes += len(append(p.buf, ']'))
					p.buf, p.count = p.buf[:0], 0
				} else {
					p.buf = p.blocks.Finish(p.buf[:0])
					bytes += len(p.buf)
					p.blocks.Reset()
				}
				records += batch
			}
			b.ReportMetric(float64(records)/b.Elapsed().Seconds(), "records/s")
			b.ReportMetric(float64(bytes)/float64(records), "wire-B/record")
		})
	}
}
