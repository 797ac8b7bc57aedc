package cli

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/culprit"
	"github.com/kipimo-hpc/kipimo/internal/pserver"
	"github.com/kipimo-hpc/kipimo/internal/run"
)

// query culprits reads a finished run's culprits.json, or asks a running
// run's parameter server, and lists culprits, outlier ranks or bursts.
func TestQueryCulprits(t *testing.T) {
	c := pserver.Culprits{Steps: 20,
		Culprits: []pserver.CulpritRow{{Rank: 2, Func: "compute", TimeLostUs: 900_000, OwnUs: 300_000, CausedUs: 600_000, Bursts: 3, Top: 3, IOSteps: []uint64{4, 9, 15}}, {Rank: 1, Func: "", TimeLostUs: 20_000, Bursts: 1, IOSteps: []uint64{7}}},
		Outliers: []pserver.OutlierRow{{Rank: 2, Func: "compute", Steps: 3, IOSteps: []uint64{4, 9, 15}, ExcessUs: 300_000, TimeLostUs: 900_000, Standing: true}},
		Bursts: []pserver.Burst{{IOStep: 4, Ranks: 4, Anomalies: 7, AnomalousRanks: 3, WaitUs: 200_000,
			Culprits: []culprit.Culprit{{Rank: 2, Func: "compute", IOStep: 4, OwnUs: 100_000, CausedUs: 200_000, TimeLostUs: 300_000, Victims: []uint32{1, 3}, VictimCount: 2}}}},
	}
	data, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, storeFile), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/culprits" || r.URL.Query().Get("n") != "0" {
			http.NotFound(w, r)
			return
		}
		w.Write(data)
	}))
	defer srv.Close()

	// a run still going: no culprits.json yet
	if _, err := runQuery(t, "query", "culprits", "--store", dir); err == nil || !strings.Contains(err.Error(), "--dashboard") {
		t.Errorf("without culprits.json: %v, want an error pointing at --dashboard", err)
	}
	if err := os.WriteFile(filepath.Join(dir, run.CulpritsFile), data, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, src := range [][]string{{"--store", dir}, {"--store", filepath.Join(dir, storeFile)}, {"--dashboard", srv.URL}} {
		t.Run(src[0], func(t *testing.T) {
			out, err := runQuery(t, append([]string{"query", "culprits", "--json"}, src...)...)
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			var first pserver.CulpritRow
			if err := json.Unmarshal([]byte(lines[0]), &first); err != nil || len(lines) != 2 || first.Rank != 2 || first.TimeLostUs != 900_000 {
				t.Errorf("culprits %q (%v), want rank 2 first of 2", out, err)
			}
			out, err = runQuery(t, append([]string{"query", "culprits"}, src...)...)
			if err != nil || !strings.Contains(out, "RANK  FUNC") || !strings.Contains(out, "2     compute       900ms") || !strings.Contains(out, "(unreported)") {
				t.Errorf("table:\n%s%v", out, err)
			}
			out, err = runQuery(t, append([]string{"query", "culprits", "--outliers"}, src...)...)
			if err != nil || !strings.Contains(out, "3/20") || !strings.Contains(out, "4,9,15") || !strings.Contains(out, "true") {
				t.Errorf("outliers:\n%s%v", out, err)
			}
			out, err = runQuery(t, append([]string{"query", "culprits", "--bursts"}, src...)...)
			if err != nil || !strings.Contains(out, "3/4") || !strings.Contains(out, "rank 2 compute (300ms)") {
				t.Errorf("bursts:\n%s%v", out, err)
			}
		})
	}
	if _, err := runQuery(t, "query", "culprits", "--outliers", "--bursts", "--store", dir); err == nil {
		t.Error("--outliers with --bursts: no error")
	}
}
