package run

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/pserver"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

// smallRun is a run that exercises every part in a few seconds.
func smallRun(t *testing.T) Config {
	t.Helper()
	wl := workload.DefaultConfig()
	wl.Ranks, wl.Steps, wl.EventsPerStep, wl.Seed = 4, 12, 8000, 3
	wl.Rates = wl.Rates.Scale(3)
	return Config{Out: t.TempDir(), RunID: "test", Workload: wl}
}

func execute(t *testing.T, cfg Config, setup func(p *Pipeline, h *testHooks), progress func(*Pipeline, Progress)) (*Pipeline, *Summary) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	h := &testHooks{}
	cfg.hooks = h
	p, err := Start(ctx, cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(context.Background()) })
	if setup != nil {
		setup(p, h)
	}
	var cb func(Progress)
	if progress != nil {
		cb = func(pr Progress) { progress(p, pr) }
	}
	sum, err := p.Execute(ctx, cb)
	if err != nil {
		t.Fatal(err)
	}
	return p, sum
}

// checkConsistent asserts what every run must satisfy: every anomaly the
// detectors flagged is stored exactly once, the ground truth is found, the
// TAU profiles exist, and the pserver counted every anomaly once.
func checkConsistent(t *testing.T, p *Pipeline, sum *Summary) {
	t.Helper()
	if sum.Stored[provenance.KindAnomalies] != int64(sum.Anomalies) {
		t.Errorf("store holds %d anomalies, detectors flagged %d", sum.Stored[provenance.KindAnomalies], sum.Anomalies)
	}
	if sum.DroppedRecords != 0 {
		t.Errorf("%d records dropped", sum.DroppedRecords)
	}
	if sum.Score == nil || sum.Score.Precision < 0.9 || sum.Score.Recall < 0.9 {
		t.Errorf("score %+v, want precision and recall >= 0.9", sum.Score)
	}
	var psAnomalies uint64
	p.ps.View(func(st *pserver.State) { psAnomalies = st.Agg.Total().Anomalies })
	if psAnomalies != sum.Anomalies {
		t.Errorf("pserver counted %d anomalies, detectors flagged %d", psAnomalies, sum.Anomalies)
	}
	profiles, _ := filepath.Glob(filepath.Join(sum.ProfilesDir, "profile.*"))
	if len(profiles) != sum.Ranks*p.cfg.Workload.ThreadsPerRank {
		t.Errorf("%d TAU profiles, want one per thread (%d)", len(profiles), sum.Ranks*p.cfg.Workload.ThreadsPerRank)
	}
}

func TestRunSyntheticWorkload(t *testing.T) {
	p, sum := execute(t, smallRun(t), nil, nil)
	checkConsistent(t, p, sum)
	if sum.Stored[provenance.KindMetadata] == 0 || sum.Stored[provenance.KindFuncStats] == 0 {
		t.Errorf("stored %v: want metadata and func_stats", sum.Stored)
	}
	if _, err := os.Stat(sum.Truth); err != nil {
		t.Errorf("ground truth: %v", err)
	}
	for _, k := range sum.Score.Kinds {
		t.Logf("%-12s %4d/%4d found", k.Kind, k.Found, k.Injected)
	}
}

// garbage returns bodies a broken or hostile publisher might send.
func garbage(t *testing.T) [][]byte {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	random := make([]byte, 300)
	for i := range random {
		random[i] = byte(rng.UintN(256))
	}
	f := frame.Frame{PID: 0, Rank: 0, Step: 99, Events: []frame.FuncEvent{{Kind: frame.Entry, FID: 1, TS: 5}}}
	good := frame.AppendBinary(nil, &f)
	wrongVersion := append([]byte(nil), good...)
	wrongVersion[4] = 99
	huge := append([]byte(nil), good...)
	binary.LittleEndian.PutUint32(huge[5:9], 1<<31)
	return [][]byte{random, good[:len(good)/2], wrongVersion, huge, []byte("{\"pid\": \"x\"}")}
}

