package run

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/format/tauprofile"
	"github.com/kipimo-hpc/kipimo/internal/instrument"
	"github.com/kipimo-hpc/kipimo/internal/mpitest"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// liveApp is one of Debian's MPI applications, run on 2 ranks with a small
// input from ../instrument/testdata.
type liveApp struct {
	tool  string   // the program, on PATH
	input string   // its input file, copied into the directory it runs in
	args  []string // after the program
	// result is what it computed, without timings, from its output and
	// the files it wrote in dir: equal with and without Kipimo.
	result func(t *testing.T, dir, out string) string
}

var (
	nwchemEnergyRE = regexp.MustCompile(`Total SCF energy =\s+(-?[0-9]+\.[0-9]{6})`)
	liveApps       = []liveApp{
		{tool: "lmp", input: "lj.in", args: []string{"-in", "lj.in", "-log", "none", "-var", "steps", "600"},
			result: func(t *testing.T, dir, out string) string { return mpitest.LAMMPSThermo(out) }},
		// A 400 x 400 HPL problem, with the other tests sized from it.
		{tool: "hpcc", input: "hpccinf.txt", result: func(t *testing.T, dir, out string) string {
			b, err := os.ReadFile(filepath.Join(dir, "hpccoutf.txt"))
			if err != nil {
				t.Fatal(err)
			}
			var checks []string
			for _, line := range strings.Split(string(b), "\n") {
				if strings.Contains(line, "passed") || strings.Contains(line, "FAILED") || strings.Contains(line, "errors in") {
					checks = append(checks, strings.TrimSpace(line))
				}
			}
			if err := os.Remove(filepath.Join(dir, "hpccoutf.txt")); err != nil { // HPCC appends to it
				t.Fatal(err)
			}
			return strings.Join(checks, "\n")
		}},
		// Water's SCF energy in the STO-3G basis, to 1e-6 Hartree (the
		// order in which Global Arrays hands out tasks, and so sums,
		// differs between runs).
		{tool: "nwchem", input: "h2o.nw", args: []string{"h2o.nw"}, result: func(t *testing.T, dir, out string) string {
			m := nwchemEnergyRE.FindStringSubmatch(out)
			if m == nil {
				return ""
			}
			return m[1]
		}},
	}
)

// setupApp skips without the application and MPI (failing in CI), holds
// the machine's MPI lock, makes a directory with the application's input
// the working directory, runs the application alone there and returns what
// it computed.
func setupApp(t *testing.T, app liveApp) (dir, plain string) {
	t.Helper()
	mpitest.Require(t, "cc", "mpicc", "mpirun", app.tool)
	mpitest.Lock(t)
	for _, kv := range mpitest.Env(nil) {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	dir = t.TempDir()
	in, err := os.ReadFile(filepath.Join("..", "instrument", "testdata", app.input))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, app.input), in, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	out, err := exec.Command("mpirun", append([]string{"-np", "2", app.tool}, app.args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s alone: %v\n%s", app.tool, err, out)
	}
	plain = app.result(t, dir, string(out))
	if plain == "" {
		t.Fatalf("%s alone computed nothing recognisable:\n%s", app.tool, out)
	}
	return dir, plain
}

// executeApp runs cfg (a live run of an application) to its end; the
// pipeline stays open until the test ends, for its store.
func executeApp(t *testing.T, cfg Config) (*Pipeline, *Summary) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	cfg.hooks = &testHooks{}
	p, err := Start(ctx, cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(context.Background()) })
	sum, err := p.Execute(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p, sum
}

// profileCalls reads the calls of every function on the flat lines of a
// run's TAU profiles, per rank (the node of profile.N.C.T), all of the
// rank's threads together.
func profileCalls(t *testing.T, dir string) map[int]map[string]int64 {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "profile.*"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no TAU profile in %s (%v)", dir, err)
	}
	out := map[int]map[string]int64{}
	for _, f := range files {
		r, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		pf, err := tauprofile.Parse(r, f)
		r.Close()
		if err != nil {
			t.Fatal(err)
		}
		node, _, _, ok := tauprofile.NCT(filepath.Base(f))
		if !ok {
			t.Fatalf("%s: not a profile.N.C.T name", f)
		}
		if out[node] == nil {
			out[node] = map[string]int64{}
		}
		for _, fl := range pf.Functions {
			if !strings.Contains(fl.Name, "=>") {
				out[node][strings.TrimSpace(fl.Name)] += int64(fl.Calls)
			}
		}
	}
	return out
}

