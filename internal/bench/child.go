package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/config"
)

// childGrace is how long a component may take to stop after SIGTERM before
// it is killed.
const childGrace = 20 * time.Second

// child is one component running in a child process (Component behind
// `kipimo component`). Whoever starts it owns it and must call stop, which
// ends it: SIGTERM, then SIGKILL after childGrace. The child also ends when
// the parent process does, as its stdin closes then.
type child struct {
	name   string
	report string // the file the component writes its peak RSS to
	cmd    *exec.Cmd
	cancel context.CancelFunc
	stderr *tailWriter
	stdin  io.WriteCloser // the child's lifeline: it stops when this closes
	done   chan struct{}  // closed once the process has exited and Wait returned
	err    error          // Wait's error, set before done is closed
}

// startChild runs command (the program and the arguments before the
// component's name, e.g. kipimo and "component") with name and args. The
// component writes its peak RSS to report when it ends.
func startChild(ctx context.Context, command []string, name, report string, args []string, stdout io.Writer) (*child, error) {
	if len(command) == 0 {
		return nil, errors.New("no command to run components with")
	}
	cctx, cancel := context.WithCancel(ctx)
	argv := append(slices.Clone(command[1:]), "--peak-rss-file", report, name)
	argv = append(argv, args...)
	cmd := exec.CommandContext(cctx, command[0], argv...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	// The daemons read KIPIMO_* variables (and KIPIMO_CONFIG's file) as
	// flags: a component gets only the flags it is given.
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, config.EnvPrefix) })
	cmd.WaitDelay = childGrace
	if stdout == nil {
		stdout = io.Discard
	}
	cmd.Stdout = stdout
	c := &child{name: name, report: report, cmd: cmd, cancel: cancel, stderr: &tailWriter{max: 8 << 10}, done: make(chan struct{})}
	cmd.Stderr = c.stderr
	// The write end stays open in this process until the child exits (Wait
	// closes it): if this process dies first, the child reads EOF and stops.
	stdin, err := cmd.StdinPipe()
	if err != nil {
		cancel()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c.stdin = stdin
	if err := cmd.Start(); err != nil {
		cancel()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

// stop ends the child (SIGTERM, SIGKILL after childGrace) and waits for it.
// It returns nil when the child exited cleanly, now or before.
func (c *child) stop() error {
	c.cancel()
	<-c.done
	return c.result()
}

// result is nil when the exited child exited with status 0, else an error
// with the end of its standard error.
func (c *child) result() error {
	ps := c.cmd.ProcessState
	if ps != nil && ps.Success() {
		return nil
	}
	err := c.err
	if ps != nil {
		err = errors.New(ps.String())
	}
	msg := strings.TrimSpace(c.stderr.String())
	if msg == "" {
		return fmt.Errorf("%s: %w", c.name, err)
	}
	return fmt.Errorf("%s: %w: %s", c.name, err, msg)
}

// exited reports whether the child has exited.
func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// peakRSS is the exited child's peak resident set size in MiB, as it
// reported it (see peakRSSSelfKiB for why not from its rusage); ok is false
// while it runs and when it did not exit cleanly.
func (c *child) peakRSS() (mib float64, ok bool) {
	if !c.exited() || c.result() != nil {
		return 0, false
	}
	b, err := os.ReadFile(c.report)
	if err != nil {
		return 0, false
	}
	kib, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || kib <= 0 {
		return 0, false
	}
	return float64(kib) / 1024, true
}

// maxRSSMiB converts ru_maxrss, KiB on Linux and bytes on macOS, to MiB.
func maxRSSMiB(ru *syscall.Rusage) float64 {
	if runtime.GOOS == "darwin" {
		return float64(ru.Maxrss) / (1 << 20)
	}
	return float64(ru.Maxrss) / 1024
}

// tailWriter keeps the last max bytes written to it; safe for concurrent
// use.
type tailWriter struct {
	max int
	mu  sync.Mutex
	buf []byte
}

func (w *tailWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	if over := len(w.buf) - w.max; over > 0 {
		w.buf = append(w.buf[:0], w.buf[over:]...)
	}
	return len(p), nil
}

func (w *tailWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.buf)
}

// lineWriter collects what a child prints and hands its first line to
// first (once).
type lineWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	sent  bool
	first chan string // buffered, one line
}

func newLineWriter() *lineWriter { return &lineWriter{first: make(chan string, 1)} }

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.buf.Len() < 1<<20 {
		w.buf.Write(p)
	}
	if !w.sent {
		if line, _, ok := bytes.Cut(w.buf.Bytes(), []byte("\n")); ok {
			w.sent = true
			w.first <- string(line)
		}
	}
	return len(p), nil
}

// Bytes is everything printed so far (up to 1 MiB).
func (w *lineWriter) Bytes() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return bytes.Clone(w.buf.Bytes())
}
