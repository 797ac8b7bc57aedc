// Package ad is Kipimo's on-node anomaly detector: it turns one rank's frames
// into executions (call stacks per thread that persist across io_steps),
// keeps running statistics per function or call path, labels executions
// against the model it shares with the parameter server, and produces
// provenance records (anomalies, sampled normal executions, metadata,
// per-thread profiles).
//
// A Detector is a pipeline of stages, each a small type with one job:
// callStacks (events to executions), modelSet (keys, statistics and, at a
// step's end, detection state; the algorithms sit behind the scorer
// interface), labelling, and the recorder (records and event windows).
//
// The detector (New, Process per io_step, Close) does no network I/O of its
// own and knows nothing of NATS or Prometheus: the parameter server is
// reached through a Syncer and records leave through a Sink. The node that
// runs the detectors of one process on NATS (frame subscriptions, durable
// frames and checkpoints, the NATS Sink and Syncer, the node's merged sync,
// metrics, the ad command) is package adnode, which uses only the API here.
//
// Semantics (docs/detection.md):
//   - An execution is flagged when its runtime lies outside its model's
//     natural range (stats.TailHist): the body of runtimes, continuous within
//     TailRatio, plus modes that recur (TailRecur, RecurFrac), up to the
//     (1-FalseAlarmRate) quantile short of a clear gap. Tail, the
//     default algorithm, uses the range alone; SSTD, HBOS and COPOD flag only
//     what they flag outside it. Chimbuko's rules (Config.Chimbuko) drop the
//     range, for comparison.
//   - Executions are labelled at the end of the step in which they exit,
//     against a model that includes that step's data: the last global model
//     from the pserver merged with every local delta it does not include yet.
//     Executions of a model with fewer than MinCount values, and executions
//     beyond the range of a model with fewer than SettleCount, wait (for at
//     most MaxPendingSteps steps) as Chimbuko's unlabelled carry-over does;
//     their statistics are counted once.
//   - With a Barrier (kipimo run on files) the detectors of a process move in
//     lockstep, so detection is reproducible.
//   - Event ids are "<rank>:<io_step>:<idx>" with the io_step and index of the
//     entry event; io_step of a record is the step it ran in (the frame
//     holding its exit event), labelled_io_step the one it was labelled in.
//   - outlier_severity is the exclusive runtime in µs; outlier_score is the
//     ratio to the natural maximum (tail), |z| (SSTD), -log2(p + α) (HBOS) or
//     the COPOD tail score; every record explains itself (Explanation).
//
// Memory is bounded: per thread the ring of executions keeps the last Window
// executions, those not yet labelled, open ones and those pinned by records
// waiting for the "after" half of their window (MaxPendingSteps at most).
package ad

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/baseline"
	"github.com/kipimo-hpc/kipimo/internal/stats"
)

// Algorithm names, as given in Config.Algorithm and in provenance records.
const (
	// Tail, the default, flags executions beyond their model's natural range
	// (stats.TailHist.NaturalMax): Config.TailRatio beyond the largest
	// runtime that belongs to the body of the function's runtimes or keeps
	// recurring.
	Tail  = "tail"
	SSTD  = "sstd"
	HBOS  = "hbos"
	COPOD = "copod"
)

// Algorithms lists the algorithm names, the default first.
var Algorithms = []string{Tail, SSTD, HBOS, COPOD}

// Default tail rule (Config.TailRatio, TailRecur, RecurFrac,
// FalseAlarmRate, Resolution).
const (
	DefaultTailRatio      = 1.4
	DefaultTailRecur      = 5
	DefaultRecurFrac      = 0.005
	DefaultFalseAlarmRate = 1e-4
	DefaultSettleCount    = 1000
	DefaultResolution     = 1.0
)

// Statistic names: which runtime the models are built on.
const (
	Exclusive = "exclusive"
	Inclusive = "inclusive"
)

// MaxCallPathDepth is the most frames a call path keeps; deeper recursion
// loses frames on the root side.
const MaxCallPathDepth = 128

