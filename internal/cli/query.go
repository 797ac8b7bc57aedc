package cli

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kipimo-hpc/kipimo/internal/daemon"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provdb"
)

// queryBackend is what kipimo query reads: a store opened directly, or
// provdb's HTTP API.
type queryBackend interface {
	// Each streams the executions q selects, in its order (see
	// provenance.Store.Each).
	Each(ctx context.Context, q provenance.Query, fn func(provenance.Exec) error) error
	Get(ctx context.Context, kind provenance.Kind, pid uint32, eventID string) (provenance.Exec, error)
	Count(ctx context.Context, q provenance.Query) (int64, error)
	Aggregate(ctx context.Context, q provenance.Query, by provenance.GroupBy) ([]provenance.Group, error)
	// FuncStats streams the run's final func_stats records.
	FuncStats(ctx context.Context, fn func(provenance.GlobalFuncStats) error) error
	Close() error
}

// Labels of kipimo query list --labels.
const (
	labelsFinal     = "final"
	labelsUnflagged = "unflagged"
	labelsAll       = "all"
)

// finalRanges reads the final models' natural ranges from b (empty when
// the run has none: Chimbuko's rules, or a run still going).
func finalRanges(ctx context.Context, b queryBackend) (map[string]provenance.Range, error) {
	var fs []provenance.GlobalFuncStats
	if err := b.FuncStats(ctx, func(f provenance.GlobalFuncStats) error {
		fs = append(fs, f)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read the final models: %w", err)
	}
	return provenance.FinalRanges(fs), nil
}

// relabel sets e's final label against ranges (anomalies only).
func relabel(e *provenance.Exec, kind provenance.Kind, ranges map[string]provenance.Range) {
	if kind != provenance.KindAnomalies || len(ranges) == 0 {
		return
	}
	e.FinalLabel = provenance.FinalUnflagged
	if provenance.FinalAnomaly(e, ranges) {
		e.FinalLabel = provenance.FinalAnomalyLabel
	}
}

type queryOpts struct {
	url, store, tokenFile string
	json                  bool
}

func newQueryCmd() *cobra.Command {
	o := &queryOpts{}
	cmd := &cobra.Command{
		Use:   "query",
		Short: "Query the provenance records of a run (anomalies, normal executions)",
		Long: `Query the provenance records provdb stored: list executions with filters and
sorting, show one record whole, count, or aggregate anomaly counts by rank,
function or io_step. Reads a store directly (--store, a SQLite file or a
mongodb:// URI) or asks a running provdb over HTTP (--url).`,
		Example: `  kipimo query list --rank 3 --func-re '^MPI_' --sort runtime_total --desc --limit 20
  kipimo query show 3:12:225 --pid 0 --store kipimo-out/first
  kipimo query count --min-score 10
  kipimo query agg --by rank,func --url kipimo-out/first
  kipimo query agg --by rank,func --url http://127.0.0.1:8081`,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			if err := cmd.Root().PersistentPreRunE(cmd, args); err != nil {
				return err
			}
			return o.resolve(cmd.ErrOrStderr())
		},
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&o.url, "url", "", "provdb HTTP API to ask, e.g. http://127.0.0.1:8081, or the directory of a kipimo run still running (instead of --store)")
	pf.StringVar(&o.store, "store", "", "store to read: a SQLite file, a run's directory or a mongodb:// URI (default: the latest run's store under ./kipimo-out, else the provdb daemon's ./kipimo-prov.db)")
	pf.StringVar(&o.tokenFile, "token-file", "", "file holding the bearer token of the provdb HTTP API")
	pf.BoolVar(&o.json, "json", false, "print JSON lines instead of a table")
	cmd.AddCommand(newQueryListCmd(o), newQueryShowCmd(o), newQueryCountCmd(o), newQueryAggCmd(o), newQueryRecurringCmd(o), newQueryCulpritsCmd(o))
	return cmd
}

