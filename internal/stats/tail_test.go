package stats

import (
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
)

var testRule = TailRule{Ratio: 1.4, Recur: 5, Resolution: 1}

func histOf(xs ...float64) TailHist {
	var h TailHist
	for _, x := range xs {
		h.Add(x)
	}
	return h
}

func repeat(x float64, n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = x
	}
	return out
}

func cat(parts ...[]float64) []float64 {
	var out []float64
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func TestTailBinEdges(t *testing.T) {
	for _, tc := range []struct {
		name string
		x    float64
		want int
	}{
		{"zero", 0, 0},
		{"negative", -3, 0},
		{"nan", math.NaN(), 0},
		{"one tick", 1, 8},
		{"two ticks", 2, 12},
		{"three ticks", 3, 16},
		{"one second", 1e6, 159},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := TailBin(tc.x); got != tc.want {
				t.Errorf("TailBin(%v) = %d, want %d", tc.x, got, tc.want)
			}
		})
	}
}

func TestTailNaturalMax(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	logNormal := func(n int, mu, sigma float64) []float64 {
		out := make([]float64, n)
		for i := range out {
			out[i] = math.Round(math.Exp(mu + sigma*rng.NormFloat64()))
		}
		return out
	}
	body := logNormal(20000, 5, 0.6)
	bodyMax := 0.0
	for _, x := range body {
		bodyMax = max(bodyMax, x)
	}
	for _, tc := range []struct {
		name   string
		values []float64
		want   float64
		frac   float64
	}{
		{"empty", nil, 0, 0},
		{"one value", []float64{7}, 7, 0},
		{"continuous log-normal tail", body, bodyMax, 0},
		{"isolated values beyond the body stay out",
			cat(body, []float64{1.6 * bodyMax, 2.2 * bodyMax, 2.9 * bodyMax}), bodyMax, 0},
		{"a mode that keeps coming back belongs",
			cat(body, repeat(10*bodyMax, 40)), 10 * bodyMax, 0},
		{"quantised wrapper: 0, 1 and 2 µs",
			cat(repeat(0, 5000), repeat(1, 400), repeat(2, 3)), 2, 0},
		{"quantised wrapper with an outlier at 6 µs",
			cat(repeat(0, 5000), repeat(1, 400), repeat(2, 3), []float64{6}), 2, 0},
		{"recurring mode above isolated values",
			cat(repeat(100, 1000), []float64{300}, repeat(1000, 8)), 1000, 0},
		{"a cluster below the recurring fraction stays out",
			cat(body, repeat(10*bodyMax, 40)), bodyMax, 0.01},
		{"a cluster above the recurring fraction belongs",
			cat(body, repeat(10*bodyMax, 400)), 10 * bodyMax, 0.01},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := histOf(tc.values...)
			r := testRule
			r.RecurFrac = tc.frac
			if got := h.NaturalMax(r); got != tc.want {
				t.Errorf("NaturalMax = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestTailThreshold(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    float64
		want float64
	}{
		{"ratio rules large values", 100, 140},
		{"resolution rules small values", 2, 3},
		{"all zero", 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := testRule.Threshold(tc.m)
			if math.Abs(got-tc.want) > 1e-9 {
				t.Errorf("Threshold(%v) = %v, want %v", tc.m, got, tc.want)
			}
		})
	}
}

func TestTailMergeIsExactAndOrderFree(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var parts []TailHist
	var all TailHist
	for range 6 {
		var h TailHist
		for range 500 {
			x := math.Round(math.Exp(3 + 2*rng.NormFloat64()))
			h.Add(x)
			all.Add(x)
		}
		parts = append(parts, h)
	}
	var fwd, rev TailHist
	for i := range parts {
		if err := fwd.Merge(parts[i]); err != nil {
			t.Fatal(err)
		}
		if err := rev.Merge(parts[len(parts)-1-i]); err != nil {
			t.Fatal(err)
		}
	}
	if !reflect.DeepEqual(fwd, rev) {
		t.Error("merging in reverse order gives a different histogram")
	}
	if !reflect.DeepEqual(fwd, all) {
		t.Error("merged histogram differs from the histogram of all values")
	}
}

func TestTailMergeRejectsMalformed(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    TailHist
	}{
		{"short mins", TailHist{Counts: []uint64{1, 2}, Mins: []float64{1}, Maxs: []float64{1, 2}}},
		{"negative lo", TailHist{Lo: -1, Counts: []uint64{1}, Mins: []float64{0}, Maxs: []float64{0}}},
		{"beyond the last bin", TailHist{Lo: tailMaxBin, Counts: []uint64{1, 1}, Mins: []float64{1, 1}, Maxs: []float64{1, 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := histOf(5, 6)
			before := h.Clone()
			if err := h.Merge(tc.o); err == nil {
				t.Fatal("Merge accepted a malformed histogram")
			}
			if !reflect.DeepEqual(h, before) {
				t.Error("a failed Merge changed the histogram")
			}
		})
	}
}

func TestTailQuantile(t *testing.T) {
	h := histOf(cat(repeat(1, 90), repeat(10, 9), []float64{100})...)
	for _, tc := range []struct {
		name string
		q    float64
		want float64
	}{
		{"median", 0.5, 1},
		{"p95", 0.95, 10},
		{"max", 1, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := h.Quantile(tc.q); got != tc.want {
				t.Errorf("Quantile(%v) = %v, want %v", tc.q, got, tc.want)
			}
		})
	}
}

