package cli

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
	"github.com/kipimo-hpc/kipimo/internal/pserver"
	"github.com/kipimo-hpc/kipimo/internal/run"
	"github.com/kipimo-hpc/kipimo/internal/stats"
)

// liveRule is the natural-range rule the detectors of the live diff tests
// send.
var liveRule = stats.TailRule{Ratio: 1.4, Recur: 5, RecurFrac: 0.005, Resolution: 1, Alpha: 1e-4}

// syncIrecv sends what the detectors of 2 ranks send over steps io_steps
// of MPI_Irecv and MPI_Wait, 2,000 runtimes of 3-12 µs each per step and
// rank; with stall, 1% of MPI_Irecv's calls also take 25 ms. Requests go
// as JSON, the sync protocol's wire form.
func syncIrecv(t *testing.T, nc *nats.Conn, runID string, steps uint64, stall bool) {
	t.Helper()
	for rank := range 2 {
		for step := range steps {
			var models []map[string]any
			for _, key := range []string{"MPI_Irecv", "MPI_Wait"} {
				var m stats.Moments
				var h stats.TailHist
				add := func(x float64) { m.Push(x); h.Add(x) }
				for i := range 2000 {
					add(float64(3 + i%10))
				}
				if stall && key == "MPI_Irecv" {
					for i := range 20 {
						add(float64(25000 + i))
					}
				}
				models = append(models, map[string]any{"key": key, "moments": m, "tail": h})
			}
			summary := map[string]any{"io_step": step, "executions": 4000, "min_ts": step * 1e6, "max_ts": (step+1)*1e6 - 1}
			data, err := json.Marshal(map[string]any{"pid": 0, "rank": rank, "seq": step + 1, "io_step": step,
				"algorithm": "tail", "models": models, "steps": []any{summary}, "tail_rule": liveRule})
			if err != nil {
				t.Fatal(err)
			}
			msg, err := nc.Request(natsx.Subjects{Run: runID}.Sync(0), data, 10*time.Second)
			if err != nil {
				t.Fatalf("sync rank %d step %d: %v", rank, step, err)
			}
			var rep struct {
				Error string `json:"error"`
			}
			if err := json.Unmarshal(msg.Data, &rep); err != nil || rep.Error != "" {
				t.Fatalf("sync rank %d step %d: %s %v", rank, step, msg.Data, err)
			}
		}
	}
}

// livePserver starts a pserver for runID on nc, its dashboard on
// 127.0.0.1, stopped when the test ends.
func livePserver(t *testing.T, nc *nats.Conn, runID string) *pserver.Server {
	t.Helper()
	s, err := pserver.New(pserver.Config{Run: runID, Durability: pserver.DurabilityNone, HTTPAddr: "127.0.0.1:0"}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Start(ctx, nc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
	})
	return s
}

