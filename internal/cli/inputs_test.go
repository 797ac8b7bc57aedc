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

// The input format comes from the files' names when --format is not given;
// names that do not tell it, or tell different ones, ask for --format.
func TestInputFormat(t *testing.T) {
	dir := t.TempDir()
	touch := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	frames, cali, txt := touch("rank-0.frames"), touch("run.cali"), touch("notes.txt")
	for _, tc := range []struct {
		name   string
		inputs []string
		want   string
		err    string
	}{
		{"frames", []string{frames}, "frames", ""},
		{"caliper", []string{cali}, "caliper", ""},
		{"unknown", []string{txt}, "", "give --format"},
		{"mixed", []string{frames, cali}, "", "different formats"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := inputFormat(tc.inputs)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Errorf("%v, want an error saying %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("%q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// kipimo run takes trace files as arguments, tells their format from their
// names, and says which it read.
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
	root.SetArgs(append([]string{"run", "--out", t.TempDir(), "--run", "args", "--json"}, files...))
	if err := root.Execute(); err != nil {
		t.Fatalf("run: %v\n%s", err, errb.String())
	}
	if !strings.Contains(errb.String(), "input format: frames, from the names") {
		t.Errorf("stderr %q: want the format told by the names", errb.String())
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

// kipimo run of an empty trace fails, as replay does, and leaves nothing.
func TestRunEmptyInput(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty.frames")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out")
	_, stderr, err := runKipimo(t, nil, "run", "--out", out, "--run", "empty", empty)
	if err == nil || !strings.Contains(err.Error(), "the input holds no frames") {
		t.Errorf("run of an empty file: %v", err)
	}
	if !strings.Contains(stderr, "removed "+filepath.Join(out, "empty")) {
		t.Errorf("stderr does not say the run's directory was removed:\n%s", stderr)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("%s left behind (%v)", out, err)
	}
}
