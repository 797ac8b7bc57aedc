package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kipimo-hpc/kipimo/internal/diff"
	"github.com/kipimo-hpc/kipimo/internal/taudb"
)

// taudbDSNEnv names the environment variable that supplies --dsn.
const taudbDSNEnv = "KIPIMO_TAUDB_DSN"

func newTaudbCmd() *cobra.Command {
	var dsn string
	cmd := &cobra.Command{
		Use:   "taudb",
		Short: "Store TAU profiles in a TAUdb (PostgreSQL) and read them back",
		Long: `taudb manages a TAUdb, TAU's performance database, in PostgreSQL: the tables
of TAUdb schema version 2, filled the way TAU's own loader fills them, so
ParaProf and PerfExplorer read what Kipimo stores.

The database is named by --dsn (a postgres:// URL) or, when the flag is not
given, by the KIPIMO_TAUDB_DSN environment variable.`,
	}
	cmd.PersistentFlags().StringVar(&dsn, "dsn", "", "PostgreSQL URL of the TAUdb, e.g. postgres://user@host:5432/taudb (default $"+taudbDSNEnv+")")
	getDSN := func() (string, error) {
		if dsn != "" {
			return dsn, nil
		}
		if v := os.Getenv(taudbDSNEnv); v != "" {
			return v, nil
		}
		return "", errors.New("no database given: pass --dsn postgres://... or set " + taudbDSNEnv)
	}
	cmd.AddCommand(newTaudbConfigureCmd(getDSN), newTaudbLoadCmd(getDSN), newTaudbListCmd(getDSN),
		newTaudbShowCmd(getDSN), newTaudbExportCmd(getDSN))
	return cmd
}

func openTaudb(ctx context.Context, getDSN func() (string, error), needSchema bool) (*taudb.Store, error) {
	dsn, err := getDSN()
	if err != nil {
		return nil, err
	}
	if ctx == nil {
		ctx = context.Background()
	}
	s, err := taudb.Open(ctx, dsn)
	if err != nil {
		return nil, err
	}
	if !needSchema {
		return s, nil
	}
	v, ok, err := s.Version(ctx)
	if err != nil {
		s.Close()
		return nil, err
	}
	if !ok {
		s.Close()
		return nil, errors.New("the database has no TAUdb schema; run `kipimo taudb configure` first")
	}
	if v != taudb.SchemaVersion {
		s.Close()
		return nil, fmt.Errorf("the database has TAUdb schema version %d; this program reads and writes version %d", v, taudb.SchemaVersion)
	}
	return s, nil
}

func taudbCtx(cmd *cobra.Command) context.Context {
	if ctx := cmd.Context(); ctx != nil {
		return ctx
	}
	return context.Background()
}

