package cli

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kipimo-hpc/kipimo/internal/perfetto"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

func newExportCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "export",
		Short: "Export a run's records for other tools (a Perfetto timeline)",
	}
	cmd.AddCommand(newExportPerfettoCmd())
	return cmd
}

// exportSel is what kipimo export perfetto exports.
type exportSel struct {
	record  string
	pid     uint32
	steps   string
	ranks   string
	margin  uint64
	maxRecs int
	out     string
}

func newExportPerfettoCmd() *cobra.Command {
	o := &queryOpts{}
	sel := &exportSel{}
	cmd := &cobra.Command{
		Use:   "perfetto",
		Short: "Write an anomaly's window, io_steps or ranks of a run as a Perfetto timeline",
		Long: `Write a timeline of a run's stored records that Perfetto (ui.perfetto.dev) and
chrome://tracing open: one process per rank, one thread per thread and GPU
queue, the executions of the records' event windows and call stacks as nested
slices, messages between ranks as flows from the send to its receive,
anomalies marked, counter samples as counter tracks, every rank on the run's
one clock. Each execution and message is written once, however many records'
windows hold it. The format is the Chrome trace event format (JSON; gzipped
when --out ends in .gz); docs/timeline.md describes it.

Choose what to export:

  --record EVENT_ID   one record's window (an anomaly, else a sampled normal
                      execution) and what every rank (or --ranks) was doing
                      meanwhile: the records of its io_step and the ones
                      beside it whose windows or callers overlap it, cut to
                      the window's time span (widened by --margin µs on
                      each side)
  --steps A-B         the records of io_steps A to B
  --ranks LIST        only these ranks ("0-3,8"); alone, their whole run

The records are read from a store (--store: a SQLite file or a run's
directory; default the latest run under ./kipimo-out) or from provdb's HTTP API
(--url), as kipimo query reads them.`,
		Example: `  kipimo export perfetto --record 3:12:225 --out anomaly.json
  kipimo export perfetto --steps 10-12 --ranks 0-3 --store kipimo-out/first --out steps.json.gz
  kipimo export perfetto --ranks 0,1 --url http://127.0.0.1:8081 --out ranks.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.resolve(cmd.ErrOrStderr()); err != nil {
				return err
			}
			return runExportPerfetto(cmd.Context(), cmd.ErrOrStderr(), o, sel)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.url, "url", "", "provdb HTTP API to ask, e.g. http://127.0.0.1:8081, or the directory of a kipimo run still running (instead of --store)")
	f.StringVar(&o.store, "store", "", "store to read: a SQLite file, a run's directory or a mongodb:// URI (default: the latest run's store under ./kipimo-out)")
	f.StringVar(&o.tokenFile, "token-file", "", "file holding the bearer token of the provdb HTTP API")
	f.StringVar(&sel.record, "record", "", `event id "<rank>:<io_step>:<idx>" of the record whose window to export`)
	f.Uint32Var(&sel.pid, "pid", 0, "program index of --record")
	f.StringVar(&sel.steps, "steps", "", `io_steps to export, "A-B" or "A"`)
	f.StringVar(&sel.ranks, "ranks", "", `ranks to export, e.g. "0-3,8" (default: every rank)`)
	f.Uint64Var(&sel.margin, "margin", 0, "--record: µs added to each side of the window's time span")
	f.IntVar(&sel.maxRecs, "max-records", 200000, "refuse to export more records than this (narrow with --steps or --ranks)")
	f.StringVarP(&sel.out, "out", "o", "kipimo-timeline.json", `file to write ("-": stdout; a name ending in .gz is gzipped)`)
	return cmd
}

func runExportPerfetto(ctx context.Context, stderr io.Writer, o *queryOpts, sel *exportSel) error {
	if sel.record == "" && sel.steps == "" && sel.ranks == "" {
		return errors.New("choose what to export: --record EVENT_ID (an anomaly's window), --steps A-B or --ranks LIST (their whole run)")
	}
	c := perfetto.Choice{Record: sel.record, PID: sel.pid, Margin: sel.margin, MaxRecords: sel.maxRecs}
	if sel.ranks != "" {
		var err error
		if c.Ranks, err = perfetto.ParseRanks(sel.ranks); err != nil {
			return fmt.Errorf("--%w", err)
		}
	}
	if sel.steps != "" {
		lo, hi, err := perfetto.ParseSpan(sel.steps)
		if err != nil {
			return fmt.Errorf("--steps: %w", err)
		}
		c.StepMin, c.StepMax = &lo, &hi
	}
	if sel.record != "" {
		if _, _, _, err := provenance.ParseEventID(sel.record); err != nil {
			return fmt.Errorf("--record: %w", err)
		}
	}
	start := time.Now()
	b, err := o.open(ctx)
	if err != nil {
		return err
	}
	defer b.Close()
	var skips provenance.Skips
	ctx = provenance.WithSkips(ctx, &skips)
	defer warnSkipped(stderr, &skips)
	tl, err := perfetto.Gather(ctx, b, c)
	switch {
	case errors.Is(err, perfetto.ErrTooMany):
		return fmt.Errorf("%w to export: narrow the choice (--steps, --ranks) or raise --max-records", err)
	case errors.Is(err, perfetto.ErrNoRecords):
		return errors.New("no records match: check --steps and --ranks against kipimo query agg --by step")
	case err != nil && sel.record != "" && errors.Is(err, provenance.ErrNotFound):
		return fmt.Errorf("--record: %w", err)
	case err != nil:
		return err
	}
	st, size, err := writeTimeline(tl, sel.out)
	if err != nil {
		return err
	}
	where := sel.out
	if where == "-" {
		where = "stdout"
	}
	fmt.Fprintf(stderr, "wrote %s (%s) in %s: %d executions (%d anomalies) from %d records on %d ranks, %d threads; %d messages, %d paired into flows; %d counter samples\n",
		where, byteSize(size), time.Since(start).Round(time.Millisecond), st.Executions, st.Anomalies, st.Records, st.Ranks, st.Threads, st.Messages, st.Flows, st.Counters)
	if st.Conflicts > 0 {
		fmt.Fprintf(stderr, "warning: %d executions were told differently by two records; the first record read was kept\n", st.Conflicts)
	}
	if where != "stdout" {
		fmt.Fprintf(stderr, "open it at https://ui.perfetto.dev (Open trace file) or in chrome://tracing\n")
	}
	return nil
}

// writeTimeline writes tl to path ("-": stdout; .gz: gzipped) and returns
// its stats and the bytes written.
func writeTimeline(tl *perfetto.Timeline, path string) (perfetto.Stats, int64, error) {
	var w io.Writer = os.Stdout
	var fh *os.File
	if path != "-" {
		var err error
		if fh, err = os.Create(path); err != nil {
			return perfetto.Stats{}, 0, fmt.Errorf("--out: %w", err)
		}
		defer fh.Close()
		w = fh
	}
	cw := &countWriter{w: w}
	w = cw
	var zw *gzip.Writer
	if strings.HasSuffix(path, ".gz") {
		zw = gzip.NewWriter(cw)
		w = zw
	}
	st, err := tl.Write(w)
	if err == nil && zw != nil {
		err = zw.Close()
	}
	if err == nil && fh != nil {
		err = fh.Close()
	}
	if err != nil {
		return st, cw.n, fmt.Errorf("write %s: %w", path, err)
	}
	return st, cw.n, nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// byteSize writes n bytes as B, KiB or MiB.
func byteSize(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
