package pserver

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
	"github.com/kipimo-hpc/kipimo/internal/stats"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// syncIrecvJSON sends, as JSON (the sync protocol's wire form), what the
// detectors of irecvState's run send: 2 ranks x 5 io_steps of MPI_Irecv and
// MPI_Wait, 1% of MPI_Irecv's calls at 25 ms with stall.
func syncIrecvJSON(t *testing.T, nc *nats.Conn, run string, stall bool) {
	t.Helper()
	for rank := range 2 {
		for step := range uint64(5) {
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
			data, err := json.Marshal(map[string]any{"pid": 0, "rank": rank, "seq": step + 1, "io_step": step,
				"algorithm": "tail", "models": models, "tail_rule": baselineRule})
			if err != nil {
				t.Fatal(err)
			}
			msg, err := nc.Request(natsx.Subjects{Run: run}.Sync(0), data, 10*time.Second)
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

// pserver --baseline RUNDIR, on a cluster: the pserver reads the baseline
// run itself, and the final ranges it publishes (the func_stats records
// kipimo query's end-of-run relabelling reads) end MPI_Irecv's where its
// new slow mode starts, as kipimo run --baseline does, so the stalls stay
// anomalies; MPI_Wait keeps its own range.
func TestMainBaselineFlag(t *testing.T) {
	// The baseline: a finished run's directory, its final func_stats
	// records in its store.
	clean, err := New(Config{Run: "clean"}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	clean.st = irecvState(t, false)
	own, err := New(Config{Run: "own"}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	own.st = irecvState(t, true)
	ownRanges := own.FinalRanges()
	if r := ownRanges["MPI_Irecv"]; r.High < 25000 {
		t.Fatalf("without a baseline MPI_Irecv's range %+v: the test assumes the mode is natural", r)
	}
	dir := filepath.Join(t.TempDir(), "clean")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	store, err := sqlitestore.Open(ctx, filepath.Join(dir, "provenance.db"), sqlitestore.Options{Synchronous: "OFF"})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Write(ctx, provenance.Batch{Kind: provenance.KindFuncStats, FuncStats: clean.FuncStatsRecords()}); err != nil {
		t.Fatal(err)
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}

	ns, nc := startNATS(t)
	mctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	var stderr bytes.Buffer
	go func() {
		done <- Main(mctx, []string{"--nats", ns.ClientURL(), "--run", "stalls", "--http", "", "--durability", "none",
			"--baseline", dir, "--log-level", "warn"}, &stderr)
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := nc.Request(natsx.Subjects{Run: "stalls"}.Sync(0), []byte(`{}`), 200*time.Millisecond); err == nil {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("Main returned before serving: %v (%s)", err, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("pserver never answered")
		}
	}
	syncIrecvJSON(t, nc, "stalls", true)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Main: %v (%s)", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Main did not return after cancel")
	}

	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	gctx, gcancel := context.WithTimeout(ctx, 10*time.Second)
	defer gcancel()
	str, err := js.Stream(gctx, natsx.ProvStream("stalls"))
	if err != nil {
		t.Fatal(err)
	}
	msg, err := str.GetLastMsgForSubject(gctx, natsx.Subjects{Run: "stalls"}.Prov(string(provenance.KindFuncStats)))
	if err != nil {
		t.Fatal(err)
	}
	var recs []provenance.GlobalFuncStats
	if err := json.Unmarshal(msg.Data, &recs); err != nil {
		t.Fatal(err)
	}
	ranges := map[string]provenance.Range{}
	for _, f := range recs {
		if f.NaturalRange != nil {
			ranges[f.Func] = *f.NaturalRange
		}
	}
	if r := ranges["MPI_Irecv"]; r.High < 12 || r.High >= 25000 {
		t.Errorf("MPI_Irecv's published final range %+v: want it to end before the new mode at 25 ms, beyond the clean runtimes", r)
	}
	if r, want := ranges["MPI_Wait"], ownRanges["MPI_Wait"]; r != want {
		t.Errorf("MPI_Wait's published final range %+v, want its own %+v", r, want)
	}
}

// --baseline's options need it, and a baseline that cannot be read stops
// the pserver before it serves, naming the flag.
func TestMainBaselineFlagErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"token without baseline", []string{"--baseline-token-file", filepath.Join(dir, "tok")}, "without --baseline"},
		{"dsn without baseline", []string{"--baseline-dsn", "postgres://x/taudb"}, "without --baseline"},
		{"no such baseline", []string{"--baseline", filepath.Join(dir, "nope")}, "--baseline: "},
		{"empty run directory", []string{"--baseline", dir}, "--baseline: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			err := Main(context.Background(), append(tc.args, "--run", "a", "--http", "", "--nats", "nats://127.0.0.1:1"), &stderr)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Main error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// GET /api/func_stats serves the models merged so far as the func_stats
// records the run would end with, with how far the run has got.
func TestLiveFuncStatsRoute(t *testing.T) {
	s, err := New(Config{Run: "stalls", Shards: 2, Shard: 1}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	get := func() LiveFuncStats {
		t.Helper()
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/func_stats", nil))
		if rec.Code != http.StatusOK {
			t.Fatalf("GET /api/func_stats: %d %s", rec.Code, rec.Body)
		}
		var v LiveFuncStats
		if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	if v := get(); v.Status != StatusLive || v.IOStep != nil || v.IOSteps != 0 || v.FuncStats == nil || len(v.FuncStats) != 0 {
		t.Errorf("before any sync: %+v, want live, no io_step and no records", v)
	}
	st := irecvState(t, true)
	for rank := range uint32(2) {
		st.Agg.AddStep(DetectorID{Rank: rank}, &syncproto.StepSummary{Step: 6, Executions: 10})
	}
	s.st = st
	v := get()
	if v.Run != "stalls" || v.Shard != 1 || v.Shards != 2 || v.IOStep == nil || *v.IOStep != 6 || v.IOSteps != 7 || len(v.FuncStats) != 2 {
		t.Fatalf("%+v: want the run's shard 1 of 2, its last io_step and its 2 keys", v)
	}
	for _, f := range v.FuncStats {
		if f.NaturalHist == nil || f.NaturalRange == nil || f.IOSteps != v.IOSteps {
			t.Errorf("record %+v: want its histogram, its range and the run's io_steps", f)
		}
	}
}
