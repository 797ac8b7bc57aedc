package ad

import (
	"fmt"
	"math"
	"strings"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// explain says how far out value x is against model m, as labelled.
func explain(m *model, x float64) *provenance.Explanation {
	e := &provenance.Explanation{
		Key: m.name, Value: x, NaturalMin: m.natMin, NaturalMax: m.natMax,
		LowThreshold: m.natLowThr, Threshold: m.natThr, P99: m.p99, Excess: x - m.natMax,
	}
	if m.natMax > 0 {
		e.Ratio = x / m.natMax
	}
	if m.logStd > 0 {
		e.LogSigmas = (math.Log1p(x) - m.logMean) / m.logStd
	}
	var b strings.Builder
	switch {
	case x < m.natLowThr:
		fmt.Fprintf(&b, "%s, below the natural range of %s (smallest natural runtime %s): unusually fast", fmtMicros(x), m.name, fmtMicros(m.natMin))
		e.Text = b.String() + fmt.Sprintf("; flagged below %s", fmtMicros(m.natLowThr))
		return e
	case x <= m.natThr:
		fmt.Fprintf(&b, "within the natural range of %s (largest natural runtime %s)", m.name, fmtMicros(m.natMax))
	case m.natMax > 0:
		fmt.Fprintf(&b, "%s× the largest natural runtime of %s (%s), %s longer than it", fmtRatio(e.Ratio), m.name, fmtMicros(m.natMax), fmtMicros(e.Excess))
	default:
		fmt.Fprintf(&b, "%s where %s naturally takes no measurable time", fmtMicros(x), m.name)
	}
	if m.p99 > 0 {
		fmt.Fprintf(&b, "; %s× its p99 over all ranks (%s)", fmtRatio(x/m.p99), fmtMicros(m.p99))
	}
	if e.LogSigmas != 0 {
		fmt.Fprintf(&b, "; %.0f σ in log time", e.LogSigmas)
	}
	fmt.Fprintf(&b, "; flagged beyond %s", fmtMicros(m.natThr))
	e.Text = b.String()
	return e
}

func fmtRatio(r float64) string {
	if r >= 10 {
		return fmt.Sprintf("%.0f", r)
	}
	return fmt.Sprintf("%.1f", r)
}

// fmtMicros renders a duration given in µs with a unit a reader takes in at
// a glance.
func fmtMicros(us float64) string {
	switch a := math.Abs(us); {
	case a >= 1e6:
		return fmt.Sprintf("%.2f s", us/1e6)
	case a >= 1e3:
		return fmt.Sprintf("%.1f ms", us/1e3)
	default:
		return fmt.Sprintf("%.0f µs", us)
	}
}

// explainCauses adds to x, the explanation of execution e of thread t
// flagged as too long, the causes the data shows: the rank preempted
// clearly more than usual in the io_step(s) e ran in (its "Involuntary
// Context Switches" counter against the median of its other recent steps),
// and e being one of the first calls of its function on t (warm-up).
func (rc *recorder) explainCauses(x *provenance.Explanation, t *thread, e *execRec) {
	if v, n, u, ok := rc.preempt.preemption(e.step, e.exit, rc.cur.step); ok && clearlyAbove(v, n, u) {
		if n == 1 {
			x.Text += fmt.Sprintf("; the rank was preempted %.0f times in this io_step, %.0f usually", v, u)
		} else {
			x.Text += fmt.Sprintf("; the rank was preempted %.0f times in the %d io_steps it ran in, %.0f per io_step usually", v, n, u)
		}
	}
	if e.flags&flagWarmup != 0 {
		x.Text += fmt.Sprintf("; among the first %d calls of %s on this thread (warm-up)", warmupCalls, rc.stacks.funcName(e.fid))
	}
}
