package stats

import (
	"bytes"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
)

// summaryOf builds the summary of values, with anoms anomalies.
func summaryOf(values []float64, anoms uint64) Summary {
	var s Summary
	for _, x := range values {
		s.Moments.Push(x)
		s.Tail.Add(x)
	}
	s.Histogram = BuildHistogram(values, DefaultBins)
	s.Anomalies = anoms
	return s
}

func randomValues(rng *rand.Rand, n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = math.Exp(rng.NormFloat64()*2 + 3)
	}
	return out
}

func TestSummaryMerge(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	a, b := summaryOf(randomValues(rng, 500), 3), summaryOf(randomValues(rng, 300), 4)
	// part by part, in the same order
	want := a.Clone()
	want.Moments.Merge(b.Moments)
	if err := want.Histogram.Merge(b.Histogram); err != nil {
		t.Fatal(err)
	}
	if err := want.Tail.Merge(b.Tail); err != nil {
		t.Fatal(err)
	}
	want.Anomalies += b.Anomalies
	got := a.Clone()
	if err := got.Merge(b); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) || got.Anomalies != 7 {
		t.Fatalf("merge differs from merging the parts:\n got %+v\nwant %+v", got, want)
	}
	if got.Moments.N != 800 || got.Histogram.Total() != 800 || got.Tail.N() != 800 {
		t.Fatalf("counts %v %d %d, want 800", got.Moments.N, got.Histogram.Total(), got.Tail.N())
	}
	// the tail and the count are the same in either order
	rev := b.Clone()
	if err := rev.Merge(a); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(rev.Tail, got.Tail) || rev.Anomalies != got.Anomalies {
		t.Fatal("tail or anomalies depend on the order of the merge")
	}
	// an empty summary merges as nothing, and into nothing as a copy
	e := a.Clone()
	if err := e.Merge(Summary{}); err != nil || !reflect.DeepEqual(e, a) {
		t.Fatalf("merging an empty summary changed it (%v)", err)
	}
	var z Summary
	if err := z.Merge(a); err != nil || !reflect.DeepEqual(z.Moments, a.Moments) || !reflect.DeepEqual(z.Tail, a.Tail) ||
		!reflect.DeepEqual(z.Histogram, a.Histogram) || z.Anomalies != a.Anomalies {
		t.Fatalf("merging into an empty summary is not a copy (%v)", err)
	}
}

func TestSummaryMergeMalformed(t *testing.T) {
	tests := []struct {
		name   string
		o      Summary
		nerrs  int
		wantN  float64
		wantAn uint64
	}{
		{"bad histogram", Summary{Moments: Moments{N: 1, Mean: 2, Min: 2, Max: 2}, Histogram: Histogram{BinWidth: -1, Counts: []uint64{1}}, Anomalies: 1}, 1, 11, 3},
		{"bad tail", Summary{Tail: TailHist{Lo: 0, Counts: []uint64{1}, Mins: []float64{1e9}, Maxs: []float64{1e9}}}, 1, 10, 2},
		{"both", Summary{Histogram: Histogram{BinWidth: 0, Counts: []uint64{1}}, Tail: TailHist{Counts: []uint64{1}}}, 2, 10, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(3, 4))
			s := summaryOf(randomValues(rng, 10), 2)
			c := s.Clone()
			h, tl := c.Histogram, c.Tail
			err := s.Merge(tc.o)
			if err == nil {
				t.Fatal("merged a malformed summary without an error")
			}
			if n := len(err.(interface{ Unwrap() []error }).Unwrap()); n != tc.nerrs {
				t.Errorf("%d errors, want %d: %v", n, tc.nerrs, err)
			}
			if s.Moments.N != tc.wantN || s.Anomalies != tc.wantAn {
				t.Errorf("N %v anomalies %d, want %v %d", s.Moments.N, s.Anomalies, tc.wantN, tc.wantAn)
			}
			if !reflect.DeepEqual(s.Histogram, h) || !reflect.DeepEqual(s.Tail, tl) {
				t.Error("a malformed part changed the summary's histograms")
			}
		})
	}
}

func TestSummaryCloneReset(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	s := summaryOf(randomValues(rng, 100), 1)
	c := s.Clone()
	if !reflect.DeepEqual(c, s) {
		t.Fatal("clone differs")
	}
	c.Histogram.Counts[0]++
	c.Tail.Counts[0]++
	c.Tail.Mins[0]++
	if reflect.DeepEqual(c, s) {
		t.Fatal("clone shares memory with the original")
	}
	s.Reset()
	if !s.Empty() || !s.Histogram.Empty() || !s.Tail.Empty() || s.Moments != (Moments{}) || s.Anomalies != 0 {
		t.Fatalf("reset left %+v", s)
	}
	if (&Summary{Anomalies: 1}).Empty() || (&Summary{Moments: Moments{N: 1}}).Empty() {
		t.Fatal("a summary with an anomaly or a runtime is empty")
	}
}

func TestSummaryBinaryRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	nan := math.Float64frombits(0x7ff8000000000123)
	tests := []struct {
		name string
		s    Summary
		size int // bytes, 0: not checked
	}{
		{"zero", Summary{}, 1 + 1 + 2 + 1},
		{"full", summaryOf(randomValues(rng, 1000), 12), 0},
		{"moments only", Summary{Moments: Moments{N: 1, Mean: 5, Min: 5, Max: 5}}, 1 + 56 + 1 + 2 + 1},
		{"empty non-nil counts", Summary{Histogram: Histogram{Counts: []uint64{}}}, 1 + 1 + 32 + 1 + 2 + 1},
		{"NaN payload kept", Summary{Moments: Moments{N: 2, Mean: nan}}, 0},
		{"tail bin with zero count", Summary{Tail: TailHist{Lo: TailBin(5) - 1, Counts: []uint64{0, 1}, Mins: []float64{3, 5}, Maxs: []float64{3, 5}}, Anomalies: 1 << 40}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := tc.s.AppendBinary([]byte("prefix"))
			if err != nil {
				t.Fatal(err)
			}
			if tc.size != 0 && len(b)-6 != tc.size {
				t.Errorf("%d bytes, want %d", len(b)-6, tc.size)
			}
			b = append(b, "suffix"...)
			var got Summary
			n, err := got.DecodeBinary(b[6:])
			if err != nil {
				t.Fatal(err)
			}
			if n != len(b)-12 {
				t.Fatalf("took %d bytes of %d", n, len(b)-12)
			}
			again, _ := got.AppendBinary(nil)
			if !bytes.Equal(again, b[6:6+n]) {
				t.Fatal("decoded summary encodes differently")
			}
			if (got.Histogram.Counts == nil) != (tc.s.Histogram.Counts == nil) || math.Float64bits(got.Moments.Mean) != math.Float64bits(tc.s.Moments.Mean) {
				t.Fatal("nil counts or float bits not kept")
			}
			// every proper prefix is refused, and leaves the summary zero
			for i := range n {
				var p Summary
				p.Anomalies = 1
				if _, err := p.DecodeBinary(b[6 : 6+i]); err == nil {
					t.Fatalf("prefix of %d of %d bytes accepted", i, n)
				}
				if !reflect.DeepEqual(p, Summary{}) {
					t.Fatalf("refused prefix of %d bytes left %+v", i, p)
				}
			}
		})
	}
}

func TestSummaryDecodeRefuses(t *testing.T) {
	valid, _ := (&Summary{Moments: Moments{N: 1, Mean: 1, Min: 1, Max: 1}}).AppendBinary(nil)
	tests := []struct {
		name string
		b    []byte
	}{
		{"moments tag", []byte{2}},
		{"histogram tag", []byte{0, 7}},
		{"histogram bins", append([]byte{0, 1}, append(make([]byte, 32), 0xff, 0xff, 0x3f)...)},
		{"malformed histogram", func() []byte {
			b, _ := (&Histogram{BinWidth: -1, Counts: []uint64{1}}).AppendBinary([]byte{0})
			return append(b, 0, 0, 0)
		}()},
		{"tail below bin 0", []byte{0, 0, 1, 0, 0}},
		{"tail bounds tag", []byte{0, 0, 0, 1, 0, 2}},
		{"malformed tail", func() []byte {
			b, _ := (&TailHist{Counts: []uint64{1}, Mins: []float64{1e9}, Maxs: []float64{1e9}}).AppendBinary([]byte{0, 0})
			return append(b, 0)
		}()},
		{"tail longer than the bytes", []byte{0, 0, 0, 0x80, 0x80, 0x04}},
		{"truncated", valid[:len(valid)-1]},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var s Summary
			if n, err := s.DecodeBinary(tc.b); err == nil {
				t.Fatalf("accepted (%d bytes): %+v", n, s)
			}
		})
	}
}

func FuzzSummaryDecode(f *testing.F) {
	rng := rand.New(rand.NewPCG(9, 10))
	for _, s := range []Summary{{}, summaryOf(randomValues(rng, 50), 2), {Histogram: Histogram{Counts: []uint64{}}}} {
		b, _ := s.AppendBinary(nil)
		f.Add(b)
	}
	f.Add([]byte{1, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		var s Summary
		n, err := s.DecodeBinary(b)
		if err != nil {
			if !reflect.DeepEqual(s, Summary{}) {
				t.Fatalf("refused form left %+v", s)
			}
			return
		}
		if n > len(b) {
			t.Fatalf("took %d of %d bytes", n, len(b))
		}
		if err := s.Histogram.Validate(); err != nil {
			t.Fatalf("decoded a malformed histogram: %v", err)
		}
		if err := s.Tail.Validate(); err != nil {
			t.Fatalf("decoded a malformed tail: %v", err)
		}
		// what it decoded encodes to a form that decodes to the same bits
		e, _ := s.AppendBinary(nil)
		var s2 Summary
		m, err := s2.DecodeBinary(e)
		if err != nil || m != len(e) {
			t.Fatalf("re-encoded form refused (%v) or not whole (%d of %d)", err, m, len(e))
		}
		e2, _ := s2.AppendBinary(nil)
		if !bytes.Equal(e, e2) {
			t.Fatal("encoding is not stable across a round trip")
		}
		// and merges into a copy of itself without a panic
		c := s.Clone()
		_ = c.Merge(s)
	})
}