// Config configures one detector (one program rank). The zero value plus PID
// and Rank is valid after Validate fills the defaults.
type Config struct {
	PID  uint32
	Rank uint32

	// Algorithm is Tail (the default), SSTD, HBOS or COPOD (HBOS with
	// Chimbuko).
	Algorithm string
	// Chimbuko applies Chimbuko's rules exactly, for comparison: no natural
	// range gate, HBOS by default, and no end-of-run relabelling. Without it
	// (the default) every algorithm flags only executions beyond their
	// model's natural range (TailRatio, TailRecur), which is what keeps real
	// runtimes' recurring tails and µs quantisation from being flagged.
	Chimbuko bool
	// TailRatio is how far beyond the natural maximum a runtime must lie to
	// be outside the natural range, and how far apart two runtimes may be
	// and still belong to one body (default 1.4).
	TailRatio float64
	// TailRecur is how many runtimes per bin (about 9% wide) it occupies a
	// mode beyond a gap needs to be natural whatever the gap below it
	// (default 5; a mode spread over an octave or more, stats.WideRatio,
	// needs at most twice this in all).
	TailRecur uint64
	// RecurFrac is the share of the model's runtimes such a mode must also
	// hold, all its bins together, or 0.3 of it (stats.DenseShare; 0.5 for
	// a mode 4x beyond) within TailRatio of each other (default 0.005): a
	// cluster of rare anomalies is not behaviour.
	RecurFrac float64
	// FalseAlarmRate is the share of a function's calls that may lie beyond
	// its natural range (per call, per function; default 1e-4, in (0,
	// 0.1)): the range never ends below the (1-FalseAlarmRate) quantile of
	// the model's runtimes, except across a clear gap (1.5x beyond,
	// stats.ClearGapRatio), so rare far stalls stay anomalies
	// (docs/detection.md).
	FalseAlarmRate float64
	// SettleCount is how many runtimes a model needs before an execution
	// beyond its natural range is flagged (default 1000): earlier, the
	// execution waits (at most MaxPendingSteps steps) for the model to
	// show its tail, as executions wait for MinCount. 0 by default with
	// Chimbuko's rules; negative means never wait.
	SettleCount float64
	// Resolution is the timer resolution in µs (default 1): a runtime one
	// tick beyond the natural maximum is still natural.
	Resolution float64
	// Sigma is SSTD's threshold in standard deviations (default 3; 6, as
	// Chimbuko, with its rules: with the natural range deciding what is
	// natural, SSTD's own threshold only has to leave the far tail to it).
	Sigma float64
	// Threshold is HBOS's and COPOD's fraction of the score range (default 0.99).
	Threshold float64
	// Bins is the number of histogram bins (default 200).
	Bins int
	// Statistic is Exclusive (default) or Inclusive runtime.
	Statistic string
	// SlowOnly flags only executions slower than the model's mean (Chimbuko
	// flags unusually fast ones too).
	SlowOnly bool
	// ByCallPath keys models by call path ("a => b => f", the execution's
	// last ModelPathDepth frames) instead of by function name.
	ByCallPath bool
	// ModelPathDepth is how many frames key a model with ByCallPath
	// (default 2).
	ModelPathDepth int
	// ProfilePaths bounds the call-path nodes a detector keeps (default
	// 8192): executions below another call on paths met once it is reached
	// count in their function's flat profile only (Stats.PathOverflows,
	// provenance.ThreadProfile.Overflow), so memory stays bounded on codes
	// whose call trees never repeat; top-level calls always get their path
	// (one per function).
	ProfilePaths int
	// CallPathDepth is how many frames a call path keeps, the execution's own
	// included (TAU's TAU_CALLPATH_DEPTH). The default, 0, keeps full paths
	// from the thread's root, up to MaxCallPathDepth frames; deeper paths
	// (and every path, with a limit) lose frames on the root side, as TAU
	// cuts them. It bounds both the profile's call paths and the
	// per-call-path models.
	CallPathDepth int
	// MinRuntime is a floor in µs: executions whose statistic is below it are
	// never flagged.
	MinRuntime float64
	// Ignore lists function names that are never flagged.
	Ignore []string
	// MinCount is the number of values a model needs before it labels
	// anything (default 2; with Isolation, also at least 1/MaxMass).
	// Executions completed earlier stay unlabelled and are retried at the
	// next steps, as Chimbuko does, for at most MaxPendingSteps steps; then
	// they are labelled normal and counted in Stats.Unscored.
	MinCount float64
	// Isolation (HBOS and COPOD) is the half-width in bins of an isolation
	// window: an execution is flagged only if the model's probability mass
	// within Isolation bins of its value is below MaxMass. HBOS then scores
	// -log2 of that mass instead of its bin's probability; COPOD keeps its
	// score. This removes the flaw of the fraction-of-range threshold, which
	// flags the sparsest bins of every histogram, outliers or not. 0 means
	// the default: 3, or with Chimbuko's rules none (their fraction-of-range
	// threshold); negative means none.
	Isolation int
	// MaxMass is the isolation window's mass below which an execution may be
	// flagged (default 0.001 when Isolation is set).
	MaxMass float64

	// Window is the number of executions before and after an anomaly on the
	// same thread kept in its exec_window (default 5; negative means 0).
	Window int
	// MaxPendingSteps bounds how many steps a record waits for its "after"
	// window to complete before it is published with what exists (default 8).
	MaxPendingSteps int
	// NormalRate is the fraction of normal executions sampled into
	// normalexecs in addition to Chimbuko's rule (one lowest-score normal
	// execution per function that had an anomaly in the step). 0 by default.
	NormalRate float64
	// ProfileEvery publishes the per-thread profiles every K steps (0: only at
	// the end of the stream).
	ProfileEvery int
	// MaxHeldFrames bounds the frames held while their events use function
	// or counter ids whose names have not arrived yet (default
	// DefaultMaxHeldFrames); beyond it the oldest is dropped and counted in
	// Stats.UnnamedFrames.
	MaxHeldFrames int
	// MaxHeldBytes bounds the same frames by the memory they take (default
	// DefaultMaxHeldBytes): beyond it the oldest are dropped and counted
	// as for MaxHeldFrames.
	MaxHeldBytes int64

	// Baseline, when set, is a finished run of the same code this run is
	// compared with while it runs (package baseline; ad --baseline, kipimo
	// run --baseline): executions of a key whose calls beyond the
	// baseline's natural threshold are significantly more frequent than in
	// the baseline are flagged, with the baseline named in their
	// explanation (docs/detection.md). Shared read-only by the detectors.
	Baseline *baseline.Reference

	// Hostname goes into every record; default the host's name, replaced by
	// the stream's "Hostname" metadata when present.
	Hostname string

	// Syncer reaches the parameter server; nil runs on the local model only.
	Syncer Syncer
	// Barrier, shared by the detectors of a process, makes detection
	// reproducible on files (see Barrier); the detector has joined it
	// already and leaves it on Close. nil for live runs.
	Barrier *Barrier
	// Shards is the number of pserver shards (default 1).
	Shards int
	// SyncWait is how long the end of a step waits for the pserver's reply
	// when the pserver is answering (default 1s); while it is not, detection
	// goes on at once with the local model merged into the last global one.
	SyncWait time.Duration
	// ExactSync sends every step's deltas at the step's end and waits for
	// the pserver's answer, however long, before labelling (as in
	// lockstep, without the other detectors). The requests a detector
	// sends are then a function of its frames alone, so a detector
	// restored from a checkpoint and fed the frames after it resends the
	// very requests, with the same Seqs, that the pserver may have applied
	// already (durable frames set it).
	ExactSync bool
	// SyncTimeout bounds one sync attempt (default 2s); failed attempts are
	// retried with exponential backoff from 50ms up to SyncBackoffMax (5s).
	SyncTimeout    time.Duration
	SyncBackoffMax time.Duration
	// MaxStepSummaries bounds the step summaries kept while the pserver is
	// unreachable (default 10000; the oldest are dropped and counted).
	MaxStepSummaries int

	// Sink receives the records; nil discards them (they are still counted).
	Sink Sink

	// Logger receives lifecycle messages (never one per event).
	Logger zerolog.Logger
}

