package diff

import (
	"math"
	"testing"
)

// The expected t, degrees of freedom and p-values were computed apart from
// this package: t and df from their formulas in Python, p by integrating
// Student's t density numerically (Simpson's rule, 200,000 intervals). The
// first case is the textbook t = 5 with 8 degrees of freedom.
func TestWelchTest(t *testing.T) {
	inf := math.Inf(1)
	cases := []struct {
		name  string
		a, b  []float64
		ok    bool
		t, df float64
		p     float64
	}{
		{"clear shift, equal spreads", []float64{1, 2, 3, 4, 5}, []float64{6, 7, 8, 9, 10}, true, 5, 8, 0.001052825793},
		{"overlap, unequal spreads", []float64{10, 11, 9, 10.5, 9.5, 10}, []float64{12, 8, 15, 7, 13, 11}, true, 0.78648375764, 5.54187772411, 0.4638748192},
		{"unequal sizes", []float64{100, 102, 98, 101, 99, 100, 103, 97}, []float64{104, 106, 103, 108, 105}, true, 4.6697378527, 8.90772159232, 0.001201808439},
		{"two against three", []float64{3.1, 2.9}, []float64{3.0, 3.2, 3.3}, true, 1.25, 2.42654028436, 0.3183109432},
		{"same values", []float64{4, 5, 6}, []float64{6, 5, 4}, true, 0, 4, 1},
		{"no spread, different means", []float64{2, 2, 2}, []float64{3, 3}, true, inf, 3, 0},
		{"no spread, same means", []float64{5, 5}, []float64{5, 5}, true, 0, 2, 1},
		{"one thread in A", []float64{1}, []float64{1, 2, 3}, false, 0, 0, 0},
		{"no thread in B", []float64{1, 2}, nil, false, 0, 0, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w, ok := WelchTest(tc.a, tc.b)
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v", ok, tc.ok)
			}
			if !ok {
				return
			}
			if !approx(w.T, tc.t, 1e-9) || !approx(w.DF, tc.df, 1e-9) {
				t.Errorf("t = %v, df = %v; want %v, %v", w.T, w.DF, tc.t, tc.df)
			}
			if !approx(w.P, tc.p, 1e-6) {
				t.Errorf("p = %.10g, want %.10g", w.P, tc.p)
			}
		})
	}
}

// The change verdict follows the test and the direction of the means.
func TestCompareOneVerdict(t *testing.T) {
	cases := []struct {
		name  string
		a, b  []float64
		alpha float64
		want  string
	}{
		{"up", []float64{1, 2, 3, 4, 5}, []float64{6, 7, 8, 9, 10}, 0.05, ChangeUp},
		{"down", []float64{6, 7, 8, 9, 10}, []float64{1, 2, 3, 4, 5}, 0.05, ChangeDown},
		{"within the spread", []float64{10, 11, 9, 10.5, 9.5, 10}, []float64{12, 8, 15, 7, 13, 11}, 0.05, ChangeSame},
		{"beyond only at a loose level", []float64{3.1, 2.9}, []float64{3.0, 3.2, 3.3}, 0.4, ChangeUp},
		{"new", nil, []float64{1, 2}, 0.05, ChangeNew},
		{"gone", []float64{1, 2}, nil, 0.05, ChangeGone},
		{"one thread", []float64{1}, []float64{2}, 0.05, ChangeUntested},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if r := compareOne("f", tc.a, tc.b, tc.alpha); r.Change != tc.want {
				t.Errorf("change = %q, want %q", r.Change, tc.want)
			}
		})
	}
}

func approx(got, want, rel float64) bool {
	if math.IsInf(want, 0) || want == 0 {
		return got == want
	}
	return math.Abs(got-want) <= rel*math.Abs(want)
}
