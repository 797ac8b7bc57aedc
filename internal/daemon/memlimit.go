package daemon

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// MemoryLimitUsage is the help of --memory-limit, the same in every command
// that takes it.
const MemoryLimitUsage = "soft limit of the Go heap and runtime (e.g. 2GiB, 1800MiB, 512MB; \"off\" for none): " +
	"near it the garbage collector runs more often instead of letting the heap double; " +
	"\"auto\" takes GOMEMLIMIT when set, else 90% of the cgroup memory limit of a container, else none"

// MemoryLimit is the soft memory limit a process runs under.
type MemoryLimit struct {
	// Bytes is the limit; 0 means none.
	Bytes int64
	// Source says where it came from: "--memory-limit", "GOMEMLIMIT",
	// "cgroup" or "" when there is none.
	Source string
}

// String is the limit as logs and summaries print it.
func (m MemoryLimit) String() string {
	if m.Bytes == 0 {
		return "none"
	}
	return fmt.Sprintf("%d MiB (%s)", m.Bytes>>20, m.Source)
}

// cgroupLimitFiles are where a container's memory limit is read, cgroup v2
// first.
var cgroupLimitFiles = []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}

// ApplyMemoryLimit sets the Go runtime's soft memory limit
// (debug.SetMemoryLimit) as a --memory-limit value says and returns it.
// "auto" keeps GOMEMLIMIT when the environment sets it (the runtime has
// applied it already), else takes 90% of the cgroup memory limit when the
// process runs under one, else sets none; "off" (or 0) sets none; anything
// else is a size (ParseSize). The limit is soft: a heap that needs more
// still gets it, the collector just works harder near it.
func ApplyMemoryLimit(value string) (MemoryLimit, error) {
	switch v := strings.TrimSpace(strings.ToLower(value)); v {
	case "auto", "":
		if os.Getenv("GOMEMLIMIT") != "" {
			return MemoryLimit{Bytes: debug.SetMemoryLimit(-1), Source: "GOMEMLIMIT"}, nil
		}
		if n := cgroupMemoryLimit(cgroupLimitFiles); n > 0 {
			lim := n / 10 * 9
			debug.SetMemoryLimit(lim)
			return MemoryLimit{Bytes: lim, Source: "cgroup"}, nil
		}
		return MemoryLimit{}, nil
	case "off", "0":
		debug.SetMemoryLimit(1<<63 - 1)
		return MemoryLimit{}, nil
	}
	n, err := ParseSize(value)
	if err != nil {
		return MemoryLimit{}, fmt.Errorf("--memory-limit: %w", err)
	}
	if n < 64<<20 {
		return MemoryLimit{}, fmt.Errorf("--memory-limit %s: at least 64MiB", value)
	}
	debug.SetMemoryLimit(n)
	return MemoryLimit{Bytes: n, Source: "--memory-limit"}, nil
}

// cgroupMemoryLimit is the first limit found in files, 0 when none is set
// ("max", or v1's "unlimited" value of about 2^63).
func cgroupMemoryLimit(files []string) int64 {
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			return 0
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 || n >= 1<<60 {
			return 0
		}
		return n
	}
	return 0
}

// sizeUnits are the suffixes ParseSize takes, longest first.
var sizeUnits = []struct {
	suffix string
	mult   int64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
	{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"t", 1 << 40},
	{"b", 1},
}

// ParseSize reads a size in bytes: a number, optionally with a fractional
// part, and a unit: B, KiB, MiB, GiB, TiB (powers of 1024; also K, M, G, T),
// or KB, MB, GB, TB (powers of 1000), in any case. A bare number is bytes.
func ParseSize(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	mult := int64(1)
	for _, u := range sizeUnits {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	if t == "" {
		return 0, fmt.Errorf("size %q: no number", s)
	}
	x, err := strconv.ParseFloat(t, 64)
	if err != nil || x < 0 || x != x {
		return 0, fmt.Errorf("size %q: not a non-negative number with a unit such as MiB or GB", s)
	}
	v := x * float64(mult)
	if v >= 1<<63 {
		return 0, errors.New("size " + strconv.Quote(s) + ": too large")
	}
	return int64(v), nil
}
