package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

// evalTrace is an evaluation trace of the workload package's testdata.
func evalTrace(name string) string {
	return filepath.Join("..", "workload", "testdata", "eval", name)
}

// readFrameFile reads a rank's frame file: its frames, events, and the
// function name of every entry by (tid, ts).
func readFrameFile(t *testing.T, path string) (frames int, events int64, entries map[[2]uint64]string) {
	t.Helper()
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	entries = map[[2]uint64]string{}
	names := map[uint32]string{}
	rd := frame.NewReader(fh)
	var f frame.Frame
	for {
		err := rd.Next(&f)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		frames++
		events += int64(f.NumEvents())
		for _, n := range f.Funcs {
			names[n.ID] = n.Name
		}
		for _, e := range f.Events {
			if e.Kind == frame.Entry {
				entries[[2]uint64{uint64(e.Tid), e.TS}] = names[e.FID]
			}
		}
	}
	return frames, events, entries
}

func TestGenEvaluationWorkloads(t *testing.T) {
	opencl, pytorch := evalTrace("opencl_course_L5"), evalTrace("pytorch_simple_add")
	for _, tc := range []struct {
		name      string
		args      []string
		profile   string
		apps      []string
		minEvents int64 // per rank and step
		maxEvents int64
	}{
		{"replay of two applications", []string{"--from", opencl, "--from", pytorch, "--beyond-max", "0.01"}, workload.ProfileReplay,
			[]string{"opencl_course_L5", "pytorch_simple_add"}, 15_000, 30_000},
		{"replay with the format given", []string{"--from", pytorch, "--format", "chrome", "--beyond-max", "0.01"}, workload.ProfileReplay,
			[]string{"pytorch_simple_add", "pytorch_simple_add"}, 15_000, 30_000},
		{"realistic profile", []string{"--profile", "realistic", "--beyond-max", "0.01"}, workload.ProfileRealistic, nil, 6_500, 10_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			args := append([]string{"--ranks", "2", "--steps", "4", "--json", "--out", dir}, tc.args...)
			out, err := genCmd(t, args...)
			if err != nil {
				t.Fatal(err)
			}
			var sum genSummary
			if err := json.Unmarshal([]byte(out), &sum); err != nil {
				t.Fatalf("summary %q: %v", out, err)
			}
			if sum.Profile != tc.profile || sum.Ranks != 2 || sum.Steps != 4 || sum.Frames != 8 {
				t.Errorf("summary %+v: want profile %s, 2 ranks x 4 steps", sum, tc.profile)
			}
			if strings.Join(sum.Applications, ",") != strings.Join(tc.apps, ",") {
				t.Errorf("applications %v, want %v", sum.Applications, tc.apps)
			}
			var events int64
			entries := map[uint32]map[[2]uint64]string{}
			for r := range uint32(2) {
				n, ev, ent := readFrameFile(t, filepath.Join(dir, "rank-"+string(rune('0'+r))+".frames"))
				if n != 4 {
					t.Errorf("rank %d: %d frames, want 4", r, n)
				}
				if ev < 4*tc.minEvents || ev > 4*tc.maxEvents {
					t.Errorf("rank %d: %d events in 4 steps, want %d to %d per step", r, ev, tc.minEvents, tc.maxEvents)
				}
				events += ev
				entries[r] = ent
			}
			if events != sum.Events {
				t.Errorf("frame files hold %d events, the summary says %d", events, sum.Events)
			}
			fh, err := os.Open(filepath.Join(dir, "truth.jsonl"))
			if err != nil {
				t.Fatal(err)
			}
			defer fh.Close()
			truth, err := workload.ReadTruth(fh)
			if err != nil {
				t.Fatal(err)
			}
			if len(truth) != sum.AnomaliesInjected || len(truth) == 0 || sum.ByKind[workload.BeyondMax] != len(truth) {
				t.Fatalf("%d truth records, summary %d injected (%v)", len(truth), sum.AnomaliesInjected, sum.ByKind)
			}
			for _, tr := range truth {
				if tr.Rank >= 2 || tr.Step >= 4 || tr.Kind != workload.BeyondMax {
					t.Fatalf("truth record %+v outside the run", tr)
				}
				if fn := entries[tr.Rank][[2]uint64{uint64(tr.Tid), tr.Entry}]; fn != tr.Func {
					t.Fatalf("truth record %+v: the frames enter %q there", tr, fn)
				}
			}
			// The same flags give the same bytes.
			again := t.TempDir()
			args[len(args)-len(tc.args)-1] = again
			if _, err := genCmd(t, args...); err != nil {
				t.Fatal(err)
			}
			a, b := readDir(t, dir), readDir(t, again)
			for name, content := range a {
				if !bytes.Equal(content, b[name]) {
					t.Errorf("%s differs between two runs with the same flags", name)
				}
			}
		})
	}
}

