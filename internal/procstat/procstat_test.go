package procstat

import (
	"runtime"
	"testing"
)

func TestCPUTimeAdvancesWithWork(t *testing.T) {
	if runtime.GOOS == "windows" || runtime.GOOS == "plan9" {
		t.Skip("no rusage here")
	}
	before := CPUTime()
	x := 0
	for i := range 50_000_000 {
		x += i ^ (x >> 3)
	}
	after := CPUTime()
	if after <= before {
		t.Fatalf("CPU time went from %v to %v over a busy loop (%d)", before, after, x)
	}
}
