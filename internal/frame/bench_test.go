package frame

import (
	"testing"
)

func reportEvents(b *testing.B, f *Frame, size int) {
	n := float64(f.NumEvents())
	b.ReportMetric(n*float64(b.N)/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(size)/n, "B/event")
}

func BenchmarkEncodeBinary(b *testing.B) {
	f := benchFrame()
	buf := AppendBinary(nil, f)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		buf = AppendBinary(buf[:0], f)
	}
	reportEvents(b, f, len(buf))
}

func BenchmarkDecodeBinary(b *testing.B) {
	f := benchFrame()
	buf := AppendBinary(nil, f)
	var g Frame
	if _, err := DecodeBinary(buf, &g); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := DecodeBinary(buf, &g); err != nil {
			b.Fatal(err)
		}
	}
	reportEvents(b, f, len(buf))
}

func BenchmarkEncodeJSON(b *testing.B) {
	f := benchFrame()
	buf, err := AppendJSON(nil, f)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		buf, _ = AppendJSON(buf[:0], f)
	}
	reportEvents(b, f, len(buf))
}

func BenchmarkDecodeJSON(b *testing.B) {
	f := benchFrame()
	buf, err := AppendJSON(nil, f)
	if err != nil {
		b.Fatal(err)
	}
	var g Frame
	if err := DecodeJSON(buf, &g); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := DecodeJSON(buf, &g); err != nil {
			b.Fatal(err)
		}
	}
	reportEvents(b, f, len(buf))
}