// kipimo diff compares a running run, given by its pserver's dashboard URL
// or by its run directory, with a finished run directory: by the models
// merged so far, saying which side is live and at which io_step, and finds
// the running run's new slow mode (1% of MPI_Irecv's calls at 25 ms) and
// nothing in MPI_Wait.
func TestDiffLiveRun(t *testing.T) {
	ns, err := natsx.StartServer(natsx.DefaultServerConfig(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	nc, err := natsx.Connect(context.Background(), ns.ClientURL(), "diff-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)

	// The finished run: its directory with the final func_stats records
	// of a clean run's pserver in its store.
	clean := livePserver(t, nc, "clean")
	syncIrecv(t, nc, "clean", 5, false)
	cleanDir := filepath.Join(t.TempDir(), "clean")
	if err := os.MkdirAll(cleanDir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, filepath.Join(cleanDir, "provenance.db"), sqlitestore.Options{Synchronous: "OFF"})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Write(ctx, provenance.Batch{Kind: provenance.KindFuncStats, FuncStats: clean.FuncStatsRecords()}); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	// The running run, 4 io_steps in, and its directory as kipimo run
	// leaves it while it runs.
	live := livePserver(t, nc, "stalls")
	syncIrecv(t, nc, "stalls", 4, true)
	url := "http://" + live.HTTPAddr()
	runDir := filepath.Join(t.TempDir(), "stalls")
	if err := os.MkdirAll(filepath.Join(runDir, "profiles"), 0o755); err != nil {
		t.Fatal(err)
	}
	e, _ := json.Marshal(run.Endpoints{Run: "stalls", Dashboard: url + "/"})
	if err := os.WriteFile(filepath.Join(runDir, run.EndpointsFile), e, 0o644); err != nil {
		t.Fatal(err)
	}

	out, stderr, err := runDiffCmd(t, cleanDir, url)
	if err != nil {
		t.Fatalf("diff: %v\n%s", err, stderr)
	}
	for _, want := range []string{
		"A: " + cleanDir + " (run, 5 io_steps, 2 functions)",
		"B: " + url + " (live run stalls, at io_step 3: the models merged so far, 2 functions)",
		"Showing 2 of 2 functions in both",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	irecv, wait := diffRow(out, "MPI_Irecv"), diffRow(out, "MPI_Wait")
	if !strings.Contains(irecv, "new slow mode") || !strings.Contains(wait, " same ") {
		t.Errorf("MPI_Irecv %q: want a new slow mode; MPI_Wait %q: want the same\n%s", irecv, wait, out)
	}
	if !strings.Contains(stderr, "B: read "+url+": live run stalls, 4 io_steps so far, 2 functions") {
		t.Errorf("stderr %q: want what was read from the live run", stderr)
	}

	// The running run's directory, as JSON, and the live run as A.
	type side struct {
		Source  string  `json:"source"`
		Kind    string  `json:"kind"`
		Live    bool    `json:"live"`
		Run     string  `json:"run"`
		IOStep  *uint64 `json:"io_step"`
		IOSteps uint64  `json:"io_steps"`
	}
	var doc struct {
		A, B      side
		Quantity  string `json:"quantity"`
		Count     int    `json:"count"`
		Functions []struct {
			Func    string   `json:"func"`
			Calls   uint64   `json:"calls"`
			Slower  []string `json:"slower"`
			NewMode *struct {
				InMode    uint64  `json:"in_mode"`
				TypicalUs float64 `json:"typical_us"`
			} `json:"new_mode"`
		} `json:"functions"`
	}
	out, stderr, err = runDiffCmd(t, "--json", cleanDir, runDir)
	if err != nil {
		t.Fatalf("diff --json: %v\n%s", err, stderr)
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("--json: %v\n%s", err, out)
	}
	if doc.A.Live || doc.A.Kind != "run" || doc.A.IOSteps != 5 ||
		!doc.B.Live || doc.B.Source != runDir || doc.B.Kind != "live" || doc.B.Run != "stalls" || doc.B.IOStep == nil || *doc.B.IOStep != 3 || doc.B.IOSteps != 4 {
		t.Errorf("sides %+v and %+v: want a finished run of 5 io_steps and the live run at io_step 3", doc.A, doc.B)
	}
	if doc.Quantity != "models" || doc.Count != 2 || len(doc.Functions) != 2 {
		t.Fatalf("%s: %d of %d functions, want models of 2", doc.Quantity, len(doc.Functions), doc.Count)
	}
	f := doc.Functions[0]
	if f.Func != "MPI_Irecv" || f.Calls != 4*2*2020 || f.NewMode == nil || f.NewMode.InMode != 4*2*20 || f.NewMode.TypicalUs < 25000 || f.NewMode.TypicalUs > 25020 {
		t.Errorf("first row %+v: want MPI_Irecv's 16,160 calls with the 160 of its mode at about 25 ms", f)
	}
	if g := doc.Functions[1]; g.Func != "MPI_Wait" || len(g.Slower) != 0 {
		t.Errorf("second row %+v: want MPI_Wait, nothing slower", g)
	}

	out, stderr, err = runDiffCmd(t, url, cleanDir)
	if err != nil {
		t.Fatalf("diff live clean: %v\n%s", err, stderr)
	}
	if !strings.Contains(out, "A: "+url+" (live run stalls, at io_step 3") || !strings.Contains(diffRow(out, "MPI_Irecv"), " same ") {
		t.Errorf("the live run as A: want it named live and the clean run as B without a new slow mode:\n%s", out)
	}
}

// diffRow is the line of out that ends with function fn.
func diffRow(out, fn string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasSuffix(l, "  "+fn) {
			return l
		}
	}
	return ""
}

// Flags of a per-thread comparison are refused against a running run, and
// a server that is no pserver nor provdb is named as such.
func TestDiffLiveRunErrors(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, run.EndpointsFile), []byte(`{"run":"x","dashboard":""}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--call-path", "a", "http://127.0.0.1:1"}, "--call-path: a running run"},
		{[]string{"--svg", "x.svg", "http://127.0.0.1:1", "b"}, "--svg: a running run"},
		{[]string{dir, loadImbalance}, "endpoints.json names no dashboard"},
		{[]string{"--token-file", "tok", loadImbalance, loadImbalance}, "--token-file is for a running run"},
	} {
		_, _, err := runDiffCmd(t, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("diff %v: %v, want %q", c.args, err, c.want)
		}
	}
}
