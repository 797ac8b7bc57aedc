package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/mpitest"
)

var (
	kipimoBinOnce sync.Once
	kipimoBin     string
	kipimoBinErr  error
)

// buildKipimo builds the kipimo binary once for the package's tests that
// need a real process (signals).
func buildKipimo(t *testing.T) string {
	t.Helper()
	kipimoBinOnce.Do(func() {
		dir, err := os.MkdirTemp("", "kipimo-bin-")
		if err != nil {
			kipimoBinErr = err
			return
		}
		kipimoBin = filepath.Join(dir, "kipimo")
		out, err := exec.Command("go", "build", "-o", kipimoBin, "../../cmd/kipimo").CombinedOutput()
		if err != nil {
			kipimoBinErr = errors.New("go build: " + err.Error() + "\n" + string(out))
		}
	})
	if kipimoBinErr != nil {
		t.Fatal(kipimoBinErr)
	}
	return kipimoBin
}

// lockedBuffer is a bytes.Buffer safe for one writer and other readers.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) WriteString(s string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.WriteString(s)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// runProcess is kipimo started as its own process group, as a shell starts
// a job, with its stdout and stderr kept.
type runProcess struct {
	cmd       *exec.Cmd
	stdout    bytes.Buffer // read once the process has exited
	stderr    lockedBuffer
	dashboard chan string
	done      chan error
}

func startKipimo(t *testing.T, args ...string) *runProcess {
	t.Helper()
	rp := &runProcess{dashboard: make(chan string, 1), done: make(chan error, 1)}
	rp.cmd = exec.Command(buildKipimo(t), args...)
	rp.cmd.Stdout = &rp.stdout
	rp.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	pr, pw := io.Pipe()
	rp.cmd.Stderr = pw
	if err := rp.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			rp.stderr.WriteString(line + "\n")
			if url, ok := strings.CutPrefix(line, "dashboard: "); ok {
				rp.dashboard <- strings.Fields(url)[0]
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	go func() {
		err := rp.cmd.Wait()
		pw.Close()
		<-copied
		rp.done <- err
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-rp.cmd.Process.Pid, syscall.SIGKILL)
	})
	return rp
}

// wait waits for kipimo to exit and returns its exit status.
func (rp *runProcess) wait(t *testing.T, limit time.Duration) int {
	t.Helper()
	select {
	case err := <-rp.done:
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return rp.cmd.ProcessState.ExitCode()
	case <-time.After(limit):
		t.Fatalf("kipimo still running %s after the signal\nstderr:\n%s", limit, rp.stderr.String())
		return -1
	}
}

// waitSteps waits until the dashboard at url has seen io_step steps.
func waitSteps(t *testing.T, rp *runProcess, steps uint64) {
	t.Helper()
	var url string
	select {
	case url = <-rp.dashboard:
	case err := <-rp.done:
		t.Fatalf("kipimo exited before the run started: %v\n%s", err, rp.stderr.String())
	case <-time.After(time.Minute):
		t.Fatalf("no dashboard line in a minute:\n%s", rp.stderr.String())
	}
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		resp, err := http.Get(url + "api/summary")
		if err == nil {
			var s struct {
				IOStep uint64 `json:"io_step"`
			}
			err = json.NewDecoder(resp.Body).Decode(&s)
			resp.Body.Close()
			if err == nil && s.IOStep >= steps {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("the run did not reach io_step %d in a minute", steps)
}

// Ctrl-C (SIGINT to kipimo's process group, as a terminal sends it) and
// SIGTERM end a synthetic run early: the pipeline drains and the summary,
// store and profiles are written, saying it was interrupted.
func TestRunInterrupted(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kipimo and runs the pipeline")
	}
	for _, tc := range []struct {
		name    string
		signals []syscall.Signal
		group   bool
		status  int
		sigName string
	}{
		{"ctrl-c", []syscall.Signal{syscall.SIGINT}, true, 130, "SIGINT"},
		{"sigterm", []syscall.Signal{syscall.SIGTERM}, false, 143, "SIGTERM"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := t.TempDir()
			rp := startKipimo(t, "run", "--out", out, "--run", "long", "--ranks", "2", "--steps", "100000", "--events-per-step", "2000")
			waitSteps(t, rp, 3)
			pid := rp.cmd.Process.Pid
			if tc.group {
				pid = -pid
			}
			for _, sig := range tc.signals {
				if err := syscall.Kill(pid, sig); err != nil {
					t.Fatal(err)
				}
			}
			status := rp.wait(t, time.Minute)
			stdout, stderr := rp.stdout.String(), rp.stderr.String()
			if status != tc.status {
				t.Errorf("exit status %d, want %d\nstdout:\n%s\nstderr:\n%s", status, tc.status, stdout, stderr)
			}
			if strings.Contains(stderr, "context canceled") {
				t.Errorf("stderr says the context was canceled:\n%s", stderr)
			}
			for _, want := range []string{`(?m)^interrupted +by ` + tc.sigName, `(?m)^provenance +` + regexp.QuoteMeta(filepath.Join(out, "long", "provenance.db")), `(?m)^TAU profiles +/`} {
				if !regexp.MustCompile(want).MatchString(stdout) {
					t.Errorf("summary lacks %q:\n%s", want, stdout)
				}
			}
			profiles, _ := filepath.Glob(filepath.Join(out, "long", "profiles", "profile.*"))
			if len(profiles) < 2 {
				t.Errorf("%d TAU profiles written, want one per thread of the 2 ranks", len(profiles))
			}
			if _, err := os.Stat(filepath.Join(out, "long", "truth.jsonl")); err != nil {
				t.Errorf("ground truth: %v", err)
			}
		})
	}
}

