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
		{"bad format", []string{"frames", "convert", "--format", "paraver", "--out", "x", in}, `unknown format "paraver"`},
		{"wrong format", []string{"frames", "convert", "--format", "otf2", "--out", "x", in}, "not an OTF2 anchor file"},
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

// TestFramesConvertLosses: what a trace held that the frames do not carry is
// printed one line per kind and listed under "losses" in --json; a trace
// with nothing the frames carry fails, naming what it had.
func TestFramesConvertLosses(t *testing.T) {
	field := filepath.Join("..", "replay", "chrome", "testdata", "field")
	metaOnly := filepath.Join(t.TempDir(), "meta.json")
	if err := os.WriteFile(metaOnly, []byte(`{"traceEvents":[{"ph":"M","name":"process_name","pid":1,"args":{"name":"p"}},{"ph":"i","name":"tick","pid":1,"tid":1,"ts":5}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, input string
		// Counted by hand (see internal/replay/chrome/field_test.go).
		lines []string
		fails bool
	}{
		{"unclosed", filepath.Join(field, "catapult_main_thread_has_unclosed_slices.json"), []string{"4 unclosed"}, false},
		{"async", filepath.Join(field, "catapult_nestable_async.json"), []string{"2 instant", "1 unclosed", "1 end-without-begin"}, false},
		{"string and negative times", filepath.Join(field, "openclcourse_L5_Profiling_tau_trace.json"), []string{"1 bad-timestamp", "1 unclosed"}, false},
		{"metadata only", metaOnly, []string{"1 instant"}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, err := runCLI(t, "frames", "convert", "--format", "chrome", "--out", t.TempDir(), tc.input)
			if tc.fails {
				if err == nil || !strings.Contains(err.Error(), "holds no event frames can carry") {
					t.Fatalf("err = %v, want nothing usable", err)
				}
				out = errOut
			} else if err != nil {
				t.Fatal(err)
			}
			lossLines := 0
			for _, l := range strings.Split(out, "\n") {
				if strings.HasPrefix(l, "not in the frames: ") {
					lossLines++
				}
			}
			if lossLines != len(tc.lines) {
				t.Errorf("%d loss lines, want %d:\n%s", lossLines, len(tc.lines), out)
			}
			for _, w := range tc.lines {
				if !strings.Contains(out, "not in the frames: "+w+" (") || !strings.Contains(out, "e.g. ") {
					t.Errorf("no line %q with an example in:\n%s", w, out)
				}
			}
			if tc.fails {
				return
			}
			js, _, err := runCLI(t, "frames", "convert", "--format", "chrome", "--out", t.TempDir(), "--json", tc.input)
			if err != nil {
				t.Fatal(err)
			}
			var s convertSummary
			if err := json.Unmarshal([]byte(js), &s); err != nil {
				t.Fatal(err)
			}
			if len(s.Losses) != len(tc.lines) || s.InputEvents == 0 {
				t.Errorf("--json losses %+v (%d input events), want %d kinds", s.Losses, s.InputEvents, len(tc.lines))
			}
		})
	}
}

// TestBenchScaleFrom: kipimo bench --scale --scale-from replays a real
// trace across each size's ranks from frame files and scores the run
// against the anomalies it injected.
func TestBenchScaleFrom(t *testing.T) {
	trace := filepath.Join("..", "replay", "tautrace", "testdata", "hecatoncheir")
	out, _, err := runCLI(t, "bench", "--scale", "--scale-ranks", "4,8", "--scale-steps", "3",
		"--scale-events-per-step", "2000", "--scale-from", trace, "--scale-format", "tau", "--out", t.TempDir(), "--json")
	if err != nil {
		t.Fatal(err)
	}
	var pts []struct {
		Ranks             int     `json:"ranks"`
		Events            int64   `json:"events"`
		EventsPerRankStep float64 `json:"events_per_rank_step"`
		Precision         float64 `json:"precision"`
		Recall            float64 `json:"recall"`
	}
	if err := json.Unmarshal([]byte(out), &pts); err != nil {
		t.Fatalf("%v in %q", err, out)
	}
	if len(pts) != 2 || pts[0].Ranks != 4 || pts[1].Ranks != 8 {
		t.Fatalf("points %+v, want 4 and 8 ranks", pts)
	}
	for _, p := range pts {
		if p.Events == 0 || p.EventsPerRankStep != float64(p.Events)/float64(p.Ranks*3) {
			t.Errorf("%d ranks: %d events, %.1f per rank-step", p.Ranks, p.Events, p.EventsPerRankStep)
		}
		if p.Recall == 0 || p.Precision == 0 {
			t.Errorf("%d ranks: not scored against the injected anomalies: precision %.3f recall %.3f", p.Ranks, p.Precision, p.Recall)
		}
	}
	if _, _, err := runCLI(t, "bench", "--scale-from", trace); err == nil || !strings.Contains(err.Error(), "--scale") {
		t.Errorf("--scale-from without --scale: %v", err)
	}
}
