package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/service"
)

// queryBackend is what kipimo query reads: a store opened directly, or
// provdb's HTTP API.
type queryBackend interface {
	Query(ctx context.Context, q provenance.Query) ([]provenance.Exec, error)
	Get(ctx context.Context, kind string, pid uint32, eventID string) (provenance.Exec, error)
	Count(ctx context.Context, q provenance.Query) (int64, error)
	Aggregate(ctx context.Context, q provenance.Query, by provenance.GroupBy) ([]provenance.Group, error)
	Close() error
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
  kipimo query show 3:12:225 --pid 0
  kipimo query count --min-score 10
  kipimo query agg --by rank,func --url http://127.0.0.1:8081`,
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&o.url, "url", "", "provdb HTTP API to ask, e.g. http://127.0.0.1:8081 (instead of --store)")
	pf.StringVar(&o.store, "store", "", "store to read: a SQLite file or a mongodb:// URI (default ./kipimo-prov.db)")
	pf.StringVar(&o.tokenFile, "token-file", "", "file holding the bearer token of the provdb HTTP API")
	pf.BoolVar(&o.json, "json", false, "print JSON lines instead of a table")
	cmd.AddCommand(newQueryListCmd(o), newQueryShowCmd(o), newQueryCountCmd(o), newQueryAggCmd(o))
	return cmd
}

// filterFlags adds the filter flags of list, count and agg; their values
// are turned into the same URL parameters the HTTP API takes, so both
// paths share one parser.
func filterFlags(fs *pflag.FlagSet, sortable bool) {
	fs.String("kind", natsx.ProvAnomalies, "records to read: anomalies or normalexecs (count: any collection)")
	fs.Uint32("pid", 0, "program index")
	fs.Uint32("rank", 0, "MPI rank")
	fs.Uint32("tid", 0, "thread")
	fs.String("func", "", "function name, exact")
	fs.String("func-re", "", "function name, RE2 regular expression (unanchored)")
	fs.Uint64("step-min", 0, "first io_step")
	fs.Uint64("step-max", 0, "last io_step")
	fs.Uint64("from", 0, "executions entered at or after this time (trace time units)")
	fs.Uint64("to", 0, "executions exited at or before this time")
	fs.Uint64("min-runtime", 0, "minimum total runtime")
	fs.Float64("min-score", 0, "minimum outlier score")
	fs.Bool("gpu", false, "GPU executions only")
	fs.Int("limit", provenance.DefaultLimit, "maximum number of records (groups for agg)")
	if sortable {
		fs.String("sort", provenance.SortEntry, "sort by "+strings.Join(provenance.SortFields, ", "))
		fs.Bool("desc", false, "sort in descending order")
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
	spec := o.store
	if spec == "" {
		spec = "./kipimo-prov.db"
	}
	s, err := service.OpenStore(ctx, spec, true)
	if err != nil {
		return nil, err
	}
	return s, nil
}

func newQueryListCmd(o *queryOpts) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List executions matching filters, sorted",
		Args:  cobra.NoArgs,
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
			recs, err := b.Query(cmd.Context(), q)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if o.json {
				return jsonLines(out, recs)
			}
			return execTable(out, recs)
		},
	}
	filterFlags(cmd.Flags(), true)
	return cmd
}

func newQueryShowCmd(o *queryOpts) *cobra.Command {
	var kind string
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
			if o.json {
				return jsonLines(cmd.OutOrStdout(), []provenance.Exec{e})
			}
			return execTree(cmd.OutOrStdout(), kind, &e)
		},
	}
	cmd.Flags().StringVar(&kind, "kind", natsx.ProvAnomalies, "anomalies or normalexecs")
	cmd.Flags().Uint32Var(&pid, "pid", 0, "program index")
	return cmd
}

func newQueryCountCmd(o *queryOpts) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "count",
		Short: "Count records matching filters",
		Args:  cobra.NoArgs,
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
			n, err := b.Count(cmd.Context(), q)
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
	return cmd
}

func newQueryAggCmd(o *queryOpts) *cobra.Command {
	var by string
	cmd := &cobra.Command{
		Use:   "agg",
		Short: "Count executions grouped by rank, function, io_step or (rank, function)",
		Args:  cobra.NoArgs,
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
			gs, err := b.Aggregate(cmd.Context(), q, g)
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

func execTable(w io.Writer, recs []provenance.Exec) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PID\tEVENT_ID\tRANK\tTID\tSTEP\tENTRY\tRUNTIME\tEXCLUSIVE\tSCORE\tGPU\tFUNC")
	for _, e := range recs {
		gpu := ""
		if e.IsGPUEvent {
			gpu = "gpu"
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%.3f\t%s\t%s\n", e.PID, e.EventID, e.RID, e.TID, e.IOStep,
			e.Entry, e.RuntimeTotal, e.RuntimeExclusive, e.OutlierScore, gpu, e.Func)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "%d records\n", len(recs))
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
func execTree(w io.Writer, kind string, e *provenance.Exec) error {
	var b strings.Builder
	label := "anomaly"
	if kind == natsx.ProvNormalExecs {
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
	fmt.Fprintf(&b, "\n├─ when: io_step %d [%d, %d], entry %d, exit %d\n", e.IOStep, e.IOStepTStart, e.IOStepTEnd, e.Entry, e.Exit)
	fmt.Fprintf(&b, "├─ runtime: total %d, exclusive %d\n", e.RuntimeTotal, e.RuntimeExclusive)
	fmt.Fprintf(&b, "├─ outlier: score %.3f, severity %g", e.OutlierScore, e.OutlierSeverity)
	if e.Algorithm != "" {
		fmt.Fprintf(&b, ", algorithm %s", e.Algorithm)
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
	if tokenFile != "" {
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			return nil, fmt.Errorf("--token-file: %w", err)
		}
		h.token = strings.TrimSpace(string(b))
	}
	return h, nil
}

func (h *httpBackend) get(ctx context.Context, path string, v url.Values, out any) error {
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
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<30))
	if err != nil {
		return fmt.Errorf("ask provdb: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct{ Error string }
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			if resp.StatusCode == http.StatusNotFound {
				return fmt.Errorf("provdb: %s: %w", e.Error, provenance.ErrNotFound)
			}
			return fmt.Errorf("provdb: %s", e.Error)
		}
		return fmt.Errorf("provdb answered %s", resp.Status)
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("provdb's answer: %w", err)
	}
	return nil
}

func (h *httpBackend) Query(ctx context.Context, q provenance.Query) ([]provenance.Exec, error) {
	var r struct{ Records []provenance.Exec }
	err := h.get(ctx, "/api/v1/records", q.Values(), &r)
	return r.Records, err
}

func (h *httpBackend) Get(ctx context.Context, kind string, pid uint32, eventID string) (provenance.Exec, error) {
	var e provenance.Exec
	err := h.get(ctx, "/api/v1/records/"+url.PathEscape(kind)+"/"+strconv.FormatUint(uint64(pid), 10)+"/"+url.PathEscape(eventID), nil, &e)
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

func (h *httpBackend) Aggregate(ctx context.Context, q provenance.Query, by provenance.GroupBy) ([]provenance.Group, error) {
	var r struct{ Groups []provenance.Group }
	v := q.Values()
	v.Set("by", string(by))
	err := h.get(ctx, "/api/v1/aggregate", v, &r)
	return r.Groups, err
}

func (h *httpBackend) Close() error { return nil }
