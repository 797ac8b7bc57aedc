package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/kipimo-hpc/kipimo/internal/daemon"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

type callstackOpts struct {
	natsURL  string
	run      string
	rank     int64
	pid      uint32
	watch    bool
	interval time.Duration
	timeout  time.Duration
	quiet    time.Duration
	json     bool
	auth     *daemon.NATSAuth
}

func newCallstackCmd() *cobra.Command {
	o := callstackOpts{}
	cmd := &cobra.Command{
		Use:   "callstack [RUN_DIR | --nats URL --run ID] [--rank R] [--watch]",
		Short: "Print the global call stack: every rank's threads and their open frames",
		Long: `callstack asks the detectors of a run for the call stacks open right now and
prints them as one global call stack: each rank, each of its threads, and the
frames entered and not yet exited, outermost first.

Without --rank it publishes one probe on the run's scatter-gather subject
(kipimo.<run>.ad.callstack) and collects answers until no new one arrives for
--quiet, or --timeout passes. With --rank it asks that rank's detector alone
(kipimo.<run>.ad.<pid>.<rank>.callstack). The detectors answer from their own
threads, so the application is never stopped.

RUN_DIR, the directory of a kipimo run still running (<out>/<run>), gives its
NATS server and run id (from its endpoints.json).`,
		Example: `  kipimo callstack kipimo-out/first
  kipimo callstack --nats nats://10.0.0.5:4222 --run run-20261128-010203 --rank 3 --watch`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("rank") {
				o.rank = -1
			}
			if len(args) == 1 {
				if err := callstackTarget(&o, args[0], cmd.Flags().Changed("nats"), cmd.Flags().Changed("run")); err != nil {
					return err
				}
			}
			return runCallstack(cmd.Context(), cmd.OutOrStdout(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.natsURL, "nats", "nats://127.0.0.1:4222", "NATS server URL(s), comma-separated")
	f.StringVar(&o.run, "run", "", "run id (required unless RUN_DIR is given)")
	f.Int64Var(&o.rank, "rank", -1, "ask only this rank's detector")
	f.Uint32Var(&o.pid, "pid", 0, "program id of --rank (workflows with several programs)")
	f.BoolVar(&o.watch, "watch", false, "refresh every --interval until interrupted")
	f.DurationVar(&o.interval, "interval", 2*time.Second, "refresh period with --watch")
	f.DurationVar(&o.timeout, "timeout", 3*time.Second, "longest wait for answers")
	f.DurationVar(&o.quiet, "quiet", 300*time.Millisecond, "stop collecting once no answer arrived for this long")
	f.BoolVar(&o.json, "json", false, "print the answers as a JSON array instead of text")
	o.auth = addNATSAuth(f)
	return cmd
}

func runCallstack(ctx context.Context, w io.Writer, o callstackOpts) error {
	if ctx == nil {
		ctx = context.Background()
	}
	if o.run == "" {
		return errors.New("--run is required: give the run id the detectors use, or the run's directory (kipimo callstack kipimo-out/<run>)")
	}
	if err := natsx.ValidRun(o.run); err != nil {
		return fmt.Errorf("--run: %w", err)
	}
	if o.rank > int64(^uint32(0)) {
		return fmt.Errorf("--rank %d is out of range", o.rank)
	}
	if o.timeout <= 0 || o.quiet <= 0 || (o.watch && o.interval <= 0) {
		return errors.New("--timeout, --quiet and --interval must be positive")
	}
	if o.auth == nil {
		o.auth = &daemon.NATSAuth{}
	}
	authOpts, err := o.auth.Options()
	if err != nil {
		return err
	}
	nc, err := natsx.Connect(ctx, o.natsURL, "kipimo-callstack", authOpts...)
	if err != nil {
		return natsAuthHint(err, o.auth)
	}
	defer nc.Close()
	for {
		start := time.Now()
		replies, err := gatherCallstacks(ctx, nc, o)
		if err != nil {
			return err
		}
		if o.watch && !o.json {
			fmt.Fprint(w, "\x1b[H\x1b[2J")
		}
		if err := printCallstacks(w, o, replies, time.Since(start)); err != nil {
			return err
		}
		if !o.watch {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(o.interval):
		}
	}
}

// gatherCallstacks sends one probe and collects the answers, ordered by
// (pid, rank).
func gatherCallstacks(ctx context.Context, nc *nats.Conn, o callstackOpts) ([]syncproto.CallstackReply, error) {
	subj := natsx.Subjects{Run: o.run}
	var req syncproto.CallstackRequest
	subject := subj.AllCallstacks()
	if o.rank >= 0 {
		r := uint32(o.rank)
		req.Rank = &r
		subject = subj.Callstack(o.pid, r)
	}
	data, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encode call-stack probe: %w", err)
	}
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, fmt.Errorf("subscribe to answers: %w", err)
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest(subject, inbox, data); err != nil {
		return nil, fmt.Errorf("publish call-stack probe on %s: %w", subject, err)
	}
	deadline := time.Now().Add(o.timeout)
	seen := map[[2]uint32]int{}
	var out []syncproto.CallstackReply
	var bad int
	for {
		wait := time.Until(deadline)
		if len(out)+bad > 0 {
			wait = min(wait, o.quiet)
		}
		if o.rank >= 0 && len(out) > 0 {
			break
		}
		if wait <= 0 {
			break
		}
		wctx, cancel := context.WithTimeout(ctx, wait)
		m, err := sub.NextMsgWithContext(wctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return out, nil
			}
			break
		}
		if len(m.Data) == 0 { // no-responders status
			if m.Header.Get("Status") == "503" {
				break
			}
			continue
		}
		var rep syncproto.CallstackReply
		if err := json.Unmarshal(m.Data, &rep); err != nil {
			bad++
			continue
		}
		k := [2]uint32{rep.PID, rep.Rank}
		if i, ok := seen[k]; ok {
			out[i] = rep
			continue
		}
		seen[k] = len(out)
		out = append(out, rep)
	}
	if len(out) == 0 {
		if bad > 0 {
			return nil, fmt.Errorf("%d answers on %s could not be decoded as call stacks", bad, subject)
		}
		return nil, fmt.Errorf("no detector answered on %s within %s: check --run and that the run's detectors are running", subject, o.timeout)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].PID != out[j].PID {
			return out[i].PID < out[j].PID
		}
		return out[i].Rank < out[j].Rank
	})
	return out, nil
}

