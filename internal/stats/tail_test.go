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

// spread returns n values spread evenly in log scale over [a, b].
func logSpread(n int, a, b float64) []float64 {
	out := make([]float64, n)
	for i := range out {
		f := 0.0
		if n > 1 {
			f = float64(i) / float64(n-1)
		}
		out[i] = a * math.Pow(b/a, f)
	}
	return out
}

// TestTailNaturalRangeRealShapes reads the natural range of histograms
// shaped like the runtimes of real codes, with the default rule (Recur 5,
// RecurFrac 0.5%) and the false-alarm rates asked.
func TestTailNaturalRangeRealShapes(t *testing.T) {
	body := logSpread(20000, 100, 258)
	small := logSpread(20000, 1, 20)
	sparse := cat(repeat(370, 10), repeat(530, 10), repeat(760, 10), repeat(1090, 10))
	for _, tc := range []struct {
		name   string
		values []float64
		alpha  float64
		want   float64
	}{
		// An OpenCL queue kernel: 1.5% of its calls spread over a dozen bins
		// beyond a gap, each bin far below the recurring fraction, together
		// well above it (its p99 lies in them).
		{"kernel tail spread over many bins", cat(body, logSpread(300, 380, 1100)), 0, 1100},
		{"kernel tail spread over many bins, alpha 1e-4", cat(body, logSpread(300, 380, 1100)), 1e-4, 1100},
		// Allocation and option-lookup helpers in a setup phase: 8-11x
		// their natural maximum in 0.3% and 0.5% of their calls.
		{"setup helper at 8-11x in 0.3% of calls", cat(small, logSpread(60, 160, 220)), 1e-4, 220},
		{"setup helper at 8-11x in 0.5% of calls", cat(small, logSpread(100, 160, 220)), 1e-3, 220},
		{"two setup helpers at 8x and 11x, 0.3% each", cat(small, repeat(160, 60), repeat(220, 60)), 1e-4, 220},
		// clFinish in bursts: 0.4% of its calls at 30x, close together.
		{"burst mode", cat(body, logSpread(80, 7700, 7800)), 1e-4, 7800},
		// An MPI send whose recorded runtimes come back at 32 µs in 0.25%
		// of the calls.
		{"one runtime that recurs in 0.25% of calls", cat(small, repeat(32, 50)), 1e-4, 32},
		// The same send on eight ranks: 22, 25 and 32 µs, 0.08% each,
		// beyond a body that ends at 12 µs.
		{"runtimes near the body that recur in 0.08% of calls each",
			cat(logSpread(20000, 1, 12), repeat(22, 17), repeat(25, 17), repeat(32, 17)), 1e-5, 32},
		// Rare far values: 0.1% of the calls at 10-12x the largest natural
		// runtime stay outside, with or without the false-alarm rate.
		{"rare far stall", cat(body, logSpread(20, 2580, 3100)), 0, 258},
		{"rare far stall, alpha 1e-3", cat(body, logSpread(20, 2580, 3100)), 1e-3, 258},
		{"rare far stall, alpha 1e-4", cat(body, logSpread(20, 2580, 3100)), 1e-4, 258},
		{"rare far stall, alpha 1e-5", cat(body, logSpread(20, 2580, 3100)), 1e-5, 258},
		{"rare far stall at 100x, alpha 1e-4", cat(body, repeat(25800, 20)), 1e-4, 258},
		// A 1 s stall in 0.08% of the calls that holds its partner as long:
		// 0.16% of the calls, 1000x beyond.
		{"rare stall at 1000x with its partners", cat(body, logSpread(32, 1e6, 1.01e6)), 1e-4, 258},
		// Anomalies spread 1.5-3x beyond the largest natural runtime in
		// 0.15% of the calls stay outside.
		{"anomalies spread 1.5-3x beyond, alpha 1e-4", cat(body, logSpread(30, 387, 774)), 1e-4, 258},
		// A sparse tail: small groups each 1.43x beyond the one below, none
		// recurring on its own. The false-alarm rate takes it up to its
		// quantile (at most alpha of the values stay above the range), but
		// not across a clear gap (1.5x).
		{"sparse tail without alpha", cat(body, sparse), 0, 258},
		{"sparse tail, alpha 1e-3", cat(body, sparse), 1e-3, 530},
		{"sparse tail, alpha 1e-4", cat(body, sparse), 1e-4, 1090},
		{"sparse tail beyond a clear gap, alpha 1e-4", cat(body, repeat(370, 10), repeat(600, 10)), 1e-4, 370},
		{"too few values for alpha 1e-5", cat(body, repeat(370, 10)), 1e-5, 258},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := histOf(tc.values...)
			r := TailRule{Ratio: 1.4, Recur: 5, RecurFrac: 0.005, Resolution: 1, Alpha: tc.alpha}
			got := h.NaturalMax(r)
			if math.Abs(got-tc.want) > 1e-9*tc.want {
				t.Errorf("NaturalMax = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestTailNaturalRangeOrderFree reads the same range from a histogram
// merged from parts in any order.
func TestTailNaturalRangeOrderFree(t *testing.T) {
	values := cat(logSpread(20000, 100, 258), logSpread(300, 380, 1100), repeat(2580, 20))
	r := TailRule{Ratio: 1.4, Recur: 5, RecurFrac: 0.005, Resolution: 1, Alpha: 1e-4}
	want := histOf(values...)
	wantLo, wantHi := want.NaturalRange(r)
	rng := rand.New(rand.NewPCG(9, 10))
	for range 5 {
		parts := make([]TailHist, 7)
		for _, x := range values {
			parts[rng.IntN(len(parts))].Add(x)
		}
		var h TailHist
		for _, i := range rng.Perm(len(parts)) {
			if err := h.Merge(parts[i]); err != nil {
				t.Fatal(err)
			}
		}
		if lo, hi := h.NaturalRange(r); lo != wantLo || hi != wantHi {
			t.Fatalf("merged in another order: [%v, %v], want [%v, %v]", lo, hi, wantLo, wantHi)
		}
	}
}
