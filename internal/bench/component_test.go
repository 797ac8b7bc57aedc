package bench

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/workload"
)

// TestMain lets the test binary be the components' child process, as the
// kipimo executable is for `kipimo bench`: `run.test component NAME FLAGS`.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == ComponentCommand {
		opt, name, args, err := ParseComponentArgs(os.Args[2:])
		if err == nil {
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			err = Component(ctx, name, args, opt, os.Stdin, os.Stdout, os.Stderr)
			stop()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// componentCommand runs components in children of the test binary.
func componentCommand(t *testing.T) []string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Skipf("no executable to start components with: %v", err)
	}
	return []string{exe, ComponentCommand}
}

// TestComponentsInChildProcesses runs a small synthetic run with NATS, the
// pserver, provdb and ad each in a child process: every one exits cleanly
// and reports its peak RSS, every frame is processed and every anomaly the
// detectors flagged is stored once.
func TestComponentsInChildProcesses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	wl := workload.DefaultConfig()
	wl.Ranks, wl.Steps, wl.EventsPerStep, wl.Seed = 3, 20, 4000, 3
	wl.Rates = wl.Rates.Scale(3)
	cr, err := benchComponents(ctx, componentCommand(t), t.TempDir(), wl)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("peak RSS (MiB): %v; %.0f events/s", cr.PeakRSS, cr.EventsPerSecond)
	for _, name := range []string{ComponentAD, ComponentPServer, ComponentProvDB, ComponentNATS} {
		if mib := cr.PeakRSS[name]; mib < 1 || mib > 4096 {
			t.Errorf("%s: peak RSS %.1f MiB", name, mib)
		}
	}
	if want := uint64(wl.Ranks * wl.Steps); cr.Frames != want {
		t.Errorf("detectors processed %d frames, want %d", cr.Frames, want)
	}
	if cr.Flagged == 0 || cr.Stored != int64(cr.Flagged) {
		t.Errorf("detectors flagged %d anomalies, provdb stored %d", cr.Flagged, cr.Stored)
	}
}

// TestComponentStopsWithItsParent checks the children's lifeline: a
// component whose standard input ends stops, cleanly.
func TestComponentStopsWithItsParent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out := newLineWriter()
	dir := t.TempDir()
	c, err := startChild(ctx, componentCommand(t), ComponentNATS, filepath.Join(dir, "peak-rss"), []string{"--dir", dir}, out)
	if err != nil {
		t.Fatal(err)
	}
	defer c.stop()
	select {
	case <-out.first:
	case <-c.done:
		t.Fatal(c.result())
	case <-ctx.Done():
		t.Fatal("the NATS component printed no URL")
	}
	// Close this end of its stdin, as the parent's exit would.
	if err := c.stdin.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		t.Fatal("the component did not stop when its stdin ended")
	}
	if err := c.result(); err != nil {
		t.Errorf("the component did not stop cleanly: %v", err)
	}
	if mib, ok := c.peakRSS(); !ok || mib < 1 {
		t.Errorf("peak RSS %.1f MiB (%v)", mib, ok)
	}
}

func TestComponentUnknown(t *testing.T) {
	if err := Component(context.Background(), "nope", nil, ComponentOptions{}, nil, nil, nil); err == nil {
		t.Error("an unknown component ran")
	}
	for _, args := range [][]string{nil, {"--peak-rss-file"}, {"--what", "ad"}} {
		if _, _, _, err := ParseComponentArgs(args); err == nil {
			t.Errorf("ParseComponentArgs(%q) accepted", args)
		}
	}
	opt, name, rest, err := ParseComponentArgs([]string{"--peak-rss-file", "f", "ad", "--run", "x"})
	if err != nil || opt.PeakRSSFile != "f" || name != "ad" || len(rest) != 2 {
		t.Errorf("ParseComponentArgs: %+v %q %q %v", opt, name, rest, err)
	}
}
