package ad

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// The configuration's part of a checkpoint, written first: the settings
// the state depends on as name=value pairs, and the hostname. Restore
// refuses a configuration that differs in one of them.

// identity is the configuration the state depends on, as name=value pairs.
func identity(c *Config) [][2]string {
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	ign := slices.Clone(c.Ignore)
	sort.Strings(ign)
	return [][2]string{
		{"pid", strconv.FormatUint(uint64(c.PID), 10)},
		{"rank", strconv.FormatUint(uint64(c.Rank), 10)},
		{"algorithm", c.Algorithm},
		{"chimbuko", strconv.FormatBool(c.Chimbuko)},
		{"statistic", c.Statistic},
		{"by-call-path", strconv.FormatBool(c.ByCallPath)},
		{"model-path-depth", strconv.Itoa(c.ModelPathDepth)},
		{"call-path-depth", strconv.Itoa(c.CallPathDepth)},
		{"profile-paths", strconv.Itoa(c.ProfilePaths)},
		{"ignore", strings.Join(ign, "\x00")},
		{"tail-ratio", f(c.TailRatio)},
		{"tail-recur", strconv.FormatUint(c.TailRecur, 10)},
		{"recur-frac", f(c.RecurFrac)},
		{"false-alarm-rate", f(c.FalseAlarmRate)},
		{"resolution", f(c.Resolution)},
		{"settle-count", f(c.SettleCount)},
		{"sigma", f(c.Sigma)},
		{"threshold", f(c.Threshold)},
		{"bins", strconv.Itoa(c.Bins)},
		{"isolation", strconv.Itoa(c.Isolation)},
		{"max-mass", f(c.MaxMass)},
		{"min-count", f(c.MinCount)},
		{"min-runtime", f(c.MinRuntime)},
		{"slow-only", strconv.FormatBool(c.SlowOnly)},
		{"window", strconv.Itoa(c.Window)},
		{"max-pending-steps", strconv.Itoa(c.MaxPendingSteps)},
		{"normal-rate", f(c.NormalRate)},
		{"shards", strconv.Itoa(c.Shards)},
		{"pserver", strconv.FormatBool(c.Syncer != nil)},
	}
}

// identity writes the settings identity(c) lists, then the hostname.
func (w *ckWriter) identity(c *Config) {
	id := identity(c)
	w.Uvarint(uint64(len(id)))
	for _, kv := range id {
		w.Str(kv[0])
		w.Str(kv[1])
	}
	w.Str(c.Hostname)
}

// identity reads what ckWriter.identity wrote and checks it against c
// (ErrCheckpointMismatch names the first setting that differs); c takes
// the checkpoint's hostname.
func (r *ckReader) identity(c *Config) error {
	want := identity(c)
	if r.version < 3 {
		// version 2 predates the false-alarm rate: its state holds
		// histograms the rate only reads
		want = slices.DeleteFunc(want, func(kv [2]string) bool { return kv[0] == "false-alarm-rate" })
	}
	n := r.Count(2)
	got := make([][2]string, 0, n)
	for range n {
		k := r.Str()
		got = append(got, [2]string{k, r.Str()})
	}
	host := r.Str()
	if r.Err != nil {
		return r.Err
	}
	for i, kv := range want {
		if i >= len(got) || got[i][0] != kv[0] {
			return fmt.Errorf("%w: offset %d: setting %q missing from the checkpoint", ErrBadCheckpoint, len(CheckpointMagic)+1, kv[0])
		}
		if got[i][1] != kv[1] {
			return fmt.Errorf("%w: the checkpoint was taken with %s %q, the configuration has %q",
				ErrCheckpointMismatch, kv[0], strings.ReplaceAll(got[i][1], "\x00", ","), strings.ReplaceAll(kv[1], "\x00", ","))
		}
	}
	if len(got) != len(want) {
		return fmt.Errorf("%w: offset %d: %d settings, this detector knows %d", ErrBadCheckpoint, len(CheckpointMagic)+1, len(got), len(want))
	}
	c.Hostname = host
	return nil
}
