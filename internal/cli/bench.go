package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"text/tabwriter"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/kipimo-hpc/kipimo/internal/bench"
)

func newBenchCmd() *cobra.Command {
	var (
		out       string
		jsonOut   bool
		detectors int
		funcs     int
		scale     bool
		ranks     []int
		steps     int
		events    int
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure the pipeline end to end: throughput, latency, sizes, memory",
		Long: `Bench measures, on this machine: the detector's events/s on one core; the
whole pipeline in one process on the default synthetic run as fast as it goes
(events/s, precision and recall, the reduction factor); the latency from each
injected anomaly's exit to its appearance in the parameter server (p50/p95),
with 4 ranks replayed in real time; provenance ingest records/s into SQLite,
bytes per stored anomaly and the median anomaly record; parameter-server sync
latency p50/p99 with many detectors; and peak RSS per component: the default
run once more with the NATS server, the parameter server, the provenance
service and the detectors each in a child process of its own (on 127.0.0.1),
each reporting its peak resident memory when it exits.
Each figure is printed next to its target.

With --scale, bench instead runs the whole pipeline of kipimo run (in this
process, a synthetic workload with few events per rank) at 256, 1,024 and
4,096 ranks (--scale-ranks changes the sizes; 16,384 only when asked) and
prints per size: wall time, time per rank-step, events/s, peak RSS of the
process, the pserver's sync latency p50/p99 (bucket bounds of its histogram),
provdb's lag (time from the detectors' end to everything stored) and where
the time went: detection, draining provenance, writing the TAU profiles.
Progress goes to stderr.`,
		Example: `  kipimo bench
  kipimo bench --json
  kipimo bench --scale
  kipimo bench --scale --scale-ranks 128,1024 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir := out
			if dir == "" {
				tmp, err := os.MkdirTemp("", "kipimo-bench-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(tmp)
				dir = tmp
			}
			log := cmd.ErrOrStderr()
			if zerolog.GlobalLevel() == zerolog.InfoLevel {
				zerolog.SetGlobalLevel(zerolog.WarnLevel)
				defer zerolog.SetGlobalLevel(zerolog.InfoLevel)
			}
			if scale {
				pts, err := bench.Scale(cmd.Context(), bench.ScaleConfig{Out: dir, Ranks: ranks, Steps: steps, EventsPerStep: events, Log: log})
				if err != nil {
					return err
				}
				if jsonOut {
					return json.NewEncoder(cmd.OutOrStdout()).Encode(pts)
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "ranks\twall s\tµs/rank-step\tevents/s\tpeak RSS MiB\tsyncs/step\tranks/sync\tsync p50 ms\tsync p99 ms\tprovdb lag s\tdetect s\tdrain s\tprofiles s\tother s\tprecision\trecall")
				for _, p := range pts {
					fmt.Fprintf(tw, "%d\t%.1f\t%.0f\t%.3g\t%.0f\t%.1f\t%.0f\t%.3g\t%.3g\t%.2f\t%.1f\t%.1f\t%.1f\t%.1f\t%.3f\t%.3f\n", p.Ranks, p.WallSeconds, p.MicrosPerRankStep, p.EventsPerSecond, p.PeakRSSMiB, p.SyncsPerStep, p.RanksPerSync, p.SyncP50Ms, p.SyncP99Ms, p.ProvLagSeconds, p.DetectSeconds, p.DrainSeconds, p.ProfileSeconds, p.OtherSeconds, p.Precision, p.Recall)
				}
				return tw.Flush()
			}
			bc := bench.Config{Out: dir, Detectors: detectors, Funcs: funcs, Log: log}
			// The components run in child processes of this executable, so
			// that each one's memory can be measured apart.
			if exe, err := os.Executable(); err == nil {
				bc.Command = []string{exe, bench.ComponentCommand}
			}
			res, err := bench.Run(cmd.Context(), bc)
			if err != nil {
				return err
			}
			if jsonOut {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(res)
			}
			names := make([]string, 0, len(res.Figures))
			for n := range res.Figures {
				names = append(names, n)
			}
			sort.Strings(names)
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "figure\tvalue\tunit\ttarget\tmet")
			for _, n := range names {
				f := res.Figures[n]
				met := ""
				if f.Met != nil {
					met = map[bool]string{true: "yes", false: "NO"}[*f.Met]
				}
				fmt.Fprintf(tw, "%s\t%.4g\t%s\t%s\t%s\n", n, f.Value, f.Unit, f.Target, met)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			for _, n := range res.Notes {
				fmt.Fprintln(cmd.OutOrStdout(), "note: "+n)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&out, "out", "", "scratch directory (default a temporary one, removed after)")
	f.BoolVar(&jsonOut, "json", false, "print the figures as JSON")
	f.IntVar(&detectors, "detectors", 1024, "detectors simulated in the sync benchmark")
	f.IntVar(&funcs, "funcs", 200, "functions per detector in the sync benchmark")
	f.BoolVar(&scale, "scale", false, "run the whole pipeline at several rank counts instead (see --scale-ranks)")
	f.IntSliceVar(&ranks, "scale-ranks", bench.DefaultScaleRanks, "--scale: rank counts to run, in increasing order")
	f.IntVar(&steps, "scale-steps", 5, "--scale: io_steps per run")
	f.IntVar(&events, "scale-events-per-step", 1000, "--scale: events per rank per io_step")
	return cmd
}
