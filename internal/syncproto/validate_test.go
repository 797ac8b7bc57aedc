package syncproto

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/stats"
)

func sample(vals ...float64) stats.Moments {
	var m stats.Moments
	for _, v := range vals {
		m.Push(v)
	}
	return m
}

// TestValidateAcceptsWhatDetectorsSend checks that statistics built the
// way detectors build them pass, however their values are spread.
func TestValidateAcceptsWhatDetectorsSend(t *testing.T) {
	sets := [][]float64{
		{1},
		{5, 5, 5, 5},
		{1, 2, 3, 1e6},
		{1e12, 1e12 + 1, 1e12 + 3},
		{1e15, 1e15 + 0.125, 1e15 + 0.25},
		{0.001, 0.002, 1e-9},
		{-3, 4, -5e20, 1e20},
	}
	for _, vals := range sets {
		a := sample(vals...)
		b := sample(vals[:len(vals)/2+1]...)
		b.Merge(a)
		h := stats.BuildHistogram(vals, 0)
		var tail stats.TailHist
		for _, v := range vals {
			if v > 0 {
				tail.Add(v)
			}
		}
		req := SyncRequest{
			PID: 1, Rank: 2, Seq: 3, Step: 4, Algorithm: "hbos", Hostname: "h",
			Models:   []ModelDelta{{Key: "f", Moments: a, Histogram: &h, Tail: &tail, Anomalies: 2, More: []ModelPart{{Moments: b, Histogram: &h}}}},
			Counters: []CounterDelta{{Name: "c", Moments: b, More: []stats.Moments{a}}},
			Steps:    []StepSummary{{Step: 4, Anomalies: 1, Executions: 4, MinTS: 10, MaxTS: 20, Scores: a, Severity: b, Funcs: []FuncAnomalyMetrics{{Func: "f", Count: 1, Score: a}}}},
		}
		if err := req.Validate(); err != nil {
			t.Errorf("values %v: %v", vals, err)
		}
	}
}

