package run

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/ad"
	"github.com/kipimo-hpc/kipimo/internal/adnode"
	"github.com/kipimo-hpc/kipimo/internal/instrument"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/replay/publish"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

// Injected is the ground-truth kind of the delays the event library injects
// (--inject).
const Injected workload.Kind = "injected_delay"

// LiveConfig configures a live run: a command run with Kipimo's event library
// preloaded, its ranks streaming to the pipeline while it runs.
type LiveConfig struct {
	// Command and its arguments, e.g. mpirun -np 4 ./app.
	Command []string
	// Period is the io_step length (default 1s).
	Period time.Duration
	// Exclude are shell patterns of function names not recorded.
	Exclude []string
	// Inject are delays to inject, recorded as ground truth; Seed seeds the
	// draws.
	Inject []instrument.Injection
	Seed   uint64
	// Build chooses the compilers and cache of the event library.
	Build instrument.BuildOptions
	// Stdin, Stdout and Stderr are the command's (default: this process's).
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// EndGrace bounds how long the run waits, after the command exits, for
	// ranks that have not ended their streams (default 3s).
	EndGrace time.Duration
}

// LiveReport is what a live run's summary says about the command and the
// event library in its processes.
type LiveReport struct {
	Command  []string `json:"command"`
	ExitCode int      `json:"exit_code"`
	// CommandSeconds is the command's wall time, from its start to its exit.
	CommandSeconds float64 `json:"command_seconds"`
	// Library is the event library's directory.
	Library string `json:"library"`
	// Processes is how many instrumented processes reported at their exit;
	// the counts below are their sums.
	Processes      int    `json:"processes"`
	Frames         uint64 `json:"frames"`
	FramesSent     uint64 `json:"frames_sent"`
	FramesDropped  uint64 `json:"frames_dropped"`
	OversizeFrames uint64 `json:"oversize_frames"`
	EventsDropped  uint64 `json:"events_dropped"`
	// DetectorSeenDropped is what the detectors learnt of dropped frames
	// from the stream itself (it is less than FramesDropped when the stream
	// was cut before the count could travel).
	DetectorSeenDropped uint64 `json:"detector_seen_dropped"`
	// FramesWhileRunning are the frames the detectors had processed when
	// the command exited: the stream was live.
	FramesWhileRunning uint64 `json:"frames_while_running"`
	// RanksNotEnded are ranks whose stream never ended (killed processes).
	RanksNotEnded int `json:"ranks_not_ended"`
	// Errors are the distinct last errors the processes reported.
	Errors []string `json:"errors,omitempty"`
}

// ExitError is returned by a live run's caller when the command failed, so
// that kipimo exits with the command's own status.
type ExitError struct{ Code int }

func (e *ExitError) Error() string { return fmt.Sprintf("the command exited with status %d", e.Code) }

// ExitCode is the status kipimo exits with.
func (e *ExitError) ExitCode() int { return e.Code }

// mpiLaunchers are commands that start MPI programs: without mpicc they
// would run unobserved.
var mpiLaunchers = map[string]bool{"mpirun": true, "mpiexec": true, "orterun": true, "srun": true, "mpiexec.hydra": true}

// buildLibrary builds the event library, with the MPI wrappers when an MPI
// is installed; a launcher command without one is an error.
func buildLibrary(ctx context.Context, lc LiveConfig) (*instrument.Library, error) {
	opts := lc.Build
	opts.MPI = true
	opts.Command = lc.Command
	lib, err := instrument.Build(ctx, opts)
	if errors.Is(err, instrument.ErrNoMPI) {
		if mpiLaunchers[filepath.Base(lc.Command[0])] {
			return nil, err
		}
		opts.MPI = false
		lib, err = instrument.Build(ctx, opts)
	}
	return lib, err
}