func TestGenEvaluationErrors(t *testing.T) {
	pytorch := evalTrace("pytorch_simple_add")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"missing trace", []string{"--from", "/nonexistent/trace.json"}, "/nonexistent/trace.json"},
		{"unknown name", []string{"--from", "gen_eval_test.go"}, "cannot tell its format"},
		{"wrong format", []string{"--from", pytorch, "--format", "tau"}, "pytorch_simple_add"},
		{"profile and traces", []string{"--from", pytorch, "--profile", "realistic"}, "--profile chooses a synthetic run"},
		{"gpu with traces", []string{"--from", pytorch, "--gpu"}, "--gpu describes the synthetic run"},
		{"fewer ranks than applications", []string{"--from", pytorch, "--from", pytorch, "--ranks", "1"}, "each application needs a rank"},
		{"unknown profile", []string{"--profile", "fancy"}, `profile must be one of`},
		{"beyond-max on the classic profile", []string{"--beyond-max", "0.01"}, "--beyond-max applies to"},
		{"rate above 1", []string{"--from", pytorch, "--beyond-max", "2"}, "anomaly rate must be in [0, 1]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := genCmd(t, append([]string{"--out", t.TempDir(), "--steps", "2"}, tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// TestRunFromTraces runs the whole pipeline on a small replay and checks
// that the summary scores it against the replay's truth.
func TestRunFromTraces(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole pipeline")
	}
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	root := NewRoot(&stdout, &stderr)
	root.SetArgs([]string{"run", "--out", out, "--run", "fromtest", "--json", "--ranks", "2", "--steps", "4",
		"--from", evalTrace("opencl_course_L5"), "--from", evalTrace("pytorch_simple_add"), "--beyond-max", "0.01"})
	if err := root.ExecuteContext(context.Background()); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	var sum struct {
		Ranks  int   `json:"ranks"`
		Frames int   `json:"frames"`
		Events int64 `json:"events"`
		Score  *struct {
			Injected int `json:"injected"`
			Flagged  int `json:"flagged"`
		} `json:"score"`
	}
	line := stdout.Bytes()
	if i := bytes.LastIndexByte(bytes.TrimSpace(line), '\n'); i >= 0 {
		line = line[i+1:]
	}
	if err := json.Unmarshal(line, &sum); err != nil {
		t.Fatalf("summary %q: %v", stdout.String(), err)
	}
	if !strings.Contains(stderr.String(), "replaying opencl_course_L5 on ranks 0; pytorch_simple_add on ranks 1") {
		t.Errorf("stderr does not say which rank replays which trace:\n%s", stderr.String())
	}
	fh, err := os.Open(filepath.Join(out, "fromtest", "truth.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	truth, err := workload.ReadTruth(fh)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Ranks != 2 || sum.Frames != 8 || sum.Score == nil || sum.Score.Injected != len(truth) || len(truth) == 0 {
		t.Fatalf("summary %+v (score %+v), want 2 ranks, 8 frames, scored against %d injected", sum, sum.Score, len(truth))
	}
}
