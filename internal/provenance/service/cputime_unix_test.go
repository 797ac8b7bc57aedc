//go:build unix

package service

import (
	"syscall"
	"time"
)

// cpuTime is the CPU time (user + system) the process has used, so that
// benchmarks on a shared machine can report records per CPU-second next to
// records per wall-clock second.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
