package adnode

import (
	"context"
	"fmt"
	"os"

	"github.com/spf13/pflag"

	"github.com/kipimo-hpc/kipimo/internal/ad"
	"github.com/kipimo-hpc/kipimo/internal/baseline/load"
)

// BaselineFlags are --baseline and its options, which `ad` and `kipimo run`
// share: the finished run the detectors compare this one with while it
// runs (ad.Config.Baseline).
type BaselineFlags struct {
	Ref       string // --baseline
	TokenFile string // --baseline-token-file
	TaudbDSN  string // --baseline-dsn
}

// BaselineUsage is --baseline's help text.
const BaselineUsage = "compare this run with a finished one of the same code while it runs: its run directory or provenance store (SQLite file, mongodb:// URI), http://PROVDB (its HTTP API), a TAU profile, or taudb:ID; calls beyond the baseline's natural range that are significantly more frequent than there (binomial test over the calls seen) are flagged as a new slow mode, with the baseline named in their explanation; the summary gains a baseline comparison per function (docs/diff.md)"

// AddBaselineFlags registers b's flags on fs.
func AddBaselineFlags(fs *pflag.FlagSet, b *BaselineFlags) {
	fs.StringVar(&b.Ref, "baseline", "", BaselineUsage)
	fs.StringVar(&b.TokenFile, "baseline-token-file", "", "--baseline http://...: file holding the bearer token of the provdb's HTTP API")
	fs.StringVar(&b.TaudbDSN, "baseline-dsn", "", "--baseline taudb:ID: PostgreSQL URL of the TAUdb (default $KIPIMO_TAUDB_DSN)")
}

// Load reads the baseline b names into c.Baseline, reading bounds with c's
// natural-range rule; it does nothing without --baseline.
func (b BaselineFlags) Load(ctx context.Context, c *ad.Config) error {
	if b.Ref == "" {
		return nil
	}
	check := *c
	if err := check.Validate(); err != nil {
		return err
	}
	dsn := b.TaudbDSN
	if dsn == "" {
		dsn = os.Getenv("KIPIMO_TAUDB_DSN")
	}
	ref, err := load.Reference(ctx, b.Ref, load.Options{Rule: check.TailRule(), TokenFile: b.TokenFile, TaudbDSN: dsn})
	if err != nil {
		return fmt.Errorf("--baseline: %w", err)
	}
	c.Baseline = ref
	return nil
}
