package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestMatchInputs(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"b.json", "a.json", ".hidden"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	empty := t.TempDir()
	tests := []struct {
		name string
		args []string
		want []string
		err  string
	}{
		{"a file", []string{filepath.Join(dir, "b.json")}, []string{filepath.Join(dir, "b.json")}, ""},
		{"a directory, sorted, hidden files left out", []string{dir}, []string{filepath.Join(dir, "a.json"), filepath.Join(dir, "b.json")}, ""},
		{"a missing file", []string{filepath.Join(dir, "nope.json")}, nil, "nope.json"},
		{"an empty directory", []string{empty}, nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := matchInputs(tc.args)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil || strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// kipimo run takes trace files as arguments and says which it read.
func TestRunTakesFilesAsArguments(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the pipeline")
	}
	frames := t.TempDir()
	gen := NewRoot(&bytes.Buffer{}, &bytes.Buffer{})
	gen.SetArgs([]string{"gen", "--ranks", "2", "--steps", "3", "--events-per-step", "2000", "--out", frames})
	if err := gen.Execute(); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(frames, "rank-*.frames"))
	if len(files) != 2 {
		t.Fatalf("gen wrote %v", files)
	}
	var out, errb bytes.Buffer
	root := NewRoot(&out, &errb)
	root.SetArgs(append([]string{"run", "--out", t.TempDir(), "--run", "args", "--json", "--format", "frames"}, files...))
	if err := root.Execute(); err != nil {
		t.Fatalf("run: %v\n%s", err, errb.String())
	}
	if !strings.Contains(errb.String(), "input: 2 files: "+files[0]) {
		t.Errorf("stderr %q: want the matched files named", errb.String())
	}
	var sum struct {
		Ranks int `json:"ranks"`
	}
	if err := json.Unmarshal(out.Bytes(), &sum); err != nil || sum.Ranks != 2 {
		t.Errorf("summary %q (%v): want 2 ranks", out.String(), err)
	}
}