// counted reads what testdata/mpistack.c counted on each rank: "call NAME N".
func counted(t *testing.T, dir string, ranks int) []map[string]int64 {
	t.Helper()
	out := make([]map[string]int64, ranks)
	for r := range ranks {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("count.%d", r)))
		if err != nil {
			t.Fatalf("the counter wrote nothing for rank %d: %v", r, err)
		}
		out[r] = map[string]int64{}
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			var name string
			var n int64
			if _, err := fmt.Sscanf(line, "call %s %d", &name, &n); err != nil {
				t.Fatalf("count.%d: %q: %v", r, line, err)
			}
			out[r][name] = n
		}
	}
	return out
}

// standing are the anomalies that stand after the end-of-run relabelling
// of a finished run whose pipeline is still open.
func standing(t *testing.T, p *Pipeline) []provenance.Exec {
	t.Helper()
	final := p.finalLabel()
	if final == nil {
		t.Fatal("no final model to relabel with")
	}
	var out []provenance.Exec
	q := provenance.Query{Kind: provenance.KindAnomalies, Limit: provenance.NoLimit}
	if err := p.store.Each(context.Background(), q, func(e provenance.Exec) error {
		if final(&e) {
			out = append(out, e)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// cause is what an anomaly's explanation says caused it, where it says.
func cause(e provenance.Exec) string {
	text := ""
	if e.Explanation != nil {
		text = e.Explanation.Text
	}
	switch {
	case strings.Contains(text, "the rank was preempted"):
		return "preemption"
	case strings.Contains(text, "(warm-up)"):
		return "warm-up"
	case strings.Contains(text, "unusually fast"):
		return "unusually fast"
	}
	return "magnitude only"
}

// LAMMPS, HPCC and NWChem, unmodified, live on 2 ranks with default
// options and nothing injected, with an independent MPI counter
// (../instrument/testdata/mpistack.c) preloaded in front of the library:
// each computes what it computes alone, nothing is dropped, and every
// MPI function's calls in the run's TAU profiles equal, rank by rank, what
// the counter counted in the same run (summarised polling calls included).
// Every anomaly that stands has its explanation; how many stand per 10,000
// calls, and their causes, are logged (docs/evaluation.md has the figures).
func TestLiveAppsProfilesCountEveryCall(t *testing.T) {
	for _, app := range liveApps {
		t.Run(app.tool, func(t *testing.T) {
			src, err := filepath.Abs(filepath.Join("..", "instrument", "testdata", "mpistack.c"))
			if err != nil {
				t.Fatal(err)
			}
			dir, plain := setupApp(t, app)
			counter := filepath.Join(t.TempDir(), "libmpistack.so")
			if b, err := exec.Command("mpicc", "-O1", "-fPIC", "-shared", "-o", counter, src, "-ldl").CombinedOutput(); err != nil {
				t.Fatalf("build the counter: %v\n%s", err, b)
			}
			// The library the run will load, so that the counter can
			// be preloaded in front of it on the ranks.
			opts := instrument.BuildOptions{CacheDir: filepath.Join(os.TempDir(), "kipimo-apps-live-test-cache")}
			command := append([]string{"mpirun", "-np", "2", app.tool}, app.args...)
			lib, err := buildLibrary(context.Background(), LiveConfig{Command: command, Build: opts})
			if err != nil {
				t.Fatal(err)
			}
			countDir := t.TempDir()
			command = append([]string{"mpirun", "-np", "2", "-x", "LD_PRELOAD=" + counter + " " + lib.Preload(),
				"-x", "MPICOUNT_DIR=" + countDir, app.tool}, app.args...)
			var out strings.Builder
			cfg := Config{Out: t.TempDir(), RunID: app.tool, Live: LiveConfig{Command: command, Build: opts, Stdout: &out, Stderr: &out}}
			p, sum := executeApp(t, cfg)
			l := sum.Live
			if l == nil || l.ExitCode != 0 || sum.Ranks != 2 {
				t.Fatalf("live report %+v with %d ranks: want 2 ranks, exit status 0\n%s", l, sum.Ranks, out.String())
			}
			if got := app.result(t, dir, out.String()); got != plain {
				t.Errorf("%s computed under Kipimo:\n%s\nalone:\n%s", app.tool, got, plain)
			}
			if l.FramesDropped != 0 || l.EventsDropped != 0 || sum.SourceDroppedCalls != 0 || l.RanksNotEnded != 0 {
				t.Errorf("live report %+v, %d calls dropped: want nothing dropped, every stream ended", l, sum.SourceDroppedCalls)
			}
			profiles := profileCalls(t, sum.ProfilesDir)
			var calls int64
			for r, want := range counted(t, countDir, 2) {
				got := profiles[r]
				for fn, n := range want {
					calls += n
					if got[fn] != n {
						t.Errorf("rank %d: %s: %d calls in the profiles, the counter counted %d in the same run", r, fn, got[fn], n)
					}
				}
				for fn, n := range got {
					if _, ok := want[fn]; !ok && strings.HasPrefix(fn, "MPI_") {
						t.Errorf("rank %d: %s: %d calls in the profiles, a function the counter does not count: add it there", r, fn, n)
					}
				}
			}
			stand := standing(t, p)
			if sum.AnomaliesFinal == nil || uint64(len(stand)) != *sum.AnomaliesFinal {
				t.Errorf("%d anomalies stand in the store, the summary says %v", len(stand), sum.AnomaliesFinal)
			}
			causes := map[string]int{}
			byFunc := map[string]int{}
			for _, e := range stand {
				if e.Explanation == nil || e.Explanation.Text == "" {
					t.Errorf("%s %s stands without an explanation", e.Func, e.EventID)
				}
				causes[cause(e)]++
				byFunc[e.Func]++
			}
			var funcs []string
			for fn, n := range byFunc {
				funcs = append(funcs, fmt.Sprintf("%s %d", fn, n))
			}
			slices.Sort(funcs)
			load, _ := os.ReadFile("/proc/loadavg")
			t.Logf("%s: %d MPI calls (%d executions, %d summarised); %d flagged live, %d stand: %.2f per 10,000 calls, %.1f per 10,000 executions; causes %v; by function %s; load average %s",
				app.tool, calls, sum.Executions, sum.SummarisedCalls, sum.Anomalies, len(stand),
				1e4*float64(len(stand))/float64(calls), 1e4*float64(len(stand))/float64(sum.Executions), causes,
				strings.Join(funcs, ", "), strings.TrimSpace(string(load)))
		})
	}
}

// loadBelowCores reports whether the machine's load average over the last
// minute is below its number of cores (false where /proc/loadavg is not
// there).
func loadBelowCores() (bool, string) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return false, "unknown"
	}
	var load float64
	if _, err := fmt.Sscanf(string(b), "%g", &load); err != nil {
		return false, "unknown"
	}
	return load < float64(runtime.NumCPU()), fmt.Sprintf("%.1f on %d cores", load, runtime.NumCPU())
}

// HPCC, unmodified, live on 2 ranks with a rare stall injected: 50 ms in
// 0.1% of its MPI_Isend calls (whose natural range ends below a
// millisecond), about 17 in the run. Every stall is found (recall >= 0.9)
// and the summary scores them against the injected truth. Precision is
// asserted (>= 0.9) only on a machine that is not oversubscribed (load
// average below its cores, before and after): on an oversubscribed one the
// scheduler itself stretches a few natural MPI_Isend calls to tens of
// milliseconds, flagged rightly as slow but not injected
// (docs/evaluation.md has both figures).
func TestLiveHPCCRareStall(t *testing.T) {
	app := liveApps[1]
	dir, plain := setupApp(t, app)
	quietBefore, loadBefore := loadBelowCores()
	var out strings.Builder
	cfg := Config{Out: t.TempDir(), RunID: "hpcc-stall", Live: LiveConfig{
		Command: []string{"mpirun", "-np", "2", "hpcc"}, Seed: 1,
		Inject: []instrument.Injection{{Func: "MPI_Isend", Prob: 0.001, Delay: 50 * time.Millisecond}},
		Build:  instrument.BuildOptions{CacheDir: filepath.Join(os.TempDir(), "kipimo-apps-live-test-cache")}, Stdout: &out, Stderr: &out,
	}}
	_, sum := executeApp(t, cfg)
	quietAfter, loadAfter := loadBelowCores()
	if l := sum.Live; l == nil || l.ExitCode != 0 || sum.Ranks != 2 {
		t.Fatalf("live report %+v with %d ranks: want 2 ranks, exit status 0\n%s", l, sum.Ranks, out.String())
	}
	if got := app.result(t, dir, out.String()); got != plain {
		t.Errorf("hpcc verified under Kipimo:\n%s\nalone:\n%s", got, plain)
	}
	sc := sum.Score
	if sc == nil || sc.Injected < 8 || sc.Recall < 0.9 {
		t.Fatalf("score %+v: want at least 8 injected stalls, recall >= 0.9", sc)
	}
	if quietBefore && quietAfter && sc.Precision < 0.9 {
		t.Errorf("precision %.3f (%d flagged, %d injected) on a machine with load %s, then %s: want >= 0.9",
			sc.Precision, sc.Flagged, sc.Injected, loadBefore, loadAfter)
	}
	t.Logf("injected %d, flagged %d (precision %.3f, recall %.3f), %d propagated, %d in other functions; load %s, then %s",
		sc.Injected, sc.Flagged, sc.Precision, sc.Recall, sc.Propagated, sc.FlaggedOtherFunctions, loadBefore, loadAfter)
}
