package pserver

import (
	"context"
	"errors"
	"io"
	"sync"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/ad"
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
	syncer := &ad.NATSSyncer{Conn: dnc, Subjects: natsx.Subjects{Run: "det"}}
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
