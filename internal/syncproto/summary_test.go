package syncproto

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
			touch(md.Histogram, md.Tail)
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

// sampleSummary is a summary of values with both histograms and anoms
// anomalies.
func sampleSummary(anoms uint64, values ...float64) stats.Summary {
	var s stats.Summary
	for _, x := range values {
		s.Moments.Push(x)
		s.Tail.Add(x)
	}
	s.Histogram = stats.BuildHistogram(values, len(values))
	s.Anomalies = anoms
	return s
}

// touch changes the first bin of the histograms a message carries: a test
// of whether they share memory with the summary they came from.
func touch(h *stats.Histogram, t *stats.TailHist) {
	if h != nil {
		h.Counts[0]++
	}
	if t != nil {
		t.Counts[0]++
	}
}

func TestDeltaSummary(t *testing.T) {
	s := sampleSummary(1, 2, 4, 9)
	tests := []struct {
		name string
		d    ModelDelta
		want stats.Summary
	}{
		{"everything", NewModelDelta("f", &s, true), s},
		{"no histogram", NewModelDelta("f", &s, false), stats.Summary{Moments: s.Moments, Tail: s.Tail, Anomalies: 1}},
		{"moments only", ModelDelta{Key: "f", Moments: s.Moments}, stats.Summary{Moments: s.Moments}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.d.Summary(); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("summary %+v, want %+v", got, tc.want)
			}
			// merged into a summary, the delta adds what it carries
			var m stats.Summary
			if err := m.Merge(tc.d.Summary()); err != nil || !reflect.DeepEqual(m.Moments, tc.want.Moments) || m.Anomalies != tc.want.Anomalies ||
				m.Tail.N() != tc.want.Tail.N() || m.Histogram.Total() != tc.want.Histogram.Total() {
				t.Fatalf("merged %+v (%v), want %+v", m, err, tc.want)
			}
		})
	}
	p := ModelPart{Moments: s.Moments, Histogram: &s.Histogram}
	if got := p.Summary(); !reflect.DeepEqual(got, stats.Summary{Moments: s.Moments, Histogram: s.Histogram}) {
		t.Fatalf("part's summary %+v", got)
	}
	if got := (&ModelPart{Moments: s.Moments}).Summary(); !reflect.DeepEqual(got, stats.Summary{Moments: s.Moments}) {
		t.Fatalf("part without a histogram: summary %+v", got)
	}
}

func TestNewGlobalModel(t *testing.T) {
	s := sampleSummary(5, 2, 4, 9)
	h, tl := s.Histogram, s.Tail
	tests := []struct {
		name string
		s    stats.Summary
		want GlobalModel
	}{
		{"everything", s, GlobalModel{Key: "f", Moments: s.Moments, Histogram: &h, Tail: &tl}},
		{"empty histograms left out", stats.Summary{Moments: s.Moments, Histogram: stats.Histogram{Counts: []uint64{0}}, Anomalies: 2},
			GlobalModel{Key: "f", Moments: s.Moments}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.s.Clone()
			g := NewGlobalModel("f", &tc.s)
			if !reflect.DeepEqual(g, tc.want) {
				t.Fatalf("global model %+v, want %+v", g, tc.want)
			}
			b, err := MarshalReply(&SyncReply{Models: []GlobalModel{g}})
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(b), "anomalies") {
				t.Errorf("a global model carries an anomaly count: %s", b)
			}
			touch(g.Histogram, g.Tail)
			if !reflect.DeepEqual(tc.s, before) {
				t.Error("the global model shares memory with the summary")
			}
		})
	}
}
