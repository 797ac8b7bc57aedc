package run

import (
	"bytes"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// The summary's text measures nothing it has nothing to measure: no
// precision of zero flags, no live phases a live program's score has not,
// no reduction below 1 for a store larger than a short run's frames; it
// says a run was interrupted and where no profiles are.
func TestSummaryText(t *testing.T) {
	base := func() *Summary {
		return &Summary{RunID: "r", Algorithm: "tail", Stored: map[provenance.Kind]int64{}, Store: "out/r/provenance.db", ProfilesDir: "out/r/profiles"}
	}
	cases := []struct {
		name      string
		edit      func(s *Summary)
		want, not []string
	}{
		{
			name: "live program with injected delays, nothing flagged live",
			edit: func(s *Summary) {
				s.Score = &Score{Injected: 3, Live: &LiveScore{}}
				s.Live = &LiveReport{Command: []string{"app"}}
			},
			want: []string{"precision not measured (nothing flagged)"},
			not:  []string{"precision 0.000", "live precision", "(0 flagged)"},
		},
		{
			name: "live program whose injected function was never called",
			edit: func(s *Summary) {
				s.Score = &Score{Live: &LiveScore{}}
				s.Live = &LiveReport{Command: []string{"true"}}
			},
			want: []string{"precision not measured (nothing flagged), recall not measured (nothing injected) (0 of 0 injected found"},
			not:  []string{"recall 0.000"},
		},
		{
			name: "synthetic run with both phases",
			edit: func(s *Summary) {
				s.Score = &Score{Injected: 3, Flagged: 3, TruePositives: 3, Precision: 1, Recall: 1,
					Live: &LiveScore{Flagged: 4, TruePositives: 3, Precision: 0.75, Recall: 1, Cold: PhaseScore{Flagged: 1, Precision: 0}, Warm: PhaseScore{Flagged: 3, Precision: 1}}}
			},
			want: []string{"precision 1.000, recall 1.000", "live precision 0.000 (1 flagged) in io_steps 0-9, 1.000 (3 flagged) after"},
		},
		{
			name: "one phase flagged nothing",
			edit: func(s *Summary) {
				s.Score = &Score{Injected: 3, Flagged: 3, TruePositives: 3, Precision: 1, Recall: 1,
					Live: &LiveScore{Flagged: 3, TruePositives: 3, Precision: 1, Recall: 1, Warm: PhaseScore{Flagged: 3, Precision: 1}}}
			},
			want: []string{"none flagged in io_steps 0-9, 1.000 (3 flagged) after"},
		},
		{
			name: "short run",
			edit: func(s *Summary) {
				s.RawBytes, s.StoredBytes, s.Events, s.Reduction, s.BytesPerInputEvent = 1000, 2000, 100, 0.5, 20
			},
			want: []string{"a short run: the store's fixed size outweighs its frames"},
			not:  []string{"reduction 0.5x"},
		},
		{
			name: "reduction",
			edit: func(s *Summary) { s.RawBytes, s.StoredBytes, s.Reduction = 4000, 1000, 4 },
			want: []string{"(reduction 4.0x;"},
		},
		{
			name: "interrupted, no profiles, NATS data kept",
			edit: func(s *Summary) { s.Interrupted, s.ProfilesDir, s.NATSBytes = "SIGINT", "", 2048 },
			want: []string{"interrupted by SIGINT: the run ended early", "TAU profiles none: no rank streamed an io_step", "NATS data kept (--keep-nats): 2.0 KiB more in out/r/nats"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := base()
			tc.edit(s)
			var b bytes.Buffer
			if err := s.WriteText(&b); err != nil {
				t.Fatal(err)
			}
			// Columns as one space each: the table's padding is not
			// what is tested.
			text := strings.Join(strings.Fields(b.String()), " ")
			for _, w := range tc.want {
				if !strings.Contains(text, w) {
					t.Errorf("no %q in:\n%s", w, b.String())
				}
			}
			for _, n := range tc.not {
				if strings.Contains(text, n) {
					t.Errorf("%q in:\n%s", n, b.String())
				}
			}
		})
	}
}
