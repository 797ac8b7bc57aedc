// Package procstat reads what the running process has used: CPU time, for
// benchmarks that report work per CPU-second on shared machines.
package procstat

import "time"

// CPUTime is the CPU time (user and system, all threads) the process has
// used so far, or 0 where the platform does not say.
func CPUTime() time.Duration { return cpuTime() }
