package run

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/replay"
	"github.com/kipimo-hpc/kipimo/internal/replay/steps"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

func traceRun(t *testing.T, input string) Config {
	t.Helper()
	return Config{Out: t.TempDir(), RunID: "trace", Inputs: []string{input}, InputFormat: replay.FormatChrome, Step: 100 * time.Millisecond, MaxLag: 16}
}

// TestRunTraceInputReport: a trace input's summary says what the frames do
// not carry of it, and measures the store against the trace (how much of
// it is kept, bytes per anomaly and per input event), not a reduction ratio.
func TestRunTraceInputReport(t *testing.T) {
	// catapult's nestable async test trace: 8 async spans, 2 instants, a
	// begin never ended, an end with no begin (counted by hand, see
	// internal/replay/chrome/field_test.go).
	in := filepath.Join("..", "replay", "chrome", "testdata", "field", "catapult_nestable_async.json")
	_, sum := execute(t, traceRun(t, in), nil, nil)
	ti := sum.TraceInput
	if ti == nil {
		t.Fatal("no trace_input in the summary")
	}
	want := map[string]int{steps.LossInstant: 2, steps.LossUnclosed: 1, steps.LossEndWithoutBegin: 1}
	if ti.Executions != 8 || ti.InputEvents != 20 || len(ti.Losses) != len(want) {
		t.Errorf("trace input %+v, want 8 executions of 20 events and %d kinds of loss", ti, len(want))
	}
	for k, n := range want {
		if ti.Losses.Count(k) != n {
			t.Errorf("%s: %d, want %d", k, ti.Losses.Count(k), n)
		}
	}
	kept := sum.Stored[provenance.KindAnomalies] + sum.Stored[provenance.KindNormalExecs]
	if sum.KeptExecutions != kept || sum.KeptFraction != float64(kept)/8 {
		t.Errorf("kept %d (%.3f), store holds %d executions of 8", sum.KeptExecutions, sum.KeptFraction, kept)
	}
	if sum.Events != 16 || sum.BytesPerInputEvent != float64(sum.StoredBytes)/16 {
		t.Errorf("%d events, %.1f stored bytes per event of %d bytes", sum.Events, sum.BytesPerInputEvent, sum.StoredBytes)
	}
	var text bytes.Buffer
	if err := sum.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"chrome input: 20 trace events read, 8 executions", "not in the frames: 2 instant (", "not in the frames: 1 unclosed (", "kept ", " per input event"} {
		if !strings.Contains(text.String(), w) {
			t.Errorf("summary lacks %q:\n%s", w, text.String())
		}
	}
	if strings.Contains(text.String(), "reduction") {
		t.Errorf("a trace input's summary still gives a reduction ratio:\n%s", text.String())
	}
}

// TestRunTraceInputNothingUsable: an input with nothing the frames carry
// fails, and says what it held.
func TestRunTraceInputNothingUsable(t *testing.T) {
	in := filepath.Join(t.TempDir(), "instants.json")
	if err := os.WriteFile(in, []byte(`{"traceEvents":[{"ph":"M","name":"process_name","pid":1,"args":{"name":"p"}},{"ph":"i","name":"tick","pid":1,"tid":1,"ts":5}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := Start(ctx, traceRun(t, in), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	_, err = p.Execute(ctx, nil)
	if err == nil || !strings.Contains(err.Error(), "holds no event frames can carry") || !strings.Contains(err.Error(), "1 instant (") {
		t.Fatalf("err = %v, want nothing usable and the instant named", err)
	}
}

// TestRunScoresGeneratedFrames: frame files written with their truth.jsonl
// (what kipimo gen writes) are scored against it when run as input, as the
// run that generated them is; without the file the run is not scored.
func TestRunScoresGeneratedFrames(t *testing.T) {
	wcfg := workload.DefaultConfig()
	wcfg.Ranks, wcfg.Steps, wcfg.EventsPerStep, wcfg.Seed = 2, 6, 4000, 3
	w, err := workload.New(wcfg)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	src := &workloadSource{w: w, cfg: wcfg}
	if _, err := replay.Convert(context.Background(), src, dir); err != nil {
		t.Fatal(err)
	}
	truth := src.Truth()
	if len(truth) == 0 {
		t.Fatal("the workload injected nothing")
	}
	frameRun := func() Config {
		return Config{Out: t.TempDir(), RunID: "frames", Inputs: []string{dir}, InputFormat: replay.FormatFrames}
	}

	t.Run("without truth.jsonl", func(t *testing.T) {
		if _, sum := execute(t, frameRun(), nil, nil); sum.Score != nil {
			t.Errorf("scored without a ground truth: %+v", sum.Score)
		}
	})
	t.Run("with truth.jsonl", func(t *testing.T) {
		fh, err := os.Create(filepath.Join(dir, "truth.jsonl"))
		if err != nil {
			t.Fatal(err)
		}
		if err := workload.WriteTruth(fh, truth); err != nil {
			t.Fatal(err)
		}
		fh.Close()
		_, sum := execute(t, frameRun(), nil, nil)
		_, direct := execute(t, Config{Out: t.TempDir(), RunID: "direct", Workload: wcfg}, nil, nil)
		if sum.Score == nil || direct.Score == nil {
			t.Fatalf("scores: frames %v, generated run %v", sum.Score, direct.Score)
		}
		if sum.Score.Injected != len(truth) || sum.Score.Injected != direct.Score.Injected {
			t.Errorf("frames scored against %d injected, generated run %d, truth.jsonl holds %d", sum.Score.Injected, direct.Score.Injected, len(truth))
		}
		if sum.Score.TruePositives == 0 || sum.Score.Recall < direct.Score.Recall-0.05 {
			t.Errorf("frames found %d (recall %.3f), the generated run recall %.3f", sum.Score.TruePositives, sum.Score.Recall, direct.Score.Recall)
		}
	})
}
