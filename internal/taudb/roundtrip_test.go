package taudb

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// fixtures are the real TAU profile directories under testdata/profiles.
var fixtures = []struct {
	name string
	dir  string
	ref  string // taudb-ref directory, if TAU's loader output is known
}{
	{"hatchet-cpi-mpi", "hatchet-tau-cpi-mpi", "A"},
	{"taudb-c-api-openmp", "tau2-taudb-c-api-parse-test", "C"},
	{"wrap-params", "tau2-examples-wrap", "D"},
}

func readFixture(t testing.TB, dir string) *Trial {
	t.Helper()
	tr, err := ReadDir(filepath.Join(profilesDir, dir), dir)
	if err != nil {
		t.Fatalf("ReadDir: %v", err)
	}
	return tr
}

func TestWriteReproducesFixtures(t *testing.T) {
	for _, fx := range fixtures {
		t.Run(fx.name, func(t *testing.T) {
			tr := readFixture(t, fx.dir)
			out := t.TempDir()
			if err := WriteDir(out, tr); err != nil {
				t.Fatal(err)
			}
			src := filepath.Join(profilesDir, fx.dir)
			entries, err := os.ReadDir(src)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				want, _ := os.ReadFile(filepath.Join(src, e.Name()))
				got, err := os.ReadFile(filepath.Join(out, e.Name()))
				if err != nil {
					t.Fatalf("%s not written: %v", e.Name(), err)
				}
				if !bytes.Equal(got, want) {
					t.Errorf("%s differs from TAU's file:\n%s", e.Name(), firstDiff(got, want))
				}
			}
		})
	}
}

func firstDiff(got, want []byte) string {
	gl, wl := bytes.Split(got, []byte("\n")), bytes.Split(want, []byte("\n"))
	for i := 0; i < len(gl) || i < len(wl); i++ {
		var g, w []byte
		if i < len(gl) {
			g = gl[i]
		}
		if i < len(wl) {
			w = wl[i]
		}
		if !bytes.Equal(g, w) {
			return "line " + itoa(i+1) + ":\n got  " + string(g) + "\n want " + string(w)
		}
	}
	return "(equal lines, different bytes)"
}

func itoa(i int) string { return string(AppendG(nil, float64(i), 16)) }
