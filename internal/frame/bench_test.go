package frame

import (
	"bytes"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/procstat"
)

// reportEvents reports throughput in events per wall-clock second, and in
// events per second of CPU time the process used since cpu0 (on a shared
// machine the latter is the steadier one-core figure; run with -cpu 1), and
// the encoded size per event.
func reportEvents(b *testing.B, f *Frame, size int, cpu0 time.Duration) {
	n := float64(f.NumEvents()) * float64(b.N)
	b.ReportMetric(n/b.Elapsed().Seconds(), "events/s")
	if cpu := procstat.CPUTime() - cpu0; cpu0 > 0 && cpu > 0 {
		b.ReportMetric(n/cpu.Seconds(), "events/cpu-s")
	}
	b.ReportMetric(float64(size)/float64(f.NumEvents()), "B/event")
}

func BenchmarkEncodeBinary(b *testing.B) {
	f := benchFrame()
	buf := AppendBinary(nil, f)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	cpu0 := procstat.CPUTime()
	for b.Loop() {
		buf = AppendBinary(buf[:0], f)
	}
	reportEvents(b, f, len(buf), cpu0)
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
	cpu0 := procstat.CPUTime()
	for b.Loop() {
		if _, err := DecodeBinary(buf, &g); err != nil {
			b.Fatal(err)
		}
	}
	reportEvents(b, f, len(buf), cpu0)
}

func BenchmarkEncodeJSON(b *testing.B) {
	f := benchFrame()
	buf, err := AppendJSON(nil, f)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	cpu0 := procstat.CPUTime()
	for b.Loop() {
		buf, _ = AppendJSON(buf[:0], f)
	}
	reportEvents(b, f, len(buf), cpu0)
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
	cpu0 := procstat.CPUTime()
	for b.Loop() {
		if err := DecodeJSON(buf, &g); err != nil {
			b.Fatal(err)
		}
	}
	reportEvents(b, f, len(buf), cpu0)
}

// BenchmarkReader decodes a stream of frames through a Reader, copying each
// frame from the underlying reader into the Reader's buffer first.
func BenchmarkReader(b *testing.B) {
	f := benchFrame()
	one := AppendBinary(nil, f)
	const frames = 8
	var stream []byte
	for range frames {
		stream = append(stream, one...)
	}
	var g Frame
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	cpu0 := procstat.CPUTime()
	for b.Loop() {
		r := NewReader(bytes.NewReader(stream))
		for range frames {
			if err := r.Next(&g); err != nil {
				b.Fatal(err)
			}
		}
	}
	n := float64(f.NumEvents()) * frames * float64(b.N)
	b.ReportMetric(n/b.Elapsed().Seconds(), "events/s")
	if cpu := procstat.CPUTime() - cpu0; cpu0 > 0 && cpu > 0 {
		b.ReportMetric(n/cpu.Seconds(), "events/cpu-s")
	}
}