func newTaudbConfigureCmd(getDSN func() (string, error)) *cobra.Command {
	return &cobra.Command{
		Use:   "configure --dsn URL",
		Short: "Create the TAUdb schema in the database if it has none",
		Long: `configure connects to the database and creates the TAUdb tables, seeded rows,
indexes and views (schema version 2) in one transaction when the database has
no schema_version table. An existing version 2 schema is left as it is; any
other version is an error.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := taudbCtx(cmd)
			s, err := openTaudb(ctx, getDSN, false)
			if err != nil {
				return err
			}
			defer s.Close()
			v, created, err := s.Configure(ctx)
			if err != nil {
				return err
			}
			if created {
				fmt.Fprintf(cmd.OutOrStdout(), "created TAUdb schema version %d\n", v)
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "TAUdb schema version %d already present\n", v)
			}
			return nil
		},
	}
}

func newTaudbLoadCmd(getDSN func() (string, error)) *cobra.Command {
	var name, metadata, app, exp, format string
	cmd := &cobra.Command{
		Use:   "load --dsn URL [--name NAME] [--format FORMAT] [--metadata FILE] FILE|DIR",
		Short: "Load a TAU, ParaProf, TAU XML or Caliper profile into the TAUdb as a new trial",
		Long: `load reads a profile, computes the derived threads (mean, total, stddev, min,
max) and percents, splits the metadata into trial-level and per-thread rows,
and stores it all as one new trial in one transaction, as TAU's taudb_loadtrial
does. It prints the new trial's id.

The profile is one of (--format, or detected from the content):
  tau           a directory of TAU profiles: profile.N.C.T files, or one
                MULTI__<metric> directory per metric
  ppk           a ParaProf packed profile (.ppk), gzip-compressed or not
  xml           a TAU snapshot (snapshot.N.C.T, or a directory of them) or
                merged (tauprofile.xml) XML profile: each thread's last
                snapshot, every metric, user events
  caliper       a Caliper .cali file written with the aggregate service
                (a region profile, not an event trace)
  caliper-json  Caliper's json-split region profile, as Hatchet reads it

Caliper region paths become TAU call paths ("main => solve"), sum#time.duration
the TIME metric in microseconds, and count the calls; see
docs/profile-formats.md for what each format gives and what is not read.
A Kipimo run's directory (<out>/<run> of kipimo run) loads its TAU profiles.
--name defaults to the file or directory name (the run's id for a run's
directory); a name the TAUdb already has is refused.`,
		Example: `  kipimo taudb load --dsn postgres://localhost/taudb ./profiles
  kipimo taudb load kipimo-out/first
  kipimo taudb load --name lulesh-16 run16.ppk
  kipimo taudb load --format xml tauprofile.xml
  kipimo taudb load --format caliper-json --application lulesh lulesh.json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if format != "" && !slices.Contains(taudb.Formats, format) {
				return fmt.Errorf("--format %q: want one of %s", format, strings.Join(taudb.Formats, ", "))
			}
			ctx := taudbCtx(cmd)
			path, detected := args[0], format
			if detected == "" && diff.IsRunDir(path) {
				// A Kipimo run's directory, as kipimo diff takes it: its
				// TAU profiles, named after the run.
				path, detected = filepath.Join(path, "profiles"), taudb.FormatTAU
				if name == "" {
					name = filepath.Base(filepath.Clean(args[0]))
				}
			}
			if detected == "" {
				f, err := taudb.DetectFormat(path)
				if errors.Is(err, taudb.ErrUnknownFormat) {
					return fmt.Errorf("%w; pass --format", err)
				}
				if err != nil {
					return err
				}
				detected = f
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "reading %s as %s\n", path, detected)
			tr, err := taudb.LoadPathContext(ctx, path, detected)
			if err != nil {
				return err
			}
			if name != "" {
				tr.Name = name
			}
			if metadata != "" {
				data, err := os.ReadFile(metadata)
				if err != nil {
					return fmt.Errorf("--metadata: %w", err)
				}
				if err := tr.AddJSONMetadata(data); err != nil {
					return fmt.Errorf("--metadata %s: %w", metadata, err)
				}
			}
			if app != "" {
				tr.PrimaryMetadata = append(tr.PrimaryMetadata, taudb.Attribute{Name: "Application", Value: app})
			}
			if exp != "" {
				if app == "" {
					return errors.New("--experiment needs --application")
				}
				tr.PrimaryMetadata = append(tr.PrimaryMetadata, taudb.Attribute{Name: "Experiment", Value: exp})
			}
			s, err := openTaudb(ctx, getDSN, true)
			if err != nil {
				return err
			}
			defer s.Close()
			if err := checkTrialName(ctx, s, tr.Name); err != nil {
				return err
			}
			st, err := s.SaveTrial(ctx, tr)
			if err != nil {
				return err
			}
			if err := s.AddViews(ctx, app, exp); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "loaded trial %d %q: %d threads, %d metrics, %d timers, %d call paths, %d rows\n",
				tr.ID, tr.Name, tr.TotalThreads, len(tr.Metrics), len(tr.Timers), len(tr.Callpaths), st.Rows())
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&name, "name", "", "name of the new trial (default the file or directory name)")
	f.StringVar(&format, "format", "", "profile format: "+strings.Join(taudb.Formats, ", ")+" (default detected from the content)")
	f.StringVar(&metadata, "metadata", "", "JSON file of extra trial metadata: scalars become trial-level rows, objects and arrays nested rows")
	f.StringVar(&app, "application", "", "application name: adds Application metadata and ParaProf's Application-<name> view")
	f.StringVar(&exp, "experiment", "", "experiment name (with --application): adds Experiment metadata and its view")
	return cmd
}

// checkTrialName refuses a trial name the TAUdb already has: two trials of
// one name cannot be told apart by name (kipimo diff taudb:NAME).
func checkTrialName(ctx context.Context, s *taudb.Store, name string) error {
	trials, err := s.Trials(ctx, taudb.Filter{Name: name})
	if err != nil {
		return err
	}
	if len(trials) == 0 {
		return nil
	}
	ids := make([]string, len(trials))
	for i, t := range trials {
		ids[i] = strconv.Itoa(t.ID)
	}
	return fmt.Errorf("the TAUdb already has a trial named %q (id %s): give this one another name with --name", name, strings.Join(ids, ", "))
}

