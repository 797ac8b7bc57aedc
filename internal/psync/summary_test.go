package psync

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/stats"
)

func TestNewModelDelta(t *testing.T) {
	var s stats.Summary
	for _, x := range []float64{3, 5, 8, 13} {
		s.Moments.Push(x)
		s.Tail.Add(x)
	}
	s.Histogram = stats.BuildHistogram([]float64{3, 5, 8, 13}, 4)
	s.Anomalies = 2
	h, tl := s.Histogram, s.Tail
	tests := []struct {
		name      string
		s         stats.Summary
		hist      bool
		histogram bool // carried
		tail      bool
	}{
		{"hbos run", s, true, true, true},
		{"histogram left out", s, false, false, true},
		{"empty histograms left out", stats.Summary{Moments: s.Moments, Histogram: stats.Histogram{Counts: []uint64{0}}}, true, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.s.Clone()
			md := NewModelDelta("f", &tc.s, tc.hist)
			want := ModelDelta{Key: "f", Moments: tc.s.Moments, Anomalies: tc.s.Anomalies}
			if tc.histogram {
				want.Histogram = &h
			}
			if tc.tail {
				want.Tail = &tl
			}
			if !reflect.DeepEqual(md, want) {
				t.Fatalf("delta %+v, want %+v", md, want)
			}
			b, err := json.Marshal(md)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Contains(string(b), `"histogram":`); got != tc.histogram {
				t.Errorf("wire form carries a histogram: %v, want %v: %s", got, tc.histogram, b)
			}
			if got := strings.Contains(string(b), `"tail":`); got != tc.tail {
				t.Errorf("wire form carries a tail: %v, want %v: %s", got, tc.tail, b)
			}
			if md.Histogram != nil {
				md.Histogram.Counts[0]++
			}
			if md.Tail != nil {
				md.Tail.Counts[0]++
			}
			if !reflect.DeepEqual(tc.s, before) {
				t.Error("the delta shares memory with the summary")
			}
		})
	}
}

func TestGlobalModelInto(t *testing.T) {
	mine := stats.Summary{Moments: stats.Moments{N: 1, Mean: 1, Min: 1, Max: 1},
		Histogram: stats.BuildHistogram([]float64{1, 2}, 2), Anomalies: 4}
	mine.Tail.Add(1)
	gh := stats.BuildHistogram([]float64{5, 6, 7}, 3)
	var gt stats.TailHist
	gt.Add(6)
	gm := stats.Moments{N: 3, Mean: 6, M2: 2, Min: 5, Max: 7}
	tests := []struct {
		name string
		g    GlobalModel
		want stats.Summary
	}{
		{"everything", GlobalModel{Key: "f", Moments: gm, Histogram: &gh, Tail: &gt}, stats.Summary{Moments: gm, Histogram: gh, Tail: gt}},
		{"moments only: the histograms stay", GlobalModel{Key: "f", Moments: gm}, stats.Summary{Moments: gm, Histogram: mine.Histogram, Tail: mine.Tail}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dst := mine
			tc.g.Into(&dst)
			if !reflect.DeepEqual(dst, tc.want) {
				t.Fatalf("got %+v, want %+v", dst, tc.want)
			}
		})
	}
}
