package run

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

func evalTraces() []workload.TraceApp {
	return workload.EvalApps(filepath.Join("..", "workload", "testdata", "eval"))
}

func TestConfigValidateEvaluation(t *testing.T) {
	apps := evalTraces()
	replay := func() workload.TraceConfig {
		tc := workload.DefaultTraceConfig(apps[1:]...)
		tc.Ranks, tc.Steps = 2, 4
		return tc
	}
	for _, tc := range []struct {
		name string
		edit func(c *Config)
		err  string
	}{
		{"replay", func(c *Config) { c.From = replay() }, ""},
		{"realistic profile", func(c *Config) {
			c.Workload = workload.DefaultConfig()
			c.Workload.Profile, c.Workload.EventsPerStep = workload.ProfileRealistic, 0
		}, ""},
		{"unknown profile", func(c *Config) {
			c.Workload = workload.DefaultConfig()
			c.Workload.Profile = "fancy"
		}, "profile must be one of"},
		{"replay and input traces", func(c *Config) {
			c.From = replay()
			c.Inputs, c.InputFormat = []string{"x.json"}, "chrome"
		}, "exclude each other"},
		{"replay and a live command", func(c *Config) {
			c.From = replay()
			c.Live.Command = []string{"./app"}
		}, "exclude each other"},
		{"replay with no ranks", func(c *Config) {
			c.From = replay()
			c.From.Ranks = 0
		}, "replay: ranks must be"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{Out: t.TempDir(), RunID: "v"}
			tc.edit(&c)
			err := c.Validate()
			if tc.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("error %v, want one containing %q", err, tc.err)
			}
		})
	}
}

// TestRunEvaluationWorkloads runs the pipeline on a small replay and a
// small realistic run: frames, truth and scores as for the classic run.
func TestRunEvaluationWorkloads(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole pipeline")
	}
	apps := evalTraces()
	for _, tc := range []struct {
		name string
		cfg  func(c *Config)
	}{
		{"replay", func(c *Config) {
			c.From = workload.DefaultTraceConfig(apps[1:]...)
			c.From.Ranks, c.From.Steps, c.From.Rate = 2, 4, 0.01
		}},
		{"realistic", func(c *Config) {
			c.Workload = workload.DefaultConfig()
			c.Workload.Profile, c.Workload.Ranks, c.Workload.Steps, c.Workload.EventsPerStep = workload.ProfileRealistic, 2, 4, 0
			c.Workload.Rates.BeyondMax = 0.01
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Out: t.TempDir(), RunID: "eval"}
			tc.cfg(&cfg)
			_, sum := execute(t, cfg, nil, nil)
			if sum.Ranks != 2 || sum.Frames != 8 {
				t.Errorf("%d ranks, %d frames: want 2 ranks x 4 steps", sum.Ranks, sum.Frames)
			}
			fh, err := os.Open(sum.Truth)
			if err != nil {
				t.Fatal(err)
			}
			defer fh.Close()
			truth, err := workload.ReadTruth(fh)
			if err != nil {
				t.Fatal(err)
			}
			if sum.Score == nil || sum.Score.Injected != len(truth) || len(truth) == 0 {
				t.Fatalf("score %+v against %d truth records", sum.Score, len(truth))
			}
			for _, k := range sum.Score.Kinds {
				if k.Kind != string(workload.BeyondMax) {
					t.Errorf("kind %s scored; the evaluation workloads inject beyond_max only", k.Kind)
				}
			}
			if sum.Stored[provenance.KindAnomalies] != int64(sum.Anomalies) {
				t.Errorf("store holds %d anomalies, detectors flagged %d", sum.Stored[provenance.KindAnomalies], sum.Anomalies)
			}
			t.Logf("%d events, %d injected, flagged %d, precision %.3f, recall %.3f",
				sum.Events, len(truth), sum.Score.Flagged, sum.Score.Precision, sum.Score.Recall)
		})
	}
}
