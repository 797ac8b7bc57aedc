package provstream

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

func startJS(t *testing.T) jetstream.JetStream {
	t.Helper()
	s, err := natsx.StartServer(natsx.DefaultServerConfig(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	nc, err := natsx.Connect(context.Background(), s.ClientURL(), "test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func TestEnsureStreamAndPublisherDedupe(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	js := startJS(t)
	if _, err := EnsureStream(ctx, js, "bad.run"); err == nil {
		t.Fatal("a run id with a dot was accepted")
	}
	st, err := EnsureStream(ctx, js, "r1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := EnsureStream(ctx, js, "r1"); err != nil {
		t.Fatalf("second EnsureStream: %v", err)
	}
	// Two publishers with the same prefix stand for a producer and its
	// restart re-publishing the same records: JetStream keeps one copy.
	for range 2 {
		p, err := NewPublisher(js, "r1", provenance.KindMetadata, "ad.0.0")
		if err != nil {
			t.Fatal(err)
		}
		p.MaxBytes = 200
		for i := range 10 {
			if err := p.Add(ctx, provenance.Metadata{Descr: "k", PID: 0, RID: uint32(i), Value: "some value"}); err != nil {
				t.Fatal(err)
			}
		}
		if err := p.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if p.Published() < 2 {
			t.Fatalf("published %d batches, want several with MaxBytes 200", p.Published())
		}
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for i := uint64(0); i < info.State.Msgs; i++ {
		m, err := cons.Next(jetstream.FetchMaxWait(2 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Data()) > 200 {
			t.Errorf("batch of %d bytes exceeds MaxBytes", len(m.Data()))
		}
		var recs []provenance.Metadata
		if err := json.Unmarshal(m.Data(), &recs); err != nil {
			t.Fatal(err)
		}
		total += len(recs)
	}
	if total != 10 {
		t.Fatalf("stream holds %d records, want 10 (duplicates not removed)", total)
	}
	if err := PublishBatch(ctx, js, Subject("r1", provenance.KindMetadata), "x", provenance.Metadata{}); err == nil {
		t.Fatal("PublishBatch accepted a non-slice")
	}
}

// TestWaitConsumed checks that WaitConsumed waits while the durable consumer
// has messages not acknowledged, and returns once every one is.
func TestWaitConsumed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	js := startJS(t)
	st, err := EnsureStream(ctx, js, "w")
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPublisher(js, "w", provenance.KindMetadata, "test")
	if err != nil {
		t.Fatal(err)
	}
	p.MaxBytes = 100
	for i := range 5 {
		if err := p.Add(ctx, provenance.Metadata{Descr: "k", RID: uint32(i), Value: "v"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	cons, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "reader", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	// Nothing acknowledged yet: it must still be waiting when its context ends.
	wctx, wcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err = WaitConsumed(wctx, js, "w", "reader")
	wcancel()
	if err == nil {
		t.Fatal("WaitConsumed returned with every message unacknowledged")
	}
	batch, err := cons.Fetch(int(p.Published()), jetstream.FetchMaxWait(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for m := range batch.Messages() {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != int(p.Published()) || n < 2 {
		t.Fatalf("fetched %d of %d batches", n, p.Published())
	}
	if err := WaitConsumed(ctx, js, "w", "reader"); err != nil {
		t.Fatalf("WaitConsumed after every message was acknowledged: %v", err)
	}
}
