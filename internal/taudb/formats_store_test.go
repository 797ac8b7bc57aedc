package taudb

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestStoreFormats saves one trial of each format to PostgreSQL (skipped
// without it, unless KIPIMO_REQUIRE_PG=1), loads it back, and checks that
// every row TAU's loader would store comes back the same, and the count of
// call-data rows against the trial's call data with calls > 0.
func TestStoreFormats(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	// The lulesh profile in json-split form stands for caliper-json.
	jsonPath := filepath.Join(t.TempDir(), "lulesh.json")
	if err := os.WriteFile(jsonPath, luleshJSONSplit(t, scanLulesh(t)), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := append(formatFixtures[:len(formatFixtures):len(formatFixtures)], struct{ name, path, format string }{"caliper-json-lulesh", jsonPath, FormatCaliperJSON})
	for _, fx := range cases {
		t.Run(fx.name, func(t *testing.T) {
			path := formatPath(fx.path)
			if filepath.IsAbs(fx.path) {
				path = fx.path
			}
			tr, err := LoadPath(path, fx.format)
			if err != nil {
				t.Fatal(err)
			}
			st, err := s.SaveTrial(ctx, tr)
			if err != nil {
				t.Fatal(err)
			}
			want := 0
			for _, th := range tr.Threads {
				for _, d := range th.CallData {
					if d.Calls > 0 || th.IsDerived() {
						want++
					}
				}
			}
			var got int
			if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM timer_call_data d JOIN thread h ON h.id = d.thread WHERE h.trial = $1`, tr.ID).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("timer_call_data rows %d, want %d", got, want)
			}
			if st.Rows() == 0 {
				t.Error("SaveTrial reports no rows")
			}
			back, err := s.LoadTrial(ctx, tr.ID)
			if err != nil {
				t.Fatal(err)
			}
			w, h := dumpTrial(tr), dumpTrial(back)
			for _, table := range refTables {
				compareRows(t, "loaded "+table, h[table], w[table])
			}
		})
	}
}
