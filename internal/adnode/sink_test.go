package adnode

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/ad"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provstream"
)

func TestSinkOverflow(t *testing.T) {
	_, nc := startNATS(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	batch := func() *ad.Batch {
		return &ad.Batch{Metadata: []provenance.Metadata{{Descr: "k", Value: "v"}, {Descr: "k2", Value: "v"}}}
	}
	t.Run("drop", func(t *testing.T) {
		s, err := NewNATSSink(js, "drop", 1, Drop, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		// not started: the queue of one fills, the rest is dropped and counted
		for i := 0; i < 3; i++ {
			if err := s.Publish(context.Background(), batch()); err != nil {
				t.Fatal(err)
			}
		}
		if s.Dropped() != 4 || s.QueueLen() != 1 {
			t.Fatalf("dropped %d queued %d, want 4 and 1", s.Dropped(), s.QueueLen())
		}
		if err := s.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := s.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		if s.Published() != 2 {
			t.Fatalf("published %d, want 2", s.Published())
		}
	})
	t.Run("block", func(t *testing.T) {
		s, err := NewNATSSink(js, "block", 1, Block, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Publish(context.Background(), batch()); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if err := s.Publish(ctx, batch()); err != nil {
			t.Fatal(err)
		}
		if s.Lag() < 40*time.Millisecond || s.Dropped() != 2 {
			t.Fatalf("lag %v dropped %d: a full queue must block until the deadline, then drop and count", s.Lag(), s.Dropped())
		}
		if err := s.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- s.Publish(context.Background(), batch()) }()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if err := s.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		if s.Published() != 4 {
			t.Fatalf("published %d, want 4", s.Published())
		}
	})
}

// TestSinkRetriesUnpublished: a batch whose publication failed is kept and
// published by the next Flush, which retries only what failed.
func TestSinkRetriesUnpublished(t *testing.T) {
	_, nc := startNATS(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := NewNATSSink(js, "retry", 4, Block, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	// Without its stream, nothing can be published.
	if err := js.DeleteStream(ctx, natsx.ProvStream("retry")); err != nil {
		t.Fatal(err)
	}
	if err := s.Publish(ctx, &ad.Batch{Rank: 3, Metadata: []provenance.Metadata{{Descr: "k", Value: "v"}}}); err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(ctx, 5*time.Second)
	defer cancelShort()
	if err := s.Flush(short); err == nil {
		t.Fatal("Flush succeeded with no stream to publish to")
	}
	if _, err := provstream.EnsureStream(ctx, js, "retry"); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatalf("Flush once the stream is back: %v", err)
	}
	st, err := js.Stream(ctx, natsx.ProvStream("retry"))
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Errorf("stream holds %d messages, want the one batch that had failed", info.State.Msgs)
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatalf("a Flush with nothing left to publish: %v", err)
	}
}