// filterFlags adds the filter flags of list, count and agg; their values
// are turned into the same URL parameters the HTTP API takes, so both
// paths share one parser.
func filterFlags(fs *pflag.FlagSet, sortable bool) {
	fs.String("kind", string(provenance.KindAnomalies), "records to read: anomalies or normalexecs (count: any collection)")
	fs.Uint32("pid", 0, "program index")
	fs.Uint32("rank", 0, "MPI rank")
	fs.Uint32("tid", 0, "thread")
	fs.String("func", "", "function name, exact")
	fs.String("func-re", "", "function name, RE2 regular expression (unanchored)")
	fs.Uint64("step-min", 0, "first io_step (the step an execution ran in: the frame of its exit)")
	fs.Uint64("step-max", 0, "last io_step (the step an execution ran in)")
	fs.Uint64("from", 0, "executions entered at or after this time (trace time units)")
	fs.Uint64("to", 0, "executions exited at or before this time")
	fs.Uint64("min-runtime", 0, "minimum total runtime")
	fs.Float64("min-score", 0, "minimum outlier score")
	fs.Bool("gpu", false, "GPU executions only")
	fs.Int("limit", provenance.DefaultLimit, "maximum number of records (groups for agg); 0: no limit, records streamed")
	if sortable {
		fs.String("sort", "", "sort by "+sortTimeLost+" (the time lost beyond the function's natural maximum, costliest first; the default for anomalies under a limit), "+
			provenance.SortEntry+" (the default for normalexecs), "+strings.Join(provenance.SortFields[1:], ", "))
		fs.Bool("desc", false, "sort in descending order (not with --sort "+sortTimeLost+", which is costliest first)")
	}
}

var flagParams = map[string]string{
	"kind": "kind", "pid": "pid", "rank": "rank", "tid": "tid", "func": "func", "func-re": "func_re",
	"step-min": "step_min", "step-max": "step_max", "from": "from", "to": "to",
	"min-runtime": "min_runtime", "min-score": "min_score", "gpu": "gpu", "limit": "limit", "sort": "sort",
}

// queryFromFlags builds the query from the flags set on the command line.
func queryFromFlags(cmd *cobra.Command) (provenance.Query, error) {
	v := url.Values{}
	cmd.Flags().Visit(func(f *pflag.Flag) {
		if f.Name == "sort" && f.Value.String() == sortTimeLost {
			return // ordered here, not by the store (listByTimeLost)
		}
		if p, ok := flagParams[f.Name]; ok {
			v.Set(p, f.Value.String())
		}
		if f.Name == "desc" && f.Value.String() == "true" {
			v.Set("order", "desc")
		}
	})
	if !v.Has("limit") {
		v.Set("limit", strconv.Itoa(provenance.DefaultLimit))
	}
	q, err := provenance.ParseQuery(v)
	if err != nil {
		// Name flags as the user typed them.
		msg := err.Error()
		for f, p := range flagParams {
			if f != p {
				msg = strings.ReplaceAll(msg, p+" ", "--"+f+" ")
			}
		}
		return q, errors.New(msg)
	}
	return q, nil
}

func (o *queryOpts) open(ctx context.Context) (queryBackend, error) {
	if o.url != "" && o.store != "" {
		return nil, errors.New("give --url or --store, not both")
	}
	if o.url != "" {
		return newHTTPBackend(o.url, o.tokenFile)
	}
	s, err := provdb.OpenStore(ctx, o.store, true)
	if err != nil {
		return nil, err
	}
	return s, nil
}

