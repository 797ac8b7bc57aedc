package run

import (
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

func TestScoreAnomalies(t *testing.T) {
	truth := []workload.Truth{
		{Rank: 0, Tid: 0, Func: "f", Entry: 10, Kind: workload.SlowCall},
		{Rank: 1, Tid: 0, Func: "f", Entry: 10, Kind: workload.SlowCall},
		{Rank: 1, Tid: 1, Func: "k", Entry: 50, Kind: workload.SlowKernel},
	}
	cases := []struct {
		name          string
		flagged       []provenance.Exec
		tp            int
		prec, recall  float64
		slowCallFound int
	}{
		{"none", nil, 0, 0, 0, 0},
		{"all", []provenance.Exec{
			{RID: 0, TID: 0, Func: "f", Entry: 10},
			{RID: 1, TID: 0, Func: "f", Entry: 10},
			{RID: 1, TID: 1, Func: "k", Entry: 50},
		}, 3, 1, 1, 2},
		{"one false positive", []provenance.Exec{
			{RID: 0, TID: 0, Func: "f", Entry: 10},
			{RID: 0, TID: 0, Func: "f", Entry: 11},
		}, 1, 0.5, 1.0 / 3, 1},
		{"wrong thread is not a match", []provenance.Exec{
			{RID: 1, TID: 1, Func: "f", Entry: 10},
		}, 0, 0, 0, 0},
		{"duplicate counted once as true", []provenance.Exec{
			{RID: 0, TID: 0, Func: "f", Entry: 10},
			{RID: 0, TID: 0, Func: "f", Entry: 10},
		}, 1, 0.5, 1.0 / 3, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := ScoreAnomalies(truth, tc.flagged)
			if s.TruePositives != tc.tp || s.Precision != tc.prec || s.Recall != tc.recall {
				t.Fatalf("tp %d precision %v recall %v, want %d %v %v", s.TruePositives, s.Precision, s.Recall, tc.tp, tc.prec, tc.recall)
			}
			for _, k := range s.Kinds {
				if k.Kind == string(workload.SlowCall) && k.Found != tc.slowCallFound {
					t.Fatalf("slow_call found %d, want %d", k.Found, tc.slowCallFound)
				}
			}
		})
	}
}

func TestScoreFinal(t *testing.T) {
	truth := []workload.Truth{
		{Rank: 0, Tid: 0, Func: "f", Entry: 10, Kind: workload.BeyondMax},
		{Rank: 0, Tid: 0, Func: "f", Entry: 90, Kind: workload.BeyondMax},
	}
	x := func(v float64) *provenance.Explanation { return &provenance.Explanation{Key: "f", Value: v} }
	anomalies := []provenance.Exec{
		{Func: "f", Entry: 10, IOStep: 1, Explanation: x(300)},  // true, cold
		{Func: "f", Entry: 20, IOStep: 2, Explanation: x(120)},  // false, cold, inside the final range
		{Func: "f", Entry: 30, IOStep: 3, Explanation: x(130)},  // false, cold, inside the final range
		{Func: "f", Entry: 90, IOStep: 12, Explanation: x(400)}, // true, warm
		{Func: "f", Entry: 95, IOStep: 13},                      // false, warm, no explanation: kept
	}
	thr := map[string]provenance.Range{"f": {Low: 50, High: 140}}
	for _, tc := range []struct {
		name             string
		final            func(*provenance.Exec) bool
		flagged          int
		precision        float64
		unflagged        int
		coldPrec, warmPr float64
	}{
		{"relabelled with the final model", func(e *provenance.Exec) bool { return provenance.FinalAnomaly(e, thr) }, 3, 2.0 / 3, 2, 1.0 / 3, 0.5},
		{"no final model keeps every anomaly", nil, 5, 0.4, 0, 1.0 / 3, 0.5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := ScoreFinal(truth, append([]provenance.Exec(nil), anomalies...), tc.final)
			if s.Flagged != tc.flagged || s.Precision != tc.precision || s.Recall != 1 {
				t.Errorf("final: flagged %d precision %v recall %v, want %d %v 1", s.Flagged, s.Precision, s.Recall, tc.flagged, tc.precision)
			}
			l := s.Live
			if l == nil || l.Flagged != 5 || l.Precision != 0.4 || l.Unflagged != tc.unflagged {
				t.Fatalf("live %+v, want 5 flagged, precision 0.4, %d unflagged", l, tc.unflagged)
			}
			if l.Cold.Flagged != 3 || l.Cold.Precision != tc.coldPrec || l.Warm.Flagged != 2 || l.Warm.Precision != tc.warmPr {
				t.Errorf("cold %+v warm %+v", l.Cold, l.Warm)
			}
		})
	}
}
