package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kipimo-hpc/kipimo/internal/daemon"
	"github.com/kipimo-hpc/kipimo/internal/pserver"
	"github.com/kipimo-hpc/kipimo/internal/run"
)

func newQueryCulpritsCmd(o *queryOpts) *cobra.Command {
	var (
		dash             string
		outliers, bursts bool
		limit            int
	)
	cmd := &cobra.Command{
		Use:   "culprits",
		Short: "List the ranks and functions where waits began, costliest first",
		Long: `List the culprits of a run: the ranks, and their functions, where the time
other ranks waited for began, ordered by the time each cost the job (its own
excess over its peers plus the waits it caused), with the bursts (io_steps)
it was a culprit of and how many of them it was the top culprit of.
--outliers lists the outlier ranks instead: ranks whose time in a function
stood out from their peers', with the io_steps; STANDING marks those that
stood out in at least 2 io_steps and 10% of the steps analysed. --bursts
lists the latest bursts, each with its culprits. docs/detection.md says how
both are decided.

A finished run's analysis is in its directory (culprits.json, read with
--store or from the latest run under ./kipimo-out); a running one is asked
with --dashboard, its parameter server's URL or the run's directory.`,
		Example: `  kipimo query culprits
  kipimo query culprits --outliers --store kipimo-out/first
  kipimo query culprits --bursts --dashboard kipimo-out/first --json`,
		Args: cobra.NoArgs,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			if err := cmd.Root().PersistentPreRunE(cmd, args); err != nil {
				return err
			}
			if dash != "" {
				return nil // no store to find
			}
			return o.resolve(cmd.ErrOrStderr())
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			if outliers && bursts {
				return errors.New("give --outliers or --bursts, not both")
			}
			c, err := readCulprits(cmd.Context(), o, dash)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			cut := func(n int) int {
				if limit > 0 {
					return min(n, limit)
				}
				return n
			}
			us := func(x float64) time.Duration {
				return time.Duration(x * float64(time.Microsecond)).Round(time.Microsecond)
			}
			tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
			switch {
			case outliers:
				rows := c.Outliers[:cut(len(c.Outliers))]
				if o.json {
					return jsonLines(out, rows)
				}
				fmt.Fprintf(tw, "RANK\tFUNC\tSTEPS\tEXCESS\tTIME LOST\tSTANDING\tIO_STEPS\n")
				for _, r := range rows {
					fmt.Fprintf(tw, "%d\t%s\t%d/%d\t%s\t%s\t%v\t%s\n", r.Rank, r.Func, r.Steps, c.Steps, us(r.ExcessUs), us(r.TimeLostUs), r.Standing, stepList(r.IOSteps))
				}
			case bursts:
				rows := c.Bursts[len(c.Bursts)-cut(len(c.Bursts)):]
				if o.json {
					return jsonLines(out, rows)
				}
				fmt.Fprintf(tw, "IO_STEP\tANOMALIES\tRANKS\tWAITS\tCULPRITS\n")
				for _, b := range rows {
					var parts []string
					for _, cu := range b.Culprits {
						parts = append(parts, fmt.Sprintf("rank %d %s (%s)", cu.Rank, funcOrUnknown(cu.Func), us(cu.TimeLostUs)))
					}
					fmt.Fprintf(tw, "%d\t%d\t%d/%d\t%s\t%s\n", b.IOStep, b.Anomalies, b.AnomalousRanks, b.Ranks, us(b.WaitUs), strings.Join(parts, ", "))
				}
			default:
				rows := c.Culprits[:cut(len(c.Culprits))]
				if o.json {
					return jsonLines(out, rows)
				}
				fmt.Fprintf(tw, "RANK\tFUNC\tTIME LOST\tOWN\tCAUSED\tBURSTS\tTOP\n")
				for _, r := range rows {
					fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%d\n", r.Rank, funcOrUnknown(r.Func), us(r.TimeLostUs), us(r.OwnUs), us(r.CausedUs), r.Bursts, r.Top)
				}
			}
			return tw.Flush()
		},
	}
	f := cmd.Flags()
	f.StringVar(&dash, "dashboard", "", "ask a running run: its parameter server's URL (http://...) or the run's directory")
	f.BoolVar(&outliers, "outliers", false, "list the outlier ranks instead")
	f.BoolVar(&bursts, "bursts", false, "list the latest bursts and their culprits instead")
	f.IntVar(&limit, "limit", 20, "list at most this many rows (0: all)")
	return cmd
}

func funcOrUnknown(f string) string {
	if f == "" {
		return "(unreported)"
	}
	return f
}

// stepList renders io_steps compactly: the last 8, after "…" when more.
func stepList(steps []uint64) string {
	var b strings.Builder
	if len(steps) > 8 {
		b.WriteString("…,")
		steps = steps[len(steps)-8:]
	}
	for i, s := range steps {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprint(&b, s)
	}
	return b.String()
}

// readCulprits reads a run's culprit analysis: from its parameter server
// with dash, else from the culprits.json beside the store the query
// resolved.
func readCulprits(ctx context.Context, o *queryOpts, dash string) (pserver.Culprits, error) {
	var c pserver.Culprits
	if dash != "" {
		if !strings.Contains(dash, "://") {
			e, err := run.ReadEndpoints(dash)
			if err != nil {
				return c, fmt.Errorf("--dashboard: %w", err)
			}
			dash = e.Dashboard
		}
		return c, getCulprits(ctx, dash, o.tokenFile, &c)
	}
	if o.store == "" || strings.Contains(o.store, "://") {
		return c, errors.New("culprits are in a run's directory: give --store <run directory>, or --dashboard for a running run")
	}
	dir := o.store
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		dir = filepath.Dir(dir)
	}
	data, err := os.ReadFile(filepath.Join(dir, run.CulpritsFile))
	if errors.Is(err, fs.ErrNotExist) {
		return c, fmt.Errorf("%s has no %s: the run has not ended (ask it with --dashboard %s) or ran before culprits were analysed", dir, run.CulpritsFile, dir)
	}
	if err != nil {
		return c, err
	}
	if err := json.Unmarshal(data, &c); err != nil {
		return c, fmt.Errorf("read %s: %w", filepath.Join(dir, run.CulpritsFile), err)
	}
	return c, nil
}

// getCulprits asks the parameter server at base for its analysis.
func getCulprits(ctx context.Context, base, tokenFile string, out *pserver.Culprits) error {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("--dashboard %q is not an http:// or https:// URL", base)
	}
	token, err := daemon.Secret("token-file", tokenFile)
	if err != nil {
		return err
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + "/api/culprits"
	u.RawQuery = "n=0"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := (&http.Client{Timeout: 60 * time.Second}).Do(req)
	if err != nil {
		return fmt.Errorf("ask the parameter server: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<30))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("the parameter server answered %s: %s", resp.Status, strings.TrimSpace(string(data)))
	}
	return json.Unmarshal(data, out)
}
