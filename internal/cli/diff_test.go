package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/taudb"
	"github.com/kipimo-hpc/kipimo/internal/taudb/pgtest"
)

// loadImbalance is TAU's LoadImbalance example at 16 and 32 ranks, kept with
// the diff package's fixtures.
var loadImbalance = filepath.Join("..", "diff", "testdata", "loadimbalance")

func runDiffCmd(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	root := NewRoot(&out, &errOut)
	root.SetArgs(append([]string{"diff"}, args...))
	err = root.ExecuteContext(context.Background())
	return out.String(), errOut.String(), err
}

type diffDoc struct {
	Count     int `json:"count"`
	Functions []struct {
		Name      string   `json:"name"`
		A         float64  `json:"a"`
		B         float64  `json:"b"`
		Ratio     *float64 `json:"ratio"`
		ThreadsA  int      `json:"threads_a"`
		ThreadsB  int      `json:"threads_b"`
		Change    string   `json:"change"`
		Anomalies *int64   `json:"anomalies"`
	} `json:"functions"`
}

// The top three changes of 16.ppk to 32.ppk, with the means per thread a
// separate Python decoder of the .ppk layout found.
func TestDiffCommandPPK(t *testing.T) {
	a, b := filepath.Join(loadImbalance, "16.ppk"), filepath.Join(loadImbalance, "32.ppk")
	svg := filepath.Join(t.TempDir(), "top.svg")
	out, stderr, err := runDiffCmd(t, "--top", "3", "--json", "--svg", svg, a, b)
	if err != nil {
		t.Fatal(err)
	}
	var doc diffDoc
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("--json output is not one JSON document: %v\n%s", err, out)
	}
	wants := []struct {
		name string
		a, b float64
	}{
		{"MPI_Sendrecv()", 35227067.625, 22694146.53125},
		{"MPI_Waitall()", 24474396.9375, 15193218.65625},
		{"MPI_Bcast()", 3068727.5, 3338044.90625},
	}
	if doc.Count != 645 || len(doc.Functions) != len(wants) {
		t.Fatalf("%d of %d functions, want 3 of 645", len(doc.Functions), doc.Count)
	}
	for i, w := range wants {
		f := doc.Functions[i]
		if f.Name != w.name || math.Abs(f.A-w.a) > 1e-6 || math.Abs(f.B-w.b) > 1e-6 || f.Ratio == nil || math.Abs(*f.Ratio-w.b/w.a) > 1e-12 {
			t.Errorf("row %d: %+v, want %s %v -> %v", i, f, w.name, w.a, w.b)
		}
	}
	for _, s := range []string{"A: read " + a + ": 16 threads", "B: read " + b + ": 32 threads"} {
		if !strings.Contains(stderr, s) {
			t.Errorf("stderr %q lacks %q", stderr, s)
		}
	}
	data, err := os.ReadFile(svg)
	if err != nil {
		t.Fatal(err)
	}
	if err := xml.Unmarshal(data, new(struct{})); err != nil {
		t.Errorf("--svg wrote a file that does not parse as XML: %v", err)
	}
	if n := strings.Count(string(data), "fill:#4C72B0"); n != 3+1 {
		t.Errorf("%d A bars in the SVG (with the legend's), want 4", n)
	}

	out, _, err = runDiffCmd(t, "--top", "2", a, b)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"A: " + a + " (ppk, 16 threads)", "Mean exclusive TIME per thread", "Welch's t-test", "Showing 2 of 645 functions", "35.23s", "22.69s", "MPI_Waitall()"} {
		if !strings.Contains(out, s) {
			t.Errorf("text output lacks %q:\n%s", s, out)
		}
	}
}

func TestDiffCommandErrors(t *testing.T) {
	t.Setenv(taudbDSNEnv, "")
	a := filepath.Join(loadImbalance, "16.ppk")
	missing := filepath.Join(t.TempDir(), "nothing-here")
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"one operand", []string{a}, "accepts 2 arg(s)"},
		{"unknown quantity", []string{"--metric", "median", a, a}, `--metric: unknown quantity "median"`},
		{"negative top", []string{"--top", "-1", a, a}, "--top -1"},
		{"bad alpha", []string{"--alpha", "1.5", a, a}, "--alpha 1.5"},
		{"missing file", []string{a, missing}, "nothing-here"},
		{"anomalies of ppk", []string{"--metric", "anomalies", a, a}, "has no anomaly counts"},
		{"taudb without a database", []string{"taudb:3", a}, "--dsn"},
		{"unknown TAU metric", []string{"--tau-metric", "PAPI_L2_DCM", a, a}, `metric "PAPI_L2_DCM"`},
		{"undetectable", []string{a, filepath.Join(formatsDir, "SOURCES.txt")}, "kipimo diff takes a format as FORMAT:PATH"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := runDiffCmd(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
			if err != nil && strings.Contains(err.Error(), "--format") {
				t.Errorf("error %v suggests --format, which diff has not", err)
			}
		})
	}
}

// A trial stored in a TAUdb and read back compares equal to the directory
// it was loaded from: every ratio 1, no change beyond the spread; trials are
// found by id and by name.
func TestDiffCommandTAUdb(t *testing.T) {
	dsn := pgtest.Isolated(t)
	if _, err := runTaudbCmd(t, "taudb", "configure", "--dsn", dsn); err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	for _, name := range []string{"cpi-a", "cpi-b"} {
		out, err := runTaudbCmd(t, "taudb", "load", "--dsn", dsn, "--name", name, cpiDir)
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`loaded trial (\d+)`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("load output %q", out)
		}
		ids[name] = m[1]
	}
	// A second trial named cpi-b, as TAU's own loader stores one (kipimo
	// taudb load refuses a name the TAUdb has).
	ctx := context.Background()
	st, err := taudb.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := taudb.LoadPathContext(ctx, cpiDir, taudb.FormatTAU)
	if err != nil {
		t.Fatal(err)
	}
	tr.Name = "cpi-b"
	if _, err := st.SaveTrial(ctx, tr); err != nil {
		t.Fatal(err)
	}
	st.Close()
	cases := []struct {
		name string
		a, b string
	}{
		{"by id against the directory", "taudb:" + ids["cpi-a"], cpiDir},
		{"by name against an id", "taudb:cpi-a", "taudb:" + ids["cpi-b"]},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, _, err := runDiffCmd(t, "--dsn", dsn, "--json", "--top", "0", tc.a, tc.b)
			if err != nil {
				t.Fatal(err)
			}
			var doc diffDoc
			if err := json.Unmarshal([]byte(out), &doc); err != nil {
				t.Fatal(err)
			}
			// cpi's profiles have 12 flat timers on each of 4 ranks.
			if doc.Count != 12 || len(doc.Functions) != 12 {
				t.Errorf("%d of %d functions, want 12", len(doc.Functions), doc.Count)
			}
			for _, f := range doc.Functions {
				if f.ThreadsA != 4 || f.ThreadsB != 4 || f.A != f.B || f.Change != "same" {
					t.Errorf("%+v: want the same values on 4 threads each", f)
				}
			}
		})
	}
	_, _, err = runDiffCmd(t, "--dsn", dsn, "taudb:cpi-b", cpiDir)
	if err == nil || !strings.Contains(err.Error(), "2 trials are named") {
		t.Errorf("ambiguous name: error %v, want one listing the two trials", err)
	}
	_, _, err = runDiffCmd(t, "--dsn", dsn, "taudb:no-such-trial", cpiDir)
	if err == nil || !strings.Contains(err.Error(), `no trial named "no-such-trial"`) {
		t.Errorf("unknown name: error %v", err)
	}
}
