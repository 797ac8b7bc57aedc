package stats

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"testing"
)

func TestBuildHistogram(t *testing.T) {
	tests := []struct {
		name   string
		values []float64
		bins   int
		total  uint64
		nbins  int
	}{
		{"empty", nil, 0, 0, 0},
		{"one value", []float64{5}, 0, 1, 1},
		{"identical values", []float64{3, 3, 3}, 0, 3, 1},
		{"zeros", []float64{0, 0}, 0, 2, 1},
		{"range", []float64{1, 2, 3, 4, 100}, 0, 5, 200},
		{"NaN and Inf skipped", []float64{1, math.NaN(), math.Inf(1), 2}, 10, 2, 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := BuildHistogram(tc.values, tc.bins)
			if h.Total() != tc.total || len(h.Counts) != tc.nbins {
				t.Fatalf("total %d bins %d, want %d %d", h.Total(), len(h.Counts), tc.total, tc.nbins)
			}
			if err := h.Validate(); err != nil {
				t.Fatal(err)
			}
			if tc.total == 0 {
				return
			}
			// min in the first bin, max in the last (lower edges exclusive)
			if h.Counts[0] == 0 || h.Counts[len(h.Counts)-1] == 0 {
				t.Errorf("first/last bin empty: %v", h.Counts)
			}
			if !(h.FirstEdge < h.Min) || h.LastEdge() < h.Max {
				t.Errorf("edges [%v, %v] do not cover (min %v, max %v]", h.FirstEdge, h.LastEdge(), h.Min, h.Max)
			}
		})
	}
}

func TestHistogramMergeKeepsCounts(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := 0; trial < 200; trial++ {
		a := make([]float64, 1+rng.IntN(500))
		b := make([]float64, 1+rng.IntN(500))
		ofs := rng.Float64() * 1000
		for i := range a {
			a[i] = 100 + 10*rng.NormFloat64()
		}
		for i := range b {
			b[i] = ofs + 50*rng.NormFloat64()
		}
		ha, hb := BuildHistogram(a, 0), BuildHistogram(b, 0)
		m := ha
		m.Counts = append([]uint64(nil), ha.Counts...)
		if err := m.Merge(hb); err != nil {
			t.Fatal(err)
		}
		if m.Total() != uint64(len(a)+len(b)) {
			t.Fatalf("trial %d: merged total %d, want %d", trial, m.Total(), len(a)+len(b))
		}
		if len(m.Counts) != DefaultBins {
			t.Fatalf("merged bins %d", len(m.Counts))
		}
		if m.Min != math.Min(ha.Min, hb.Min) || m.Max != math.Max(ha.Max, hb.Max) {
			t.Fatalf("merged min/max %v %v", m.Min, m.Max)
		}
		// Every value of a and b is inside the merged histogram.
		for _, v := range append(a, b...) {
			if m.bin(v) < 0 {
				t.Fatalf("value %v outside merged [%v, %v]", v, m.FirstEdge, m.LastEdge())
			}
		}
		if ha.Total() != uint64(len(a)) {
			t.Fatal("merge changed its argument's source")
		}
	}
}

func TestHistogramMergeSameLayoutAddsCounts(t *testing.T) {
	vals := []float64{1, 2, 2, 3, 5, 8, 13, 21, 34, 55}
	h := BuildHistogram(vals, 0)
	m := h
	m.Counts = append([]uint64(nil), h.Counts...)
	if err := m.Merge(h); err != nil {
		t.Fatal(err)
	}
	for i := range h.Counts {
		if m.Counts[i] != 2*h.Counts[i] {
			t.Fatalf("bin %d: %d, want %d", i, m.Counts[i], 2*h.Counts[i])
		}
	}
}

func TestHistogramMergeEmpty(t *testing.T) {
	h := BuildHistogram([]float64{1, 2, 3}, 0)
	var e Histogram
	if err := e.Merge(h); err != nil || e.Total() != 3 || e.FirstEdge != h.FirstEdge {
		t.Fatalf("merge into empty: %v %+v", err, e)
	}
	e.Counts[0] = 99
	if h.Counts[0] == 99 {
		t.Fatal("merge into empty aliases the source counts")
	}
	before := h.Total()
	if err := h.Merge(Histogram{}); err != nil || h.Total() != before {
		t.Fatalf("merging empty changed the histogram: %v", err)
	}
	bad := Histogram{FirstEdge: 0, BinWidth: -1, Counts: []uint64{1}}
	if err := h.Merge(bad); err == nil {
		t.Fatal("negative bin width accepted")
	}
}

