package run

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/baseline"
)

// compareBaseline is the run's final models against its baseline
// (Config.Detector.Baseline), nil without one.
func (p *Pipeline) compareBaseline() *baseline.Report {
	if p.ps == nil {
		return nil
	}
	return p.ps.CompareBaseline()
}

// baselineRows is how many functions the text summary shows against the
// baseline (--json has them all).
const baselineRows = 8

// writeBaselineText writes the summary's comparison with the baseline.
func writeBaselineText(w io.Writer, s *Summary) {
	b := s.Baseline
	if b == nil {
		return
	}
	fmt.Fprintf(w, "baseline\t%s: compared %s; %d functions in both, by extra time\n", b.Source, b.Compared, len(b.Functions))
	for _, f := range b.Functions[:min(len(b.Functions), baselineRows)] {
		verdict := "nothing slower beyond noise"
		if len(f.Slower) > 0 {
			verdict = strings.Join(f.Slower, ", ")
		}
		line := fmt.Sprintf("  %s\t%.2fx time per io_step, %s extra, %.2fx calls per io_step", f.Func, f.TimePerStepRatio, dur(f.ExtraUs), f.CallsRatio)
		if f.BaselineP99 > 0 {
			line += fmt.Sprintf(", p50 %s (was %s), p99 %s (was %s)", dur(f.P50), dur(f.BaselineP50), dur(f.P99), dur(f.BaselineP99))
		}
		line += ": " + verdict
		if m := f.NewMode; m != nil {
			line += fmt.Sprintf(" (%d of %d calls over %s against %d of %d in the baseline; from %s on %d calls, typically %s, against %d; binomial p = %.2g)",
				m.Beyond, m.Calls, dur(m.Bound), m.BaselineBeyond, m.BaselineCalls, dur(m.FromUs), m.InMode, dur(m.TypicalUs), m.BaselineInMode, m.PValue)
		}
		fmt.Fprintln(w, line)
	}
	if len(b.Absent) > 0 {
		fmt.Fprintf(w, "  not in the baseline\t%s\n", listShort(b.Absent, 10))
	}
}

// dur writes µs as a duration rounded to 3 significant digits or so.
func dur(us float64) string {
	d := time.Duration(us * float64(time.Microsecond))
	switch a := d.Abs(); {
	case a >= time.Second:
		d = d.Round(time.Millisecond)
	case a >= time.Millisecond:
		d = d.Round(10 * time.Microsecond)
	default:
		d = d.Round(time.Microsecond)
	}
	return d.String()
}

// listShort joins the first n of names, saying how many more there are.
func listShort(names []string, n int) string {
	if len(names) <= n {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:n], ", "), len(names)-n)
}