// executeLive is Execute for a command: the detectors discover its ranks as
// they stream, and the run ends when the command has exited and its ranks
// have ended their streams.
func (p *Pipeline) executeLive(ctx context.Context, progress func(Progress)) (*Summary, error) {
	cfg := p.cfg
	lc := cfg.Live
	start := time.Now()
	if _, err := exec.LookPath(lc.Command[0]); err != nil {
		return nil, fmt.Errorf("the command to run: %w", err)
	}
	lib, err := buildLibrary(ctx, lc)
	if errors.Is(err, instrument.ErrProgramMPI) {
		// Never load wrappers of another MPI: the program runs as it would alone.
		p.log.Warn().Err(err).Msg("running the command uninstrumented")
		lib, err = &instrument.Library{}, nil
	}
	if err != nil {
		return nil, err
	}
	statusDir := cfg.path("live")
	if err := os.RemoveAll(statusDir); err != nil {
		return nil, fmt.Errorf("clear the status directory: %w", err)
	}
	if err := os.MkdirAll(statusDir, 0o755); err != nil {
		return nil, fmt.Errorf("create the status directory: %w", err)
	}
	dc := cfg.Detector
	dc.Sink = p.sink
	sctx, cancelServe := context.WithCancel(ctx)
	defer cancelServe()
	node, err := p.startDetectors(sctx, adnode.ServeConfig{Discover: true, Detector: dc})
	if err != nil {
		return nil, err
	}
	collector := node.Collector()

	cmd := exec.CommandContext(ctx, lc.Command[0], lc.Command[1:]...)
	cmd.Env = lib.Environ(instrument.Env{
		NATSURL: p.natsClientURL(), Run: cfg.RunID, Period: lc.Period, Exclude: lc.Exclude,
		Inject: lc.Inject, Seed: lc.Seed, StatusDir: statusDir,
	}, os.Environ())
	cmd.Stdin, cmd.Stdout, cmd.Stderr = lc.Stdin, lc.Stdout, lc.Stderr
	if cmd.Stdin == nil {
		cmd.Stdin = os.Stdin
	}
	// The command leads a process group of its own, so that a signal
	// reaches all of it (mpirun and the ranks it starts here) as from a
	// terminal, once: kipimo forwards SIGINT and SIGTERM to the group.
	// Reading a terminal from outside the terminal's foreground group
	// would stop it, so a command whose stdin is a terminal stays in
	// kipimo's group, where the terminal's Ctrl-C reaches it directly.
	ownGroup := !isTerminal(cmd.Stdin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: ownGroup}
	if cmd.Stdout == nil {
		cmd.Stdout = os.Stdout
	}
	if cmd.Stderr == nil {
		cmd.Stderr = os.Stderr
	}
	// Interrupted, the command gets SIGTERM (mpirun passes it on to its
	// ranks) and ten seconds before it is killed.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	if sig := p.interrupted(); sig != nil {
		return nil, fmt.Errorf("interrupted (%s) before %s started", sig, lc.Command[0])
	}
	cmdStart := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", lc.Command[0], err)
	}
	p.childGroup.Store(ownGroup)
	p.child.Store(int64(cmd.Process.Pid))
	p.log.Info().Strs("command", lc.Command).Str("library", lib.Dir).Msg("command started under the event library")
	waitErr := make(chan error, 1)
	go func() { waitErr <- cmd.Wait() }()

	report := func() {
		if progress == nil {
			return
		}
		var total ad.Stats
		st := collector.Stats()
		step := uint64(0)
		for i, s := range st {
			total.Add(s)
			if i == 0 || s.Frames < step {
				step = s.Frames
			}
		}
		progress(Progress{Step: int(step), Frames: int(total.Frames), Events: int64(total.Events), Anomalies: total.Anomalies, Elapsed: time.Since(start)})
	}
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	var runErr error
	var cmdTime time.Duration
	stop := p.stop.Done()
wait:
	for {
		select {
		case runErr = <-waitErr:
			cmdTime = time.Since(cmdStart)
			break wait
		case <-stop:
			// The command ends as it would on the terminal's signal;
			// the run then ends with it, as it always does.
			stop = nil
			p.signalChild(p.stopSig, false)
		case <-tick.C:
			report()
		}
	}
	p.child.Store(0)
	if h := p.cfg.hooks; h != nil && h.onCommandExit != nil {
		h.onCommandExit()
	}
	var whileRunning uint64
	for _, s := range collector.Stats() {
		whileRunning += s.Frames
	}
	exitCode := 0
	var ee *exec.ExitError
	switch {
	case errors.As(runErr, &ee):
		exitCode = exitStatus(ee.ProcessState)
	case runErr != nil:
		return nil, fmt.Errorf("run %s: %w", lc.Command[0], runErr)
	}
	p.waitStreamsEnded(ctx, collector, lc.EndGrace)
	if err := p.publishControl(adnode.ControlEndOfRun); err != nil {
		return nil, err
	}
	stats, err := detectorsEnded(node)
	if err != nil {
		return nil, fmt.Errorf("detectors: %w", err)
	}
	detectTime := time.Since(start)
	if err := p.finishDetection(ctx); err != nil {
		return nil, err
	}
	status, serr := instrument.ReadStatus(statusDir)
	if serr != nil {
		p.log.Warn().Err(serr).Msg("some status files of the instrumented processes could not be read")
	}
	var in publish.Counts
	for _, st := range stats {
		in.Frames += int(st.Frames)
		in.Events += int(st.Events)
	}
	for _, st := range status {
		in.Bytes += int64(st.BytesSent)
	}
	var truthFn func() []workload.Truth
	if len(lc.Inject) > 0 {
		truth := liveTruth(status)
		truthFn = func() []workload.Truth { return truth }
		p.truth = truth
	}
	if len(stats) == 0 {
		for _, why := range lib.ExplainNoEvents(ctx, lc.Command, cmd.Env, status) {
			p.log.Warn().Msg("no rank streamed a frame: " + why)
		}
	}
	sum, err := p.summarize(ctx, stats, truthFn, in, 0, detectTime, time.Since(start))
	if err != nil {
		return nil, err
	}
	if sum.Score != nil {
		anomalies, err := p.allAnomalies(ctx)
		if err != nil {
			return nil, err
		}
		live := ScoreInjected(p.truth, lc.Inject, anomalies)
		if final := p.finalLabel(); final != nil {
			kept := anomalies[:0:0]
			for i := range anomalies {
				if final(&anomalies[i]) {
					kept = append(kept, anomalies[i])
				}
			}
			anomalies = kept
		}
		sc := ScoreInjected(p.truth, lc.Inject, anomalies)
		sc.Live = &LiveScore{Flagged: live.Flagged, TruePositives: live.TruePositives, Precision: live.Precision,
			Recall: live.Recall, Unflagged: live.Flagged - sc.Flagged}
		sum.Score = &sc
	}
	sum.setInterrupted(p.interrupted())
	sum.Live = liveReport(lc, lib, exitCode, status, stats)
	sum.Live.FramesWhileRunning = whileRunning
	sum.Live.CommandSeconds = cmdTime.Seconds()
	return sum, nil
}

