package diff

import (
	"context"
	"io"
	"testing"
)

// BenchmarkCompare compares LoadImbalance's 16- and 32-rank profiles (645
// functions, 48 threads) and prints the table, reporting functions compared
// per second as rows/s.
func BenchmarkCompare(b *testing.B) {
	ctx := context.Background()
	sa, err := LoadPath(ctx, "testdata/loadimbalance/16.ppk", "")
	if err != nil {
		b.Fatal(err)
	}
	sb, err := LoadPath(ctx, "testdata/loadimbalance/32.ppk", "")
	if err != nil {
		b.Fatal(err)
	}
	rows := 0
	b.ResetTimer()
	for b.Loop() {
		r, err := Compare(sa, sb, Options{})
		if err != nil {
			b.Fatal(err)
		}
		if err := WriteText(io.Discard, r); err != nil {
			b.Fatal(err)
		}
		rows += r.Count
	}
	b.ReportMetric(float64(rows)/b.Elapsed().Seconds(), "rows/s")
}
