package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/kipimo-hpc/kipimo/internal/bench"
	"github.com/kipimo-hpc/kipimo/internal/daemon"
	"github.com/kipimo-hpc/kipimo/internal/workload"
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
		simulate  bool
		sim       bench.SimConfig
		from      []string
		format    string
		memLimit  string
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
--scale-from TRACE replays real traces across the ranks instead: each size's
frame files and truth.jsonl are written first as kipimo gen --from writes them
(untimed), then run as kipimo run --format frames runs them, and scored.
--memory-limit applies to the whole process.

With --simulate, bench runs a deployment at scale in this one process, each
part on a NATS connection of its own as it would be deployed: one NATS server
with JetStream, --sim-shards pserver instances (one shard each, write-ahead
log on), --sim-provdbs provdb services on one durable consumer and one SQLite
store, one ad per node of --sim-ranks-per-node ranks (its own connection,
merged per-node syncs and provenance sink, as the ad daemon), and a publisher
of every rank's synthetic frames (--sim-events-per-step events per rank), one
wave per io_step. A node's detectors move in lockstep (one merged write and
one read per shard per step) unless --sim-free runs them as the ad daemon does.
It prints per component the messages and bytes per second in and out (the NATS
server's per-connection counts) and its memory (the growth of the Go heap when
it started, and the live heap its code allocated at the end of the last wave,
from the heap profile); the pserver's merged writes per wave against nodes x
shards, its sync p50/p99, the sizes and round trips of the nodes' requests,
provdb's records/s and lag; and checks that every frame was processed, provdb
stored every record the detectors sent, and the pserver counts each rank's
anomalies as its detector does. The defaults are 16,384 ranks, 64 per node, 4
shards, 2 provdb; the 16,384 ranks take about 1.5-3 minutes and 6.5 GB of
memory on a 2-core machine.
Progress goes to stderr.`,
		Example: `  kipimo bench
  kipimo bench --json
  kipimo bench --scale
  kipimo bench --scale --scale-ranks 128,1024 --json
  kipimo bench --scale --scale-from trace/ --memory-limit 1800MiB
  kipimo bench --simulate
  kipimo bench --simulate --sim-ranks 1024 --sim-shards 2 --sim-provdbs 1 --json
  kipimo bench --simulate --sim-step-period 1s --sim-steps 10`,
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
			if simulate {
				sim.Out, sim.Log = dir, log
				res, err := bench.Simulate(cmd.Context(), sim)
				if err != nil {
					return err
				}
				if jsonOut {
					return json.NewEncoder(cmd.OutOrStdout()).Encode(res)
				}
				return writeSimulation(cmd.OutOrStdout(), res)
			}
			if err := applyMemoryLimit(log, memLimit); err != nil {
				return err
			}
			if len(from) > 0 && !scale {
				return errors.New("--scale-from replays traces in the --scale benchmark: give --scale too")
			}
			if scale {
				sc := bench.ScaleConfig{Out: dir, Ranks: ranks, Steps: steps, EventsPerStep: events, Log: log}
				if len(from) > 0 {
					sc.Prepare = func(ctx context.Context, r int, in string) error {
						tc := workload.DefaultTraceConfig()
						for _, p := range from {
							tc.Apps = append(tc.Apps, workload.TraceApp{Files: []string{p}, Format: format})
						}
						tc.Ranks, tc.Steps, tc.EventsPerStep = r, steps, events
						if err := tc.Validate(); err != nil {
							return err
						}
						w, err := workload.FromTraces(ctx, tc)
						if err != nil {
							return err
						}
						fmt.Fprintf(log, "scale: writing %d ranks replaying %s ...\n", r, strings.Join(slices.Compact(w.Applications()), ", "))
						_, err = generateRun(ctx, w, in)
						return err
					}
				}
				pts, err := bench.Scale(cmd.Context(), sc)
				if err != nil {
					return err
				}
				if jsonOut {
					return json.NewEncoder(cmd.OutOrStdout()).Encode(pts)
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "ranks\twall s\tµs/rank-step\tevents/rank-step\tevents/s\tpeak RSS MiB\tsyncs/step\tranks/sync\tsync p50 ms\tsync p99 ms\tprovdb lag s\tdetect s\tdrain s\tprofiles s\tother s\tprecision\trecall")
				for _, p := range pts {
					fmt.Fprintf(tw, "%d\t%.1f\t%.0f\t%.0f\t%.3g\t%.0f\t%.1f\t%.0f\t%.3g\t%.3g\t%.2f\t%.1f\t%.1f\t%.1f\t%.1f\t%.3f\t%.3f\n", p.Ranks, p.WallSeconds, p.MicrosPerRankStep, p.EventsPerRankStep, p.EventsPerSecond, p.PeakRSSMiB, p.SyncsPerStep, p.RanksPerSync, p.SyncP50Ms, p.SyncP99Ms, p.ProvLagSeconds, p.DetectSeconds, p.DrainSeconds, p.ProfileSeconds, p.OtherSeconds, p.Precision, p.Recall)
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
	f.StringArrayVar(&from, "scale-from", nil, "--scale: replay this trace (a file, or a directory of one run's files) across the ranks instead of the synthetic workload; repeat for more applications")
	f.StringVar(&format, "scale-format", "", "--scale-from: format of the traces (default: from the names): tau, caliper, chrome, otf2 or frames")
	f.StringVar(&memLimit, "memory-limit", "auto", daemon.MemoryLimitUsage)
	f.BoolVar(&simulate, "simulate", false, "simulate a deployment at scale in this process instead (see the --sim- flags)")
	f.IntVar(&sim.Ranks, "sim-ranks", 16384, "--simulate: ranks")
	f.IntVar(&sim.RanksPerNode, "sim-ranks-per-node", 64, "--simulate: ranks served by each ad (one per node)")
	f.IntVar(&sim.Shards, "sim-shards", 4, "--simulate: pserver instances, one shard each")
	f.IntVar(&sim.ProvDBs, "sim-provdbs", 2, "--simulate: provdb services on the one durable consumer")
	f.IntVar(&sim.Steps, "sim-steps", 5, "--simulate: io_steps (waves of one frame per rank)")
	f.IntVar(&sim.EventsPerStep, "sim-events-per-step", 600, "--simulate: the synthetic workload's events-per-step setting (600 gives about 110 events per rank per io_step; at least 100)")
	f.DurationVar(&sim.StepPeriod, "sim-step-period", 0, "--simulate: least time between the starts of two waves (0: each wave as soon as the previous one is processed)")
	f.BoolVar(&sim.Free, "sim-free", false, "--simulate: each node's detectors at their own pace, as the ad daemon runs them, instead of in lockstep within the node (then a node's writes per step are at most one per shard, not exactly)")
	f.DurationVar(&sim.NodeSyncLinger, "sim-node-sync-linger", 250*time.Millisecond, "--simulate --sim-free: how long a node's merged sync waits for its ranks that have not sent yet")
	return cmd
}

// writeSimulation prints a simulation's figures as text tables.
func writeSimulation(w io.Writer, r *bench.SimResult) error {
	mode := "in lockstep within each node"
	if !r.Lockstep {
		mode = "each detector at its own pace"
	}
	fmt.Fprintf(w, "%d ranks on %d nodes (%d ranks each, %s), %d pserver shards, %d provdb, %d io_steps (workload events-per-step %d)\n",
		r.Ranks, r.Nodes, r.RanksPerNode, mode, r.Shards, r.ProvDBs, r.Steps, r.EventsPerStep)
	fmt.Fprintf(w, "published %d frames, %d events, %.1f MiB; setup %.1f s, detection %.1f s, provdb lag at the end %.2f s (of which the pservers' final statistics %.2f s), wall %.1f s (heap sample %.1f s)\n\n",
		r.Frames, r.Events, float64(r.FrameBytes)/(1<<20), r.SetupSeconds, r.DetectSeconds, r.DrainSeconds, r.FinishSeconds, r.WallSeconds, r.HeapSampleSeconds)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "component\tinstances\tin msg/s\tin MB/s\tout msg/s\tout MB/s\tbusiest out msg/s\tCPU s\theap at start MiB\tlive heap MiB\tcarries")
	for _, c := range r.Components {
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.2f\t%.0f\t%.2f\t%.0f\t%.1f\t%.1f\t%.1f\t%s\n", c.Name, c.Instances, c.InMsgsPerSec, c.InBytesPerSec/1e6,
			c.OutMsgsPerSec, c.OutBytesPerSec/1e6, c.MaxInstanceOutMsgsPerSec, c.CPUSeconds, c.StartHeapMiB, c.LiveHeapMiB, c.Carries)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "CPU %.1f s in all from the first frame to provdb caught up (CPU profile, by each part's goroutine label)\n", r.CPUSeconds)
	fmt.Fprintf(w, "live Go heap %.0f MiB (%.0f MiB attributed by the heap profile), goroutine stacks %.0f MiB (%d goroutines), peak RSS of the process %.0f MiB\n\n", r.HeapLiveMiB, r.HeapAttributedMiB, r.StackMiB, r.Goroutines, r.PeakRSSMiB)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "wave\tseconds\tnode writes per shard\tall shards\tnodes x shards\tranks in them\trequests per shard\tsettled\tprovdb pending msgs")
	for _, s := range r.StepsMeasured {
		var total uint64
		parts := make([]string, len(s.Writes))
		for i, x := range s.Writes {
			total += x
			parts[i] = fmt.Sprint(x)
		}
		reqs := make([]string, len(s.Requests))
		for i, x := range s.Requests {
			reqs[i] = fmt.Sprint(x)
		}
		fmt.Fprintf(tw, "%d\t%.2f\t%s\t%d\t%d\t%d\t%s\t%v\t%d\n", s.Step, s.Seconds, strings.Join(parts, " "), total, r.ExpectedWritesPerStep, s.RankParts, strings.Join(reqs, " "), s.Settled, s.ProvPending)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "node writes per io_step %.1f (nodes x shards = %d); node writes at close %d, per-rank writes at close %d; reads or duplicates %d\n", r.WritesPerStep, r.ExpectedWritesPerStep, r.CloseNodeWrites, r.RankWrites, r.Duplicates)
	fmt.Fprintf(w, "sync latency in the pserver (bucket bounds): during the waves p50 %.3g ms, p99 %.3g ms (%d replies; p99 per shard %v ms); at the detectors' close p50 %.3g ms, p99 %.3g ms (%d replies)\n",
		r.SyncP50Ms, r.SyncP99Ms, r.WaveSyncs, r.ShardP99Ms, r.CloseSyncP50Ms, r.CloseSyncP99Ms, r.CloseSyncs)
	fmt.Fprintf(w, "messages delivered per shard per s %.0f\n", r.ShardOutMsgsPerSec)
	for _, k := range r.Syncs {
		fmt.Fprintf(w, "%s: %d, %.0f B each (reply %.0f B), %.1f ranks and %.0f key deltas each, round trip p50 %.3g ms p99 %.3g ms as the node saw it\n",
			k.Kind, k.Requests, k.RequestBytes, k.ReplyBytes, k.RanksPerRequest, k.KeyPartsPerRequest, k.RoundTripP50Ms, k.RoundTripP99Ms)
	}
	if len(r.SyncBeyond) > 0 {
		fmt.Fprintf(w, "beyond the latency histogram's last bound (shown as that bound): %s\n", strings.Join(r.SyncBeyond, ", "))
	}
	fmt.Fprintf(w, "anomalies %d, records %d, published %d, dropped %d, stored %d (%d anomalies); provdb %.0f records/s over the run, %.0f while draining, written per instance %v\n",
		r.Anomalies, r.Records, r.RecordsPublished, r.RecordsDropped, r.RecordsStored, r.StoredAnomalies, r.ProvRecordsPerSec, r.ProvDrainRecordsPerSec, r.ProvWritten)
	kinds := make([]string, 0, len(r.StoredByKind))
	for k, n := range r.StoredByKind {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
	}
	sort.Strings(kinds)
	fmt.Fprintf(w, "stored by kind: %s\n", strings.Join(kinds, ", "))
	fmt.Fprintf(w, "checks: ranks missing frames %d, ranks whose anomaly count differs at the pserver %d\n", r.FramesMissing, r.RankAnomalyMismatches)
	return nil
}