// TailRule is the rule the natural range is read with.
func (c *Config) TailRule() stats.TailRule {
	return stats.TailRule{Ratio: c.TailRatio, Recur: c.TailRecur, RecurFrac: c.RecurFrac, Resolution: c.Resolution, Alpha: c.FalseAlarmRate}
}

// gated reports whether executions must lie beyond the natural range to be
// flagged (every algorithm but with Chimbuko's rules).
func (c *Config) gated() bool { return !c.Chimbuko }

// Validate checks c and fills its defaults.
func (c *Config) Validate() error {
	c.Algorithm = strings.ToLower(c.Algorithm)
	if c.Algorithm == "" {
		c.Algorithm = Tail
		if c.Chimbuko {
			c.Algorithm = HBOS
		}
	}
	switch c.Algorithm {
	case Tail, SSTD, HBOS, COPOD:
	default:
		return fmt.Errorf("algorithm %q is not one of %s", c.Algorithm, strings.Join(Algorithms, ", "))
	}
	if c.Algorithm == Tail && c.Chimbuko {
		return errors.New("algorithm tail is not one of Chimbuko's (use sstd, hbos or copod with Chimbuko's rules)")
	}
	if c.TailRatio == 0 {
		c.TailRatio = DefaultTailRatio
	}
	if !(c.TailRatio > 1) {
		return fmt.Errorf("tail ratio %v must be greater than 1", c.TailRatio)
	}
	if c.TailRecur == 0 {
		c.TailRecur = DefaultTailRecur
	}
	if c.SettleCount == 0 && !c.Chimbuko {
		c.SettleCount = DefaultSettleCount
	}
	if c.RecurFrac == 0 {
		c.RecurFrac = DefaultRecurFrac
	}
	if c.RecurFrac < 0 || c.RecurFrac >= 1 {
		return fmt.Errorf("recurring fraction %v must be in [0, 1)", c.RecurFrac)
	}
	if c.FalseAlarmRate == 0 {
		c.FalseAlarmRate = DefaultFalseAlarmRate
	}
	if !(c.FalseAlarmRate > 0 && c.FalseAlarmRate < 0.1) {
		return fmt.Errorf("false-alarm rate %v must be in (0, 0.1): the share of a function's calls that may be flagged, e.g. 1e-4", c.FalseAlarmRate)
	}
	if c.Resolution == 0 {
		c.Resolution = DefaultResolution
	}
	if !(c.Resolution > 0) {
		return fmt.Errorf("resolution %v must be positive", c.Resolution)
	}
	if c.Sigma == 0 {
		c.Sigma = 3
		if c.Chimbuko {
			c.Sigma = 6
		}
	}
	if !(c.Sigma > 0) {
		return fmt.Errorf("sigma %v must be positive", c.Sigma)
	}
	if c.Threshold == 0 {
		c.Threshold = stats.DefaultHBOSThreshold
	}
	if !(c.Threshold > 0 && c.Threshold <= 1) {
		return fmt.Errorf("threshold %v must be in (0, 1]", c.Threshold)
	}
	if c.Bins == 0 {
		c.Bins = stats.DefaultBins
	}
	if c.Bins < 1 || c.Bins > 1<<16 {
		return fmt.Errorf("bins %d must be in [1, 65536]", c.Bins)
	}
	if c.Statistic == "" {
		c.Statistic = Exclusive
	}
	if c.Statistic != Exclusive && c.Statistic != Inclusive {
		return fmt.Errorf("statistic %q is not exclusive or inclusive", c.Statistic)
	}
	if c.CallPathDepth == 0 {
		c.CallPathDepth = MaxCallPathDepth
	}
	if c.CallPathDepth < 1 || c.CallPathDepth > MaxCallPathDepth {
		return fmt.Errorf("call-path depth %d must be in [1, %d] (0: full paths)", c.CallPathDepth, MaxCallPathDepth)
	}
	if c.ModelPathDepth == 0 {
		c.ModelPathDepth = 2
	}
	if c.ModelPathDepth < 1 || c.ModelPathDepth > MaxCallPathDepth {
		return fmt.Errorf("model path depth %d must be in [1, %d]", c.ModelPathDepth, MaxCallPathDepth)
	}
	if c.ProfilePaths == 0 {
		c.ProfilePaths = 1 << 13
	}
	if c.ProfilePaths < 1 || c.ProfilePaths >= int(pathOverflow) {
		return fmt.Errorf("profile paths %d must be positive", c.ProfilePaths)
	}
	if c.MinRuntime < 0 {
		return fmt.Errorf("minimum runtime %v must not be negative", c.MinRuntime)
	}
	if c.MinCount == 0 {
		c.MinCount = 2
	}
	if c.Isolation == 0 && !c.Chimbuko && (c.Algorithm == HBOS || c.Algorithm == COPOD) {
		c.Isolation = 3
	}
	if c.Isolation < 0 {
		c.Isolation = 0
	}
	if c.Isolation > 1<<16 {
		return fmt.Errorf("isolation %d must be at most 65536", c.Isolation)
	}
	if c.Isolation > 0 && c.MaxMass == 0 {
		c.MaxMass = 0.001
	}
	if c.MaxMass < 0 || c.MaxMass >= 1 {
		return fmt.Errorf("max mass %v must be in [0, 1)", c.MaxMass)
	}
	if c.Isolation > 0 {
		c.MinCount = max(c.MinCount, 1/c.MaxMass)
	}
	if c.Window == 0 {
		c.Window = 5
	}
	if c.Window < 0 {
		c.Window = 0
	}
	if c.Window > 1000 {
		return fmt.Errorf("window %d is larger than 1000", c.Window)
	}
	if c.MaxPendingSteps <= 0 {
		c.MaxPendingSteps = 8
	}
	if c.NormalRate < 0 || c.NormalRate > 1 {
		return fmt.Errorf("normal rate %v must be in [0, 1]", c.NormalRate)
	}
	if c.ProfileEvery < 0 {
		return errors.New("profile interval must not be negative")
	}
	if c.MaxHeldFrames == 0 {
		c.MaxHeldFrames = DefaultMaxHeldFrames
	}
	if c.MaxHeldFrames < 1 || c.MaxHeldFrames > 1<<16 {
		return fmt.Errorf("max held frames %d must be in [1, 65536]", c.MaxHeldFrames)
	}
	if c.MaxHeldBytes == 0 {
		c.MaxHeldBytes = DefaultMaxHeldBytes
	}
	if c.MaxHeldBytes < 1<<20 || c.MaxHeldBytes > 1<<36 {
		return fmt.Errorf("max held bytes %d must be between 1 MiB and 64 GiB", c.MaxHeldBytes)
	}
	if c.Hostname == "" {
		c.Hostname, _ = os.Hostname()
	}
	if c.Shards == 0 {
		c.Shards = 1
	}
	if c.Shards < 1 || c.Shards > 4096 {
		return fmt.Errorf("shards %d must be in [1, 4096]", c.Shards)
	}
	if c.SyncWait == 0 {
		c.SyncWait = time.Second
	}
	if c.SyncTimeout == 0 {
		c.SyncTimeout = 2 * time.Second
	}
	if c.SyncBackoffMax == 0 {
		c.SyncBackoffMax = 5 * time.Second
	}
	if c.MaxStepSummaries <= 0 {
		c.MaxStepSummaries = 10000
	}
	return nil
}
