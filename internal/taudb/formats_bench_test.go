package taudb

import (
	"bytes"
	"os"
	"testing"
)

// BenchmarkLoadFormats reads each real file from memory and reports
// rows/s: call-data rows (threads × call paths with data, derived threads
// included) made per second, and the file's bytes per row.
func BenchmarkLoadFormats(b *testing.B) {
	readers := map[string]func([]byte) (*Trial, error){
		FormatPPK:     func(d []byte) (*Trial, error) { return ReadPPK(bytes.NewReader(d), "bench", "bench") },
		FormatXML:     func(d []byte) (*Trial, error) { return ReadSnapshotXML(bytes.NewReader(d), "bench", "bench") },
		FormatCaliper: func(d []byte) (*Trial, error) { return ReadCaliper(bytes.NewReader(d), "bench", "bench") },
	}
	for _, fx := range formatFixtures {
		b.Run(fx.name, func(b *testing.B) {
			data, err := os.ReadFile(formatPath(fx.path))
			if err != nil {
				b.Fatal(err)
			}
			read := readers[fx.format]
			tr, err := read(data)
			if err != nil {
				b.Fatal(err)
			}
			rows := 0
			for _, th := range tr.Threads {
				rows += len(th.CallData)
			}
			b.SetBytes(int64(len(data)))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := read(data); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(rows)*float64(b.N)/b.Elapsed().Seconds(), "rows/s")
			b.ReportMetric(float64(len(data))/float64(rows), "B/record")
		})
	}
}
