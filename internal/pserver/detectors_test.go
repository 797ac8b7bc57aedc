package pserver

import (
	"context"
	"errors"
	"io"
	"slices"
	"sync"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/ad"
	"github.com/kipimo-hpc/kipimo/internal/adnode"
	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

// TestRealDetectorsTwoShards runs the real detectors over a synthetic
// workload, syncing over NATS with two pserver shards: each shard holds its
// own functions' models, and shard 0's aggregates match what the detectors
// counted.
func TestRealDetectorsTwoShards(t *testing.T) {
	if testing.Short() {
		t.Skip("detector integration skipped with -short")
	}
	wcfg := workload.DefaultConfig()
	wcfg.Ranks, wcfg.Steps, wcfg.EventsPerStep = 6, 8, 2000
	wcfg.Rates = workload.Rates{SlowRank: 0.05}
	w, err := workload.New(wcfg)
	if err != nil {
		t.Fatal(err)
	}
	ns, nc := startNATS(t)
	s0 := startServer(t, nc, Config{Run: "det", Shard: 0, Shards: 2})
	defer s0.Shutdown(context.Background())
	s1 := startServer(t, nc, Config{Run: "det", Shard: 1, Shards: 2})
	defer s1.Shutdown(context.Background())

	dnc := connect(t, ns)
	syncer := &adnode.NATSSyncer{Conn: dnc, Subjects: natsx.Subjects{Run: "det"}}
	var mu sync.Mutex
	var total ad.Stats
	var wg sync.WaitGroup
	errs := make(chan error, wcfg.Ranks)
	for r := range uint32(wcfg.Ranks) {
		wg.Go(func() {
			d, err := ad.New(ad.Config{PID: wcfg.PID, Rank: r, Syncer: syncer, Shards: 2, Algorithm: ad.SSTD, Sigma: 4, SlowOnly: true})
			if err != nil {
				errs <- err
				return
			}
			g := w.Rank(r)
			var f frame.Frame
			for {
				if _, err := g.Next(&f); errors.Is(err, io.EOF) {
					break
				} else if err != nil {
					errs <- err
					return
				}
				if err := d.Process(context.Background(), &f); err != nil {
					errs <- err
					return
				}
			}
			if err := d.Close(context.Background()); err != nil {
				errs <- err
				return
			}
			st := d.Stats()
			mu.Lock()
			total.Executions += st.Executions
			total.Anomalies += st.Anomalies
			total.Frames += st.Frames
			mu.Unlock()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	a, b := state(s0), state(s1)
	if len(a.Models) == 0 || len(b.Models) == 0 {
		t.Errorf("shards hold %d and %d models; the detectors did not route by shard", len(a.Models), len(b.Models))
	}
	for k := range b.Models {
		if a.Models[k] != nil {
			t.Errorf("model %q on both shards", k)
		}
	}
	tot := a.Agg.Total()
	if tot.Frames != total.Frames || tot.Anomalies != total.Anomalies || tot.Steps != uint64(wcfg.Steps) {
		t.Errorf("pserver totals %+v; the detectors counted %d frames of %d steps, %d anomalies", tot, total.Frames, wcfg.Steps, total.Anomalies)
	}
	if tot.Executions > total.Executions || float64(tot.Executions) < 0.999*float64(total.Executions) {
		t.Errorf("pserver counted %d executions, the detectors %d", tot.Executions, total.Executions)
	} else if tot.Executions != total.Executions {
		t.Logf("pserver counted %d executions, the detectors %d (labelled after their last sync)", tot.Executions, total.Executions)
	}
	var n float64
	for _, m := range a.Models {
		n += m.Moments.N
	}
	for _, m := range b.Models {
		n += m.Moments.N
	}
	if n == 0 {
		t.Error("the global models are empty")
	}
}

// TestRestartedDetectorIsANewIncarnation runs one rank's frames through a
// detector that stops half way and a new detector, without its checkpoint,
// that processes the rest (a restarted ad process): the new detector
// numbers its requests from 1 again, and the pserver applies them as a new
// incarnation instead of dropping them as retries, so it counts every frame
// once.
func TestRestartedDetectorIsANewIncarnation(t *testing.T) {
	wcfg := workload.DefaultConfig()
	wcfg.Ranks, wcfg.Steps, wcfg.EventsPerStep = 1, 8, 1000
	w, err := workload.New(wcfg)
	if err != nil {
		t.Fatal(err)
	}
	ns, nc := startNATS(t)
	s := startServer(t, nc, Config{Run: "reinc"})
	defer s.Shutdown(context.Background())
	syncer := &adnode.NATSSyncer{Conn: connect(t, ns), Subjects: natsx.Subjects{Run: "reinc"}}
	g := w.Rank(0)
	var frames uint64
	var funcs, ctrs []frame.Name // the names the frames carried so far
	for half := range 2 {
		d, err := ad.New(ad.Config{PID: wcfg.PID, Rank: 0, Syncer: syncer, Algorithm: ad.SSTD})
		if err != nil {
			t.Fatal(err)
		}
		var f frame.Frame
		for i := range wcfg.Steps / 2 {
			if _, err := g.Next(&f); err != nil {
				t.Fatal(err)
			}
			funcs, ctrs = append(funcs, f.Funcs...), append(ctrs, f.Counters...)
			if i == 0 {
				// The new process learns the names the old one had seen.
				f.Funcs, f.Counters = slices.Clone(funcs), slices.Clone(ctrs)
			}
			if err := d.Process(context.Background(), &f); err != nil {
				t.Fatal(err)
			}
		}
		if err := d.Close(context.Background()); err != nil {
			t.Fatalf("detector %d: %v", half, err)
		}
		frames += d.Stats().Frames
	}
	st := state(s)
	if tot := st.Agg.Total(); tot.Frames != frames || frames != uint64(wcfg.Steps) {
		t.Errorf("pserver counted %d frames, the two detectors %d of %d", tot.Frames, frames, wcfg.Steps)
	}
	if st.Incarnations != 1 || st.Duplicates != 0 {
		t.Errorf("%d new incarnations and %d duplicates, want 1 and 0", st.Incarnations, st.Duplicates)
	}
}
