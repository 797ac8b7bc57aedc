package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kipimo-hpc/kipimo/internal/replay"
	"github.com/kipimo-hpc/kipimo/internal/replay/steps"
)

// traceFlags are the flags shared by the commands that read traces.
type traceFlags struct {
	format string
	step   time.Duration
	marker string
}

// register adds the flags; an empty def makes --format required.
func (o *traceFlags) register(cmd *cobra.Command, formats []string, def string) {
	f := cmd.Flags()
	if def == "" {
		f.StringVar(&o.format, "format", "", "input format: "+strings.Join(formats, ", ")+" (required)")
		_ = cmd.MarkFlagRequired("format")
	} else {
		f.StringVar(&o.format, "format", def, "input format: "+strings.Join(formats, ", "))
	}
	f.DurationVar(&o.step, "step", steps.DefaultStep, "io_step length in trace time (e.g. 1s, 100ms)")
	f.StringVar(&o.marker, "step-marker", "", "start a new io_step at each entry of this function instead of every --step")
}

func (o *traceFlags) open(files []string) (replay.Source, error) {
	if o.step <= 0 {
		return nil, fmt.Errorf("--step must be positive, got %s", o.step)
	}
	return replay.Open(o.format, files, steps.Config{Step: o.step, Marker: o.marker})
}

func newFramesConvertCmd() *cobra.Command {
	var (
		tf     traceFlags
		out    string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "convert --format tau|caliper|chrome|otf2 --out DIR [flags] FILE...",
		Short: "Convert TAU, Caliper, Chrome or OTF2 traces into frame files",
		Long: `Convert reads traces made by other tools and writes their events as frames,
one binary frame file per rank, DIR/rank-<r>.frames (the layout of "kipimo gen"),
cut into io_steps of --step trace time or at each entry of --step-marker.

Formats:
  tau      tautrace.<node>.<ctx>.<thread>.trc with events.<node>.edf next to it,
           or TAU's merged tau.trc with tau.edf; a directory stands for its traces.
           Nodes become ranks; user events become counters, messages comm events.
  caliper  .cali event traces (event, recorder, timestamp and trace services);
           one rank per file (mpi.rank when recorded).
  chrome   Chrome trace event / Perfetto JSON, plain or gzipped (PyTorch profiler
           traces); one rank per file, GPU kernels and copies on GPU threads.
  otf2     OTF2 archives (Score-P): the anchor file traces.otf2, or its directory,
           with traces.def and traces/<location>.def/.evt. Location groups become
           ranks, locations threads; MPI sends and receives comm events, metrics
           (PAPI counters...) counters. See docs/formats/otf2.md.

It prints a one-line summary: frames, events, executions (completed calls read
from the input), threads and gpu_threads (GPU streams or queues found), then one
line per kind of input it could not carry into the frames as it was, with the
count and the first example: unclosed (begins never ended), end-without-begin,
overlap (spans overlapping their parent's end, moved whole to an extra thread),
instant, flow, async-step, bad-timestamp, counter-value, unsupported,
duplicate-input (TAU's merged tau.trc given with its per-thread files),
unknown-event. --json prints the same as one JSON object, the kinds under
"losses". It fails only when the input holds nothing the frames can carry, or
is damaged (the frames before the damage are written). See docs/trace-inputs.md.`,
		Example: `  kipimo frames convert --format tau --out run trace_dir/
  kipimo frames convert --format chrome --out run --step 10ms --json trace.json.gz
  kipimo frames convert --format otf2 --out run --step 100ms scorep-run/traces.otf2`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, files []string) error {
			if out == "" {
				return fmt.Errorf("--out DIR is required: the directory to write rank-<r>.frames files to")
			}
			if tf.format == replay.FormatFrames {
				return fmt.Errorf("--format frames: the input is already frames (use tau, caliper, chrome or otf2)")
			}
			if err := reportInputs(cmd.ErrOrStderr(), files); err != nil {
				return fmt.Errorf("convert: %w", err)
			}
			src, err := tf.open(files)
			if err != nil {
				return fmt.Errorf("convert: %w", err)
			}
			st, err := replay.Convert(cmd.Context(), src, out)
			if err != nil {
				writeLosses(cmd.ErrOrStderr(), st.Losses)
				return fmt.Errorf("convert: %w", err)
			}
			if asJSON {
				b, err := json.Marshal(summaryOf(st))
				if err != nil {
					return err
				}
				_, err = fmt.Fprintln(cmd.OutOrStdout(), string(b))
				return err
			}
			w := cmd.OutOrStdout()
			if _, err := fmt.Fprintf(w, "wrote %d frames (%d events, %d executions, %d threads, %d GPU threads) to %s from %d input events\n",
				st.Frames, st.Events, st.Executions, st.Threads, st.GPUThreads, out, st.InputEvents); err != nil {
				return err
			}
			return writeLosses(w, st.Losses)
		},
	}
	tf.register(cmd, []string{replay.FormatTAU, replay.FormatCaliper, replay.FormatChrome, replay.FormatOTF2}, "")
	f := cmd.Flags()
	f.StringVar(&out, "out", "", "directory for the frame files (created if missing; required)")
	f.BoolVar(&asJSON, "json", false, "print the summary as one JSON line")
	return cmd
}

// convertSummary is the one-line summary of convert and replay.
type convertSummary struct {
	Frames     int `json:"frames"`
	Events     int `json:"events"`
	Executions int `json:"executions"`
	Threads    int `json:"threads"`
	GPUThreads int `json:"gpu_threads"`
	// InputEvents is what the reader read (trace events or records);
	// Losses what of it the frames do not carry as it was, per kind.
	InputEvents int           `json:"input_events"`
	Losses      replay.Losses `json:"losses"`
}

func summaryOf(st replay.Stats) convertSummary {
	l := st.Losses
	if l == nil {
		l = replay.Losses{}
	}
	return convertSummary{st.Frames, st.Events, st.Executions, st.Threads, st.GPUThreads, st.InputEvents, l}
}

// writeLosses prints one line per kind of loss.
func writeLosses(w io.Writer, l replay.Losses) error {
	for _, line := range l.Lines() {
		if _, err := fmt.Fprintf(w, "not in the frames: %s\n", line); err != nil {
			return err
		}
	}
	return nil
}
