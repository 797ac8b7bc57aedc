package ad

import (
	"math"
	"reflect"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/stats"
)

// done is what callStacks hands on, in the order it does.
type done struct {
	fid, parent uint32 // parent 0: at the root (fids start at 1 here)
	incl, excl  uint64
	repaired    bool
}

// The call-stack stage alone: frames in, completed executions out.
func TestCallStacksStage(t *testing.T) {
	for _, tc := range []struct {
		name       string
		frames     [][]frame.FuncEvent
		want       []done
		unmatched  uint64
		repairedIn uint64
	}{
		{"nested calls complete innermost first",
			[][]frame.FuncEvent{{en(0, 1, 0), en(0, 2, 10), ex(0, 2, 30), en(0, 3, 40), ex(0, 3, 45), ex(0, 1, 100)}},
			[]done{{fid: 2, parent: 1, incl: 20, excl: 20}, {fid: 3, parent: 1, incl: 5, excl: 5}, {fid: 1, incl: 100, excl: 75}}, 0, 0},
		{"a call spans two io_steps",
			[][]frame.FuncEvent{{en(0, 1, 0), en(0, 2, 10)}, {ex(0, 2, 20), ex(0, 1, 50)}},
			[]done{{fid: 2, parent: 1, incl: 10, excl: 10}, {fid: 1, incl: 50, excl: 40}}, 0, 0},
		{"an outer exit closes entries that never exited",
			[][]frame.FuncEvent{{en(0, 1, 0), en(0, 2, 10), ex(0, 1, 60)}},
			[]done{{fid: 2, parent: 1, incl: 50, excl: 50, repaired: true}, {fid: 1, incl: 60, excl: 10}}, 0, 1},
		{"an exit with no entry is counted and dropped",
			[][]frame.FuncEvent{{ex(0, 4, 5), en(0, 1, 10), ex(0, 1, 20)}},
			[]done{{fid: 1, incl: 10, excl: 10}}, 1, 0},
		{"threads keep their own stacks",
			[][]frame.FuncEvent{{en(0, 1, 0), en(1, 2, 5), ex(0, 1, 10), ex(1, 2, 30)}},
			[]done{{fid: 1, incl: 10, excl: 10}, {fid: 2, incl: 25, excl: 25}}, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{}
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			var st counters
			var got []done
			cs := newCallStacks(&cfg, &st, nil)
			cs.done = func(th *thread, e *execRec) {
				d := done{fid: e.fid, incl: e.incl(), excl: e.excl(), repaired: e.flags&flagRepaired != 0}
				if e.parent != 0 {
					d.parent = th.rec(e.parent - 1).fid
				}
				got = append(got, d)
			}
			for i, evs := range tc.frames {
				cs.build(&frame.Frame{Step: uint64(i), Events: evs})
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("executions\n got %+v\nwant %+v", got, tc.want)
			}
			if st.unmatchedExits.Load() != tc.unmatched || st.repairedOpen.Load() != tc.repairedIn {
				t.Errorf("unmatched %d repaired %d, want %d %d", st.unmatchedExits.Load(), st.repairedOpen.Load(), tc.unmatched, tc.repairedIn)
			}
		})
	}
}

// The model stage alone: keys, statistics and the natural range.
func TestModelSetStage(t *testing.T) {
	frameOf := func() *frame.Frame {
		f := &frame.Frame{Funcs: []frame.Name{{ID: 1, Name: "a"}, {ID: 2, Name: "b"}, {ID: 3, Name: "f"}}}
		ts := uint64(0)
		for i := range 100 {
			f.Events = append(f.Events, en(0, 1, ts), en(0, 3, ts+1), ex(0, 3, ts+11+uint64(i%3)), ex(0, 1, ts+20))
			f.Events = append(f.Events, en(0, 2, ts+30), en(0, 3, ts+31), ex(0, 3, ts+131), ex(0, 2, ts+140))
			ts += 200
		}
		return f
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		want map[string][2]float64 // key -> natural range
	}{
		{"by function: one model for f", Config{}, map[string][2]float64{"a": {8, 10}, "b": {10, 10}, "f": {10, 100}}},
		{"by call path: f has a model per caller", Config{ByCallPath: true},
			map[string][2]float64{"a": {8, 10}, "b": {10, 10}, "a => f": {10, 12}, "b => f": {100, 100}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			var st counters
			cs := newCallStacks(&cfg, &st, nil)
			ms := newModelSet(&cfg, &st, cs)
			cs.done = ms.observe
			f := frameOf()
			cs.names(f)
			cs.build(f)
			got := map[string][2]float64{}
			for _, m := range ms.list {
				m.accum.Moments.Merge(m.step)
				ms.prepare(m)
				got[m.name] = [2]float64{m.natMin, m.natMax}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("natural ranges %v, want %v", got, tc.want)
			}
		})
	}
}

// The algorithms alone, behind the scorer interface.
func TestScorers(t *testing.T) {
	var h stats.Histogram
	vals := make([]float64, 0, 1000)
	for i := range 1000 {
		vals = append(vals, 100+float64(i%21))
	}
	h = stats.BuildHistogram(vals, 200)
	var mo stats.Moments
	for _, v := range vals {
		mo.Push(v)
	}
	base := model{det: mo, natMin: 100, natMax: 120, natLowThr: 100 / 1.96, natThr: 168}
	for _, tc := range []struct {
		name    string
		cfg     Config
		x       float64
		flagged bool
		score   float64 // checked when not NaN
	}{
		{"tail: inside the range", Config{}, 150, false, 1.25},
		{"tail: beyond it", Config{}, 240, true, 2},
		{"tail: far below it", Config{}, 10, true, 10},
		{"tail: below it, slow only", Config{SlowOnly: true}, 10, false, math.NaN()},
		{"sstd: within sigma", Config{Algorithm: SSTD}, 115, false, math.NaN()},
		{"sstd: beyond sigma", Config{Algorithm: SSTD}, 400, true, math.NaN()},
		{"hbos: a bin of the body", Config{Algorithm: HBOS}, 110, false, math.NaN()},
		{"hbos: outside the histogram", Config{Algorithm: HBOS}, 900, true, stats.MaxScore},
		{"copod: the median", Config{Algorithm: COPOD}, 110, false, math.NaN()},
		{"copod: far in the tail", Config{Algorithm: COPOD}, 900, true, math.NaN()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			s := newScorer(&cfg).newState()
			m := base
			s.reset(&m, h)
			score, flagged := s.judge(&m, tc.x)
			if flagged != tc.flagged {
				t.Errorf("judge(%v) flagged %v (score %v), want %v", tc.x, flagged, score, tc.flagged)
			}
			if !math.IsNaN(tc.score) && math.Abs(score-tc.score) > 1e-9 {
				t.Errorf("judge(%v) score %v, want %v", tc.x, score, tc.score)
			}
		})
	}
}
