package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runCLI(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	root := NewRoot(&out, &errOut)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), errOut.String(), err
}

func TestFramesConvert(t *testing.T) {
	cases := []struct {
		name, format, input string
		gpu                 int
	}{
		{"chrome", "chrome", filepath.Join("..", "replay", "chrome", "testdata", "cuda_event_sync__event_sync_trace.json.gz"), 1},
		{"tau", "tau", filepath.Join("..", "replay", "tautrace", "testdata", "opencl_course_L5", "tau.trc"), 1},
		{"caliper", "caliper", filepath.Join("..", "replay", "caliper", "testdata", "160809-094411_72298_fuu1NeAHT2US.cali"), 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			// Flags after the positional argument work too.
			out, _, err := runCLI(t, "frames", "convert", tc.input, "--format", tc.format, "--out", dir, "--json")
			if err != nil {
				t.Fatal(err)
			}
			if strings.Count(out, "\n") != 1 {
				t.Errorf("want one line, got %q", out)
			}
			var s convertSummary
			if err := json.Unmarshal([]byte(out), &s); err != nil {
				t.Fatalf("summary %q: %v", out, err)
			}
			if s.Frames == 0 || s.Events == 0 || s.Executions == 0 || s.Threads == 0 || s.GPUThreads != tc.gpu {
				t.Errorf("summary %+v", s)
			}
			st, err := os.Stat(filepath.Join(dir, "rank-0.frames"))
			if err != nil || st.Size() == 0 {
				t.Fatalf("rank-0.frames: %v", err)
			}
			// The files dump as frames.
			dump, _, err := runCLI(t, "frames", "dump", filepath.Join(dir, "rank-0.frames"))
			if err != nil || strings.Count(dump, "\n") != s.Frames {
				t.Errorf("dump: %d lines for %d frames, err %v", strings.Count(dump, "\n"), s.Frames, err)
			}
		})
	}
}

func TestFramesConvertErrors(t *testing.T) {
	in := filepath.Join("..", "replay", "chrome", "testdata", "cuda_event_sync__event_sync_trace.json.gz")
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"no format", []string{"frames", "convert", "--out", "x", in}, "format"},
		{"no out", []string{"frames", "convert", "--format", "chrome", in}, "--out DIR is required"},
		{"bad format", []string{"frames", "convert", "--format", "otf2", "--out", "x", in}, `unknown format "otf2"`},
		{"missing file", []string{"frames", "convert", "--format", "chrome", "--out", "x", "nope.json"}, "nope.json"},
		{"bad step", []string{"frames", "convert", "--format", "chrome", "--out", "x", "--step", "-1s", in}, "--step must be positive"},
		{"not a trace", []string{"frames", "convert", "--format", "chrome", "--out", "x", "frames_convert_test.go"}, "not a JSON trace"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := runCLI(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want %q", err, tc.want)
			}
		})
	}
}
