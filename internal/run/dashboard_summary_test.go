package run

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// TestSummaryDashboardLifecycle: the summary never prints the dashboard's URL
// as if it still answered once the run has stopped it; it says how to keep it
// (--keep-serving), and with --keep-serving that it is still served.
func TestSummaryDashboardLifecycle(t *testing.T) {
	const url = "http://127.0.0.1:43210/"
	cases := []struct {
		name     string
		served   string
		wantText []string
		notText  []string
		wantJSON string
	}{
		{
			name:     "stopped with the run",
			served:   DashboardDuringRun,
			wantText: []string{"served at " + url + " during the run only", "now stopped", "--keep-serving"},
			notText:  []string{"until interrupted"},
			wantJSON: DashboardDuringRun,
		},
		{
			name:     "kept serving",
			served:   DashboardUntilInterrupted,
			wantText: []string{url + " (still served until interrupted"},
			notText:  []string{"now stopped", "--keep-serving"},
			wantJSON: DashboardUntilInterrupted,
		},
		{
			name:     "unset means stopped",
			served:   "",
			wantText: []string{"during the run only", "--keep-serving"},
			wantJSON: "",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := &Summary{RunID: "r", Algorithm: "sstd", Stored: map[provenance.Kind]int64{}, Dashboard: url, DashboardServed: tc.served}
			var text bytes.Buffer
			if err := s.WriteText(&text); err != nil {
				t.Fatal(err)
			}
			var line string
			for _, l := range strings.Split(text.String(), "\n") {
				if strings.HasPrefix(l, "dashboard") {
					line = l
				}
			}
			if line == "" {
				t.Fatalf("no dashboard line in:\n%s", text.String())
			}
			for _, w := range tc.wantText {
				if !strings.Contains(line, w) {
					t.Errorf("dashboard line %q lacks %q", line, w)
				}
			}
			for _, w := range tc.notText {
				if strings.Contains(line, w) {
					t.Errorf("dashboard line %q has %q", line, w)
				}
			}
			var js bytes.Buffer
			if err := s.WriteJSON(&js); err != nil {
				t.Fatal(err)
			}
			var got struct {
				Dashboard       string  `json:"dashboard"`
				DashboardServed *string `json:"dashboard_served"`
			}
			if err := json.Unmarshal(js.Bytes(), &got); err != nil {
				t.Fatal(err)
			}
			if got.Dashboard != url {
				t.Errorf("JSON dashboard %q, want %q", got.Dashboard, url)
			}
			if got.DashboardServed == nil || *got.DashboardServed != tc.wantJSON {
				t.Errorf("JSON dashboard_served %v, want %q", got.DashboardServed, tc.wantJSON)
			}
		})
	}
}
