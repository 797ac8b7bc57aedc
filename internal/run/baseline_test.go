package run

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/baseline"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// The summary's baseline section: functions by extra time with what is
// slower and the new mode's statistic, functions absent from the baseline
// listed; --json has the key baseline; nothing without a baseline.
func TestSummaryBaseline(t *testing.T) {
	s := &Summary{RunID: "r", Algorithm: "tail", Stored: map[provenance.Kind]int64{}, Store: "out/r/provenance.db"}
	var text bytes.Buffer
	if err := s.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(text.String(), "baseline") {
		t.Errorf("without a baseline:\n%s", text.String())
	}
	s.Baseline = &baseline.Report{Source: "out/clean", Compared: "time per io_step", Functions: []baseline.FuncComparison{
		{Func: "MPI_Irecv", TimePerStepRatio: 160, ExtraUs: 16.9e6, CallsRatio: 0.7, P50: 0, BaselineP50: 0, P99: 21175, BaselineP99: 44,
			Slower:  []string{"new slow mode", "p99 shifted"},
			NewMode: &baseline.NewMode{Bound: 1299.2, Calls: 16210, Beyond: 797, BaselineCalls: 16210, BaselineBeyond: 6, FromUs: 9340, InMode: 793, TypicalUs: 21175, PValue: 1e-300}},
		{Func: "MPI_Wait", TimePerStepRatio: 0.98, ExtraUs: 20224, CallsRatio: 0.7, P99: 62, BaselineP99: 48},
	}, Absent: []string{"new_func"}}
	text.Reset()
	if err := s.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(strings.Fields(text.String()), " ")
	for _, want := range []string{
		"baseline out/clean: compared time per io_step; 2 functions in both, by extra time",
		"MPI_Irecv 160.00x time per io_step, 16.9s extra, 0.70x calls per io_step, p50 0s (was 0s), p99 21.18ms (was 44µs): new slow mode, p99 shifted (797 of 16210 calls over 1.3ms against 6 of 16210 in the baseline; from 9.34ms on 793 calls, typically 21.18ms, against 0; binomial p = 1e-300)",
		"MPI_Wait 0.98x time per io_step, 20.22ms extra, 0.70x calls per io_step, p50 0s (was 0s), p99 62µs (was 48µs): nothing slower beyond noise",
		"not in the baseline new_func",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("summary lacks %q:\n%s", want, text.String())
		}
	}
	var js bytes.Buffer
	if err := s.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Baseline struct {
			Functions []struct {
				Func    string `json:"func"`
				NewMode *struct {
					FromUs float64 `json:"from_us"`
					PValue float64 `json:"p_value"`
				} `json:"new_mode"`
			} `json:"functions"`
			Absent []string `json:"absent"`
		} `json:"baseline"`
	}
	if err := json.Unmarshal(js.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if b := doc.Baseline; len(b.Functions) != 2 || b.Functions[0].NewMode == nil || b.Functions[0].NewMode.FromUs != 9340 || len(b.Absent) != 1 {
		t.Errorf("--json baseline %+v", b)
	}
}