// SIGTERM to kipimo alone, as a batch system may send it, during a run
// with --exec reaches the command's whole process group (here a shell and
// the process it started), and the run then ends with its summary.
func TestRunExecInterrupted(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kipimo and runs the pipeline")
	}
	mpitest.Require(t, "cc")
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "sleep.pid")
	rp := startKipimo(t, "run", "--out", dir, "--run", "exec", "--exec", "--",
		"sh", "-c", "sleep 300 & echo $! > "+pidFile+"; wait")
	waitFor(t, rp, func() bool { return readPID(pidFile) > 0 })
	sleepPID := readPID(pidFile)
	if err := syscall.Kill(rp.cmd.Process.Pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	status := rp.wait(t, time.Minute)
	stdout, stderr := rp.stdout.String(), rp.stderr.String()
	if status != 128+int(syscall.SIGTERM) {
		t.Errorf("exit status %d, want the command's (143, ended by SIGTERM)\nstdout:\n%s\nstderr:\n%s", status, stdout, stderr)
	}
	if !regexp.MustCompile(`(?m)^interrupted +by SIGTERM`).MatchString(stdout) || !strings.Contains(stdout, "(exit status 143)") {
		t.Errorf("summary does not say the run was interrupted and how the command ended:\n%s\nstderr:\n%s", stdout, stderr)
	}
	checkGone(t, sleepPID)
}

