package run

import (
	"bytes"
	"context"
	"encoding/json"
	"sort"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/ad"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

// evalReplay is a replay of the three real evaluation traces (an MPI code
// and an OpenCL application traced by TAU, a PyTorch run), small enough for
// the suite: 3 ranks, one per application.
func evalReplay(t *testing.T, steps int) Config {
	tc := workload.DefaultTraceConfig(workload.EvalApps("../workload/testdata/eval")...)
	tc.Ranks, tc.Steps = 3, steps
	tc.Rate = 0.0015 // ten times the default, for enough anomalies in a short run
	return Config{Out: t.TempDir(), RunID: "eval", From: tc, MaxLag: 16}
}

// storedAnomalies returns every stored anomaly as its JSON document, sorted.
func storedAnomalies(t *testing.T, p *Pipeline) []string {
	t.Helper()
	as, err := p.allAnomalies(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, len(as))
	for i := range as {
		b, err := json.Marshal(&as[i])
		if err != nil {
			t.Fatal(err)
		}
		out[i] = string(b)
	}
	sort.Strings(out)
	return out
}

// The same input files with the same options store the same anomalies,
// byte for byte, every time: the detectors move in lockstep and the
// natural-range model merges exactly.
func TestReproducibleOnFiles(t *testing.T) {
	if testing.Short() {
		t.Skip("three pipeline runs")
	}
	var first []string
	for i := range 3 {
		p, sum := execute(t, evalReplay(t, 12), nil, nil)
		got := storedAnomalies(t, p)
		if len(got) == 0 || sum.Anomalies != uint64(len(got)) {
			t.Fatalf("run %d: %d anomalies stored, %d flagged", i+1, len(got), sum.Anomalies)
		}
		if i == 0 {
			first = got
			continue
		}
		if len(got) != len(first) {
			t.Fatalf("run %d stored %d anomalies, run 1 %d", i+1, len(got), len(first))
		}
		for j := range got {
			if got[j] != first[j] {
				t.Fatalf("run %d differs from run 1 at anomaly %d:\n%s\n%s", i+1, j, got[j], first[j])
			}
		}
	}
}

// Detection on replays of real runtimes, and on the realistic synthetic
// profile: every algorithm, with the default rules, after the end-of-run
// relabelling.
func TestDetectionOnRealRuntimes(t *testing.T) {
	if testing.Short() {
		t.Skip("pipeline runs")
	}
	realistic := func(t *testing.T) Config {
		wl := workload.DefaultConfig()
		wl.Profile = workload.ProfileRealistic
		wl.Ranks, wl.Steps = 4, 16
		return Config{Out: t.TempDir(), RunID: "realistic", Workload: wl, MaxLag: 16}
	}
	replay := func(t *testing.T) Config { return evalReplay(t, 16) }
	for _, tc := range []struct {
		name      string
		cfg       func(*testing.T) Config
		algorithm string
		minF1     float64
	}{
		{"replay, default", replay, "", 0.95},
		{"replay, sstd", replay, ad.SSTD, 0.9},
		{"replay, hbos", replay, ad.HBOS, 0.9},
		{"replay, copod", replay, ad.COPOD, 0.9},
		{"realistic, default", realistic, "", 0.95},
		{"realistic, sstd", realistic, ad.SSTD, 0.9},
		{"realistic, hbos", realistic, ad.HBOS, 0.9},
		{"realistic, copod", realistic, ad.COPOD, 0.9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg(t)
			cfg.Detector.Algorithm = tc.algorithm
			_, sum := execute(t, cfg, nil, nil)
			sc := sum.Score
			if sc == nil || sc.Injected < 20 {
				t.Fatalf("score %+v: want a scored run with at least 20 injected anomalies", sc)
			}
			f1 := 0.0
			if sc.Precision+sc.Recall > 0 {
				f1 = 2 * sc.Precision * sc.Recall / (sc.Precision + sc.Recall)
			}
			var b bytes.Buffer
			_ = sum.WriteText(&b)
			if f1 < tc.minF1 {
				t.Errorf("F1 %.3f (precision %.3f, recall %.3f of %d injected), want at least %.2f\n%s", f1, sc.Precision, sc.Recall, sc.Injected, tc.minF1, b.String())
			}
			if l := sc.Live; l == nil || (l.Warm.Flagged > 0 && l.Warm.Precision < 0.9) {
				t.Errorf("live labels %+v: want precision at least 0.9 after io_step %d", l, ColdSteps)
			}
		})
	}
}
