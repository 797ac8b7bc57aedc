package hatchetread

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const header = "# Name Calls Subrs Excl Incl ProfileCalls # <metadata><attribute><name>Metric Name</name><value>TIME</value></attribute></metadata>\n"

func writeDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func profile(lines ...string) string {
	var b strings.Builder
	b.WriteString(strconv.Itoa(len(lines)) + " templated_functions_MULTI_TIME\n" + header)
	for _, l := range lines {
		b.WriteString(l + "\n")
	}
	b.WriteString("0 aggregates\n")
	return b.String()
}

func TestRules(t *testing.T) {
	good := profile(
		`"main" 1 1 10 100 0 GROUP="TAU_DEFAULT" `,
		`"solve" 2 0 90 90 0 GROUP="TAU_USER" `,
		`"main => solve" 2 0 90 90 0 GROUP="TAU_USER|TAU_CALLPATH" `,
	)
	tests := []struct {
		name  string
		files map[string]string
		want  string // substring of the error; "" for none
	}{
		{"root and full paths", map[string]string{"profile.0.0.0": good}, ""},
		{"two-level path without its root", map[string]string{"profile.0.0.0": profile(
			`"main" 1 1 10 100 0 GROUP="TAU_DEFAULT" `,
			`"setup => read_input" 1 0 5 5 0 GROUP="TAU_USER|TAU_CALLPATH" `,
		)}, "rule 3"},
		{"missing prefix", map[string]string{"profile.0.0.0": profile(
			`"main" 1 1 10 100 0 GROUP="TAU_DEFAULT" `,
			`"main => a => b" 1 0 5 5 0 GROUP="TAU_USER|TAU_CALLPATH" `,
		)}, "rule 4"},
		{"root not an integer", map[string]string{"profile.0.0.0": profile(
			`"main" 1 1 10.5 100 0 GROUP="TAU_DEFAULT" `,
		)}, "rule 2"},
		{"call path first", map[string]string{"profile.0.0.0": profile(
			`"main => solve" 1 1 10 100 0 GROUP="TAU_DEFAULT" `,
		)}, "rule 2"},
		{"path twice", map[string]string{"profile.0.0.0": profile(
			`"main" 1 1 10 100 0 GROUP="TAU_DEFAULT" `,
			`"main => solve" 2 0 90 90 0 GROUP="TAU_USER|TAU_CALLPATH" `,
			`"main => solve" 2 0 90 90 0 GROUP="TAU_USER|TAU_CALLPATH" `,
		)}, "rule 5"},
		{"metric name not first", map[string]string{"profile.0.0.0": strings.Replace(good, "<name>Metric Name</name><value>TIME</value>", "<name>pid</name><value>1</value></attribute><attribute><name>Metric Name</name><value>TIME</value>", 1)}, "rule 1"},
		{"a root read in an earlier file", map[string]string{
			"profile.0.0.0": good,
			"profile.0.0.1": profile(
				`"worker" 1 1 10 100 0 GROUP="TAU_DEFAULT" `,
				`"main => solve" 2 0 90 90 0 GROUP="TAU_USER|TAU_CALLPATH" `,
				`"main" 1 0 1 1 0 GROUP="TAU_USER" `,
			),
		}, "rule 4"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g, err := Read(writeDir(t, tc.files))
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if len(g.Roots) != 1 || len(g.Roots[0].Children) != 1 || g.Roots[0].Children[0].Path[1] != "solve" {
					t.Errorf("tree:\n%s", g.Tree())
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one about %s", err, tc.want)
			}
		})
	}
}

// The profiles Hatchet's own tests read (TAU 2.x, cpi on 4 MPI ranks) pass.
func TestHatchetFixture(t *testing.T) {
	dir := "../../../shared/fixtures/tau/hatchet-tau-cpi-mpi"
	if _, err := os.Stat(dir); err != nil {
		t.Skipf("fixture: %v", err)
	}
	g, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Roots) != 1 || g.Roots[0].Path[0] != ".TAU application" || len(g.Roots[0].Rows) != 4 {
		t.Errorf("roots %v:\n%s", g.Roots, g.Tree())
	}
}