func newQueryListCmd(o *queryOpts) *cobra.Command {
	var labels string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List executions matching filters, sorted",
		Long: `List executions matching filters, sorted. --limit 0 lists every one: records
are streamed as they are read (from the store, or page after page from
provdb), so a listing of any length takes little memory.

Once a run has ended, its anomalies are relabelled with the final models
(docs/detection.md): those the final model no longer flags are "unflagged",
not deleted. --labels final (the default) lists the anomalies that stand,
--labels unflagged the others, --labels all both; each record then says
which it is (the LABEL column, final_label in JSON).

Anomalies are listed costliest first: by the time each lost beyond its
function's natural maximum (explanation.excess, shown by query show), records
without an explanation last. That order reads every matching record and keeps
the costliest --limit, where the other orders are the store's; so with
--limit 0 and no --sort, records stream in entry order, and --sort time-lost
--limit 0 holds them all in memory.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			q, err := queryFromFlags(cmd)
			if err != nil {
				return err
			}
			if !provenance.IsExecKind(q.Kind) {
				return fmt.Errorf("--kind %s cannot be listed: use anomalies or normalexecs", q.Kind)
			}
			b, err := o.open(cmd.Context())
			if err != nil {
				return err
			}
			defer b.Close()
			labels, err := parseLabels(labels)
			if err != nil {
				return err
			}
			// Records whose stored documents are bad are left out of
			// the listing; a warning on stderr says how many.
			var skips provenance.Skips
			ctx := provenance.WithSkips(cmd.Context(), &skips)
			defer warnSkipped(cmd.ErrOrStderr(), &skips)
			var ranges map[string]provenance.Range
			if q.Kind == provenance.KindAnomalies {
				if ranges, err = finalRanges(ctx, b); err != nil {
					return err
				}
			}
			return listExecs(ctx, cmd.OutOrStdout(), b, q, o.json, ranges, labels, listByTimeLost(cmd, q))
		},
	}
	filterFlags(cmd.Flags(), true)
	cmd.Flags().StringVar(&labels, "labels", labelsFinal, labelsUsage)
	return cmd
}

// warnSkipped prints a warning on w when reads left stored records out
// because their documents are bad.
func warnSkipped(w io.Writer, sk *provenance.Skips) {
	if n := sk.Count(); n > 0 {
		fmt.Fprintf(w, "warning: %d stored records left out: their documents are bad (the first: %v)\n", n, sk.First())
	}
}

func newQueryShowCmd(o *queryOpts) *cobra.Command {
	var kind provenance.Kind
	var pid uint32
	cmd := &cobra.Command{
		Use:   "show EVENT_ID",
		Short: "Show one execution whole: call stack, window, counters, GPU context",
		Long: `Show one execution whole, as a tree: where and when it ran, its outlier score,
the function's statistics, its call stack, the executions and messages of its
event window (times relative to its entry), its counters and its GPU context.
EVENT_ID is "<rank>:<io_step>:<idx>".`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !provenance.IsExecKind(kind) {
				return fmt.Errorf("--kind %q is not anomalies or normalexecs", kind)
			}
			if _, _, _, err := provenance.ParseEventID(args[0]); err != nil {
				return err
			}
			b, err := o.open(cmd.Context())
			if err != nil {
				return err
			}
			defer b.Close()
			e, err := b.Get(cmd.Context(), kind, pid, args[0])
			if err != nil {
				return err
			}
			if kind == provenance.KindAnomalies {
				ranges, err := finalRanges(cmd.Context(), b)
				if err != nil {
					return err
				}
				relabel(&e, kind, ranges)
			}
			if o.json {
				return jsonLines(cmd.OutOrStdout(), []provenance.Exec{e})
			}
			return execTree(cmd.OutOrStdout(), kind, &e)
		},
	}
	cmd.Flags().StringVar((*string)(&kind), "kind", string(provenance.KindAnomalies), "anomalies or normalexecs")
	cmd.Flags().Uint32Var(&pid, "pid", 0, "program index")
	return cmd
}

func newQueryCountCmd(o *queryOpts) *cobra.Command {
	var labels string
	cmd := &cobra.Command{
		Use:   "count",
		Short: "Count records matching filters",
		Long: `Count records matching filters. Anomalies are counted as list shows them:
once a run has ended, those the final models still flag (--labels final, the
default); --labels unflagged counts the others, --labels all every anomaly
flagged during the run.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			q, err := queryFromFlags(cmd)
			if err != nil {
				return err
			}
			b, err := o.open(cmd.Context())
			if err != nil {
				return err
			}
			defer b.Close()
			var skips provenance.Skips
			ctx := provenance.WithSkips(cmd.Context(), &skips)
			defer warnSkipped(cmd.ErrOrStderr(), &skips)
			labels, ranges, err := labelRanges(cmd, b, q.Kind, labels)
			if err != nil {
				return err
			}
			var n int64
			if ranges != nil {
				n, err = countLabelled(ctx, b, q, labels, ranges)
			} else {
				n, err = b.Count(ctx, q)
			}
			if err != nil {
				return err
			}
			if o.json {
				return jsonLines(cmd.OutOrStdout(), []any{map[string]any{"kind": q.Kind, "count": n}})
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), n)
			return err
		},
	}
	filterFlags(cmd.Flags(), false)
	cmd.Flags().StringVar(&labels, "labels", labelsFinal, labelsUsage)
	return cmd
}

