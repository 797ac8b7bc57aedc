package run

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/pserver"
)

// A recurring slow mode is in the summary's JSON under "recurring" with the
// fields the docs name, and on a line of its text.
func TestSummaryRecurring(t *testing.T) {
	s := &Summary{RunID: "r", Algorithm: "tail", Stored: map[provenance.Kind]int64{}, Recurring: []pserver.Recurring{{
		Func: "MPI_Irecv", RecurringMode: provenance.RecurringMode{Calls: 43, CallsFraction: 0.006, TypicalUs: 25100, LowUs: 25003, HighUs: 25410,
			TimeShare: 0.91, FirstIOStep: 2, Ranks: []uint32{0, 1}},
	}}}
	var b bytes.Buffer
	if err := s.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Recurring []map[string]any `json:"recurring"`
	}
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Recurring) != 1 {
		t.Fatalf("recurring %v, want one finding", got.Recurring)
	}
	for _, k := range []string{"func", "calls_fraction", "typical_us", "time_share", "first_io_step", "ranks"} {
		if _, ok := got.Recurring[0][k]; !ok {
			t.Errorf("recurring finding %v has no %q", got.Recurring[0], k)
		}
	}
	b.Reset()
	if err := s.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	text := strings.Join(strings.Fields(b.String()), " ")
	if want := "recurring MPI_Irecv: 0.6% of its calls take about 25.1ms (91% of its time), from io_step 2 on 2 ranks"; !strings.Contains(text, want) {
		t.Errorf("text lacks %q:\n%s", want, text)
	}
}
