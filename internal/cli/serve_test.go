package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
	"github.com/kipimo-hpc/kipimo/internal/provenance/storetest"
	"github.com/kipimo-hpc/kipimo/internal/pserver"
	"github.com/kipimo-hpc/kipimo/internal/run"
)

// serveStore writes a finished run's anomalies, normal executions and
// func_stats records into a SQLite store; withStats false leaves out the
// func_stats, as when the run did not finish.
func serveStore(t *testing.T, withStats bool) (string, []provenance.Exec, []provenance.GlobalFuncStats) {
	t.Helper()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "finished-run.db")
	s, err := sqlitestore.Open(ctx, path, sqlitestore.Options{Synchronous: "OFF"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	an := storetest.Generate(storetest.GenConfig{Seed: 7, N: 200, Programs: 1, Ranks: 4, Steps: 5, Anomaly: true})
	ne := storetest.Generate(storetest.GenConfig{Seed: 8, N: 400, Programs: 1, Ranks: 4, Steps: 5})
	_, fs, _, _ := storetest.GenerateOthers(0, 4)
	batches := []provenance.Batch{{Kind: provenance.KindAnomalies, Execs: an}, {Kind: provenance.KindNormalExecs, Execs: ne}}
	if withStats {
		batches = append(batches, provenance.Batch{Kind: provenance.KindFuncStats, FuncStats: fs})
	} else {
		fs = nil
	}
	for _, b := range batches {
		if err := s.Write(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	return path, an, fs
}

// startServe runs `kipimo serve` until the returned stop is called, and
// returns the dashboard URL it prints and everything printed before it.
func startServe(t *testing.T, args ...string) (url, printed string, stop func() error) {
	t.Helper()
	pr, pw := io.Pipe()
	root := NewRoot(pw, io.Discard)
	root.SetArgs(append([]string{"serve"}, args...))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		err := root.ExecuteContext(ctx)
		pw.CloseWithError(io.EOF)
		done <- err
	}()
	sc := bufio.NewScanner(pr)
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if u, ok := strings.CutPrefix(sc.Text(), "dashboard: "); ok {
			url = strings.Fields(u)[0]
			break
		}
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	stop = func() error { cancel(); return <-done }
	if url == "" {
		t.Fatalf("kipimo serve printed no dashboard URL: %q, error %v", lines, stop())
	}
	return url, strings.Join(lines, "\n"), stop
}

func TestServeStore(t *testing.T) {
	for _, tc := range []struct {
		name string
		// withStats writes the func_stats records, withCulprits the run's
		// culprits.json beside the store, as a run that ended does.
		withStats, withCulprits bool
		notes                   []string
	}{
		{"finished", true, true, nil},
		{"without func_stats", false, true, []string{"no func_stats"}},
		{"without culprits", true, false, []string{"no culprits.json"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, an, fs := serveStore(t, tc.withStats)
			want := pserver.Culprits{Steps: 5, Culprits: []pserver.CulpritRow{{Rank: 2, Func: "MPI_Send", TimeLostUs: 3e5, OwnUs: 1e5, CausedUs: 2e5, Bursts: 3, Top: 3, IOSteps: []uint64{1, 2, 4}}},
				Outliers: []pserver.OutlierRow{}, Bursts: []pserver.Burst{}}
			if tc.withCulprits {
				b, err := json.Marshal(want)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(filepath.Dir(path), run.CulpritsFile), b, 0o600); err != nil {
					t.Fatal(err)
				}
			} else {
				want = pserver.Culprits{Culprits: []pserver.CulpritRow{}, Outliers: []pserver.OutlierRow{}, Bursts: []pserver.Burst{}}
			}
			url, printed, stop := startServe(t, "--store", path, "--http", "127.0.0.1:0")
			if !strings.HasPrefix(url, "http://127.0.0.1:") || !strings.Contains(printed, "200 anomalies on 4 ranks") || !strings.Contains(printed, "run finished-run from") {
				t.Errorf("kipimo serve printed %q", printed)
			}
			if got := strings.Count(printed, "note:"); got != len(tc.notes) {
				t.Errorf("kipimo serve printed %q, want notes %q", printed, tc.notes)
			}
			for _, n := range tc.notes {
				if !strings.Contains(printed, n) {
					t.Errorf("kipimo serve printed %q, want note %q", printed, n)
				}
			}
			get := func(path string, v any) {
				t.Helper()
				res, err := http.Get(url + strings.TrimPrefix(path, "/"))
				if err != nil {
					t.Fatal(err)
				}
				defer res.Body.Close()
				if res.StatusCode != 200 {
					t.Fatalf("GET %s: %s", path, res.Status)
				}
				if v != nil {
					if err := json.NewDecoder(res.Body).Decode(v); err != nil {
						t.Fatal(err)
					}
				}
			}
			var sum pserver.Summary
			get("/api/summary", &sum)
			if sum.Status != pserver.StatusStored || sum.Totals.Anomalies != uint64(len(an)) || sum.Ranks != 4 {
				t.Errorf("summary %+v", sum)
			}
			var funcs []pserver.FuncRow
			get("/api/functions", &funcs)
			withModel := 0
			for _, f := range funcs {
				if f.HasModel {
					withModel++
				}
			}
			if withModel != len(fs) || len(funcs) == 0 {
				t.Errorf("%d function rows, %d with final statistics, want %d", len(funcs), withModel, len(fs))
			}
			var fv pserver.FuncView
			get("/api/function?func="+an[0].Func, &fv)
			if len(fv.Bins) == 0 {
				t.Errorf("no histogram of %s", an[0].Func)
			}
			var recs struct {
				Records []provenance.Exec `json:"records"`
			}
			get("/provdb/api/v1/records?limit=5&sort=outlier_score&order=desc", &recs)
			if len(recs.Records) != 5 {
				t.Errorf("the anomaly list through the store gave %d records, want 5", len(recs.Records))
			}
			var culprits pserver.Culprits
			get("/api/culprits?n=0", &culprits)
			if !reflect.DeepEqual(culprits, want) {
				t.Errorf("GET /api/culprits: %+v, want %+v", culprits, want)
			}
			get("/", nil)
			if err := stop(); err != nil {
				t.Errorf("kipimo serve ended with %v", err)
			}
		})
	}
}

func TestServeErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no store", []string{"serve"}, `"store" not set`},
		{"missing file", []string{"serve", "--store", filepath.Join(t.TempDir(), "none.db")}, "no such file"},
		{"bad window", []string{"serve", "--store", "x.db", "--window", "0"}, "--window 0"},
		{"argument", []string{"serve", "run.db"}, "unknown command"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := NewRoot(io.Discard, io.Discard)
			root.SetArgs(tc.args)
			err := root.ExecuteContext(context.Background())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}