// exitStatus is the status a shell reports for a process: its exit code,
// or 128 plus the signal that killed it.
func exitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// isTerminal reports whether r may be a terminal: a character device other
// than /dev/null.
func isTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	null, err := os.Stat(os.DevNull)
	return err != nil || !os.SameFile(fi, null)
}

// natsClientURL is the URL the instrumented processes connect to.
func (p *Pipeline) natsClientURL() string {
	if p.ns != nil {
		return p.ns.ClientURL()
	}
	return p.cfg.NATSURL
}

// waitStreamsEnded waits until every rank discovered so far has ended its
// stream, or until grace passes without a frame arriving.
func (p *Pipeline) waitStreamsEnded(ctx context.Context, c *adnode.Collector, grace time.Duration) {
	if grace <= 0 {
		grace = 3 * time.Second
	}
	// A round trip to the server: whatever the processes sent before they
	// exited has reached it.
	_ = p.nc.FlushTimeout(5 * time.Second)
	last, lastChange := uint64(0), time.Now()
	for {
		st := c.Stats()
		ended := 0
		var frames uint64
		for _, s := range st {
			frames += s.Frames + s.BadFrames
			if s.Ended {
				ended++
			}
		}
		if ended == len(st) && len(st) > 0 {
			return
		}
		if frames != last {
			last, lastChange = frames, time.Now()
		}
		if time.Since(lastChange) > grace {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// publishControl sends a run-wide control message.
func (p *Pipeline) publishControl(kind string) error {
	b, err := json.Marshal(adnode.ControlMessage{Kind: kind})
	if err != nil {
		return err
	}
	if err := p.nc.Publish(natsx.Subjects{Run: p.cfg.RunID}.Control(), b); err != nil {
		return fmt.Errorf("publish %s: %w", kind, err)
	}
	return p.nc.Flush()
}

// liveTruth is the ground truth of a live run: every call the library
// delayed, as its processes reported.
func liveTruth(status []instrument.Status) []workload.Truth {
	var out []workload.Truth
	for _, st := range status {
		for _, in := range st.Injected {
			out = append(out, workload.Truth{
				PID: st.PID, Rank: st.Rank, Tid: in.Tid, Func: in.Func,
				Entry: in.Entry, Exit: in.Entry + in.DelayUS, Kind: Injected,
			})
		}
	}
	return out
}

func liveReport(lc LiveConfig, lib *instrument.Library, code int, status []instrument.Status, st []ad.Stats) *LiveReport {
	r := &LiveReport{Command: lc.Command, ExitCode: code, Library: lib.Dir, Processes: len(status)}
	seen := map[string]bool{}
	for _, s := range status {
		r.Frames += s.Frames
		r.FramesSent += s.FramesSent
		r.FramesDropped += s.FramesDropped
		r.OversizeFrames += s.OversizeFrames
		r.EventsDropped += s.EventsDropped
		if s.LastError != "" && !seen[s.LastError] {
			seen[s.LastError] = true
			r.Errors = append(r.Errors, s.LastError)
		}
	}
	for _, s := range st {
		r.DetectorSeenDropped += s.SourceDroppedFrames
		if !s.Ended {
			r.RanksNotEnded++
		}
	}
	return r
}

// commandLine is a command for messages.
func commandLine(c []string) string { return strings.Join(c, " ") }
