package provstream

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/storetest"
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

// readAll reads every message of run's stream, in order.
func readAll(ctx context.Context, t *testing.T, js jetstream.JetStream, run string) []jetstream.Msg {
	t.Helper()
	st, err := js.Stream(ctx, natsx.ProvStream(run))
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var out []jetstream.Msg
	for range info.State.Msgs {
		m, err := cons.Next(jetstream.FetchMaxWait(2 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

// TestPublisherExecEncodings publishes executions with Publishers, twice
// with the same prefix as a restarted producer would, and checks each
// message's encoding, its size, that JetStream kept one copy of each, and
// that Decode reads back exactly what the JSON batch's decoder reads from
// the same records.
func TestPublisherExecEncodings(t *testing.T) {
	execs := storetest.Generate(storetest.GenConfig{Seed: 4, N: 300, Ranks: 4, Steps: 10, Window: 5, Anomaly: true})
	data, err := json.Marshal(execs)
	if err != nil {
		t.Fatal(err)
	}
	want, err := provenance.DecodeBatch(provenance.KindAnomalies, data)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		json     bool
		maxBytes int
		encoding string
		minMsgs  int
	}{
		{name: "blocks by default", encoding: EncodingBlocks, minMsgs: 1},
		{name: "blocks split at MaxBytes", maxBytes: 30000, encoding: EncodingBlocks, minMsgs: 3},
		{name: "JSON when asked", json: true, encoding: "", minMsgs: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			js := startJS(t)
			if _, err := EnsureStream(ctx, js, "e"); err != nil {
				t.Fatal(err)
			}
			var published uint64
			for range 2 {
				p, err := NewPublisher(js, "e", provenance.KindAnomalies, "ad.0.0")
				if err != nil {
					t.Fatal(err)
				}
				p.JSON, p.MaxBytes = tc.json, tc.maxBytes
				for i := range execs {
					if err := p.Add(ctx, &execs[i]); err != nil {
						t.Fatal(err)
					}
				}
				if err := p.Flush(ctx); err != nil {
					t.Fatal(err)
				}
				// Published, the batch's buffers went back to the pools:
				// a producer keeps a publisher per rank and kind.
				if p.blocks != nil || p.buf != nil {
					t.Errorf("after Flush the publisher holds an encoder (%v) or %d bytes of room", p.blocks != nil, cap(p.buf))
				}
				if published != 0 && p.Published() != published {
					t.Fatalf("the second publisher published %d batches, the first %d", p.Published(), published)
				}
				published = p.Published()
			}
			msgs := readAll(ctx, t, js, "e")
			if len(msgs) != int(published) || len(msgs) < tc.minMsgs {
				t.Fatalf("stream holds %d messages; each publisher published %d, want at least %d", len(msgs), published, tc.minMsgs)
			}
			var got []provenance.Exec
			for i, m := range msgs {
				if enc := m.Headers().Get(EncodingHeader); enc != tc.encoding {
					t.Errorf("message %d: encoding %q, want %q", i, enc, tc.encoding)
				}
				limit := tc.maxBytes
				if limit == 0 {
					limit = MaxBatchBytes
				}
				if len(m.Data()) > limit {
					t.Errorf("message %d: %d bytes, more than %d", i, len(m.Data()), limit)
				}
				b, err := Decode(provenance.KindAnomalies, m.Headers(), m.Data())
				if err != nil {
					t.Fatalf("message %d: %v", i, err)
				}
				got = append(got, b.Execs...)
			}
			if !reflect.DeepEqual(got, want.Execs) {
				t.Fatalf("decoded %d records that differ from the %d of the JSON batch", len(got), len(want.Execs))
			}
		})
	}
}

// TestDecodeEncodings checks which encodings Decode takes for which kinds,
// and that PublishBatch and PublishExecBlocks publish the encodings they
// name.
func TestDecodeEncodings(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	js := startJS(t)
	if _, err := EnsureStream(ctx, js, "d"); err != nil {
		t.Fatal(err)
	}
	execs := storetest.Generate(storetest.GenConfig{Seed: 6, N: 5})
	subj := Subject("d", provenance.KindNormalExecs)
	if err := PublishBatch(ctx, js, subj, "json", execs); err != nil {
		t.Fatal(err)
	}
	if err := PublishExecBlocks(ctx, js, subj, "blocks", execs); err != nil {
		t.Fatal(err)
	}
	msgs := readAll(ctx, t, js, "d")
	if len(msgs) != 2 || msgs[0].Headers().Get(EncodingHeader) != "" || msgs[1].Headers().Get(EncodingHeader) != EncodingBlocks {
		t.Fatalf("%d messages, encodings not JSON then blocks", len(msgs))
	}
	for i, m := range msgs {
		b, err := Decode(provenance.KindNormalExecs, m.Headers(), m.Data())
		if err != nil || !reflect.DeepEqual(b.Execs, execs) {
			t.Errorf("message %d: %d records, %v", i, len(b.Execs), err)
		}
	}
	blocks := msgs[1]
	for _, tc := range []struct {
		name string
		kind provenance.Kind
		h    nats.Header
		data []byte
		err  string
	}{
		{"unknown encoding", provenance.KindNormalExecs, nats.Header{EncodingHeader: {"blocks-v9"}}, blocks.Data(), `unknown encoding "blocks-v9"`},
		{"blocks of metadata", provenance.KindMetadata, blocks.Headers(), blocks.Data(), "executions only"},
		{"JSON body named blocks", provenance.KindNormalExecs, blocks.Headers(), msgs[0].Data(), "magic"},
		{"blocks body without the header", provenance.KindNormalExecs, nats.Header{}, blocks.Data(), "not a JSON array"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Decode(tc.kind, tc.h, tc.data); err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("error %v, want one containing %q", err, tc.err)
			}
		})
	}
	if err := PublishExecBlocks(ctx, js, subj, "none", nil); err == nil {
		t.Error("PublishExecBlocks published no records")
	}
}

// A server with NATS's default maximum payload (1,000,000 bytes, less than
// MaxBatchBytes) still takes every batch: batches are sized under it.
func TestBatchesFitTheServersPayload(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := natsx.DefaultServerConfig(t.TempDir())
	cfg.MaxPayload = 1_000_000
	s, err := natsx.StartServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	nc, err := natsx.Connect(ctx, s.ClientURL(), "test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := EnsureStream(ctx, js, "small"); err != nil {
		t.Fatal(err)
	}
	p, err := NewPublisher(js, "small", provenance.KindMetadata, "ad.0.0")
	if err != nil {
		t.Fatal(err)
	}
	value := strings.Repeat("v", 1000)
	const n = 3000 // some 3 MB of records
	for i := range n {
		if err := p.Add(ctx, provenance.Metadata{Descr: "k", RID: uint32(i), Value: value}); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, m := range readAll(ctx, t, js, "small") {
		if len(m.Data()) > 1_000_000-payloadHeadroom {
			t.Errorf("batch of %d bytes", len(m.Data()))
		}
		var recs []provenance.Metadata
		if err := json.Unmarshal(m.Data(), &recs); err != nil {
			t.Fatal(err)
		}
		total += len(recs)
	}
	if total != n {
		t.Errorf("stream holds %d records, want %d", total, n)
	}
}