func FuzzTailMerge(f *testing.F) {
	f.Add(3, uint64(2), 1.0, 2.0, 5.0)
	f.Add(0, uint64(0), 0.0, 0.0, 0.0)
	f.Fuzz(func(t *testing.T, lo int, c uint64, mn, mx, x float64) {
		h := histOf(x, 2*x)
		o := TailHist{Lo: lo, Counts: []uint64{c}, Mins: []float64{mn}, Maxs: []float64{mx}}
		before := h.N()
		if err := h.Merge(o); err != nil {
			if h.N() != before {
				t.Fatal("failed merge changed the count")
			}
			return
		}
		if h.N() != before+c {
			t.Fatalf("N = %d after merging %d into %d", h.N(), c, before)
		}
		_ = h.NaturalMax(testRule)
	})
}

func TestTailBinMatchesLog(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for range 100000 {
		x := math.Exp(20 * rng.Float64())
		if rng.IntN(2) == 0 {
			x = math.Round(x)
		}
		want := int(math.Floor(TailBinsPerOctave * math.Log2(1+x)))
		got := TailBin(x)
		// exact edges may round either way; nothing else may differ
		if got != want && math.Abs(TailBinsPerOctave*math.Log2(1+x)-math.Round(TailBinsPerOctave*math.Log2(1+x))) > 1e-9 {
			t.Fatalf("TailBin(%v) = %d, floor(8·log2(1+x)) = %d", x, got, want)
		}
	}
}

func BenchmarkTailAdd(b *testing.B) {
	xs := make([]float64, 4096)
	rng := rand.New(rand.NewPCG(7, 8))
	for i := range xs {
		xs[i] = math.Round(math.Exp(3 + 2*rng.NormFloat64()))
	}
	var h TailHist
	b.ResetTimer()
	for i := range b.N {
		h.Add(xs[i&4095])
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
}

func TestTailNaturalRangeLow(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values []float64
		lo, hi float64
	}{
		{"a fast outlier stays out", cat(repeat(100, 500), repeat(110, 500), []float64{8}), 100, 110},
		{"a continuous lower tail belongs", cat(repeat(100, 500), []float64{60, 35, 20}), 20, 100},
		{"a recurring fast mode belongs", cat(repeat(100, 500), repeat(5, 20)), 5, 100},
		{"a few ticks faster is natural", cat(repeat(12, 500), repeat(3, 3)), 3, 12},
		{"a moderately faster call is natural", cat(repeat(100, 500), []float64{60}), 60, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := histOf(tc.values...)
			lo, hi := h.NaturalRange(testRule)
			if lo != tc.lo || hi != tc.hi {
				t.Errorf("NaturalRange = [%v, %v], want [%v, %v]", lo, hi, tc.lo, tc.hi)
			}
		})
	}
}
