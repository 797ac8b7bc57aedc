package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/kipimo-hpc/kipimo/internal/hatchetread"
	"github.com/kipimo-hpc/kipimo/internal/taudb"
	"github.com/kipimo-hpc/kipimo/internal/taudb/pgtest"
)

// cpiDir is TAU's hatchet cpi-mpi profile directory (4 ranks, call paths,
// user events), kept with the TAU profile reader's fixtures.
var cpiDir = filepath.Join("..", "format", "tauprofile", "testdata", "profiles", "hatchet-tau-cpi-mpi")

// formatsDir holds the taudb package's real Caliper files; ppkDir and xmlDir
// the real ppk and TAU XML files, kept with their readers.
var (
	formatsDir = filepath.Join("..", "taudb", "testdata", "formats")
	ppkDir     = filepath.Join("..", "format", "ppk", "testdata")
	xmlDir     = filepath.Join("..", "format", "tauxml", "testdata")
)

func runTaudbCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	root := NewRoot(&out, &errOut)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

func TestTaudbCommands(t *testing.T) {
	dsn := pgtest.Isolated(t)
	if _, err := runTaudbCmd(t, "taudb", "list", "--dsn", dsn); err == nil || !strings.Contains(err.Error(), "taudb configure") {
		t.Fatalf("list before configure: err = %v, want one pointing at configure", err)
	}
	out, err := runTaudbCmd(t, "taudb", "configure", "--dsn", dsn)
	if err != nil || !strings.Contains(out, "created TAUdb schema version 2") {
		t.Fatalf("configure: %q, %v", out, err)
	}
	out, err = runTaudbCmd(t, "taudb", "configure", "--dsn", dsn)
	if err != nil || !strings.Contains(out, "already present") {
		t.Fatalf("configure again: %q, %v", out, err)
	}

	meta := filepath.Join(t.TempDir(), "meta.json")
	if err := os.WriteFile(meta, []byte(`{"Machine": "perlmutter", "nodes": [1, 2]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	// Flags after the positional argument, DSN from the environment.
	t.Setenv(taudbDSNEnv, dsn)
	out, err = runTaudbCmd(t, "taudb", "load", cpiDir, "--name", "cpi", "--metadata", meta, "--application", "cpi", "--experiment", "scaling")
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	m := regexp.MustCompile(`loaded trial (\d+) "cpi": 4 threads`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("load output %q", out)
	}
	id := m[1]

	out, err = runTaudbCmd(t, "taudb", "list", "--json", "--metadata", "Machine=perlmutter")
	if err != nil {
		t.Fatal(err)
	}
	var list []taudb.TrialInfo
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list) != 1 || list[0].Name != "cpi" || list[0].TotalThreads != 4 {
		t.Fatalf("list --json = %q (%v)", out, err)
	}
	if out, _ := runTaudbCmd(t, "taudb", "list", "--metadata", "Machine=other"); strings.Contains(out, "cpi") {
		t.Errorf("list with a non-matching filter shows the trial:\n%s", out)
	}

	out, err = runTaudbCmd(t, "taudb", "show", id, "--top", "3")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"4 threads", "Metrics: TIME", "Threads: 0,0,0 1,0,0 2,0,0 3,0,0", "MPI_File_open()", "flat%"} {
		if !strings.Contains(out, want) {
			t.Errorf("show output lacks %q:\n%s", want, out)
		}
	}
	if lines := strings.Count(out, "\n"); lines != 8 {
		t.Errorf("show --top 3 printed %d lines, want 8:\n%s", lines, out)
	}

	// The seed's views give the derived numbers computed in Go.
	tr, err := taudb.ReadDir(cpiDir, "cpi")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var mean, total float64
	err = conn.QueryRow(context.Background(), `SELECT m.inclusive, s.exclusive FROM interval_mean_summary m
		JOIN interval_total_summary s ON s.interval_event = m.interval_event AND s.metric = m.metric
		JOIN timer_callpath c ON c.id = m.interval_event JOIN timer t ON t.id = c.timer
		WHERE t.name = 'MPI_Finalize()' AND c.parent IS NULL`).Scan(&mean, &total)
	if err != nil {
		t.Fatal(err)
	}
	time := tr.Metric("TIME")
	root := tr.Timer("MPI_Finalize()").Root()
	if want := tr.Thread(taudb.MeanWithoutNulls).CallDataFor(root).Value(time).Inclusive; mean != want {
		t.Errorf("interval_mean_summary inclusive = %v, Go mean %v", mean, want)
	}
	if want := tr.Thread(taudb.Total).CallDataFor(root).Value(time).Exclusive; total != want {
		t.Errorf("interval_total_summary exclusive = %v, Go total %v", total, want)
	}

	dir := t.TempDir()
	if out, err = runTaudbCmd(t, "taudb", "export", id, "--out", dir); err != nil {
		t.Fatalf("export: %v", err)
	}
	back, err := taudb.ReadDir(dir, "cpi")
	if err != nil {
		t.Fatalf("exported profiles do not parse: %v", err)
	}
	if _, err := hatchetread.Read(dir); err != nil {
		t.Errorf("exported profiles break Hatchet's rules: %v", err)
	}
	if len(back.Callpaths) != len(tr.Callpaths) || back.TotalThreads != 4 {
		t.Errorf("exported trial has %d call paths and %d threads, want %d and 4", len(back.Callpaths), back.TotalThreads, len(tr.Callpaths))
	}
}

func TestTaudbErrors(t *testing.T) {
	t.Setenv(taudbDSNEnv, "")
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"no dsn", []string{"taudb", "list"}, "KIPIMO_TAUDB_DSN"},
		{"bad dir", []string{"taudb", "load", "--dsn", "postgres://127.0.0.1:1/x", "--name", "x", "/nonexistent"}, "/nonexistent"},
		{"bad format", []string{"taudb", "load", "--dsn", "postgres://127.0.0.1:1/x", "--format", "gprof", cpiDir}, "want one of tau, ppk, xml, caliper, caliper-json"},
		{"forced format", []string{"taudb", "load", "--dsn", "postgres://127.0.0.1:1/x", "--format", "ppk", filepath.Join(xmlDir, "tauprofile-weighted.xml")},
			`tauprofile-weighted.xml: byte 0: expected "PPK"`},
		{"trace not profile", []string{"taudb", "load", "--dsn", "postgres://127.0.0.1:1/x", filepath.Join(formatsDir, "caliper", "160809-094411_72298_fuu1NeAHT2US.cali")},
			"is a Caliper event trace"},
		{"bad caliper line", []string{"taudb", "load", "--dsn", "postgres://127.0.0.1:1/x", "--format", "caliper", filepath.Join(formatsDir, "SOURCES.txt")},
			"SOURCES.txt:1: column"},
		{"bad id", []string{"taudb", "show", "--dsn", "postgres://127.0.0.1:1/x", "abc"}, "positive number"},
		{"undetectable", []string{"taudb", "load", "--dsn", "postgres://127.0.0.1:1/x", filepath.Join(formatsDir, "SOURCES.txt")}, "cannot tell the profile format from its first"},
		{"undetectable says --format", []string{"taudb", "load", "--dsn", "postgres://127.0.0.1:1/x", filepath.Join(formatsDir, "SOURCES.txt")}, "; pass --format"},
		{"no out", []string{"taudb", "export", "--dsn", "postgres://127.0.0.1:1/x", "1"}, "--out is required"},
		{"bad filter", []string{"taudb", "list", "--dsn", "postgres://127.0.0.1:1/x", "--metadata", "novalue"}, "KEY=VALUE"},
		{"unreachable", []string{"taudb", "configure", "--dsn", "postgres://postgres@127.0.0.1:1/x?connect_timeout=2"}, "connect"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := runTaudbCmd(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

// TestTaudbLoadFormats loads one real file of each format through the
// command, by detection and by --format, and checks what TAUdb holds: the
// thread count of each file (the ppk header's, the XML's <thread> blocks,
// one Caliper rank), the data source, and that export writes profiles of the
// same threads.
func TestTaudbLoadFormats(t *testing.T) {
	dsn := pgtest.Isolated(t)
	if _, err := runTaudbCmd(t, "taudb", "configure", "--dsn", dsn); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, path, format string
		threads, source    int
	}{
		{"ppk-16", filepath.Join(ppkDir, "LoadImbalance-16.ppk"), "", 16, 0},
		{"ppk-32", filepath.Join(ppkDir, "LoadImbalance-32.ppk"), "ppk", 32, 0},
		{"xml-merged", filepath.Join(xmlDir, "tauprofile-weighted.xml"), "", 8, 10},
		{"caliper-lulesh", filepath.Join(formatsDir, "caliper", "lulesh-annotation-profile.cali"), "caliper", 1, 999},
	}
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"taudb", "load", "--dsn", dsn, "--name", tc.name, tc.path}
			if tc.format != "" {
				args = append(args, "--format", tc.format)
			}
			out, err := runTaudbCmd(t, args...)
			if err != nil {
				t.Fatalf("load: %v", err)
			}
			m := regexp.MustCompile(`loaded trial (\d+) "` + tc.name + `": (\d+) threads`).FindStringSubmatch(out)
			if m == nil || m[2] != strconv.Itoa(tc.threads) {
				t.Fatalf("load output %q, want %d threads", out, tc.threads)
			}
			var threads, source, realRows int
			err = conn.QueryRow(context.Background(), `SELECT total_threads, data_source,
				(SELECT count(*) FROM thread h WHERE h.trial = t.id AND h.thread_index >= 0) FROM trial t WHERE t.id = $1`, m[1]).Scan(&threads, &source, &realRows)
			if err != nil {
				t.Fatal(err)
			}
			if threads != tc.threads || realRows != tc.threads || source != tc.source {
				t.Errorf("stored trial: %d threads (%d rows), data source %d; want %d, %d", threads, realRows, source, tc.threads, tc.source)
			}
			dir := t.TempDir()
			if _, err := runTaudbCmd(t, "taudb", "export", "--dsn", dsn, m[1], "--out", dir); err != nil {
				t.Fatal(err)
			}
			back, err := taudb.ReadDir(dir, tc.name)
			if err != nil {
				t.Fatalf("exported profiles do not parse: %v", err)
			}
			if back.TotalThreads != tc.threads {
				t.Errorf("exported %d threads, want %d", back.TotalThreads, tc.threads)
			}
		})
	}
}

// taudb load takes a Kipimo run's directory, as kipimo diff does, named
// after the run, and refuses a trial name the TAUdb already has.
func TestTaudbLoadRunDirOnce(t *testing.T) {
	dsn := pgtest.Isolated(t)
	if _, err := runTaudbCmd(t, "taudb", "configure", "--dsn", dsn); err != nil {
		t.Fatal(err)
	}
	runDir := filepath.Join(t.TempDir(), "myrun")
	if err := os.CopyFS(filepath.Join(runDir, "profiles"), os.DirFS(cpiDir)); err != nil {
		t.Fatal(err)
	}
	out, err := runTaudbCmd(t, "taudb", "load", "--dsn", dsn, runDir)
	if err != nil || !strings.Contains(out, `"myrun": 4 threads`) {
		t.Fatalf("load of a run directory: %q, %v", out, err)
	}
	_, err = runTaudbCmd(t, "taudb", "load", "--dsn", dsn, runDir)
	if err == nil || !regexp.MustCompile(`already has a trial named "myrun" \(id \d+\).*--name`).MatchString(err.Error()) {
		t.Errorf("second load under the same name: %v, want a refusal naming the trial and --name", err)
	}
	if out, err := runTaudbCmd(t, "taudb", "load", "--dsn", dsn, "--name", "myrun-2", runDir); err != nil || !strings.Contains(out, `"myrun-2"`) {
		t.Errorf("load under another name: %q, %v", out, err)
	}
	out, err = runTaudbCmd(t, "taudb", "list", "--dsn", dsn, "--name", "myrun")
	if err != nil || strings.Count(out, "myrun") != 1 {
		t.Errorf("trials named myrun: %q, %v; want one", out, err)
	}
}