func newQueryAggCmd(o *queryOpts) *cobra.Command {
	var by, labels string
	cmd := &cobra.Command{
		Use:   "agg",
		Short: "Count executions grouped by rank, function, io_step or (rank, function)",
		Long: `Count executions grouped by rank, function, io_step or (rank, function).
Anomalies are counted as list shows them: once a run has ended, those the
final models still flag (--labels final, the default); --labels unflagged
counts the others, --labels all every anomaly flagged during the run.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			g, err := provenance.ParseGroupBy(by)
			if err != nil {
				return fmt.Errorf("--by: %w", err)
			}
			q, err := queryFromFlags(cmd)
			if err != nil {
				return err
			}
			if !provenance.IsExecKind(q.Kind) {
				return fmt.Errorf("--kind %s cannot be aggregated: use anomalies or normalexecs", q.Kind)
			}
			b, err := o.open(cmd.Context())
			if err != nil {
				return err
			}
			defer b.Close()
			var skips provenance.Skips
			ctx := provenance.WithSkips(cmd.Context(), &skips)
			defer warnSkipped(cmd.ErrOrStderr(), &skips)
			labels, ranges, err := labelRanges(cmd, b, q.Kind, labels)
			if err != nil {
				return err
			}
			var gs []provenance.Group
			if ranges != nil {
				gs, err = aggregateLabelled(ctx, b, q, g, labels, ranges)
			} else {
				gs, err = b.Aggregate(ctx, q, g)
			}
			if err != nil {
				return err
			}
			if o.json {
				return jsonLines(cmd.OutOrStdout(), gs)
			}
			return groupTable(cmd.OutOrStdout(), g, gs)
		},
	}
	cmd.Flags().StringVar(&by, "by", "func", "grouping: rank, func, step or rank,func")
	filterFlags(cmd.Flags(), false)
	cmd.Flags().StringVar(&labels, "labels", labelsFinal, labelsUsage)
	return cmd
}

func jsonLines[T any](w io.Writer, items []T) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	for _, it := range items {
		if err := enc.Encode(it); err != nil {
			return err
		}
	}
	return nil
}

// listExecs prints the executions q selects as JSON lines or a table, one
// at a time as b streams them.
func listExecs(ctx context.Context, w io.Writer, b queryBackend, q provenance.Query, asJSON bool, ranges map[string]provenance.Range, labels string, byTimeLost bool) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	var fn func(provenance.Exec) error
	var t *streamTable
	n := 0
	// With --labels unflagged and no final models, nothing was unflagged:
	// every record is left out.
	labelled := q.Kind == provenance.KindAnomalies && (len(ranges) > 0 || labels == labelsUnflagged)
	if asJSON {
		enc := json.NewEncoder(bw)
		enc.SetEscapeHTML(false)
		fn = func(e provenance.Exec) error {
			return enc.Encode(&e)
		}
	} else {
		t = &streamTable{w: bw, hold: tableHold}
		head := []string{"PID", "EVENT_ID", "RANK", "TID", "STEP", "ENTRY", "RUNTIME", "EXCLUSIVE", "SCORE", "GPU", "FUNC"}
		if labelled {
			head = append(head[:10], "LABEL", "FUNC")
		}
		if err := t.row(head...); err != nil {
			return err
		}
		u := func(x uint64) string { return strconv.FormatUint(x, 10) }
		fn = func(e provenance.Exec) error {
			n++
			gpu := ""
			if e.IsGPUEvent {
				gpu = "gpu"
			}
			row := []string{u(uint64(e.PID)), e.EventID, u(uint64(e.RID)), u(uint64(e.TID)), u(e.IOStep), u(e.Entry),
				u(e.RuntimeTotal), u(e.RuntimeExclusive), strconv.FormatFloat(e.OutlierScore, 'f', 3, 64), gpu, e.Func}
			if labelled {
				row = append(row[:10], e.FinalLabel, e.Func)
			}
			return t.row(row...)
		}
	}
	var costly *costliest
	out := fn
	if byTimeLost {
		// Every matching record is read; the costliest --limit are kept.
		costly = &costliest{limit: q.Limit}
		fn, q.Limit = costly.add, provenance.NoLimit
	}
	if labelled {
		// Relabel as records stream by; with a filter on the label, read
		// past the limit until it is reached among the records kept.
		inner, limit, kept := fn, q.Limit, 0
		stop := errors.New("limit reached")
		fn = func(e provenance.Exec) error {
			relabel(&e, q.Kind, ranges)
			if labels == labelsFinal && e.FinalLabel != provenance.FinalAnomalyLabel ||
				labels == labelsUnflagged && e.FinalLabel != provenance.FinalUnflagged {
				return nil
			}
			if limit != provenance.NoLimit && kept >= limit {
				return stop
			}
			kept++
			return inner(e)
		}
		if labels != labelsAll {
			q.Limit = provenance.NoLimit
		}
		if err := b.Each(ctx, q, fn); err != nil && !errors.Is(err, stop) {
			_ = bw.Flush()
			return err
		}
	} else if err := b.Each(ctx, q, fn); err != nil {
		_ = bw.Flush()
		return err
	}
	if costly != nil {
		if err := costly.each(out); err != nil {
			_ = bw.Flush()
			return err
		}
	}
	if t != nil {
		if err := t.flush(); err != nil {
			return err
		}
		if _, err := fmt.Fprintf(bw, "%d records\n", n); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// sortTimeLost is the --sort value that lists executions by the time they
// lost (Explanation.Excess), costliest first. The stores do not index it:
// the listing reads every matching record and keeps the costliest.
const sortTimeLost = "time-lost"

// listByTimeLost says whether the listing is ordered by the time lost: when
// asked, and by default for anomalies under a limit (a listing of every
// record streams in entry order instead of holding them all).
func listByTimeLost(cmd *cobra.Command, q provenance.Query) bool {
	f := cmd.Flags().Lookup("sort")
	if f == nil {
		return false
	}
	if f.Changed {
		return f.Value.String() == sortTimeLost
	}
	return q.Kind == provenance.KindAnomalies && q.Limit != provenance.NoLimit
}

// costliest keeps the limit records that lost the most time (all of them
// with provenance.NoLimit), in the order they came for equal losses;
// records without an explanation come last.
type costliest struct {
	limit int
	recs  []provenance.Exec
}

// timeLost is e's time lost, or -Inf when its record does not say.
func timeLost(e *provenance.Exec) float64 {
	if e.Explanation == nil || math.IsNaN(e.Explanation.Excess) {
		return math.Inf(-1)
	}
	return e.Explanation.Excess
}

func (c *costliest) add(e provenance.Exec) error {
	c.recs = append(c.recs, e)
	if c.limit != provenance.NoLimit && len(c.recs) >= 2*c.limit+64 {
		c.sort()
		c.recs = c.recs[:c.limit]
	}
	return nil
}

// sort orders the records costliest first, keeping their arrival order
// among equals.
func (c *costliest) sort() {
	slices.SortStableFunc(c.recs, func(a, b provenance.Exec) int {
		return cmp.Compare(timeLost(&b), timeLost(&a))
	})
}

// each hands the kept records to fn, costliest first.
func (c *costliest) each(fn func(provenance.Exec) error) error {
	c.sort()
	if c.limit != provenance.NoLimit && len(c.recs) > c.limit {
		c.recs = c.recs[:c.limit]
	}
	for _, e := range c.recs {
		if err := fn(e); err != nil {
			return err
		}
	}
	return nil
}

// tableHold is the number of rows a streamed table holds to size its
// columns.
const tableHold = 1000

// streamTable aligns columns as text/tabwriter does (each cell but the last
// padded to its column's widest cell and two spaces) but holds only its
// first hold rows: their widths are the table's, widened by any later cell
// wider still, so that a table of any length streams. A table of up to hold
// rows prints exactly as text/tabwriter would.
type streamTable struct {
	w      io.Writer
	hold   int
	rows   [][]string
	widths []int
	fixed  bool
	line   []byte
}

// row adds a row; all rows have the same number of cells.
func (t *streamTable) row(cells ...string) error {
	if t.fixed {
		return t.write(cells)
	}
	t.rows = append(t.rows, cells)
	if len(t.rows) >= t.hold {
		return t.flush()
	}
	return nil
}

// flush sizes the columns on the rows held, if not done yet, and writes
// them.
func (t *streamTable) flush() error {
	if t.fixed {
		return nil
	}
	t.fixed = true
	for _, r := range t.rows {
		t.widen(r)
	}
	for _, r := range t.rows {
		if err := t.write(r); err != nil {
			return err
		}
	}
	t.rows = nil
	return nil
}

// widen grows the column widths to fit cells.
func (t *streamTable) widen(cells []string) {
	for len(t.widths) < len(cells) {
		t.widths = append(t.widths, 0)
	}
	for j, c := range cells[:len(cells)-1] {
		t.widths[j] = max(t.widths[j], utf8.RuneCountInString(c))
	}
}

func (t *streamTable) write(cells []string) error {
	t.widen(cells)
	t.line = t.line[:0]
	for j, c := range cells {
		t.line = append(t.line, c...)
		if j < len(cells)-1 {
			for range t.widths[j] + 2 - utf8.RuneCountInString(c) {
				t.line = append(t.line, ' ')
			}
		}
	}
	t.line = append(t.line, '\n')
	_, err := t.w.Write(t.line)
	return err
}

func groupTable(w io.Writer, by provenance.GroupBy, gs []provenance.Group) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	switch by {
	case provenance.ByRank:
		fmt.Fprintln(tw, "RANK\tANOMALIES")
	case provenance.ByFunc:
		fmt.Fprintln(tw, "FUNC\tANOMALIES")
	case provenance.ByStep:
		fmt.Fprintln(tw, "IO_STEP\tANOMALIES")
	case provenance.ByRankFunc:
		fmt.Fprintln(tw, "RANK\tFUNC\tANOMALIES")
	}
	for _, g := range gs {
		switch by {
		case provenance.ByRank:
			fmt.Fprintf(tw, "%d\t%d\n", *g.Rank, g.Count)
		case provenance.ByFunc:
			fmt.Fprintf(tw, "%s\t%d\n", g.Func, g.Count)
		case provenance.ByStep:
			fmt.Fprintf(tw, "%d\t%d\n", *g.Step, g.Count)
		case provenance.ByRankFunc:
			fmt.Fprintf(tw, "%d\t%s\t%d\n", *g.Rank, g.Func, g.Count)
		}
	}
	return tw.Flush()
}

// execTree prints one execution as a readable tree.
func execTree(w io.Writer, kind provenance.Kind, e *provenance.Exec) error {
	var b strings.Builder
	label := "anomaly"
	if kind == provenance.KindNormalExecs {
		label = "normal execution"
	}
	rel := func(t uint64) string {
		if t == 0 {
			return "open"
		}
		return fmt.Sprintf("%+d", int64(t)-int64(e.Entry))
	}
	fmt.Fprintf(&b, "%s %s of %s (fid %d)\n", label, provenance.ExecKey(e.PID, e.EventID), e.Func, e.FID)
	fmt.Fprintf(&b, "├─ where: program %d, rank %d, thread %d", e.PID, e.RID, e.TID)
	if e.Hostname != "" {
		fmt.Fprintf(&b, ", host %s", e.Hostname)
	}
	fmt.Fprintf(&b, "\n├─ when: io_step %d [%d, %d], entry %d, exit %d", e.IOStep, e.IOStepTStart, e.IOStepTEnd, e.Entry, e.Exit)
	if e.LabelledIOStep > e.IOStep {
		fmt.Fprintf(&b, "; labelled in io_step %d (its model was too young to judge it at once)", e.LabelledIOStep)
	}
	b.WriteByte('\n')
	fmt.Fprintf(&b, "├─ runtime: total %d, exclusive %d\n", e.RuntimeTotal, e.RuntimeExclusive)
	fmt.Fprintf(&b, "├─ outlier: score %.3f, severity %g", e.OutlierScore, e.OutlierSeverity)
	if e.Algorithm != "" {
		fmt.Fprintf(&b, ", algorithm %s", e.Algorithm)
	}
	if e.FinalLabel != "" {
		fmt.Fprintf(&b, "\n├─ final label: %s (after the end-of-run relabelling with the final models)", e.FinalLabel)
	}
	if x := e.Explanation; x != nil {
		fmt.Fprintf(&b, "\n├─ why: %s\n│  natural range of %s: %.4g to %.4g µs; flagged below %.4g or above %.4g µs", x.Text, x.Key, x.NaturalMin, x.NaturalMax, x.LowThreshold, x.Threshold)
	}
	s := e.FuncStats
	fmt.Fprintf(&b, "\n├─ function statistics: count %g, mean %g, stddev %g, min %g, max %g, skewness %g, kurtosis %g\n",
		s.Count, s.Mean, s.Stddev, s.Minimum, s.Maximum, s.Skewness, s.Kurtosis)
	fmt.Fprintf(&b, "├─ call stack (%d frames, innermost first)\n", len(e.CallStack))
	for i, f := range e.CallStack {
		fmt.Fprintf(&b, "│  %s %s [%s] entry %s exit %s%s\n", branch(i, len(e.CallStack)), f.Func, f.EventID, rel(f.Entry), rel(f.Exit), mark(f.IsAnomaly, " ANOMALY"))
	}
	ew := e.EventWindow
	fmt.Fprintf(&b, "├─ event window (%d executions, %d messages; times relative to entry)\n", len(ew.ExecWindow), len(ew.CommWindow))
	n := len(ew.ExecWindow) + len(ew.CommWindow)
	i := 0
	for _, x := range ew.ExecWindow {
		fmt.Fprintf(&b, "│  %s %s [%s] entry %s exit %s parent %s%s%s\n", branch(i, n), x.Func, x.EventID, rel(x.Entry), rel(x.Exit), x.ParentEventID,
			mark(x.EventID == e.EventID, " <= this execution"), mark(x.IsAnomaly && x.EventID != e.EventID, " ANOMALY"))
		i++
	}
	for _, c := range ew.CommWindow {
		fmt.Fprintf(&b, "│  %s %s %d -> %d, %d bytes, tag %d at %s (in %s)\n", branch(i, n), c.Type, c.Src, c.Tar, c.Bytes, c.Tag, rel(c.Timestamp), c.ExecdataKey)
		i++
	}
	fmt.Fprintf(&b, "├─ counters (%d)\n", len(e.CounterEvents))
	for i, c := range e.CounterEvents {
		fmt.Fprintf(&b, "│  %s %s = %d at %s\n", branch(i, len(e.CounterEvents)), c.CounterName, c.CounterValue, rel(c.TS))
	}
	if !e.IsGPUEvent || e.GPULocation == nil {
		b.WriteString("└─ GPU: no\n")
	} else {
		l := e.GPULocation
		fmt.Fprintf(&b, "└─ GPU: device %d, context %d, stream %d, virtual thread %d\n", l.Device, l.Context, l.Stream, l.Thread)
		if p := e.GPUParent; p != nil {
			fmt.Fprintf(&b, "   └─ launched by %s on thread %d\n", p.EventID, p.TID)
			for i, f := range p.CallStack {
				fmt.Fprintf(&b, "      %s %s [%s] entry %s exit %s\n", branch(i, len(p.CallStack)), f.Func, f.EventID, rel(f.Entry), rel(f.Exit))
			}
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func branch(i, n int) string {
	if i == n-1 {
		return "└─"
	}
	return "├─"
}

func mark(b bool, s string) string {
	if b {
		return s
	}
	return ""
}

// httpBackend asks provdb's HTTP API.
type httpBackend struct {
	base   *url.URL
	token  string
	client *http.Client
}

func newHTTPBackend(raw, tokenFile string) (*httpBackend, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--url %q is not an http:// or https:// URL", raw)
	}
	h := &httpBackend{base: u, client: &http.Client{Timeout: 60 * time.Second}}
	if h.token, err = daemon.Secret("token-file", tokenFile); err != nil {
		return nil, err
	}
	return h, nil
}

func (h *httpBackend) get(ctx context.Context, path string, v url.Values, out any) error {
	return h.do(ctx, path, v, func(body io.Reader) error {
		data, err := io.ReadAll(io.LimitReader(body, 1<<30))
		if err != nil {
			return err
		}
		return json.Unmarshal(data, out)
	})
}

// do asks provdb for path with parameters v and passes the body of a 200
// answer to read.
func (h *httpBackend) do(ctx context.Context, path string, v url.Values, read func(io.Reader) error) error {
	u := *h.base
	u.Path = strings.TrimSuffix(u.Path, "/") + path
	u.RawQuery = v.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	if h.token != "" {
		req.Header.Set("Authorization", "Bearer "+h.token)
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return fmt.Errorf("ask provdb: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if err != nil {
			return fmt.Errorf("ask provdb: %w", err)
		}
		var e struct{ Error string }
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			if resp.StatusCode == http.StatusNotFound {
				return fmt.Errorf("provdb: %s: %w", e.Error, provenance.ErrNotFound)
			}
			return fmt.Errorf("provdb: %s", e.Error)
		}
		return fmt.Errorf("provdb answered %s", resp.Status)
	}
	if err := read(resp.Body); err != nil {
		return fmt.Errorf("provdb's answer: %w", err)
	}
	return nil
}

// callbackError carries the error of Each's callback through a page's read,
// to be returned as it is.
type callbackError struct{ err error }

func (e callbackError) Error() string { return e.err.Error() }

// Each asks /api/v1/records page after page, following its "next" cursor,
// until q.Limit records or no "next"; each page is decoded one record at a
// time as it arrives.
func (h *httpBackend) Each(ctx context.Context, q provenance.Query, fn func(provenance.Exec) error) error {
	if err := q.Normalize(); err != nil {
		return fmt.Errorf("list: %w", err)
	}
	left := q.Limit // NoLimit: every record
	for {
		pq := q
		if left != provenance.NoLimit {
			pq.Limit = left
		}
		var next string
		var skipped int64
		n := 0
		err := h.do(ctx, "/api/v1/records", pq.Values(), func(body io.Reader) error {
			var err error
			next, skipped, err = readRecords(body, func(e provenance.Exec) error {
				n++
				if err := fn(e); err != nil {
					return callbackError{err}
				}
				return nil
			})
			return err
		})
		provenance.Skip(ctx, skipped, fmt.Errorf("provdb left %d out of an answer: %w", skipped, provenance.ErrBadDocument))
		var cb callbackError
		if errors.As(err, &cb) {
			return cb.err
		}
		if err != nil {
			return err
		}
		if left != provenance.NoLimit {
			left -= n
		}
		if next == "" || left == 0 || n == 0 {
			return nil
		}
		c, err := provenance.ParseCursor(next)
		if err != nil {
			return fmt.Errorf("provdb's answer: %w", err)
		}
		q.After = c
	}
}

// readRecords decodes an answer of /api/v1/records, {"records":[...],
// "skipped":n,"next":"..."}, passing each record to fn as it is read, and
// returns next and the number of records provdb left out.
func readRecords(r io.Reader, fn func(provenance.Exec) error) (next string, skipped int64, err error) {
	dec := json.NewDecoder(r)
	delim := func(want json.Delim) error {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		if d, ok := tok.(json.Delim); !ok || d != want {
			return fmt.Errorf("got %v where %q was due", tok, want)
		}
		return nil
	}
	if err := delim('{'); err != nil {
		return "", 0, err
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return "", 0, err
		}
		switch tok {
		case "records":
			if err := delim('['); err != nil {
				return "", 0, err
			}
			for dec.More() {
				var e provenance.Exec
				if err := dec.Decode(&e); err != nil {
					return "", 0, err
				}
				if err := fn(e); err != nil {
					return "", 0, err
				}
			}
			if err := delim(']'); err != nil {
				return "", 0, err
			}
		case "next":
			if err := dec.Decode(&next); err != nil {
				return "", 0, err
			}
		case "skipped":
			if err := dec.Decode(&skipped); err != nil {
				return "", 0, err
			}
		default:
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return "", 0, err
			}
		}
	}
	if err := delim('}'); err != nil {
		return "", 0, err
	}
	return next, skipped, nil
}

func (h *httpBackend) Get(ctx context.Context, kind provenance.Kind, pid uint32, eventID string) (provenance.Exec, error) {
	var e provenance.Exec
	err := h.get(ctx, "/api/v1/records/"+url.PathEscape(string(kind))+"/"+strconv.FormatUint(uint64(pid), 10)+"/"+url.PathEscape(eventID), nil, &e)
	return e, err
}

func (h *httpBackend) Count(ctx context.Context, q provenance.Query) (int64, error) {
	var r struct{ Count int64 }
	v := q.Values()
	v.Del("limit")
	v.Del("sort")
	err := h.get(ctx, "/api/v1/count", v, &r)
	return r.Count, err
}

// FuncStats asks /api/v1/func_stats.
func (h *httpBackend) FuncStats(ctx context.Context, fn func(provenance.GlobalFuncStats) error) error {
	var out struct {
		FuncStats []provenance.GlobalFuncStats `json:"func_stats"`
		Skipped   int64                        `json:"skipped"`
	}
	if err := h.get(ctx, "/api/v1/func_stats", nil, &out); err != nil {
		return err
	}
	provenance.Skip(ctx, out.Skipped, fmt.Errorf("provdb left %d func_stats records out: %w", out.Skipped, provenance.ErrBadDocument))
	for _, f := range out.FuncStats {
		if err := fn(f); err != nil {
			return err
		}
	}
	return nil
}

func (h *httpBackend) Aggregate(ctx context.Context, q provenance.Query, by provenance.GroupBy) ([]provenance.Group, error) {
	var r struct{ Groups []provenance.Group }
	v := q.Values()
	v.Set("by", string(by))
	err := h.get(ctx, "/api/v1/aggregate", v, &r)
	return r.Groups, err
}

func (h *httpBackend) Close() error { return nil }