func TestRunRejectsGarbageFrames(t *testing.T) {
	cfg := smallRun(t)
	_, clean := execute(t, cfg, nil, nil)

	cfg.Out = t.TempDir()
	bodies := garbage(t)
	p, sum := execute(t, cfg, func(p *Pipeline, h *testHooks) {
		h.afterReady = func() {
			subj := natsx.Subjects{Run: cfg.RunID}
			for r := range cfg.Workload.Ranks {
				for _, b := range bodies {
					if err := p.nc.Publish(subj.Frames(0, uint32(r)), b); err != nil {
						t.Error(err)
					}
				}
			}
		}
	}, nil)
	checkConsistent(t, p, sum)
	want := uint64(len(bodies) * cfg.Workload.Ranks)
	if sum.BadFrames != want {
		t.Errorf("%d bad frames counted, %d sent", sum.BadFrames, want)
	}
	// Frames, events and executions are exact. Labels of the first steps
	// depend on which ranks' statistics the global model already holds when
	// a rank syncs, so two runs may label a few early calls differently;
	// both must still find the ground truth.
	if sum.Frames != clean.Frames || sum.Events != clean.Events || sum.Executions != clean.Executions {
		t.Errorf("garbage changed the input: frames %d/%d events %d/%d executions %d/%d",
			sum.Frames, clean.Frames, sum.Events, clean.Events, sum.Executions, clean.Executions)
	}
	if d := sum.Score.TruePositives - clean.Score.TruePositives; d*d*400 > clean.Score.TruePositives*clean.Score.TruePositives {
		t.Errorf("true positives %d with garbage, %d without", sum.Score.TruePositives, clean.Score.TruePositives)
	}
}

// TestRunSurvivesRestarts stops the parameter server and the provenance
// service in the middle of a run and starts new ones: nothing may be lost or
// counted twice.
func TestRunSurvivesRestarts(t *testing.T) {
	cfg := smallRun(t)
	cfg.Pace = 2 // slow enough that the restarts happen mid-run
	restarted := false
	p, sum := execute(t, cfg, nil, func(p *Pipeline, pr Progress) {
		if restarted || pr.Frames < cfg.Workload.Ranks*cfg.Workload.Steps/3 {
			return
		}
		restarted = true
		ctx := context.Background()
		addr := p.ps.HTTPAddr()
		if err := p.ps.Shutdown(ctx); err != nil {
			t.Error(err)
		}
		if err := p.prov.Shutdown(ctx); err != nil {
			t.Error(err)
		}
		time.Sleep(300 * time.Millisecond) // detectors see the pserver gone
		if err := p.startProvenance(ctx); err != nil {
			t.Fatal(err)
		}
		if err := p.startPServer(ctx, addr); err != nil {
			t.Fatal(err)
		}
	})
	if !restarted {
		t.Fatal("the run ended before the restart")
	}
	checkConsistent(t, p, sum)
	n, err := p.store.Count(context.Background(), provenance.Query{Kind: provenance.KindNormalExecs})
	if err != nil || n != sum.Stored[provenance.KindNormalExecs] {
		t.Errorf("normal executions %d (%v)", n, err)
	}
}

// TestRunSurvivesNATSRestart restarts the embedded NATS server (same port,
// same JetStream directory) in the middle of a run.
func TestRunSurvivesNATSRestart(t *testing.T) {
	cfg := smallRun(t)
	cfg.Pace = 2
	restarted := false
	p, sum := execute(t, cfg, nil, func(p *Pipeline, pr Progress) {
		if restarted || pr.Frames < cfg.Workload.Ranks*cfg.Workload.Steps/3 {
			return
		}
		restarted = true
		u, err := url.Parse(p.ns.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		port, _ := strconv.Atoi(u.Port())
		p.ns.Shutdown()
		time.Sleep(200 * time.Millisecond)
		sc := natsx.DefaultServerConfig(cfg.path("nats"))
		sc.Port = port
		ns, err := natsx.StartServer(sc)
		if err != nil {
			t.Fatal(err)
		}
		p.ns = ns
	})
	if !restarted {
		t.Fatal("the run ended before the restart")
	}
	t.Logf("after a NATS restart: %d bad frames, %d dropped records, %d failed syncs, %d/%d frames", sum.BadFrames, sum.DroppedRecords, sum.SyncFailures, sum.Frames, cfg.Workload.Ranks*cfg.Workload.Steps)
	checkConsistent(t, p, sum)
}

func testLogger(t *testing.T) zerolog.Logger {
	return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel).With().Timestamp().Logger()
}
