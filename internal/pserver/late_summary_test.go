package pserver

import (
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// A detector sends the anomalies it labelled after the io_step they ran in
// as a summary of that earlier step, after the step's own: they count in
// that step's cell of the heat map and in its anomalies, and no frame or
// step is counted twice.
func TestLateSummaryCountsInTheStepItRan(t *testing.T) {
	a := NewAggregates(0)
	id := DetectorID{Rank: 3}
	a.AddStep(id, &syncproto.StepSummary{Step: 0, Anomalies: 1, Executions: 10, Events: 20, MinTS: 100, MaxTS: 200})
	a.AddStep(id, &syncproto.StepSummary{Step: 1, Anomalies: 0, Executions: 12, Events: 24, MinTS: 200, MaxTS: 300})
	// labelled in io_step 2, ran in io_step 0
	a.AddStep(id, &syncproto.StepSummary{Step: 0, Anomalies: 2, Executions: 2, MinTS: 120, MaxTS: 150,
		FuncAnomalies: map[string]uint64{"f": 2}, Funcs: []syncproto.FuncAnomalyMetrics{{Func: "f", Count: 2}}})
	a.AddStep(id, &syncproto.StepSummary{Step: 2, Anomalies: 0, Executions: 9, Events: 18, MinTS: 300, MaxTS: 400})
	if c := a.Steps[0].Ranks[id]; c.Anomalies != 3 || c.Executions != 12 {
		t.Errorf("io_step 0's cell %+v, want 3 anomalies in 12 executions", c)
	}
	if got := a.Steps[0].Anomalies; got != 3 {
		t.Errorf("io_step 0: %d anomalies, want 3", got)
	}
	if c := a.Steps[2].Ranks[id]; c.Anomalies != 0 {
		t.Errorf("io_step 2's cell %+v, want no anomalies", c)
	}
	tot := a.Total()
	if tot.Frames != 3 || tot.Steps != 3 || tot.Anomalies != 3 || tot.Executions != 33 {
		t.Errorf("totals %+v, want 3 frames and steps, 3 anomalies, 33 executions", tot)
	}
	if r := a.Ranks[id]; r.Frames != 3 || r.Anomalies != 3 || r.FirstStep != 0 || r.LastStep != 2 {
		t.Errorf("rank totals %+v", *r)
	}
}
