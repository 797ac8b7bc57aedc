package pserver

import (
	"fmt"
	"math"
	"sort"
	"sync"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/stats"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// saneMoments reports whether m, a merged statistic of the state, can be
// served: every field finite, n and m2 not negative and, with values,
// min <= max. (A merge of validated deltas always is; a snapshot written
// before requests were validated may hold one that is not.)
func saneMoments(m *stats.Moments) bool {
	for _, v := range []float64{m.N, m.Mean, m.M2, m.M3, m.M4, m.Min, m.Max} {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return false
		}
	}
	return m.N >= 0 && m.M2 >= 0 && (m.N == 0 || m.Min <= m.Max)
}

// sanitize removes from a state loaded from a snapshot what no valid
// request could have put there: models and counters whose statistics or
// histograms are not sane are dropped, and non-finite statistics of the
// aggregates are reset (their counts are kept). It returns one line per
// thing removed, in a stable order.
func (st *State) sanitize() []string {
	var out []string
	for _, k := range st.ModelKeys() {
		m := st.Models[k]
		var err error
		switch {
		case !saneMoments(&m.Moments):
			err = fmt.Errorf("moments %+v", m.Moments)
		case m.Histogram.Validate() != nil:
			err = m.Histogram.Validate()
		case syncproto.ValidateTail(&m.Tail) != nil:
			err = syncproto.ValidateTail(&m.Tail)
		}
		if err != nil {
			delete(st.Models, k)
			out = append(out, fmt.Sprintf("model %q dropped: %v", k, err))
		}
	}
	for _, k := range sortedKeys(st.Counters) {
		if m := st.Counters[k]; m == nil || !saneMoments(m) {
			delete(st.Counters, k)
			out = append(out, fmt.Sprintf("counter %q dropped: not finite", k))
		}
	}
	reset := func(what string, ms ...*stats.Moments) {
		for _, m := range ms {
			if !saneMoments(m) {
				*m = stats.Moments{}
				out = append(out, what+": statistics not finite, reset")
			}
		}
	}
	ids := st.Agg.RankIDs()
	for _, id := range ids {
		r := st.Agg.Ranks[id]
		reset(fmt.Sprintf("rank %d/%d", id.PID, id.Rank), &r.PerStep, &r.Scores, &r.Severity)
	}
	rfs := make([]RankFunc, 0, len(st.Agg.RankFunc))
	for k := range st.Agg.RankFunc {
		rfs = append(rfs, k)
	}
	sort.Slice(rfs, func(i, j int) bool {
		if rfs[i].DetectorID != rfs[j].DetectorID {
			return lessID(rfs[i].DetectorID, rfs[j].DetectorID)
		}
		return rfs[i].Func < rfs[j].Func
	})
	for _, k := range rfs {
		a := st.Agg.RankFunc[k]
		reset(fmt.Sprintf("function %q of rank %d/%d", k.Func, k.PID, k.Rank), &a.PerStep, &a.Score, &a.Severity)
	}
	for _, f := range sortedKeys(st.Agg.Funcs) {
		a := st.Agg.Funcs[f]
		reset(fmt.Sprintf("function %q", f), &a.PerStep, &a.Score, &a.Severity)
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// finiteOr0 returns v, or 0 when v is not finite: the derived statistics
// (standard deviation, skewness, kurtosis) of a sample of almost equal
// values can underflow to a division by zero.
func finiteOr0(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	return v
}

// logLimiter lets one log line through per interval and counts the ones it
// held back, so a flood of bad requests costs a line per interval, not one
// per request.
type logLimiter struct {
	every time.Duration

	mu         sync.Mutex
	last       time.Time
	suppressed uint64
}

// allow reports whether to log now and, when it does, how many lines were
// held back since the last one.
func (l *logLimiter) allow(now time.Time) (bool, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.last.IsZero() && now.Sub(l.last) < l.every {
		l.suppressed++
		return false, 0
	}
	n := l.suppressed
	l.last, l.suppressed = now, 0
	return true, n
}
