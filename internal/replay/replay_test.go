package replay

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/replay/steps"
)

// TestConvertRoundTrip converts each format's fixture to frame files and reads
// them back: the frame files give the same counts as the trace.
func TestConvertRoundTrip(t *testing.T) {
	cases := []struct {
		name, format string
		files        []string
	}{
		{"tau", FormatTAU, []string{filepath.Join("tautrace", "testdata", "opencl_course_L5")}},
		{"chrome", FormatChrome, []string{filepath.Join("chrome", "testdata", "cuda_event_sync__event_sync_trace.json.gz"), filepath.Join("chrome", "testdata", "mi250_minitoy_train_ROCm6_2_kineto.json.gz")}},
		{"caliper", FormatCaliper, []string{filepath.Join("caliper", "testdata", "160809-094411_72298_fuu1NeAHT2US.cali")}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src, err := Open(tc.format, tc.files, steps.Config{Step: 100 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			st, err := Convert(context.Background(), src, dir)
			if err != nil {
				t.Fatal(err)
			}
			back, err := OpenFrames([]string{dir})
			if err != nil {
				t.Fatal(err)
			}
			var last = map[uint32]uint64{}
			var prevStep, prevStart uint64
			got, err := back.Frames(context.Background(), func(f *frame.Frame) error {
				if s, ok := last[f.Rank]; ok && f.Step != s+1 {
					t.Errorf("rank %d: step %d after %d", f.Rank, f.Step, s)
				}
				// Across files, frames come in order of io_step, then start.
				if f.Step < prevStep || (f.Step == prevStep && f.TStart < prevStart) {
					t.Errorf("rank %d step %d starting at %d after step %d starting at %d", f.Rank, f.Step, f.TStart, prevStep, prevStart)
				}
				prevStep, prevStart = f.Step, f.TStart
				last[f.Rank] = f.Step
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			// Executions read back count exits (the source counts matched pairs).
			st.Executions += st.Unmatched
			st.Unmatched = 0
			// Frame files hold only what the trace's reader kept: their
			// input events are the frame events, and they lose nothing.
			if got.InputEvents != got.Events || got.Losses != nil {
				t.Errorf("frame files: %d input events for %d events, losses %v", got.InputEvents, got.Events, got.Losses)
			}
			st.InputEvents, st.Losses = got.InputEvents, nil
			if !reflect.DeepEqual(got, st) {
				t.Errorf("frame files give %+v, the trace gave %+v", got, st)
			}
			if done, total := back.Progress(); done != total || total == 0 {
				t.Errorf("progress %d of %d bytes at the end", done, total)
			}
		})
	}
}

func TestFrameFilesDamaged(t *testing.T) {
	src, err := Open(FormatTAU, []string{filepath.Join("tautrace", "testdata", "hecatoncheir")}, steps.Config{Step: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	st, err := Convert(context.Background(), src, dir)
	if err != nil {
		t.Fatal(err)
	}
	path := RankFile(dir, 0)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data[:len(data)*2/3], 0o644); err != nil {
		t.Fatal(err)
	}
	back, err := OpenFrames([]string{path})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	_, err = back.Frames(context.Background(), func(*frame.Frame) error { n++; return nil })
	if !errors.Is(err, steps.ErrStopped) || !strings.Contains(err.Error(), "rank-0.frames") {
		t.Fatalf("err = %v, want a stop naming the file", err)
	}
	if n == 0 || n >= st.Frames {
		t.Errorf("%d frames before the damage, of %d", n, st.Frames)
	}
}

func TestOpenErrors(t *testing.T) {
	cases := []struct {
		name, format string
		files        []string
		want         string
	}{
		{"no files", FormatTAU, nil, "no input files"},
		{"missing", FormatChrome, []string{"nope.json"}, "nope.json"},
		{"format", "paraver", []string{"replay.go"}, `unknown format "paraver"`},
		{"empty dir", FormatFrames, []string{"steps"}, "no *.frames files"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Open(tc.format, tc.files, steps.Config{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want %q", err, tc.want)
			}
		})
	}
}
