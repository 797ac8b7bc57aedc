package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kipimo-hpc/kipimo/internal/ad"
	"github.com/kipimo-hpc/kipimo/internal/baseline"
	"github.com/kipimo-hpc/kipimo/internal/baseline/load"
	"github.com/kipimo-hpc/kipimo/internal/daemon"
	"github.com/kipimo-hpc/kipimo/internal/diff"
	"github.com/kipimo-hpc/kipimo/internal/run"
	"github.com/kipimo-hpc/kipimo/internal/stats"
)

// diffLiveURL says whether operand arg names a run by URL or a running
// run's directory, which kipimo diff compares by their models: the
// dashboard URL of the latter (from its endpoints file), or arg itself.
func diffLiveURL(arg string) (string, bool, error) {
	if strings.HasPrefix(arg, "http://") || strings.HasPrefix(arg, "https://") {
		return arg, true, nil
	}
	fi, err := os.Stat(arg)
	if err != nil || !fi.IsDir() {
		return "", false, nil
	}
	if _, err := os.Stat(filepath.Join(arg, run.EndpointsFile)); err != nil {
		return "", false, nil
	}
	e, err := run.ReadEndpoints(arg)
	if err != nil {
		return "", false, err
	}
	if e.Dashboard == "" {
		return "", false, fmt.Errorf("%s: its %s names no dashboard (the run was started without one): diff it once it is over", arg, run.EndpointsFile)
	}
	return e.Dashboard, true, nil
}

// diffModelOpts are kipimo diff's settings that a comparison of models
// reads.
type diffModelOpts struct {
	alpha     float64 // 0: baseline.DefaultAlpha
	top       int
	asJSON    bool
	tokenFile string
	getDSN    func() (string, error)
}

// runModelDiff compares the runs args name by their models, one or both
// running (their models merged so far, from their pserver), as kipimo run
// --baseline compares a run with its baseline.
func runModelDiff(ctx context.Context, stdout, stderr io.Writer, args []string, o diffModelOpts) error {
	def := ad.Config{}
	if err := def.Validate(); err != nil {
		return err
	}
	rule := def.TailRule()
	token, err := daemon.Secret("token-file", o.tokenFile)
	if err != nil {
		return err
	}
	var sides [2]*diff.ModelSide
	for i, arg := range args {
		start := time.Now()
		s, err := loadModelSide(ctx, arg, token, o, rule)
		if err != nil {
			return fmt.Errorf("%c: %w", 'A'+i, err)
		}
		sides[i] = s
		what := fmt.Sprintf("%s models", s.Kind())
		if l := s.Live; l != nil {
			what = fmt.Sprintf("live run %s, %d io_steps so far", l.Run, l.IOSteps)
		}
		fmt.Fprintf(stderr, "%c: read %s: %s, %s in %s\n", 'A'+i, arg, what, diffCount(len(s.Ref.Keys), "function"), time.Since(start).Round(time.Millisecond))
	}
	res, err := diff.CompareModels(sides[0], sides[1], o.alpha)
	if err != nil {
		return err
	}
	res.Top(o.top)
	if o.asJSON {
		return diff.WriteModelsJSON(stdout, res)
	}
	return diff.WriteModelsText(stdout, res)
}

// loadModelSide reads one operand's models: a running run's from its
// pserver (a dashboard URL or the run's directory), else a finished run's
// final ones as a baseline is read (a run directory, provenance store,
// http://PROVDB, TAU profile or taudb:ID).
func loadModelSide(ctx context.Context, arg, token string, o diffModelOpts, rule stats.TailRule) (*diff.ModelSide, error) {
	u, live, err := diffLiveURL(arg)
	if err != nil {
		return nil, err
	}
	var notLive error
	if live {
		l, err := diff.FetchLive(ctx, u, token)
		switch {
		case err == nil:
			return liveSide(arg, l, rule)
		case !errors.Is(err, diff.ErrNotLive) || u != arg:
			return nil, err
		}
		notLive = err // perhaps a provdb's HTTP API: a finished run's
	}
	opt := load.Options{Rule: rule, TokenFile: o.tokenFile}
	if op, perr := diff.ParseOperand(arg); perr == nil && op.Trial != "" {
		if opt.TaudbDSN, err = o.getDSN(); err != nil {
			return nil, err
		}
	}
	ref, err := load.Reference(ctx, arg, opt)
	if err != nil {
		if notLive != nil {
			return nil, fmt.Errorf("%s is neither a running run's pserver (%w) nor a provdb holding a finished one (%w)", arg, notLive, err)
		}
		return nil, err
	}
	return &diff.ModelSide{Label: arg, Ref: ref}, nil
}

// liveSide is a running run's side from the models l its pserver serves.
func liveSide(label string, l *diff.Live, rule stats.TailRule) (*diff.ModelSide, error) {
	if len(l.FuncStats) == 0 {
		return nil, fmt.Errorf("%s: the live run %s has merged no models yet (no detector has synced): try again once it has run an io_step", label, l.Run)
	}
	hists := false
	for _, f := range l.FuncStats {
		hists = hists || f.NaturalHist != nil
	}
	if !hists {
		return nil, fmt.Errorf("%s: the live run %s's models carry no natural-range histograms (its detectors run Chimbuko's rules): diff it once it is over, by its profiles", label, l.Run)
	}
	ref, err := baseline.FromFuncStats(label, l.FuncStats, rule)
	if err != nil {
		return nil, err
	}
	return &diff.ModelSide{Label: label, Ref: ref, Live: l}, nil
}

// checkModelFlags refuses kipimo diff's flags that a comparison of models
// has no use for.
func checkModelFlags(cmd *cobra.Command) error {
	for _, f := range []string{"metric", "tau-metric", "call-path", "svg", "png"} {
		if cmd.Flags().Changed(f) {
			return fmt.Errorf("--%s: a running run (a pserver URL or a running run's directory) is compared by its models, per function as a baseline is (docs/diff.md), without per-thread values: drop --%s, or diff the run once it is over", f, f)
		}
	}
	return nil
}
