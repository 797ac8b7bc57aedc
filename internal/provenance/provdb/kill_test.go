package provdb

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provstream"
	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
	"github.com/kipimo-hpc/kipimo/internal/provenance/storetest"
)

// TestMain lets the test binary run as provdb itself (a child process the
// kill test can SIGKILL) when KIPIMO_PROVDB_CHILD_ARGS is set.
func TestMain(m *testing.M) {
	if args := os.Getenv("KIPIMO_PROVDB_CHILD_ARGS"); args != "" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
		err := Main(ctx, strings.Split(args, "\n"), os.Stderr)
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, "provdb child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// drainBound bounds the time from provdb's restart to a drained consumer
// in TestKillAndRestartLosesNothing: the default --ack-wait (after which
// the batches the killed process held are delivered again), the rest of
// the stream's ingest, and a margin for a loaded machine.
const drainBound = 30 * time.Second

// child is provdb running as a child process of the test.
type child struct {
	cmd    *exec.Cmd
	stderr *testWriter
	done   chan struct{} // closed when the process has exited
	err    error         // its exit, once done is closed
}

func startChild(t *testing.T, args ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "KIPIMO_PROVDB_CHILD_ARGS="+strings.Join(args, "\n"))
	c := &child{cmd: cmd, stderr: &testWriter{t: t}, done: make(chan struct{})}
	cmd.Stderr = c.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	return c
}

// exited reports whether the child has exited, and how.
func (c *child) exited() (bool, error) {
	select {
	case <-c.done:
		return true, c.err
	default:
		return false, nil
	}
}

// testWriter keeps what the child writes on stderr, and logs it as it
// comes with -v.
type testWriter struct {
	t   *testing.T
	out syncBuffer
}

func (w *testWriter) Write(p []byte) (int, error) {
	if testing.Verbose() {
		w.t.Logf("provdb: %s", strings.TrimSpace(string(p)))
	}
	return w.out.Write(p)
}

func (w *testWriter) String() string { return w.out.String() }

// TestKillAndRestartLosesNothing publishes 100,000 records in 200 batches,
// in the block encoding and, every other one, as JSON (producers of two
// versions), and 10 batches again under new message ids, as a restarted
// producer would; it SIGKILLs provdb twice while it ingests, restarts it
// each time (with the default flags), and checks the store ends with
// exactly 100,000 records, 500 per batch, and that the batches the killed
// provdb held reach the store within drainBound of the last restart (the
// default --ack-wait, not a minute).
func TestKillAndRestartLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("kill test skipped in -short mode")
	}
	const batches, per = 200, 500
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	srv, err := natsx.StartServer(natsx.DefaultServerConfig(dir))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := natsx.Connect(ctx, srv.ClientURL(), "producer")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	const run = "killtest"
	if _, err := provstream.EnsureStream(ctx, js, run); err != nil {
		t.Fatal(err)
	}
	dbPath := filepath.Join(dir, "prov.db")
	args := []string{"--nats", srv.ClientURL(), "--store", dbPath, "--run", run, "--http", "", "--log-level", "warn"}

	produced := make(chan error, 1)
	go func() {
		subj := provstream.Subject(run, provenance.KindAnomalies)
		for b := range batches {
			execs := storetest.Generate(storetest.GenConfig{Seed: uint64(b), N: per, Window: 1, Anomaly: true})
			for i := range execs {
				execs[i].PID = uint32(b)
			}
			publish := provstream.PublishBatch
			if b%2 == 0 {
				publish = func(ctx context.Context, js jetstream.JetStream, subj, id string, records any) error {
					return provstream.PublishExecBlocks(ctx, js, subj, id, records.([]provenance.Exec))
				}
			}
			if err := publish(ctx, js, subj, fmt.Sprintf("b%d", b), execs); err != nil {
				produced <- err
				return
			}
			if b%20 == 0 {
				// A producer restarted past the duplicate window sends
				// the batch again under a new id: the store must dedupe.
				if err := publish(ctx, js, subj, fmt.Sprintf("again-b%d", b), execs); err != nil {
					produced <- err
					return
				}
			}
		}
		produced <- nil
	}()

	count := func() int64 {
		s, err := sqlitestore.Open(ctx, dbPath, sqlitestore.Options{ReadOnly: true})
		if err != nil {
			return 0 // not created yet
		}
		defer s.Close()
		n, err := s.Count(ctx, provenance.Query{})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitFor := func(c *child, what string, cond func() bool) {
		for !cond() {
			if done, err := c.exited(); done {
				t.Fatalf("waiting for %s (store holds %d), provdb exited: %v; its stderr:\n%s", what, count(), err, c.stderr)
			}
			if ctx.Err() != nil {
				t.Fatalf("timed out waiting for %s (store holds %d); provdb's stderr:\n%s", what, count(), c.stderr)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for _, at := range []int64{30000, 65000} {
		c := startChild(t, args...)
		waitFor(c, fmt.Sprintf("%d records", at), func() bool { return count() >= at })
		if err := c.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		<-c.done
		t.Logf("%s: killed provdb with %d records stored", time.Since(start).Round(time.Millisecond), count())
	}
	c := startChild(t, args...)
	restarted := time.Now()
	if err := <-produced; err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: producer done, %d records stored", time.Since(start).Round(time.Millisecond), count())
	cons, err := js.Consumer(ctx, natsx.ProvStream(run), "provdb")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(c, "the consumer to drain", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
	drained := time.Since(restarted)
	t.Logf("%s: consumer drained, %s after the last restart", time.Since(start).Round(time.Millisecond), drained.Round(time.Millisecond))
	if drained > drainBound {
		t.Errorf("the batches held by the killed provdb reached the store %s after the restart; want within %s", drained.Round(time.Millisecond), drainBound)
	}
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-c.done
	if c.err != nil {
		t.Fatalf("provdb did not stop cleanly on SIGTERM: %v; its stderr:\n%s", c.err, c.stderr)
	}

	s, err := sqlitestore.Open(ctx, dbPath, sqlitestore.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if n, err := s.Count(ctx, provenance.Query{}); err != nil || n != batches*per {
		t.Fatalf("store holds %d records (%v), want exactly %d", n, err, batches*per)
	}
	for b := range batches {
		pid := uint32(b)
		if n, err := s.Count(ctx, provenance.Query{PID: &pid}); err != nil || n != per {
			t.Fatalf("batch %d: %d records stored (%v), want %d", b, n, err, per)
		}
	}
}