// TestValidateRefuses checks one violation of each kind.
func TestValidateRefuses(t *testing.T) {
	good := sample(1, 2, 3)
	bad := func(f func(m *stats.Moments)) stats.Moments { m := good; f(&m); return m }
	model := func(m stats.Moments) SyncRequest {
		return SyncRequest{Models: []ModelDelta{{Key: "f", Moments: m}}}
	}
	long := strings.Repeat("x", MaxKeyLen+1)
	tests := []struct {
		name string
		req  SyncRequest
		want string
	}{
		{"negative n", model(bad(func(m *stats.Moments) { m.N = -1e300 })), "n"},
		{"infinite mean", model(bad(func(m *stats.Moments) { m.Mean = math.Inf(1) })), "not finite"},
		{"NaN m3", model(bad(func(m *stats.Moments) { m.M3 = math.NaN() })), "not finite"},
		{"fractional n", model(bad(func(m *stats.Moments) { m.N = 2.5 })), "whole number"},
		{"n beyond 2^53", model(bad(func(m *stats.Moments) { m.N = 1 << 54 })), "whole number"},
		{"min above max", model(bad(func(m *stats.Moments) { m.Min = 4 })), "min <= max"},
		{"huge max", model(bad(func(m *stats.Moments) { m.Max = 1e31 })), "within"},
		{"negative m2", model(bad(func(m *stats.Moments) { m.M2 = -1 })), "m2"},
		{"m2 beyond range", model(bad(func(m *stats.Moments) { m.M2 = 1e9 })), "m2"},
		{"m3 beyond range", model(bad(func(m *stats.Moments) { m.M3 = -1e9 })), "m3"},
		{"m4 beyond range", model(bad(func(m *stats.Moments) { m.M4 = 1e12 })), "m4"},
		{"long key", SyncRequest{Models: []ModelDelta{{Key: long}}}, "bytes"},
		{"anomalies", SyncRequest{Models: []ModelDelta{{Key: "f", Anomalies: math.MaxUint64}}}, "anomalies"},
		{"histogram width", SyncRequest{Models: []ModelDelta{{Key: "f", Histogram: &stats.Histogram{BinWidth: -1, Counts: []uint64{1}}}}}, "bin width"},
		{"histogram bins", SyncRequest{Models: []ModelDelta{{Key: "f", Histogram: &stats.Histogram{BinWidth: 1, Counts: make([]uint64, MaxBins+1)}}}}, "bins"},
		{"histogram range", SyncRequest{Models: []ModelDelta{{Key: "f", Histogram: &stats.Histogram{FirstEdge: -1e300, BinWidth: 1e298, Counts: []uint64{1}, Min: -1e300, Max: -1e300}}}}, "edges"},
		{"histogram total", SyncRequest{Models: []ModelDelta{{Key: "f", Histogram: &stats.Histogram{BinWidth: 1, Counts: []uint64{MaxCount, 1}, Min: 0, Max: 1}}}}, "counts more"},
		{"tail", SyncRequest{Models: []ModelDelta{{Key: "f", Tail: &stats.TailHist{Counts: []uint64{1}}}}}, "tail"},
		{"further rank", SyncRequest{Models: []ModelDelta{{Key: "f", Moments: good, More: []ModelPart{{Moments: bad(func(m *stats.Moments) { m.N = -1 })}}}}}, "further rank"},
		{"counter", SyncRequest{Counters: []CounterDelta{{Name: "c", Moments: bad(func(m *stats.Moments) { m.Max = math.Inf(1) })}}}, "counter"},
		{"counter further rank", SyncRequest{Counters: []CounterDelta{{Name: "c", More: []stats.Moments{bad(func(m *stats.Moments) { m.N = -1 })}}}}, "further rank"},
		{"step scores", SyncRequest{Steps: []StepSummary{{Scores: bad(func(m *stats.Moments) { m.Mean = math.Inf(-1) })}}}, "scores"},
		{"step executions", SyncRequest{Steps: []StepSummary{{Executions: 1 << 60}}}, "executions"},
		{"step summarised calls", SyncRequest{Steps: []StepSummary{{SummarisedCalls: 1 << 60}}}, "summarised_calls"},
		{"step dropped calls", SyncRequest{Steps: []StepSummary{{DroppedCalls: 1 << 60}}}, "dropped_calls"},
		{"step dropped events", SyncRequest{Steps: []StepSummary{{DroppedEvents: 1 << 60}}}, "dropped_events"},
		{"step timestamps", SyncRequest{Steps: []StepSummary{{MaxTS: math.MaxUint64}}}, "timestamps"},
		{"io_step", SyncRequest{Steps: []StepSummary{{Step: math.MaxUint64}}}, "io_step"},
		{"function severity", SyncRequest{Steps: []StepSummary{{Funcs: []FuncAnomalyMetrics{{Func: "f", Severity: bad(func(m *stats.Moments) { m.N = -2 })}}}}}, "severity"},
		{"function anomalies", SyncRequest{Steps: []StepSummary{{FuncAnomalies: map[string]uint64{"f": math.MaxUint64}}}}, "func_anomalies"},
		{"more anomalies than executions", SyncRequest{Steps: []StepSummary{{Anomalies: 4_000_000_000, Executions: 1}}}, "among 1 executions"},
		{"function anomalies beyond the step's", SyncRequest{Steps: []StepSummary{{Anomalies: 1, Executions: 5, FuncAnomalies: map[string]uint64{"f": 1, "g": 1}}}}, "add up to 2"},
		{"tail rule", SyncRequest{TailRule: &stats.TailRule{Ratio: math.NaN()}}, "tail rule"},
		{"tail rule alpha", SyncRequest{TailRule: &stats.TailRule{Ratio: 1.4, Alpha: 0.5}}, "alpha"},
		{"tail rule NaN alpha", SyncRequest{TailRule: &stats.TailRule{Ratio: 1.4, Alpha: math.NaN()}}, "alpha"},
		{"hostname", SyncRequest{Hostname: long}, "hostname"},
		{"ranks twice", SyncRequest{Ranks: []RankPart{{Rank: 1, Seq: 1}, {Rank: 1, Seq: 2}}}, "twice"},
		{"ranks' steps", SyncRequest{Ranks: []RankPart{{Rank: 1, Seq: 1, Steps: []StepSummary{{Anomalies: math.MaxUint64}}}}}, "rank 0/1"},
		{"too many ranks", SyncRequest{Ranks: make([]RankPart, MaxRanks+1)}, "ranks"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.req.Validate()
			if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate: %v, want an ErrInvalid naming %q", err, tc.want)
			}
		})
	}
}

func TestCheckAdvance(t *testing.T) {
	tests := []struct {
		last, next, bound uint64
		ok                bool
	}{
		{0, 1, 10, true}, {0, 10, 10, true}, {0, 11, 10, false}, {5, 15, 10, true}, {5, 16, 10, false},
		{100, 3, 10, true}, {0, 1 << 62, MaxSeqAdvance, false}, {math.MaxUint64 - 1, math.MaxUint64, 1, true},
	}
	for _, tc := range tests {
		err := CheckAdvance("seq", tc.last, tc.next, tc.bound)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalid)) {
			t.Errorf("CheckAdvance(%d, %d, %d) = %v, want ok %v", tc.last, tc.next, tc.bound, err, tc.ok)
		}
	}
}

