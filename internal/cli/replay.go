package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/kipimo-hpc/kipimo/internal/daemon"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/replay"
	"github.com/kipimo-hpc/kipimo/internal/replay/publish"
)

func newReplayCmd() *cobra.Command {
	var (
		tf       traceFlags
		natsURL  string
		run      string
		speed    string
		asJSON   bool
		progress bool
		endMark  bool
		auth     *daemon.NATSAuth
	)
	cmd := &cobra.Command{
		Use:   "replay [--format tau|caliper|chrome|otf2|frames] [flags] FILE...",
		Short: "Publish frames or traces to NATS as a live run would",
		Long: `Replay reads frame files (--format frames, the default; e.g. written by "kipimo gen" or
"kipimo frames convert") or traces (tau, caliper, chrome, otf2; see "kipimo frames
convert --help") and publishes each frame on kipimo.<run>.frames.<pid>.<rank>,
every rank's frames in io_step order, so detectors consume them like a live run;
then an empty message on each rank's subject ends its stream (--end-of-stream).

--speed max sends as fast as the server takes them (with a round trip every 64
frames for flow control); realtime sends each step when its recorded end time
has passed; Nx runs N times faster than recorded (0.5x is half speed).

Without --nats an embedded NATS server is started on 127.0.0.1; nothing else
is subscribed to it then, so this only checks the input and measures speed.
On a terminal a progress line (events, frames, rate, ETA) is drawn on stderr.
What a trace held that the frames do not carry is reported as "kipimo frames
convert" reports it: one line per kind, and "losses" in --json.`,
		Example: `  kipimo replay --nats nats://127.0.0.1:4222 --run r1 --format frames run/
  kipimo replay --nats nats://host:4222 --run r1 --format chrome --speed realtime trace.json.gz`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, files []string) error {
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			if err := natsx.ValidRun(run); err != nil {
				return fmt.Errorf("--run: %w", err)
			}
			sp, err := publish.ParseSpeed(speed)
			if err != nil {
				return fmt.Errorf("--speed: %w", err)
			}
			stderr := cmd.ErrOrStderr()
			if err := reportInputs(stderr, files); err != nil {
				return fmt.Errorf("replay: %w", err)
			}
			src, err := tf.open(files)
			if err != nil {
				return fmt.Errorf("replay: %w", err)
			}
			authOpts, err := auth.Options()
			if err != nil {
				return err
			}
			url := natsURL
			if url == "" {
				dir, err := os.MkdirTemp("", "kipimo-replay-nats-")
				if err != nil {
					return fmt.Errorf("embedded NATS: %w", err)
				}
				defer os.RemoveAll(dir)
				srv, err := natsx.StartServer(natsx.DefaultServerConfig(dir))
				if err != nil {
					return err
				}
				defer srv.Shutdown()
				url = srv.ClientURL()
				fmt.Fprintf(stderr, "note: no --nats given; publishing to an embedded NATS server at %s that nothing else subscribes to\n", url)
			}
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			// Like an instrumented application, replay rides out a NATS
			// restart: frames wait in the client's buffer (64 MiB) and go
			// out on reconnecting; it gives up after 30 s without a server.
			nc, err := natsx.Connect(cctx, url, "kipimo-replay", append(authOpts, nats.MaxReconnects(120))...)
			cancel()
			if err != nil {
				return natsAuthHint(err, auth)
			}
			defer nc.Close()
			pace := publish.Pace{Speed: sp, EndOfStream: endMark}
			bar := newProgressBar(stderr, progress)
			if bar != nil {
				pace.Progress = bar.draw
			}
			c, st, err := publish.Frames(ctx, nc, natsx.Subjects{Run: run}, src, pace)
			if bar != nil {
				bar.done()
			}
			if err != nil {
				writeLosses(stderr, st.Losses)
				return fmt.Errorf("replay: %w (%d frames published)", err, c.Frames)
			}
			if c.Frames == 0 {
				// As kipimo run says of the same input.
				writeLosses(stderr, st.Losses)
				return fmt.Errorf("replay: the input holds no frames: nothing was published (%s)", strings.Join(files, ", "))
			}
			if asJSON {
				b, err := json.Marshal(struct {
					convertSummary
					Bytes      int64   `json:"bytes"`
					Seconds    float64 `json:"seconds"`
					EventsPerS float64 `json:"events_per_s"`
				}{summaryOf(st), c.Bytes, c.Elapsed.Seconds(), c.Rate()})
				if err != nil {
					return err
				}
				_, err = fmt.Fprintln(cmd.OutOrStdout(), string(b))
				return err
			}
			w := cmd.OutOrStdout()
			if _, err := fmt.Fprintf(w, "published %d frames (%d events, %d executions, %d threads, %d GPU threads) to run %s in %s\n",
				c.Frames, c.Events, st.Executions, st.Threads, st.GPUThreads, run, c.Elapsed.Round(time.Millisecond)); err != nil {
				return err
			}
			return writeLosses(w, st.Losses)
		},
	}
	tf.register(cmd, replay.Formats, replay.FormatFrames)
	f := cmd.Flags()
	f.StringVar(&natsURL, "nats", "", "NATS server URL (nats://host:port); empty starts an embedded server")
	auth = addNATSAuth(f)
	f.StringVar(&run, "run", "default", "run id: the <run> of the frame subjects")
	f.StringVar(&speed, "speed", "max", "max, realtime, or a factor of recorded time such as 10x")
	f.BoolVar(&asJSON, "json", false, "print the summary as one JSON line")
	f.BoolVar(&progress, "progress", true, "draw a progress line on stderr when it is a terminal")
	f.BoolVar(&endMark, "end-of-stream", true, "end each rank's stream with an empty message after its last frame, so detectors close")
	return cmd
}

// progressBar draws one self-overwriting line on a terminal.
type progressBar struct {
	w     io.Writer
	width int
}

// newProgressBar returns a bar when enabled and w is a terminal, else nil.
func newProgressBar(w io.Writer, enabled bool) *progressBar {
	if !enabled || !isTerminal(w) {
		return nil
	}
	return &progressBar{w: w}
}

func (p *progressBar) draw(c publish.Counts) {
	line := progressLine(c)
	pad := ""
	if n := p.width - len(line); n > 0 {
		pad = strings.Repeat(" ", n)
	}
	p.width = len(line)
	fmt.Fprintf(p.w, "\r%s%s", line, pad)
}

func (p *progressBar) done() { fmt.Fprintln(p.w) }

// progressLine renders counts: a bar when the input size is known, events,
// frames, rate and ETA.
func progressLine(c publish.Counts) string {
	var b strings.Builder
	if c.Total > 0 {
		const width = 24
		n := int(float64(width) * float64(c.Done) / float64(c.Total))
		n = min(max(n, 0), width)
		fmt.Fprintf(&b, "[%s%s] %3.0f%% ", strings.Repeat("=", n), strings.Repeat(" ", width-n), 100*float64(c.Done)/float64(c.Total))
	}
	fmt.Fprintf(&b, "%s events, %d frames, %s events/s", human(float64(c.Events)), c.Frames, human(c.Rate()))
	if eta := c.ETA(); eta >= 0 {
		fmt.Fprintf(&b, ", ETA %s", eta.Round(time.Second))
	} else {
		b.WriteString(", ETA --")
	}
	return b.String()
}

func human(v float64) string {
	switch {
	case v >= 1e9:
		return fmt.Sprintf("%.2fG", v/1e9)
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}
