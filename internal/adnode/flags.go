package adnode

import (
	"fmt"
	"strconv"

	"github.com/spf13/pflag"

	"github.com/kipimo-hpc/kipimo/internal/ad"
	"github.com/kipimo-hpc/kipimo/internal/daemon"
)

// AddFlags registers the detector's options on fs, writing into c: the one
// definition `ad` and `kipimo run` share, so that both have the same flags,
// defaults and meanings. Defaults are those Validate fills in.
func AddFlags(fs *pflag.FlagSet, c *ad.Config) {
	fs.StringVar(&c.Algorithm, "algorithm", ad.Tail, "outlier algorithm: tail, sstd, hbos or copod")
	fs.BoolVar(&c.Chimbuko, "chimbuko", false, "apply Chimbuko's rules exactly, for comparison: no natural-range gate (so real runtimes' recurring tails are flagged), HBOS by default, no end-of-run relabelling")
	fs.Float64Var(&c.TailRatio, "tail-ratio", ad.DefaultTailRatio, "how far beyond its function's natural maximum a runtime must lie to be flagged")
	fs.Uint64Var(&c.TailRecur, "tail-recur", ad.DefaultTailRecur, "runtimes per bin (9% wide) it occupies that a mode beyond a gap needs to be natural (a mode spread over an octave or more: at most twice this in all)")
	fs.Float64Var(&c.RecurFrac, "recur-frac", ad.DefaultRecurFrac, "share of a function's runtimes a mode beyond a gap needs, all its bins together (0.3 of it within 40%, 0.5 of it 4x beyond), to be natural")
	fs.Float64Var(&c.FalseAlarmRate, "false-alarm-rate", ad.DefaultFalseAlarmRate, "share of a function's calls that may lie beyond its natural range (per call, per function; in (0, 0.1)): the range reaches the (1-rate) quantile short of a clear gap (1.5x)")
	fs.Float64Var(&c.SettleCount, "settle-count", ad.DefaultSettleCount, "runtimes a model needs before an execution beyond its natural range is flagged; earlier ones wait (at most 8 steps) for the model's tail to show (negative: never wait)")
	fs.Float64Var(&c.Resolution, "resolution", ad.DefaultResolution, "timer resolution in µs: one tick beyond the natural maximum is still natural")
	fs.Float64Var(&c.Sigma, "sigma", 0, "SSTD threshold in standard deviations (default 3; 6 with --chimbuko)")
	fs.Float64Var(&c.Threshold, "threshold", 0.99, "HBOS/COPOD threshold as a fraction of the score range")
	fs.IntVar(&c.Bins, "bins", 200, "HBOS/COPOD histogram bins")
	fs.StringVar(&c.Statistic, "statistic", ad.Exclusive, "runtime the models are built on: exclusive or inclusive")
	fs.BoolVar(&c.SlowOnly, "slow-only", false, "flag only executions slower than the model's mean (with --chimbuko; the natural range is one-sided already)")
	fs.BoolVar(&c.ByCallPath, "by-call-path", false, "key models by call path instead of by function")
	fs.IntVar(&c.CallPathDepth, "call-path-depth", 0, "frames kept in the profiles' call paths (0: full paths from the root, as Hatchet needs; a limit cuts frames on the root side, as TAU does)")
	fs.IntVar(&c.ModelPathDepth, "model-path-depth", 2, "frames of the call path that keys a model with --by-call-path")
	fs.IntVar(&c.ProfilePaths, "profile-paths", 8192, "most call-path nodes kept per rank; executions below another call on further paths count in their function's flat profile only (top-level calls always get theirs)")
	fs.Float64Var(&c.MinRuntime, "min-runtime", 0, "never flag executions whose runtime (µs) is below this")
	fs.StringSliceVar(&c.Ignore, "ignore", nil, "function names never flagged (repeat or comma-separate)")
	fs.IntVar(&c.Isolation, "isolation", 0, "HBOS/COPOD isolation window half-width in bins (default 3; none with --chimbuko; negative: none, Chimbuko's fraction-of-range threshold)")
	fs.Float64Var(&c.MaxMass, "max-mass", 0, "isolation window mass below which an execution may be flagged (default 0.001 with --isolation)")
	c.Window = 5
	fs.Var((*windowFlag)(&c.Window), "window", "executions before and after an anomaly kept in its exec_window (0: none)")
	fs.Float64Var(&c.NormalRate, "normal-rate", 0, "fraction of normal executions sampled into normalexecs, besides Chimbuko's rule")
	fs.IntVar(&c.ProfileEvery, "profile-every", 0, "publish per-thread profiles every K steps (0: at the end only)")
	fs.IntVar(&c.MaxHeldFrames, "max-held-frames", ad.DefaultMaxHeldFrames, "frames of a rank held while their events use function or counter ids whose names have not arrived yet (a detector started late learns them from the dictionary publishers re-send); beyond it the oldest is dropped and counted")
	c.MaxHeldBytes = ad.DefaultMaxHeldBytes
	fs.Var((*sizeFlag)(&c.MaxHeldBytes), "max-held-bytes", "memory the frames held for their names may take per rank (e.g. 64MiB); beyond it the oldest is dropped and counted")
}

// windowFlag is Config.Window as a flag: an explicit 0 means no window (the
// Config's -1), as users expect of a count.
type windowFlag int

func (w *windowFlag) String() string {
	if *w < 0 {
		return "0"
	}
	return strconv.Itoa(int(*w))
}

func (w *windowFlag) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		return err
	}
	if n == 0 {
		n = -1
	}
	*w = windowFlag(n)
	return nil
}

func (w *windowFlag) Type() string { return "int" }

// sizeFlag is a byte count as a flag: a number with an optional unit (KiB,
// MiB, GiB, ...; daemon.ParseSize).
type sizeFlag int64

func (f *sizeFlag) String() string {
	n := int64(*f)
	for _, u := range []struct {
		name string
		size int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.size && n%u.size == 0 {
			return fmt.Sprintf("%d%s", n/u.size, u.name)
		}
	}
	return strconv.FormatInt(n, 10)
}

func (f *sizeFlag) Set(s string) error {
	n, err := daemon.ParseSize(s)
	if err != nil {
		return err
	}
	*f = sizeFlag(n)
	return nil
}

func (f *sizeFlag) Type() string { return "size" }