// A second Ctrl-C quits at once, here while the command, which ignores
// SIGINT, keeps running after the first: kipimo kills the command's process
// group and exits without a summary.
func TestRunExecCtrlCTwice(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kipimo and runs the pipeline")
	}
	mpitest.Require(t, "cc")
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "sleep.pid")
	rp := startKipimo(t, "run", "--out", dir, "--run", "exec", "--exec", "--",
		"sh", "-c", "trap '' INT; sleep 300 & echo $! > "+pidFile+"; wait")
	waitFor(t, rp, func() bool { return readPID(pidFile) > 0 })
	sleepPID := readPID(pidFile)
	group := -rp.cmd.Process.Pid
	if err := syscall.Kill(group, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	waitFor(t, rp, func() bool { return strings.Contains(rp.stderr.String(), "ending the run") })
	if err := syscall.Kill(group, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	status := rp.wait(t, 30*time.Second)
	if status != 130 || strings.Contains(rp.stdout.String(), "provenance") {
		t.Errorf("exit status %d, stdout %q: want 130 and no summary\nstderr:\n%s", status, rp.stdout.String(), rp.stderr.String())
	}
	if !strings.Contains(rp.stderr.String(), filepath.Join(dir, "exec")) {
		t.Errorf("stderr does not say where what was stored is:\n%s", rp.stderr.String())
	}
	checkGone(t, sleepPID)
}

// readPID reads a pid file the command wrote (0 until it is complete).
func readPID(path string) int {
	b, err := os.ReadFile(path)
	if err != nil || !bytes.HasSuffix(b, []byte("\n")) {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

// waitFor polls cond until it holds, for at most two minutes, failing if
// kipimo exits first.
func waitFor(t *testing.T, rp *runProcess, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting; stderr:\n%s", rp.stderr.String())
		case err := <-rp.done:
			t.Fatalf("kipimo exited early: %v\n%s", err, rp.stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// checkGone asserts that process pid has ended (a child of the command,
// reached through the command's process group).
func checkGone(t *testing.T, pid int) {
	t.Helper()
	// The process was the command's grandchild: once it is killed, init
	// reaps it; give that a moment.
	for range 100 {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Errorf("the command's child %d is still there: the signal did not reach the command's process group", pid)
	_ = syscall.Kill(pid, syscall.SIGKILL)
}

// Every binary prints its version from the module's build information.
func TestVersionFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries")
	}
	bin := t.TempDir()
	if out, err := exec.Command("go", "build", "-o", bin+"/", "../../cmd/ad", "../../cmd/pserver", "../../cmd/provdb").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, name := range []string{"kipimo", "ad", "pserver", "provdb"} {
		path := filepath.Join(bin, name)
		if name == "kipimo" {
			path = buildKipimo(t)
		}
		out, err := exec.Command(path, "--version").CombinedOutput()
		line := strings.TrimSpace(string(out))
		if err != nil || !strings.HasPrefix(line, name+" ") || !strings.Contains(line, "github.com/kipimo-hpc/kipimo") ||
			!strings.Contains(line, "revision ") || !strings.Contains(line, "built with go1.") || strings.Count(line, "\n") != 0 {
			t.Errorf("%s --version: %q (%v): want one line with the module, the revision and the Go version", name, line, err)
		}
	}
}

// A running kipimo run writes its endpoints into its directory and prints
// them; kipimo callstack and kipimo query --url reach it given the
// directory. Once it is over, the endpoints file is gone, --url on the
// directory says to read the store, and query reads the latest run's store
// by default.
func TestRunEndpoints(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kipimo and runs the pipeline")
	}
	buildKipimo(t) // before leaving the package's directory
	t.Chdir(t.TempDir())
	dir := filepath.Join(defaultOut, "ep")
	rp := startKipimo(t, "run", "--run", "ep", "--ranks", "2", "--steps", "100000", "--events-per-step", "2000")
	waitSteps(t, rp, 3)
	if !strings.Contains(rp.stderr.String(), "endpoints: NATS nats://127.0.0.1:") || !strings.Contains(rp.stderr.String(), filepath.Join(dir, "endpoints.json")) {
		t.Errorf("the endpoints are not printed:\n%s", rp.stderr.String())
	}
	b, err := os.ReadFile(filepath.Join(dir, "endpoints.json"))
	var ep struct{ Run, NATS, Dashboard, ProvDB string }
	if err != nil || json.Unmarshal(b, &ep) != nil || ep.Run != "ep" || !strings.HasPrefix(ep.NATS, "nats://") ||
		!strings.HasPrefix(ep.ProvDB, "http://") || !strings.HasPrefix(ep.Dashboard, "http://") {
		t.Fatalf("endpoints.json %q (%v)", b, err)
	}
	out, errOut, err := runKipimo(t, nil, "callstack", dir, "--json")
	var stacks []struct {
		Rank uint32 `json:"rank"`
	}
	if err != nil || json.Unmarshal([]byte(out), &stacks) != nil || len(stacks) != 2 {
		t.Errorf("callstack %s: %v %q %q: want both ranks' stacks", dir, err, out, errOut)
	}
	out, errOut, err = runKipimo(t, nil, "query", "count", "--url", dir, "--kind", "metadata")
	if n, perr := strconv.Atoi(strings.TrimSpace(out)); err != nil || perr != nil || n == 0 {
		t.Errorf("query count --url %s: %v %q %q: want the running run's metadata count", dir, err, out, errOut)
	}

	if err := syscall.Kill(rp.cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if status := rp.wait(t, time.Minute); status != 130 {
		t.Fatalf("exit status %d\n%s", status, rp.stderr.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "endpoints.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("endpoints.json left after the run: %v", err)
	}
	_, _, err = runKipimo(t, nil, "query", "count", "--url", dir)
	if err == nil || !strings.Contains(err.Error(), "--store "+filepath.Join(dir, "provenance.db")) {
		t.Errorf("query --url on a finished run's directory: %v, want an error naming its store", err)
	}
	for _, args := range [][]string{{"query", "count"}, {"query", "count", "--store", dir}} {
		out, errOut, err := runKipimo(t, nil, args...)
		if n, perr := strconv.Atoi(strings.TrimSpace(out)); err != nil || perr != nil || n == 0 {
			t.Errorf("%q: %v %q %q: want the run's anomaly count", args, err, out, errOut)
		}
		if len(args) == 2 && !strings.Contains(errOut, filepath.Join(dir, "provenance.db")) {
			t.Errorf("%q does not say which store it read: %q", args, errOut)
		}
	}
	t.Chdir(t.TempDir())
	if _, _, err := runKipimo(t, nil, "query", "count"); err == nil || !strings.Contains(err.Error(), "no run's store under ./kipimo-out") {
		t.Errorf("query without a store anywhere: %v", err)
	}
}