func newTaudbListCmd(getDSN func() (string, error)) *cobra.Command {
	var name string
	var meta []string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list --dsn URL [--name NAME] [--metadata KEY=VALUE]...",
		Short: "List the trials in the TAUdb",
		Long: `list prints the trials (id, name, threads and shape), optionally only those
with a given name or whose trial-level metadata has every KEY=VALUE given.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f := taudb.Filter{Name: name}
			for _, kv := range meta {
				k, v, ok := strings.Cut(kv, "=")
				if !ok || k == "" {
					return fmt.Errorf("--metadata %q: want KEY=VALUE", kv)
				}
				if f.Metadata == nil {
					f.Metadata = map[string]string{}
				}
				f.Metadata[k] = v
			}
			ctx := taudbCtx(cmd)
			s, err := openTaudb(ctx, getDSN, true)
			if err != nil {
				return err
			}
			defer s.Close()
			trials, err := s.Trials(ctx, f)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if asJSON {
				if trials == nil {
					trials = []taudb.TrialInfo{}
				}
				return taudbJSON(w, trials)
			}
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tTHREADS\tNODES\tCONTEXTS/NODE\tTHREADS/CONTEXT")
			for _, t := range trials {
				fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d\t%d\n", t.ID, t.Name, t.TotalThreads, t.NodeCount, t.ContextsPerNode, t.ThreadsPerContext)
			}
			return tw.Flush()
		},
	}
	f := cmd.Flags()
	f.StringVar(&name, "name", "", "only trials with this name")
	f.StringArrayVar(&meta, "metadata", nil, "only trials whose trial-level metadata has KEY=VALUE (repeatable)")
	f.BoolVar(&asJSON, "json", false, "print a JSON array")
	return cmd
}

func taudbJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func taudbTrialID(s string) (int, error) {
	id, err := strconv.Atoi(s)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("trial id %q: want a positive number (see `kipimo taudb list`)", s)
	}
	return id, nil
}

// taudbTimerRow is one line of the show command's table.
type taudbTimerRow struct {
	Name      string  `json:"name"`
	Exclusive float64 `json:"exclusive"`
	ExclPct   float64 `json:"exclusive_percent"`
	SumPct    float64 `json:"sum_percent"`
	Inclusive float64 `json:"inclusive"`
	InclPct   float64 `json:"inclusive_percent"`
	Calls     float64 `json:"calls"`
}

type taudbShowResult struct {
	Trial    taudb.TrialInfo   `json:"trial"`
	Metrics  []string          `json:"metrics"`
	Threads  []string          `json:"threads"`
	Metric   string            `json:"metric"`
	Total    float64           `json:"total_exclusive"`
	Timers   []taudbTimerRow   `json:"timers"`
	Metadata map[string]string `json:"metadata"`
}

func newTaudbShowCmd(getDSN func() (string, error)) *cobra.Command {
	var metric string
	var top int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show --dsn URL ID",
		Short: "Summarize a trial: threads, metrics and the top timers",
		Long: `show prints a trial's threads and metrics and its flat timers by exclusive value
summed over all threads (the stored TOTAL thread), largest first, in the
manner of pprof's text view: flat (exclusive) and its percent of the sum of all
timers' exclusive values, the running sum of those percents, cum (inclusive)
and its percent, and the call count. Times are microseconds in TAUdb and are
printed as durations.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := taudbTrialID(args[0])
			if err != nil {
				return err
			}
			if top <= 0 {
				return fmt.Errorf("--top %d: want a positive number", top)
			}
			ctx := taudbCtx(cmd)
			s, err := openTaudb(ctx, getDSN, true)
			if err != nil {
				return err
			}
			defer s.Close()
			tr, err := s.LoadTrial(ctx, id)
			if err != nil {
				return err
			}
			res, err := taudbSummarize(tr, metric, top)
			if err != nil {
				return err
			}
			if asJSON {
				return taudbJSON(cmd.OutOrStdout(), res)
			}
			return taudbPrintShow(cmd.OutOrStdout(), res)
		},
	}
	f := cmd.Flags()
	f.StringVar(&metric, "metric", "", "metric to rank timers by (default the trial's first metric)")
	f.IntVar(&top, "top", 20, "number of timers to show")
	f.BoolVar(&asJSON, "json", false, "print the summary as JSON")
	return cmd
}

