package cli

import (
	"fmt"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// recurringRow is one line of kipimo query recurring: a func_stats record's
// recurring slow mode.
type recurringRow struct {
	PID  uint32 `json:"pid"`
	Func string `json:"func"`
	provenance.RecurringMode
}

func newQueryRecurringCmd(o *queryOpts) *cobra.Command {
	return &cobra.Command{
		Use:   "recurring",
		Short: "List the functions with a recurring slow mode, the largest share of time first",
		Long: `List the functions whose runtimes have a recurring slow mode: natural
runtimes beyond a gap above the body of their runtimes that hold at least
5% of their time (docs/detection.md). Such a mode is behaviour, so its
executions are not flagged; it is listed here whether or not any were. The
run's final func_stats records carry it: nothing is listed for a run still
going, or run with Chimbuko's rules.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b, err := o.open(cmd.Context())
			if err != nil {
				return err
			}
			defer b.Close()
			var skips provenance.Skips
			ctx := provenance.WithSkips(cmd.Context(), &skips)
			defer warnSkipped(cmd.ErrOrStderr(), &skips)
			var rows []recurringRow
			if err := b.FuncStats(ctx, func(f provenance.GlobalFuncStats) error {
				if f.Recurring != nil {
					rows = append(rows, recurringRow{PID: f.PID, Func: f.Func, RecurringMode: *f.Recurring})
				}
				return nil
			}); err != nil {
				return fmt.Errorf("read the final models: %w", err)
			}
			slices.SortStableFunc(rows, func(a, b recurringRow) int {
				switch {
				case a.TimeShare > b.TimeShare:
					return -1
				case a.TimeShare < b.TimeShare:
					return 1
				}
				return 0
			})
			if o.json {
				return jsonLines(cmd.OutOrStdout(), rows)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "FUNC\tCALLS\tTYPICAL\tTIME\tFIRST IO_STEP\tRANKS")
			for _, r := range rows {
				fmt.Fprintf(tw, "%s\t%.2g%% (%d)\t%s\t%.0f%%\t%d\t%d\n", r.Func, 100*r.CallsFraction, r.Calls,
					time.Duration(r.TypicalUs*float64(time.Microsecond)).Round(time.Microsecond), 100*r.TimeShare, r.FirstIOStep, len(r.Ranks))
			}
			return tw.Flush()
		},
	}
}