func printCallstacks(w io.Writer, o callstackOpts, replies []syncproto.CallstackReply, took time.Duration) error {
	if o.json {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(replies)
	}
	threads := 0
	for _, r := range replies {
		threads += len(r.Threads)
	}
	fmt.Fprintf(w, "global call stack of run %s: %d ranks, %d threads (gathered in %s)\n", o.run, len(replies), threads, took.Round(time.Millisecond))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, r := range replies {
		fmt.Fprintf(tw, "rank %d (pid %d, io_step %d)\n", r.Rank, r.PID, r.IOStep)
		ths := append([]syncproto.ThreadStack(nil), r.Threads...)
		sort.Slice(ths, func(i, j int) bool { return ths[i].TID < ths[j].TID })
		for _, t := range ths {
			kind := ""
			if t.GPU {
				kind = " (GPU)"
			}
			fmt.Fprintf(tw, "  thread %d%s\n", t.TID, kind)
			if len(t.Frames) == 0 {
				fmt.Fprintln(tw, "    (no open frames)")
			}
			for d, f := range t.Frames {
				fmt.Fprintf(tw, "    %d\t%s%s\tentry %d\t%s\n", d, strings.Repeat("  ", d), f.Func, f.Entry, f.EventID)
			}
		}
	}
	return tw.Flush()
}
