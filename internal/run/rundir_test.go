package run

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
)

// countStored counts the anomalies in the store at path.
func countStored(t *testing.T, path string) int64 {
	t.Helper()
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, path, sqlitestore.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	n, err := st.Count(ctx, provenance.Query{Kind: provenance.KindAnomalies})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A second run under a taken id is refused, saying what to do, and leaves
// the first run as it was; with Replace it starts afresh, and its store
// holds its own records, every one of them.
func TestRunIDTaken(t *testing.T) {
	cfg := smallRun(t)
	cfg.Workload.Ranks, cfg.Workload.Steps = 2, 8
	_, first := execute(t, cfg, nil, nil)
	before := countStored(t, first.Store)

	second := cfg
	second.Workload.Seed = 9
	_, err := Start(context.Background(), second, testLogger(t))
	var taken *ExistsError
	if !errors.As(err, &taken) {
		t.Fatalf("second run under id %q: %v, want an ExistsError", cfg.RunID, err)
	}
	for _, want := range []string{`"test"`, filepath.Join(cfg.Out, "test"), "--run", "--replace", "kipimo serve --store"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if n := countStored(t, first.Store); n != before {
		t.Errorf("the refused run changed the first run's store: %d anomalies, was %d", n, before)
	}

	second.Replace = true
	p, sum := execute(t, second, nil, nil)
	checkConsistent(t, p, sum)
	if n := countStored(t, sum.Store); n != int64(sum.Anomalies) {
		t.Errorf("replaced run: store holds %d anomalies, detectors flagged %d", n, sum.Anomalies)
	}
}

// claimRunDir: an empty directory is taken as it is, a chosen id moves on
// to the next free one, a given id is refused.
func TestClaimRunDir(t *testing.T) {
	out := t.TempDir()
	occupy := func(id string) {
		if err := os.MkdirAll(filepath.Join(out, id), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(out, id, "provenance.db"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	occupy("run-a")
	occupy("run-a-2")
	occupy("given")
	if err := os.Mkdir(filepath.Join(out, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		id      string
		auto    bool
		want    string
		wantErr bool
	}{
		{id: "run-a", auto: true, want: "run-a-3"},
		{id: "run-b", auto: true, want: "run-b"},
		{id: "empty", want: "empty"},
		{id: "given", wantErr: true},
		{id: "new", want: "new"},
	} {
		p := &Pipeline{cfg: Config{Out: out, RunID: tc.id, autoID: tc.auto}}
		err := p.claimRunDir()
		if tc.wantErr {
			var taken *ExistsError
			if !errors.As(err, &taken) || taken.Dir != filepath.Join(out, tc.id) {
				t.Errorf("%s: %v, want an ExistsError for its directory", tc.id, err)
			}
			continue
		}
		if err != nil || p.cfg.RunID != tc.want {
			t.Errorf("%s: claimed %q (%v), want %q", tc.id, p.cfg.RunID, err, tc.want)
			continue
		}
		if fi, err := os.Stat(filepath.Join(out, tc.want)); err != nil || !fi.IsDir() {
			t.Errorf("%s: no directory %s (%v)", tc.id, tc.want, err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(out, "run-a", "provenance.db")); err != nil || string(b) != "x" {
		t.Errorf("an earlier run's file changed: %q, %v", b, err)
	}
}

// On an external NATS server, an earlier run's provenance stream holds its
// id even when the new run's directory is fresh: JetStream would drop the
// new run's batches with the same message ids.
func TestRunIDTakenOnExternalNATS(t *testing.T) {
	ns, err := natsx.StartServer(natsx.DefaultServerConfig(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := Config{Out: t.TempDir(), RunID: "shared", NATSURL: ns.ClientURL()}
	p, err := Start(ctx, cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	p.Close(ctx)

	cfg.Out = t.TempDir()
	_, err = Start(ctx, cfg, testLogger(t))
	var taken *ExistsError
	if !errors.As(err, &taken) || taken.Stream != natsx.ProvStream("shared") || !strings.Contains(err.Error(), "--replace") {
		t.Fatalf("second run on the same server: %v, want an ExistsError naming the stream", err)
	}
	cfg.Out = t.TempDir()
	cfg.Replace = true
	p, err = Start(ctx, cfg, testLogger(t))
	if err != nil {
		t.Fatalf("with Replace: %v", err)
	}
	p.Close(ctx)
}

// A run that fails removes the directory it created when it stored
// nothing, and says so; one that finishes deletes its NATS data unless
// KeepNATS, which the summary then counts.
func TestRunLeftovers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	t.Run("failed", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "out")
		cfg := Config{Out: out, RunID: "failed", Live: LiveConfig{Command: []string{"/nonexistent/app"}}}
		p, err := Start(ctx, cfg, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Execute(ctx, nil); err == nil {
			t.Fatal("a missing command ran")
		}
		p.Close(ctx)
		if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left after the failed run (%v)", out, err)
		}
		if note := p.CloseNote(); !strings.Contains(note, "removed "+filepath.Join(out, "failed")) {
			t.Errorf("close note %q", note)
		}
	})
	t.Run("failed start", func(t *testing.T) {
		out := t.TempDir()
		cfg := Config{Out: out, RunID: "nostart", HTTP: "127.0.0.1:99999"}
		if _, err := Start(ctx, cfg, testLogger(t)); err == nil {
			t.Fatal("a dashboard on port 99999 started")
		}
		if _, err := os.Stat(filepath.Join(out, "nostart")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the run's directory is left after Start failed (%v)", err)
		}
	})
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprintf("keep NATS %v", keep), func(t *testing.T) {
			cfg := smallRun(t)
			cfg.Workload.Ranks, cfg.Workload.Steps = 2, 4
			cfg.KeepNATS = keep
			p, sum := execute(t, cfg, nil, nil)
			p.Close(ctx)
			_, err := os.Stat(filepath.Join(cfg.Out, cfg.RunID, "nats"))
			if kept := err == nil; kept != keep {
				t.Errorf("nats/ there after the run: %v, want %v", kept, keep)
			}
			if (sum.NATSBytes > 0) != keep {
				t.Errorf("summary counts %d bytes of kept NATS data", sum.NATSBytes)
			}
			if p.CloseNote() != "" {
				t.Errorf("close note %q for a finished run", p.CloseNote())
			}
			if _, err := os.Stat(sum.Store); err != nil {
				t.Errorf("store: %v", err)
			}
		})
	}
}
