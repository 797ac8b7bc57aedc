package docblock

import (
	"syscall"
	"testing"
	"time"
)

// cpuTime is the CPU time the process has used.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkMessageCheck measures what provdb's decoders do with a message
// of the block encoding before its blocks are stored: decode it and check
// every block (Message.Check), for a batch of 250 anomaly records of a 5+5
// event window, as the detectors send. cpu-µs/record is the process's CPU
// time per record (garbage collection included), which a machine shared
// with other work disturbs less than the wall time.
func BenchmarkMessageCheck(b *testing.B) {
	data := encode(b, testExecs(250))
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	cpu0 := cpuTime(b)
	for b.Loop() {
		m, err := DecodeMessage(data)
		if err != nil {
			b.Fatal(err)
		}
		if err := m.Check(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64((cpuTime(b)-cpu0).Nanoseconds())/float64(b.N)/250/1000, "cpu-µs/record")
}
