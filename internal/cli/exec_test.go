package cli

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kipimo-hpc/kipimo/internal/instrument"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
)

func TestExecAndLibArguments(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"exec without a command", []string{"exec", "--run", "r"}, "give the command to run after --"},
		{"exec with a bad run id", []string{"exec", "--run", "a.b", "--", "true"}, "--run"},
		{"exec with a bad injection", []string{"exec", "--run", "r", "--inject", "MPI_Send:2:1ms", "--", "true"}, "probability"},
		{"exec of a missing command", []string{"exec", "--run", "r", "--", "/nonexistent/app"}, "/nonexistent/app"},
		{"run with files but no --format", []string{"run", "./app"}, "--exec -- COMMAND"},
		{"run with a missing input file", []string{"run", "--format", "frames", "/nonexistent/rank-0.frames"}, "/nonexistent/rank-0.frames"},
		{"run --exec without a command", []string{"run", "--exec"}, "--exec needs a command"},
		{"run --inject without --exec", []string{"run", "--inject", "f:0.1:1ms"}, "apply to a program run with --exec"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := NewRoot(io.Discard, io.Discard)
			root.SetArgs(tc.args)
			err := root.Execute()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// kipimo exec, as a rank launcher does it: the built kipimo binary replaces
// itself with the program, which streams to the given server with the
// library inside and keeps its own output and exit status.
func TestExecStreamsToExternalServer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the kipimo binary")
	}
	if _, err := exec.LookPath("cc"); err != nil {
		t.Skip("no C compiler")
	}
	dir := t.TempDir()
	t.Setenv("KIPIMO_CACHE_DIR", filepath.Join(dir, "cache"))
	bin := filepath.Join(dir, "kipimo")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/kipimo").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	flags, err := exec.Command(bin, "lib", "--no-mpi", "--cflags", "--libs").Output()
	if err != nil {
		t.Fatal(err)
	}
	prog := filepath.Join(dir, "serial")
	args := append([]string{"-O1", "../instrument/testdata/serial.c", "-o", prog}, strings.Fields(string(flags))...)
	if out, err := exec.Command("cc", args...).CombinedOutput(); err != nil {
		t.Fatalf("cc %v: %v\n%s", args, err, out)
	}
	cfg := natsx.DefaultServerConfig(dir)
	cfg.JetStream = false
	ns, err := natsx.StartServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sub, err := nc.SubscribeSync("kipimo.r7.frames.2.0")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	status := filepath.Join(dir, "status")
	if err := os.Mkdir(status, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "exec", "--nats", ns.ClientURL(), "--run", "r7", "--pid", "2", "--no-mpi", "--status-dir", status, "--", prog, "300")
	var out bytes.Buffer
	cmd.Stdout = &out
	err = cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 || out.String() != "serial done 0\n" {
		t.Fatalf("exit %v, output %q: want the program's status 3 and output", err, out.String())
	}
	frames, ended := 0, false
	for !ended {
		m, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("after %d frames: %v", frames, err)
		}
		if m.Header.Get("Kipimo-End-Of-Stream") != "" {
			ended = true
			continue
		}
		frames++
	}
	st, err := instrument.ReadStatus(status)
	if err != nil || len(st) != 1 || st[0].PID != 2 || st[0].FramesSent != uint64(frames) || frames == 0 {
		t.Errorf("status %+v (%v), %d frames received", st, err, frames)
	}
}

func TestOneDashLongFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string // "" for no error
	}{
		{"long flag with one dash", []string{"run", "-http", "127.0.0.1:0"}, "use --http"},
		{"subcommand flag with one dash", []string{"query", "list", "-limit", "5"}, "use --limit"},
		{"two dashes", []string{"run", "--http", "127.0.0.1:0"}, ""},
		{"a shorthand", []string{"gen", "-o", "dir"}, ""},
		{"the command's own arguments after --", []string{"run", "--exec", "--", "mpirun", "-np", "2", "./app"}, ""},
		{"a negative value", []string{"run", "--sigma", "-1"}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := checkDashes(NewRoot(io.Discard, io.Discard), tc.args)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("error %v, want none", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}
