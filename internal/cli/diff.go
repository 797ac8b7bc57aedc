package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kipimo-hpc/kipimo/internal/diff"
	"github.com/kipimo-hpc/kipimo/internal/taudb"
)

func newDiffCmd() *cobra.Command {
	var (
		dsn, quantity, metric, svgFile, pngFile, tokenFile string
		callPaths, asJSON                                  bool
		top                                                int
		alpha                                              float64
	)
	cmd := &cobra.Command{
		Use:   "diff [flags] A B",
		Short: "Compare two profiles function by function: what changed between two runs",
		Long: `diff compares two performance profiles, A (before) and B (after), function by
function (call path by call path with --call-path). For each it prints the mean
per-thread value of the chosen quantity in A and in B over the threads that ran
the function (TAU's MEAN thread), the ratio B/A, the change of the function's
total over all threads, and whether the change is beyond the thread-to-thread
spread: Welch's two-sided t-test on the two sets of per-thread values (unequal
variances, Welch–Satterthwaite degrees of freedom), significant when p < --alpha.
Rows are sorted by impact, the absolute change of the total over all threads
(for --metric anomalies, of the anomaly count), largest first.

The change column says "up" or "down" when the test finds the change beyond
the spread, "same" when it does not, "new" or "gone" for a function only B or
only A ran, and "untested" when a side has fewer than two threads.

A and B are each one of:
  DIR            a TAU profile directory (profile.N.C.T or MULTI__<metric>)
  FILE           a profile file read by content: ParaProf .ppk, TAU XML, Caliper
  RUNDIR         a Kipimo run directory, <out>/<run> of kipimo run: its TAU
                 profiles and, from its provenance.db, its anomaly counts
  FORMAT:PATH    PATH read as FORMAT (tau, ppk, xml, caliper, caliper-json, run)
  taudb:ID       trial ID of the TAUdb named by --dsn (or $` + taudbDSNEnv + `)
  taudb:NAME     the TAUdb trial with that name (it must be the only one)
  http://HOST:PORT  a running run: its pserver's dashboard (as kipimo run
                 prints it), or a provdb holding a finished run
  RUNNING-RUNDIR the directory of a run still going (it has endpoints.json)

A running run has no profiles yet: it is compared by the models its pserver
has merged so far, function by function as kipimo run --baseline compares a
run with its baseline (A is the baseline, B the run): mean time per call,
time and calls per io_step, p50 and p99, new slow modes (binomial tests at
--alpha over all functions, default 0.001), by B's extra time. The output says
which side is live and at which io_step; --metric, --tau-metric, --call-path,
--svg and --png do not apply.

--metric chooses the quantity: exclusive (the default) or inclusive values of
the TAU metric --tau-metric (default TIME when both sides have it, else the
first metric they share), calls, or anomalies per 1,000 calls (Kipimo runs
only). Times are microseconds, printed with a unit.`,
		Example: `  kipimo diff 16.ppk 32.ppk
  kipimo diff --top 10 --svg changes.svg before/ after/
  kipimo diff --metric anomalies kipimo-out/run-a kipimo-out/run-b
  kipimo diff --call-path --metric inclusive --json old-profiles/ new-profiles/
  kipimo diff --dsn postgres://localhost/taudb taudb:12 taudb:nightly-0412
  kipimo diff --tau-metric PAPI_TOT_CYC ppk:run1.dat ppk:run2.dat
  kipimo diff kipimo-out/clean http://127.0.0.1:8080
  kipimo diff --json kipimo-out/clean kipimo-out/running`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			q, err := diff.ParseQuantity(quantity)
			if err != nil {
				return fmt.Errorf("--metric: %w", err)
			}
			if top < 0 {
				return fmt.Errorf("--top %d: want 0 (all) or a positive number", top)
			}
			if !(alpha > 0 && alpha < 1) {
				return fmt.Errorf("--alpha %v: want a number between 0 and 1", alpha)
			}
			ctx := taudbCtx(cmd)
			getDSN := func() (string, error) {
				if dsn != "" {
					return dsn, nil
				}
				if v := os.Getenv(taudbDSNEnv); v != "" {
					return v, nil
				}
				return "", errors.New("a taudb: operand needs a database: pass --dsn postgres://... or set " + taudbDSNEnv)
			}
			var live bool
			for _, arg := range args {
				_, l, err := diffLiveURL(arg)
				if err != nil {
					return err
				}
				live = live || l
			}
			if live {
				if err := checkModelFlags(cmd); err != nil {
					return err
				}
				o := diffModelOpts{top: top, asJSON: asJSON, tokenFile: tokenFile, getDSN: getDSN}
				if cmd.Flags().Changed("alpha") {
					o.alpha = alpha
				}
				return runModelDiff(ctx, cmd.OutOrStdout(), cmd.ErrOrStderr(), args, o)
			}
			if tokenFile != "" {
				return errors.New("--token-file is for a running run's pserver (or a provdb) given as http://HOST:PORT: neither operand is one")
			}
			var sides [2]*diff.Side
			for i, arg := range args {
				start := time.Now()
				s, err := loadDiffSide(ctx, arg, getDSN)
				if err != nil {
					return err
				}
				sides[i] = s
				fmt.Fprintf(cmd.ErrOrStderr(), "%c: read %s: %s, %s, %s in %s\n", 'A'+i, arg,
					diffCount(len(s.Trial.RealThreads()), "thread"), diffCount(len(s.Trial.Metrics), "metric"),
					diffCount(len(s.Trial.Timers), "timer"), time.Since(start).Round(time.Millisecond))
			}
			res, err := diff.Compare(sides[0], sides[1], diff.Options{Quantity: q, Metric: metric, CallPaths: callPaths, Alpha: alpha})
			if err != nil {
				return err
			}
			res.Top(top)
			for _, c := range []struct{ file, format string }{{svgFile, "svg"}, {pngFile, "png"}} {
				if c.file == "" {
					continue
				}
				if err := writeDiffChart(c.file, c.format, res); err != nil {
					return err
				}
			}
			if asJSON {
				return diff.WriteJSON(cmd.OutOrStdout(), res)
			}
			return diff.WriteText(cmd.OutOrStdout(), res)
		},
	}
	f := cmd.Flags()
	f.StringVar(&quantity, "metric", string(diff.Exclusive), "quantity compared: exclusive, inclusive, calls or anomalies (per 1,000 calls; Kipimo runs only)")
	f.StringVar(&metric, "tau-metric", "", "TAU metric of exclusive and inclusive values, e.g. PAPI_TOT_CYC (default TIME, else the first metric both sides have)")
	f.BoolVar(&callPaths, "call-path", false, "compare call paths (a => b) instead of flat functions")
	f.IntVar(&top, "top", 20, "rows to show, by impact (0: all)")
	f.Float64Var(&alpha, "alpha", diff.DefaultAlpha, "significance level of Welch's t-test (against a running run: of the binomial tests over all functions, default 0.001)")
	f.BoolVar(&asJSON, "json", false, "print one JSON document with a functions array")
	f.StringVar(&svgFile, "svg", "", "also draw the shown rows (up to 40) as a bar chart of A and B into this SVG file")
	f.StringVar(&pngFile, "png", "", "also draw the shown rows (up to 40) as a bar chart into this PNG file")
	f.StringVar(&tokenFile, "token-file", "", "file holding the bearer token of a running run's pserver dashboard (its --token-file) or of a provdb, given as http://HOST:PORT")
	f.StringVar(&dsn, "dsn", "", "PostgreSQL URL of the TAUdb for taudb:ID and taudb:NAME operands (default $"+taudbDSNEnv+")")
	return cmd
}

