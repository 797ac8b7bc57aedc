package ad

import (
	"math"
	"testing"
)

// The false-alarm rate defaults to DefaultFalseAlarmRate, reaches the tail
// rule, and must lie in (0, 0.1).
func TestFalseAlarmRateValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		rate  float64
		want  float64
		valid bool
	}{
		{"default", 0, DefaultFalseAlarmRate, true},
		{"asked", 1e-5, 1e-5, true},
		{"negative", -1e-4, 0, false},
		{"too large", 0.1, 0, false},
		{"not a number", math.NaN(), 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{FalseAlarmRate: tc.rate}
			err := c.Validate()
			if (err == nil) != tc.valid {
				t.Fatalf("Validate() = %v, want valid %v", err, tc.valid)
			}
			if tc.valid && (c.FalseAlarmRate != tc.want || c.TailRule().Alpha != tc.want) {
				t.Errorf("rate %v, rule's alpha %v, want %v", c.FalseAlarmRate, c.TailRule().Alpha, tc.want)
			}
		})
	}
}
