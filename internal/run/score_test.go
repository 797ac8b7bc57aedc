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
