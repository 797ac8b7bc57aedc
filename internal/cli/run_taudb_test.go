package cli

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/taudb/pgtest"
)

// kipimo run with a TAUdb (--taudb, or KIPIMO_TAUDB_DSN as the quickstart
// exports it) refuses, before it starts, a run id the TAUdb already has a
// trial of: the database keeps one trial of each name, and the refused run
// leaves nothing behind.
func TestRunRefusesATaudbTrialName(t *testing.T) {
	dsn := pgtest.Isolated(t)
	if _, err := runTaudbCmd(t, "taudb", "configure", "--dsn", dsn); err != nil {
		t.Fatal(err)
	}
	if _, err := runTaudbCmd(t, "taudb", "load", "--dsn", dsn, "--name", "taken",
		filepath.Join(ppkDir, "LoadImbalance-16.ppk")); err != nil {
		t.Fatal(err)
	}
	synthetic := []string{"--ranks", "1", "--steps", "2", "--events-per-step", "2000", "--json"}
	for _, tc := range []struct {
		name string
		env  bool
		want string
	}{
		{"flag", false, `the TAUdb of --taudb already has a trial named "taken"`},
		{"environment", true, `the TAUdb of KIPIMO_TAUDB_DSN already has a trial named "taken"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := t.TempDir()
			args := append([]string{"run", "--out", out, "--run", "taken"}, synthetic...)
			if tc.env {
				t.Setenv("KIPIMO_TAUDB_DSN", dsn)
			} else {
				args = append(args, "--taudb", dsn)
			}
			_, _, err := runCLI(t, args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("run --run taken: %v, want an error saying %q", err, tc.want)
			}
			if m, _ := filepath.Glob(filepath.Join(out, "*")); len(m) != 0 {
				t.Errorf("the refused run left %v", m)
			}
		})
	}
	list, err := runTaudbCmd(t, "taudb", "list", "--dsn", dsn)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(list, " taken "); n != 1 {
		t.Errorf("%d trials named taken, want 1:\n%s", n, list)
	}
	// another id is stored as its own trial
	if _, errOut, err := runCLI(t, append([]string{"run", "--out", t.TempDir(), "--run", "other", "--taudb", dsn}, synthetic...)...); err != nil {
		t.Fatalf("run --run other: %v\n%s", err, errOut)
	}
	if list, err = runTaudbCmd(t, "taudb", "list", "--dsn", dsn); err != nil || !strings.Contains(list, " other ") {
		t.Errorf("taudb list after run --run other (%v):\n%s", err, list)
	}
}
