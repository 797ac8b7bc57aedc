package run

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/ad"
	"github.com/kipimo-hpc/kipimo/internal/baseline"
	"github.com/kipimo-hpc/kipimo/internal/baseline/load"
	"github.com/kipimo-hpc/kipimo/internal/instrument"
	"github.com/kipimo-hpc/kipimo/internal/mpitest"
)

// LAMMPS against a clean run of itself as its baseline: recurring stalls
// injected into MPI_Irecv (0.6% of its calls at 25 ms, 5% at 20 ms), which
// the run's own models take in as behaviour, are found with per-execution
// precision and recall >= 0.9 in the final labels, and the summary's
// baseline comparison reports MPI_Irecv's new slow mode holding them; a
// second clean run against the same baseline has no function with a new
// slow mode.
func TestLiveLAMMPSBaseline(t *testing.T) {
	mpitest.Require(t, "cc", "mpicc", "mpirun", "lmp")
	mpitest.Lock(t)
	input, err := filepath.Abs("../instrument/testdata/lj.in")
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range mpitest.Env(nil) {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	cache := t.TempDir()
	lammps := func(t *testing.T, name string, ref *baseline.Reference, inj []instrument.Injection) (*Pipeline, *Summary) {
		t.Helper()
		args := []string{"mpirun", "-np", "2", "lmp", "-in", input, "-log", "none", "-var", "steps", "2000"}
		cfg := Config{Out: t.TempDir(), RunID: name, Detector: ad.Config{Baseline: ref}, Live: LiveConfig{
			Command: args, Period: 250 * time.Millisecond, Seed: 7, Inject: inj,
			Build: instrument.BuildOptions{CacheDir: cache},
		}}
		// a loaded machine stretches a LAMMPS run with its drain well
		// past execute's bound
		ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
		defer cancel()
		p, err := Start(ctx, cfg, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close(context.Background()) })
		sum, err := p.Execute(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		return p, sum
	}
	p, clean := lammps(t, "clean", nil, nil)
	rule := ad.Config{}
	if err := rule.Validate(); err != nil {
		t.Fatal(err)
	}
	ref, err := load.Reference(context.Background(), p.Dir(), load.Options{Rule: rule.TailRule()})
	if err != nil {
		t.Fatal(err)
	}
	irecv := ref.Keys["MPI_Irecv"]
	if irecv == nil || !irecv.HasModes() || ref.IOSteps == 0 {
		t.Fatalf("baseline %+v MPI_Irecv %+v: want MPI_Irecv's histogram and the run's io_steps", ref, irecv)
	}
	t.Logf("baseline: %d io_steps, %d anomalies; MPI_Irecv %d calls, bound %.0f µs, %d beyond, p50 %.0f µs, p99 %.0f µs; level %.2g",
		ref.IOSteps, clean.Anomalies, irecv.Calls, irecv.Bound, irecv.Beyond, irecv.P50, irecv.P99, ref.Level(0))

	for _, tc := range []struct {
		name  string
		prob  float64
		delay time.Duration
	}{
		{"recurring-0_6pc-25ms", 0.006, 25 * time.Millisecond},
		{"recurring-5pc-20ms", 0.05, 20 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, sum := lammps(t, tc.name, ref, []instrument.Injection{{Func: "MPI_Irecv", Prob: tc.prob, Delay: tc.delay}})
			sc := sum.Score
			if sc == nil || sc.Injected < 20 {
				t.Fatalf("score %+v: want at least 20 injected stalls", sc)
			}
			t.Logf("injected %d, flagged %d (precision %.3f, recall %.3f), %d propagated, %d anomalies in other functions; live labels %+v",
				sc.Injected, sc.Flagged, sc.Precision, sc.Recall, sc.Propagated, sc.FlaggedOtherFunctions, sc.Live)
			logBaseline(t, sum.Baseline)
			as, err := p.allAnomalies(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range as {
				if x := a.Explanation; x != nil && x.Baseline != nil {
					t.Logf("flagged against the baseline: %s", x.Text)
					break
				}
			}
			if sc.Precision < 0.9 || sc.Recall < 0.9 {
				t.Errorf("precision %.3f recall %.3f against the baseline: want >= 0.9", sc.Precision, sc.Recall)
			}
			var mode *baseline.NewMode
			if sum.Baseline != nil {
				for _, f := range sum.Baseline.Functions {
					if f.Func == "MPI_Irecv" {
						mode = f.NewMode
					}
				}
			}
			if mode == nil || float64(mode.InMode) < 0.9*float64(sc.Injected) {
				t.Errorf("MPI_Irecv's new slow mode %+v: want one holding the %d stalls", mode, sc.Injected)
			}
		})
	}
	t.Run("clean-again", func(t *testing.T) {
		p, sum := lammps(t, "clean-again", ref, nil)
		logBaseline(t, sum.Baseline)
		var flagged int
		as, err := p.allAnomalies(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range as {
			if a.Explanation != nil && a.Explanation.Baseline != nil {
				flagged++
				if flagged <= 3 {
					t.Logf("flagged against the baseline: %s %s", a.Func, a.Explanation.Text)
				}
			}
		}
		// A rank's live test may fire on a burst of slow calls; the final
		// comparison over all ranks decides what stands.
		t.Logf("%d anomalies (%d flagged live against the baseline)", sum.Anomalies, flagged)
		for _, f := range sum.Baseline.Functions {
			if f.NewMode != nil {
				t.Errorf("%s: new slow mode %+v in a clean run", f.Func, *f.NewMode)
			}
		}
	})
}

// logBaseline logs the comparison's rows that say something is slower, and
// the first few.
func logBaseline(t *testing.T, b *baseline.Report) {
	t.Helper()
	if b == nil {
		t.Error("no baseline comparison in the summary")
		return
	}
	for i, f := range b.Functions {
		if i >= 5 && len(f.Slower) == 0 {
			continue
		}
		mode := ""
		if m := f.NewMode; m != nil {
			mode = fmt.Sprintf(" new mode: %d of %d calls over %.0f µs, baseline %d of %d, p = %.2g; %d from %.0f µs (typically %.0f)",
				m.Beyond, m.Calls, m.Bound, m.BaselineBeyond, m.BaselineCalls, m.PValue, m.InMode, m.FromUs, m.TypicalUs)
		}
		t.Logf("  %s: %.2fx time/step, %.2fx calls/step, p50 %.0f (%.0f) p99 %.0f (%.0f) µs, p99 shift p=%.2g, call rate p=%.2g, slower %v%s",
			f.Func, f.TimePerStepRatio, f.CallsRatio, f.P50, f.BaselineP50, f.P99, f.BaselineP99, f.ShiftP99, f.CallRateP, f.Slower, mode)
	}
	t.Logf("  not in the baseline: %v; baseline functions not called: %d", b.Absent, len(b.Missing))
}
