package provdb

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provstream"
	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
	"github.com/kipimo-hpc/kipimo/internal/provenance/storetest"
)

// recordingStore is a store without Prepare (so provdb writes it one kind
// at a time) that records the executions of each successful write in order
// and fails the writes whose numbers are in fail.
type recordingStore struct {
	provenance.Store
	mu      sync.Mutex
	writes  int
	fail    map[int]bool
	written []string // execution keys, in the order of successful writes
}

var errInjected = errors.New("injected write failure")

func (r *recordingStore) Write(ctx context.Context, b provenance.Batch) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.writes++
	if r.fail[r.writes] {
		return errInjected
	}
	if err := r.Store.Write(ctx, b); err != nil {
		return err
	}
	for _, e := range b.Execs {
		r.written = append(r.written, provenance.ExecKey(e.PID, e.EventID))
	}
	return nil
}

// TestPipelineOrderAndRedelivery publishes 40 batches of executions, as
// JSON or in the block encoding, and checks, for a store provdb prepares
// writes for (SQLite) and one it does not, that every record is stored
// once, that a consumer has nothing left pending, and, for the second one,
// that records are written in publish order and that batches whose write
// failed are redelivered and written.
func TestPipelineOrderAndRedelivery(t *testing.T) {
	for _, tc := range []struct {
		name      string
		recording bool
		blocks    bool
		fail      map[int]bool
	}{
		{name: "prepared SQLite writes"},
		{name: "prepared SQLite writes of blocks", blocks: true},
		{name: "one write per kind, in order", recording: true},
		{name: "one write per kind of blocks, in order", recording: true, blocks: true},
		{name: "failed writes redelivered", recording: true, fail: map[int]bool{2: true, 3: true}},
		{name: "failed writes of blocks redelivered", recording: true, blocks: true, fail: map[int]bool{2: true, 3: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			_, _, js, sq := jetStreamAndStore(ctx, t)
			var store provenance.Store = sq
			rec := &recordingStore{Store: sq, fail: tc.fail}
			if tc.recording {
				store = rec
			}
			const batches, per = 40, 25
			execs := storetest.Generate(storetest.GenConfig{Seed: 12, N: batches * per, Ranks: 8, Steps: 50, Window: 2, Anomaly: true})
			subj := provstream.Subject("p", provenance.KindAnomalies)
			if _, err := provstream.EnsureStream(ctx, js, "p"); err != nil {
				t.Fatal(err)
			}
			for i := range batches {
				part := execs[i*per : (i+1)*per]
				var err error
				if tc.blocks {
					err = provstream.PublishExecBlocks(ctx, js, subj, fmt.Sprint(i), part)
				} else {
					err = provstream.PublishBatch(ctx, js, subj, fmt.Sprint(i), part)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			svc := New(Config{Run: "p", Fetch: 4, FetchWait: 100 * time.Millisecond, RetryDelay: 50 * time.Millisecond}, store, js, zerolog.Nop())
			if err := svc.Start(ctx); err != nil {
				t.Fatal(err)
			}
			for svc.Stats().Written[provenance.KindAnomalies] < batches*per {
				if ctx.Err() != nil {
					t.Fatalf("stats %+v, want %d records written", svc.Stats(), batches*per)
				}
				time.Sleep(10 * time.Millisecond)
			}
			if err := svc.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			st := svc.Stats()
			if st.Batches != batches || st.WriteErrors != int64(len(tc.fail)) {
				t.Errorf("%d batches and %d write errors, want %d and %d", st.Batches, st.WriteErrors, batches, len(tc.fail))
			}
			if n, err := sq.Count(ctx, provenance.Query{Kind: provenance.KindAnomalies}); err != nil || n != batches*per {
				t.Fatalf("store holds %d records (%v), want %d", n, err, batches*per)
			}
			cons, err := js.Consumer(ctx, natsx.ProvStream("p"), "provdb")
			if err != nil {
				t.Fatal(err)
			}
			info, err := cons.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if info.NumAckPending != 0 || info.NumPending != 0 {
				t.Errorf("consumer: %d pending acks, %d pending after every record was written", info.NumAckPending, info.NumPending)
			}
			if !tc.recording {
				return
			}
			var want []string
			for _, e := range execs {
				want = append(want, provenance.ExecKey(e.PID, e.EventID))
			}
			if tc.fail == nil {
				if !slices.Equal(rec.written, want) {
					t.Errorf("records written out of publish order")
				}
				return
			}
			// A failed batch comes again later: each record once, all there.
			got := slices.Clone(rec.written)
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("%d records written, want each of the %d once", len(got), len(want))
			}
		})
	}
}

// slowStore is a recordingStore whose first write takes hold.
type slowStore struct {
	*recordingStore
	hold time.Duration
	once sync.Once
}

func (s *slowStore) Write(ctx context.Context, b provenance.Batch) error {
	s.once.Do(func() { time.Sleep(s.hold) })
	return s.recordingStore.Write(ctx, b)
}

// A batch held longer than AckWait (here a write three times as long) is
// kept from redelivery by in-progress acknowledgements: every record is
// written once, every message acknowledged once.
func TestSlowWriteIsNotRedelivered(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, _, js, sq := jetStreamAndStore(ctx, t)
	const ackWait = time.Second
	store := &slowStore{recordingStore: &recordingStore{Store: sq}, hold: 3 * ackWait}
	const batches, per = 12, 10
	execs := storetest.Generate(storetest.GenConfig{Seed: 5, N: batches * per, Ranks: 2, Steps: 20, Window: 1, Anomaly: true})
	if _, err := provstream.EnsureStream(ctx, js, "p"); err != nil {
		t.Fatal(err)
	}
	subj := provstream.Subject("p", provenance.KindAnomalies)
	for i := range batches {
		if err := provstream.PublishBatch(ctx, js, subj, fmt.Sprint(i), execs[i*per:(i+1)*per]); err != nil {
			t.Fatal(err)
		}
	}
	svc := New(Config{Run: "p", Fetch: 4, FetchWait: 100 * time.Millisecond, AckWait: ackWait}, store, js, zerolog.Nop())
	if err := svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cons, err := js.Consumer(ctx, natsx.ProvStream("p"), "provdb")
	if err != nil {
		t.Fatal(err)
	}
	for {
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumAckPending == 0 && info.NumPending == 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("consumer %+v, stats %+v", info, svc.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := svc.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if st := svc.Stats(); st.Batches != batches || st.Written[provenance.KindAnomalies] != batches*per {
		t.Errorf("%d batches, %d records written; want %d and %d, each once", st.Batches, st.Written[provenance.KindAnomalies], batches, batches*per)
	}
	store.mu.Lock()
	defer store.mu.Unlock()
	if len(store.written) != batches*per {
		t.Errorf("%d records written, want each of %d once", len(store.written), batches*per)
	}
}

// gatedStore is a SQLite store whose prepared writes wait until gate is
// closed, and which records how many messages each write took.
type gatedStore struct {
	*sqlitestore.Store
	gate   chan struct{}
	mu     sync.Mutex
	groups []int
}

func (g *gatedStore) WritePrepared(ctx context.Context, ps []*sqlitestore.Prepared) error {
	<-g.gate
	g.mu.Lock()
	g.groups = append(g.groups, len(ps))
	g.mu.Unlock()
	return g.Store.WritePrepared(ctx, ps)
}

// While a write is under way the pipeline goes on fetching until it holds
// 4*Fetch messages, the consumer's MaxAckPending, and no more, so that the
// writer's next transaction can take two fetches' worth; once the write
// ends every message is written once and acknowledged.
func TestPipelineHoldsFourFetches(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _, js, sq := jetStreamAndStore(ctx, t)
	store := &gatedStore{Store: sq, gate: make(chan struct{})}
	const fetch, batches, per = 4, 40, 3
	execs := storetest.Generate(storetest.GenConfig{Seed: 9, N: batches * per, Ranks: 2, Steps: 20, Window: 1, Anomaly: true})
	if _, err := provstream.EnsureStream(ctx, js, "p"); err != nil {
		t.Fatal(err)
	}
	subj := provstream.Subject("p", provenance.KindAnomalies)
	for i := range batches {
		if err := provstream.PublishExecBlocks(ctx, js, subj, fmt.Sprint(i), execs[i*per:(i+1)*per]); err != nil {
			t.Fatal(err)
		}
	}
	svc := New(Config{Run: "p", Fetch: fetch, FetchWait: 100 * time.Millisecond}, store, js, zerolog.Nop())
	if err := svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer svc.Shutdown(context.Background())
	release := sync.OnceFunc(func() { close(store.gate) })
	defer release() // before the Shutdown above, which waits for the write
	cons, err := js.Consumer(ctx, natsx.ProvStream("p"), "provdb")
	if err != nil {
		t.Fatal(err)
	}
	// The first write waits at the gate: the fetcher fills the pipeline.
	want, held := 4*fetch, 0
	for held != want {
		if held > want {
			t.Fatalf("%d messages held during a write, want at most %d", held, want)
		}
		wait, stop := context.WithTimeout(ctx, 5*time.Second)
		info, err := cons.Info(wait)
		stop()
		if err != nil {
			t.Fatalf("%v; %d messages held during a write, want %d", err, held, want)
		}
		held = info.NumAckPending
		time.Sleep(10 * time.Millisecond)
	}
	release()
	for {
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumAckPending == 0 && info.NumPending == 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("consumer %+v, stats %+v", info, svc.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := svc.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if st := svc.Stats(); st.Batches != batches || st.Written[provenance.KindAnomalies] != batches*per {
		t.Errorf("%d batches, %d records written; want %d and %d", st.Batches, st.Written[provenance.KindAnomalies], batches, batches*per)
	}
	n, err := sq.Count(ctx, provenance.Query{Kind: provenance.KindAnomalies})
	if err != nil || n != batches*per {
		t.Errorf("store holds %d anomalies (%v), want %d", n, err, batches*per)
	}
	store.mu.Lock()
	defer store.mu.Unlock()
	total := 0
	for _, g := range store.groups {
		total += g
	}
	if total != batches {
		t.Errorf("writes took %v messages, %d in all; want each of %d once", store.groups, total, batches)
	}
}
