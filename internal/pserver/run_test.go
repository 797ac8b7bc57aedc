package pserver

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestRunServesUntilCancelled(t *testing.T) {
	ns, nc := startNATS(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var stderr bytes.Buffer
	go func() {
		done <- Run(ctx, []string{"--nats", ns.ClientURL(), "--run", "cmd", "--http", "", "--log-level", "warn"}, &stderr)
	}()
	g := newGenRun(2, 3, 3, 0, 101)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := nc.Request("kipimo.cmd.ps.sync.0", []byte(`{}`), 200*time.Millisecond); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("pserver never answered")
		}
	}
	for _, row := range g.reqs {
		for i := range row {
			doSync(t, nc, "cmd", 0, &row[i])
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v (%s)", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	// A new instance continues from the persisted state.
	s := startServer(t, nc, Config{Run: "cmd"})
	defer s.Shutdown(context.Background())
	want := reference(t, g.all(), DefaultWindow)
	got := state(s)
	compareModels(t, "after Run", want, got)
	compareAggregates(t, "after Run", want, got)
}

func TestRunFlagErrors(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no run", nil, "--run is required"},
		{"bad run", []string{"--run", "a.b"}, "not allowed"},
		{"bad durability", []string{"--run", "a", "--durability", "disk"}, "durability"},
		{"bad shard", []string{"--run", "a", "--shard", "3", "--shards", "2"}, "shard 3"},
		{"empty token file", []string{"--run", "a", "--token-file", empty}, "is empty"},
		{"missing token file", []string{"--run", "a", "--token-file", filepath.Join(dir, "nope")}, "read --token-file"},
		{"positional", []string{"--run", "a", "extra"}, "unexpected arguments"},
		{"bad nats", []string{"--run", "a", "--nats", "http://x"}, "scheme"},
		{"bad level", []string{"--run", "a", "--log-level", "loud"}, "--log-level"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			err := Run(context.Background(), append(tc.args, "--http", ""), &stderr)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Run error %v, want one containing %q", err, tc.want)
			}
		})
	}
}
