package provdb

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provstream"
	"github.com/kipimo-hpc/kipimo/internal/provenance/storetest"
)

// The service registers its counts on the registerer its caller gives
// (Config.Metrics): the records written by kind, the batches, the refused
// messages by reason, and the Go runtime's metrics.
func TestServiceMetricsOnCallersRegistry(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _, js, store := jetStreamAndStore(ctx, t)
	reg := prometheus.NewRegistry()
	svc := New(Config{Run: "m", Fetch: 4, FetchWait: 200 * time.Millisecond, Metrics: reg}, store, js, zerolog.Nop())
	if err := svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = svc.Shutdown(context.Background()) }()
	execs := storetest.Generate(storetest.GenConfig{Seed: 3, N: 20, Anomaly: true})
	if err := provstream.PublishBatch(ctx, js, provstream.Subject("m", provenance.KindAnomalies), "a", execs); err != nil {
		t.Fatal(err)
	}
	for svc.Stats().Batches < 1 {
		if ctx.Err() != nil {
			t.Fatalf("stats %+v: the batch was not written", svc.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range m.GetLabel() {
				name += "," + l.GetName() + "=" + l.GetValue()
			}
			got[name] = m.GetCounter().GetValue()
		}
	}
	for name, want := range map[string]float64{
		"kipimo_provdb_batches_total": 1,
		"kipimo_provdb_records_written_total,kind=" + string(provenance.KindAnomalies): float64(len(execs)),
		"kipimo_provdb_rejected_messages_total,reason=" + RejectUndecodable:            0,
		"kipimo_provdb_write_errors_total":                                             0,
	} {
		if v, ok := got[name]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", name, v, ok, want)
		}
	}
	if _, ok := got["kipimo_go_goroutines"]; !ok {
		t.Error("no kipimo_go_goroutines: the Go collector is not registered")
	}
}