// loadDiffSide reads one operand of kipimo diff.
func loadDiffSide(ctx context.Context, arg string, getDSN func() (string, error)) (*diff.Side, error) {
	op, err := diff.ParseOperand(arg)
	if err != nil {
		return nil, err
	}
	if op.Trial == "" {
		return diff.LoadPath(ctx, op.Path, op.Format)
	}
	s, err := openTaudb(ctx, getDSN, true)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", arg, err)
	}
	defer s.Close()
	id, err := strconv.Atoi(op.Trial)
	if err != nil || id <= 0 {
		trials, err := s.Trials(ctx, taudb.Filter{Name: op.Trial})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", arg, err)
		}
		switch len(trials) {
		case 0:
			return nil, fmt.Errorf("%s: no trial named %q (see `kipimo taudb list`)", arg, op.Trial)
		case 1:
			id = trials[0].ID
		default:
			ids := make([]string, len(trials))
			for i, t := range trials {
				ids[i] = strconv.Itoa(t.ID)
			}
			return nil, fmt.Errorf("%s: %d trials are named %q (ids %s): name one by id, taudb:ID", arg, len(trials), op.Trial, strings.Join(ids, ", "))
		}
	}
	tr, err := s.LoadTrial(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", arg, err)
	}
	return &diff.Side{Label: arg, Kind: diff.KindTAUdb, Trial: tr}, nil
}

func writeDiffChart(file, format string, res *diff.Result) error {
	f, err := os.Create(file)
	if err != nil {
		return fmt.Errorf("--%s: %w", format, err)
	}
	werr := diff.WriteChart(f, res, format)
	if cerr := f.Close(); werr == nil && cerr != nil {
		werr = fmt.Errorf("--%s %s: %w", format, file, cerr)
	}
	if werr != nil {
		return fmt.Errorf("--%s %s: %w", format, file, werr)
	}
	return nil
}

// diffCount is "1 thread", "16 threads".
func diffCount(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