func TestHBOSScorer(t *testing.T) {
	vals := make([]float64, 0, 1001)
	rng := rand.New(rand.NewPCG(5, 6))
	for i := 0; i < 1000; i++ {
		vals = append(vals, 100+5*rng.NormFloat64())
	}
	vals = append(vals, 1000)
	s := NewHBOSScorer(BuildHistogram(vals, 0), 0)
	tests := []struct {
		name string
		v    float64
		anom bool
	}{
		{"bulk", 100, false},
		{"counted outlier", 1000, true},
		{"above the histogram", 2000, true},
		{"below the histogram", -50, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sc := s.Score(tc.v)
			if (sc >= s.Threshold) != tc.anom {
				t.Errorf("score %v threshold %v: anomalous %v, want %v", sc, s.Threshold, sc >= s.Threshold, tc.anom)
			}
		})
	}
	if got := s.Score(2000); got != MaxScore || math.Abs(MaxScore-(-math.Log2(HBOSAlpha))) > 1e-12 {
		t.Errorf("out-of-range score %v, want %v", got, MaxScore)
	}
	// Identical values: one bin, never anomalous.
	one := NewHBOSScorer(BuildHistogram([]float64{7, 7, 7}, 0), 0)
	if one.Score(7) >= one.Threshold {
		t.Errorf("identical values flagged: score %v threshold %v", one.Score(7), one.Threshold)
	}
	if m := s.WindowMass(100, 3); m < 0.1 || m > 1 {
		t.Errorf("window mass at the bulk %v", m)
	}
	if m := s.WindowMass(1000, 3); m != 1.0/1001 {
		t.Errorf("window mass at the outlier %v, want 1/1001", m)
	}
}

func TestCOPODScorer(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	var m Moments
	vals := make([]float64, 0, 2001)
	for i := 0; i < 2000; i++ {
		v := 50 + 20*rng.ExpFloat64()
		vals = append(vals, v)
		m.Push(v)
	}
	vals = append(vals, 2000)
	m.Push(2000)
	s := NewCOPODScorer(BuildHistogram(vals, 0), m.Skewness(), 0)
	if s.Score(2000) < s.Threshold {
		t.Errorf("far right tail not flagged: %v < %v", s.Score(2000), s.Threshold)
	}
	if s.Score(60) >= s.Threshold {
		t.Errorf("bulk flagged: %v >= %v", s.Score(60), s.Threshold)
	}
	if s.Score(1e6) != MaxScore {
		t.Errorf("out-of-range score %v", s.Score(1e6))
	}
}

func FuzzHistogramMerge(f *testing.F) {
	f.Add([]byte(`{"first_edge":0,"bin_width":1,"counts":[1,2,3],"min":0.5,"max":2.5}`), []byte(`{"first_edge":10,"bin_width":0.5,"counts":[4],"min":10.2,"max":10.2}`))
	f.Add([]byte(`{"first_edge":-1e300,"bin_width":1e300,"counts":[1,1],"min":-1e300,"max":1e300}`), []byte(`{}`))
	f.Add([]byte(`{"first_edge":0,"bin_width":0,"counts":[1]}`), []byte(`{"counts":[]}`))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		var ha, hb Histogram
		if json.Unmarshal(a, &ha) != nil || json.Unmarshal(b, &hb) != nil {
			return
		}
		if len(ha.Counts) > 4096 || len(hb.Counts) > 4096 {
			return
		}
		ta, tb := ha.Total(), hb.Total()
		errA, errB := ha.Validate(), hb.Validate()
		err := ha.Merge(hb)
		if err != nil {
			return
		}
		if errA == nil && errB == nil && ta+tb >= ta && ha.Total() != ta+tb {
			t.Fatalf("merge lost counts: %d + %d -> %d", ta, tb, ha.Total())
		}
		s := NewHBOSScorer(ha, 0.99)
		_ = s.Score(ha.Min)
		c := NewCOPODScorer(ha, 1, 0.99)
		_ = c.Score(ha.Max)
	})
}

func TestCOPODScoreFastAgrees(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	vals := make([]float64, 0, 5000)
	var m Moments
	for i := 0; i < 5000; i++ {
		v := 100 + 30*rng.NormFloat64()
		if i%3 == 0 {
			v += 400
		}
		vals = append(vals, v)
		m.Push(v)
	}
	s := NewCOPODScorer(BuildHistogram(vals, 0), m.Skewness(), 0.9)
	for _, v := range append(vals, -1000, 5000) {
		fast, exact := s.ScoreFast(v)
		full := s.Score(v)
		if (fast >= s.Threshold) != (full >= s.Threshold) {
			t.Fatalf("value %v: fast %v (exact %v) and full %v disagree on threshold %v", v, fast, exact, full, s.Threshold)
		}
		if exact && fast != full {
			t.Fatalf("value %v: exact fast score %v != %v", v, fast, full)
		}
	}
}