// FuzzValidate decodes arbitrary sync requests: whatever Validate accepts
// must merge (moments, histograms, tails, as the parameter server does,
// many times over) into statistics that stay finite and encode.
func FuzzValidate(f *testing.F) {
	h := stats.BuildHistogram([]float64{1, 2, 3}, 0)
	seed := SyncRequest{PID: 1, Rank: 2, Seq: 3, Algorithm: "hbos",
		Models:   []ModelDelta{{Key: "f", Moments: sample(1, 2, 3), Histogram: &h, More: []ModelPart{{Moments: sample(4, 9)}}}},
		Counters: []CounterDelta{{Name: "c", Moments: sample(1e6, 3e6)}},
		Steps:    []StepSummary{{Step: 1, Scores: sample(6, 7)}},
	}
	b, _ := json.Marshal(seed)
	f.Add(b)
	f.Add([]byte(`{"models":[{"key":"f","moments":{"n":-1e300,"mean":-1e300,"m2":-1e300,"min":-1e300,"max":-1e300}}]}`))
	f.Add([]byte(`{"models":[{"key":"f","moments":{"n":9007199254740992,"mean":1e30,"m2":1e60,"m3":1e90,"m4":1e120,"min":-1e30,"max":1e30}}]}`))
	f.Add([]byte(`{"models":[{"key":"f","histogram":{"first_edge":-1e30,"bin_width":1e28,"counts":[1,2,3],"min":-1e30,"max":1e30}}]}`))
	f.Add([]byte(`{"ranks":[{"pid":1,"rank":1,"seq":1},{"pid":1,"rank":1,"seq":1}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var req SyncRequest
		if err := json.Unmarshal(data, &req); err != nil {
			return
		}
		if err := req.Validate(); err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		var all []stats.Moments
		var hs []*stats.Histogram
		for i := range req.Models {
			d := &req.Models[i]
			all = append(all, d.Moments)
			hs = append(hs, d.Histogram)
			for j := range d.More {
				all = append(all, d.More[j].Moments)
				hs = append(hs, d.More[j].Histogram)
			}
		}
		for i := range req.Counters {
			all = append(all, req.Counters[i].Moments)
			all = append(all, req.Counters[i].More...)
		}
		for i := range req.Steps {
			all = append(all, req.Steps[i].Scores, req.Steps[i].Severity)
		}
		var g stats.Moments
		var gh stats.Histogram
		for range 4 {
			for _, m := range all {
				g.Merge(m)
			}
			for _, h := range hs {
				if h != nil {
					if err := gh.Merge(*h); err != nil {
						t.Fatalf("validated histogram %+v does not merge: %v", *h, err)
					}
				}
			}
		}
		for _, v := range []float64{g.N, g.Mean, g.M2, g.M3, g.M4, g.Min, g.Max, gh.FirstEdge, gh.BinWidth, gh.Min, gh.Max} {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				t.Fatalf("merged statistics %+v / histogram edges %v %v are not finite", g, gh.FirstEdge, gh.BinWidth)
			}
		}
		if _, err := json.Marshal(g); err != nil {
			t.Fatal(err)
		}
		if _, err := json.Marshal(req); err != nil {
			t.Fatalf("a validated request does not encode: %v", err)
		}
	})
}

// BenchmarkValidate measures the validation of a request of 200 model
// deltas with histograms and a step summary (what a detector sends each
// step), to set against decoding it.
func BenchmarkValidate(b *testing.B) {
	vals := make([]float64, 50)
	for i := range vals {
		vals[i] = 100 + float64(i*i)
	}
	m := sample(vals...)
	h := stats.BuildHistogram(vals, 0)
	req := SyncRequest{PID: 1, Rank: 2, Seq: 3, Algorithm: "hbos", Steps: []StepSummary{{Step: 3, Scores: m, Severity: m}}}
	for i := range 200 {
		req.Models = append(req.Models, ModelDelta{Key: fmt.Sprintf("solver::kernel_%03d", i), Moments: m, Histogram: &h})
	}
	data, _ := json.Marshal(req)
	b.Run("validate", func(b *testing.B) {
		for range b.N {
			if err := req.Validate(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode", func(b *testing.B) {
		for range b.N {
			var q SyncRequest
			if err := json.Unmarshal(data, &q); err != nil {
				b.Fatal(err)
			}
		}
	})
}