func taudbSummarize(tr *taudb.Trial, metric string, top int) (*taudbShowResult, error) {
	res := &taudbShowResult{Trial: taudb.TrialInfo{ID: tr.ID, Name: tr.Name, DataSource: tr.DataSource, NodeCount: tr.NodeCount,
		ContextsPerNode: tr.ContextsPerNode, ThreadsPerContext: tr.ThreadsPerContext, TotalThreads: tr.TotalThreads},
		Metadata: map[string]string{}}
	for _, m := range tr.Metrics {
		res.Metrics = append(res.Metrics, m.Name)
	}
	for _, th := range tr.RealThreads() {
		res.Threads = append(res.Threads, th.String())
	}
	for _, a := range tr.PrimaryMetadata {
		res.Metadata[a.Name] = a.Value
	}
	if len(tr.Metrics) == 0 {
		return res, nil
	}
	m := tr.Metrics[0]
	if metric != "" {
		if m = tr.Metric(metric); m == nil {
			return nil, fmt.Errorf("--metric %q: the trial's metrics are %s", metric, strings.Join(res.Metrics, ", "))
		}
	}
	res.Metric = m.Name
	total := tr.Thread(taudb.Total)
	if total == nil {
		return res, nil
	}
	for _, t := range tr.Timers {
		d := total.CallDataFor(t.Root())
		if d == nil {
			continue
		}
		v := d.Value(m)
		if v == nil {
			continue
		}
		res.Timers = append(res.Timers, taudbTimerRow{Name: t.Name, Exclusive: v.Exclusive, Inclusive: v.Inclusive, Calls: d.Calls})
		res.Total += v.Exclusive
	}
	sort.SliceStable(res.Timers, func(i, j int) bool { return res.Timers[i].Exclusive > res.Timers[j].Exclusive })
	sum := 0.0
	for i := range res.Timers {
		r := &res.Timers[i]
		if res.Total > 0 {
			r.ExclPct = 100 * r.Exclusive / res.Total
			r.InclPct = 100 * r.Inclusive / res.Total
		}
		sum += r.ExclPct
		r.SumPct = sum
	}
	if len(res.Timers) > top {
		res.Timers = res.Timers[:top]
	}
	return res, nil
}

func taudbPrintShow(w io.Writer, r *taudbShowResult) error {
	fmt.Fprintf(w, "Trial %d %q: %d threads (%d nodes, up to %d contexts per node and %d threads per context)\n",
		r.Trial.ID, r.Trial.Name, r.Trial.TotalThreads, r.Trial.NodeCount, r.Trial.ContextsPerNode, r.Trial.ThreadsPerContext)
	threads := r.Threads
	more := ""
	if len(threads) > 16 {
		more = fmt.Sprintf(" ... (%d more)", len(threads)-16)
		threads = threads[:16]
	}
	fmt.Fprintf(w, "Threads: %s%s\n", strings.Join(threads, " "), more)
	fmt.Fprintf(w, "Metrics: %s\n", strings.Join(r.Metrics, ", "))
	if r.Metric == "" {
		return nil
	}
	isTime := strings.Contains(strings.ToUpper(r.Metric), "TIME")
	value := func(v float64) string {
		if isTime {
			return time.Duration(v * float64(time.Microsecond)).String()
		}
		return taudb.FormatG(v, 6)
	}
	fmt.Fprintf(w, "Showing top %d timers by exclusive %s summed over all threads, total %s\n", len(r.Timers), r.Metric, value(r.Total))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "flat\tflat%\tsum%\tcum\tcum%\tcalls\t")
	for _, t := range r.Timers {
		fmt.Fprintf(tw, "%s\t%.2f%%\t%.2f%%\t%s\t%.2f%%\t%s\t  %s\n", value(t.Exclusive), t.ExclPct, t.SumPct, value(t.Inclusive), t.InclPct,
			strconv.FormatFloat(t.Calls, 'f', -1, 64), t.Name)
	}
	return tw.Flush()
}

func newTaudbExportCmd(getDSN func() (string, error)) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "export --dsn URL --out DIR ID",
		Short: "Write a stored trial back out as TAU profile files",
		Long: `export loads trial ID whole and writes its threads as TAU profile files in
DIR (profile.N.C.T, or one MULTI__<metric> directory per metric), formatted as
TAU writes them. Names and groups come out in TAUdb's normalized spelling, and
each thread's metadata is the trial-level metadata plus its own.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return errors.New("--out is required: give the directory to write the profiles into")
			}
			id, err := taudbTrialID(args[0])
			if err != nil {
				return err
			}
			ctx := taudbCtx(cmd)
			s, err := openTaudb(ctx, getDSN, true)
			if err != nil {
				return err
			}
			defer s.Close()
			tr, err := s.LoadTrial(ctx, id)
			if err != nil {
				return err
			}
			if err := taudb.WriteDir(out, tr); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %d threads x %d metrics of trial %d to %s\n", tr.TotalThreads, len(tr.Metrics), tr.ID, out)
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "directory to write the profiles into (required)")
	return cmd
}
