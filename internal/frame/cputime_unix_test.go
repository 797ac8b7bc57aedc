//go:build unix

package frame

import (
	"syscall"
	"time"
)

// cpuTime is the user+system CPU time this process has used, or 0 when it
// cannot be read.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
