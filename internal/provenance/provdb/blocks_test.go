package provdb

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/docblock"
	"github.com/kipimo-hpc/kipimo/internal/provenance/mongostore"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provstream"
	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
	"github.com/kipimo-hpc/kipimo/internal/provenance/storetest"
)

// startJS starts a NATS server for the test and returns its JetStream.
func startJS(t *testing.T) jetstream.JetStream {
	t.Helper()
	srv, err := natsx.StartServer(natsx.DefaultServerConfig(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := natsx.Connect(context.Background(), srv.ClientURL(), "test")
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

// testStore is a kind of store provdb writes to. open returns a new, empty
// one, closed when the test ends, and the path of its SQLite file ("" for
// another store).
type testStore struct {
	name string
	open func(t *testing.T) (provenance.Store, string)
}

func openSQLite(t *testing.T) (provenance.Store, string) {
	path := filepath.Join(t.TempDir(), "p.db")
	s, err := sqlitestore.Open(context.Background(), path, sqlitestore.Options{Synchronous: "OFF"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

var (
	sqliteStore = testStore{"SQLite", openSQLite}
	// decodingStore is a store provdb cannot prepare writes for, as
	// MongoDB: it hands it decoded records.
	decodingStore = testStore{"a store given decoded records", func(t *testing.T) (provenance.Store, string) {
		s, _ := openSQLite(t)
		return &recordingStore{Store: s}, ""
	}}
)

// ferretStore is an in-process FerretDB (the MongoDB store's test server),
// left out in -short mode.
func ferretStore(t *testing.T) []testStore {
	if testing.Short() {
		return nil
	}
	var uri string
	var dbs atomic.Int64
	return []testStore{{"MongoDB (FerretDB)", func(t *testing.T) (provenance.Store, string) {
		if uri == "" {
			uri = storetest.StartFerretDB(t)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		db := fmt.Sprintf("kipimo_service_%d_%d", os.Getpid(), dbs.Add(1))
		s, err := mongostore.Open(ctx, withDB(uri, db))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s, ""
	}}}
}

// withDB is uri, mongodb://host:port/ possibly with a query, naming
// database db.
func withDB(uri, db string) string {
	for i := len("mongodb://"); i < len(uri); i++ {
		if uri[i] == '/' {
			return uri[:i+1] + db + uri[i+1:]
		}
	}
	return uri + "/" + db
}

// ingest runs a provdb on run's stream into store until it has written
// records records (duplicates included) and acknowledged batches messages,
// and returns its stats.
func ingest(t *testing.T, js jetstream.JetStream, run string, store provenance.Store, records, batches int64, log zerolog.Logger) Stats {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	svc := New(Config{Run: run, Fetch: 4, FetchWait: 100 * time.Millisecond}, store, js, log)
	if err := svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for {
		st := svc.Stats()
		var n int64
		for _, w := range st.Written {
			n += w
		}
		if n >= records && st.Batches >= batches {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("stats %+v, want %d records in %d batches", st, records, batches)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := svc.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	cons, err := js.Consumer(ctx, natsx.ProvStream(run), "provdb")
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumAckPending != 0 || info.NumPending != 0 || info.NumRedelivered != 0 {
		t.Fatalf("consumer: %d pending acks, %d pending, %d redelivered", info.NumAckPending, info.NumPending, info.NumRedelivered)
	}
	return svc.Stats()
}

// stored reads every execution of kind in s, ordered by key.
func stored(t *testing.T, s provenance.Store, kind provenance.Kind) []provenance.Exec {
	t.Helper()
	var out []provenance.Exec
	if err := s.Each(context.Background(), provenance.Query{Kind: kind, Limit: provenance.NoLimit}, func(e provenance.Exec) error {
		out = append(out, e)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(out, func(a, b provenance.Exec) int {
		return cmp.Or(cmp.Compare(a.PID, b.PID), cmp.Compare(a.EventID, b.EventID))
	})
	return out
}

// sqliteFile is what a SQLite store holds of kind: the documents of its
// blocks in the order they were stored, and the indexed columns of every
// row (with their SQL types), ordered by key.
func sqliteFile(t *testing.T, path string, kind provenance.Kind) (docs [][]byte, rows []string) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	r, err := db.Query("SELECT data FROM " + string(kind) + "_docs ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	for r.Next() {
		var data []byte
		if err := r.Scan(&data); err != nil {
			t.Fatal(err)
		}
		d, err := docblock.Decode(data)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, d...)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	cols := "pid, event_id, rid, tid, fid, func, io_step, entry, exit, runtime_total, runtime_exclusive, outlier_score, is_gpu_event"
	r, err = db.Query("SELECT " + cols + ", typeof(event_id), typeof(func), typeof(outlier_score) FROM " + string(kind) + " ORDER BY pid, event_id")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for r.Next() {
		v := make([]any, 16)
		p := make([]any, len(v))
		for i := range v {
			p[i] = &v[i]
		}
		if err := r.Scan(p...); err != nil {
			t.Fatal(err)
		}
		rows = append(rows, fmt.Sprint(v...))
	}
	return docs, rows
}

// oddRecords are executions the generator does not make: arrays left nil,
// no exit, strings that are not UTF-8, a GPU parent without a call stack.
func oddRecords(base []provenance.Exec) []provenance.Exec {
	a, b, c := base[0], base[1], base[2]
	a.EventID, b.EventID, c.EventID = "63:1:900001", "63:1:900002", "63:1:900003"
	a.CallStack, a.CounterEvents, a.EventWindow = nil, nil, provenance.EventWindow{}
	a.Exit = 0
	b.Func = "halo\xffexchange"
	b.EventWindow.ExecWindow = slices.Clone(b.EventWindow.ExecWindow)
	b.EventWindow.ExecWindow[0].Func = "\xc3"
	c.IsGPUEvent = true
	c.GPULocation = &provenance.GPULocation{Device: 1}
	c.GPUParent = &provenance.GPUParent{EventID: "63:1:5"}
	return []provenance.Exec{a, b, c}
}

// TestBlocksStoreWhatJSONStores sends the same records as JSON batches and
// through a Publisher (the block encoding) to two stores of each kind and
// checks they store the same: for SQLite, byte-identical documents in the
// same order and the same indexed columns; for every store, the same
// records read back, equal to what the JSON batch's decoder reads.
func TestBlocksStoreWhatJSONStores(t *testing.T) {
	execs := storetest.Generate(storetest.GenConfig{Seed: 21, N: 600, Ranks: 16, Steps: 30, Window: 5, Anomaly: true})
	execs = append(execs, oddRecords(execs)...)
	data, err := json.Marshal(execs)
	if err != nil {
		t.Fatal(err)
	}
	want, err := provenance.DecodeBatch(provenance.KindAnomalies, data)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(want.Execs, func(a, b provenance.Exec) int {
		return cmp.Or(cmp.Compare(a.PID, b.PID), cmp.Compare(a.EventID, b.EventID))
	})
	for _, ts := range append([]testStore{sqliteStore}, ferretStore(t)...) {
		t.Run(ts.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			js := startJS(t)
			for _, run := range []string{"j", "b"} {
				if _, err := provstream.EnsureStream(ctx, js, run); err != nil {
					t.Fatal(err)
				}
			}
			const batch = 250
			for lo := 0; lo < len(execs); lo += batch {
				if err := provstream.PublishBatch(ctx, js, provstream.Subject("j", provenance.KindAnomalies), fmt.Sprint(lo), execs[lo:min(lo+batch, len(execs))]); err != nil {
					t.Fatal(err)
				}
			}
			p, err := provstream.NewPublisher(js, "b", provenance.KindAnomalies, "ad.0.0")
			if err != nil {
				t.Fatal(err)
			}
			for i := range execs {
				if err := p.Add(ctx, &execs[i]); err != nil {
					t.Fatal(err)
				}
			}
			if err := p.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			fromJSON, jsonPath := ts.open(t)
			fromBlocks, blocksPath := ts.open(t)
			ingest(t, js, "j", fromJSON, int64(len(execs)), 0, zerolog.Nop())
			ingest(t, js, "b", fromBlocks, int64(len(execs)), int64(p.Published()), zerolog.Nop())
			got, gotJSON := stored(t, fromBlocks, provenance.KindAnomalies), stored(t, fromJSON, provenance.KindAnomalies)
			if !reflect.DeepEqual(gotJSON, want.Execs) {
				t.Fatalf("the JSON path stored %d records that differ from the %d sent", len(gotJSON), len(want.Execs))
			}
			if !reflect.DeepEqual(got, gotJSON) {
				t.Fatalf("the block path stored %d records that differ from the %d of the JSON path", len(got), len(gotJSON))
			}
			if jsonPath == "" {
				return
			}
			jsonDocs, jsonRows := sqliteFile(t, jsonPath, provenance.KindAnomalies)
			docs, rows := sqliteFile(t, blocksPath, provenance.KindAnomalies)
			if len(docs) != len(execs) || len(jsonDocs) != len(execs) {
				t.Fatalf("%d and %d documents stored for %d records", len(docs), len(jsonDocs), len(execs))
			}
			for i := range docs {
				if string(docs[i]) != string(jsonDocs[i]) {
					t.Fatalf("stored document %d differs:\nblocks %s\nJSON   %s", i, docs[i], jsonDocs[i])
				}
			}
			if !slices.Equal(rows, jsonRows) {
				for i := range rows {
					if rows[i] != jsonRows[i] {
						t.Fatalf("row %d differs:\nblocks %s\nJSON   %s", i, rows[i], jsonRows[i])
					}
				}
			}
		})
	}
}

// withBlock replaces the last block of a message of the block encoding by
// z, a block of as many documents.
func withBlock(t *testing.T, body, z []byte) []byte {
	t.Helper()
	m, err := docblock.DecodeMessage(body)
	if err != nil {
		t.Fatal(err)
	}
	last := m.Blocks[len(m.Blocks)-1].Data
	head := body[:len(body)-len(last)-len(binary.AppendUvarint(nil, uint64(len(last))))]
	out := append([]byte(nil), head...)
	out = binary.AppendUvarint(out, uint64(len(z)))
	return append(out, z...)
}

// TestBadBlockMessagesTerminated publishes malformed messages of the block
// encoding among good ones: the good are stored and acknowledged, the bad
// counted, terminated (never redelivered) and logged once per kind, for a
// store provdb prepares writes for and for one it gives decoded records.
func TestBadBlockMessagesTerminated(t *testing.T) {
	execs := storetest.Generate(storetest.GenConfig{Seed: 31, N: 91, Anomaly: true})
	good, err := provstream.EncodeExecBlocks(nil, execs[90:])
	if err != nil {
		t.Fatal(err)
	}
	block := func(docs ...string) []byte {
		var b docblock.Builder
		for _, d := range docs {
			b.Add([]byte(d))
		}
		return b.AppendCompressed(nil)
	}
	blocks := nats.Header{provstream.EncodingHeader: {provstream.EncodingBlocks}}
	bad := []struct {
		name string
		kind provenance.Kind
		h    nats.Header
		data []byte
	}{
		{"not a block batch", provenance.KindAnomalies, blocks, []byte("garbage")},
		{"JSON sent as blocks", provenance.KindAnomalies, blocks, []byte(`[{"event_id":"1:2:3"}]`)},
		{"truncated", provenance.KindAnomalies, blocks, good[:len(good)-10]},
		{"unknown encoding", provenance.KindAnomalies, nats.Header{provstream.EncodingHeader: {"blocks-v2"}}, good},
		{"block not zstd", provenance.KindAnomalies, blocks, withBlock(t, good, []byte("not zstd at all"))},
		{"document not an object", provenance.KindAnomalies, blocks, withBlock(t, good, block(`[1]`))},
		{"two documents for one record", provenance.KindAnomalies, blocks, withBlock(t, good, block(`{}`, `{}`))},
		{"blocks of metadata", provenance.KindMetadata, blocks, good},
	}
	for _, ts := range []testStore{sqliteStore, decodingStore} {
		t.Run(ts.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			js := startJS(t)
			if _, err := provstream.EnsureStream(ctx, js, "r"); err != nil {
				t.Fatal(err)
			}
			for i, b := range bad {
				if err := provstream.PublishExecBlocks(ctx, js, provstream.Subject("r", provenance.KindAnomalies), fmt.Sprint("good", i), execs[i*10:i*10+10]); err != nil {
					t.Fatal(err)
				}
				m := &nats.Msg{Subject: provstream.Subject("r", b.kind), Data: b.data, Header: nats.Header{}}
				for k, v := range b.h {
					m.Header[k] = v
				}
				m.Header.Set(jetstream.MsgIDHeader, b.name)
				if _, err := js.PublishMsg(ctx, m); err != nil {
					t.Fatal(err)
				}
			}
			store, _ := ts.open(t)
			var logs syncBuffer
			st := ingest(t, js, "r", store, int64(10*len(bad)), int64(len(bad)), zerolog.New(&logs))
			// The bad ones were fetched before the last good one was
			// written, so each is counted by now.
			if st.Bad != int64(len(bad)) || st.Batches != int64(len(bad)) {
				t.Errorf("%d bad and %d written batches, want %d of each", st.Bad, st.Batches, len(bad))
			}
			if n, err := store.Count(ctx, provenance.Query{Kind: provenance.KindAnomalies}); err != nil || n != int64(10*len(bad)) {
				t.Errorf("store holds %d records (%v), want %d", n, err, 10*len(bad))
			}
			if n := strings.Count(logs.String(), "bad provenance batch"); n != 2 {
				t.Errorf("%d log lines about bad batches, want 2 (one per kind):\n%s", n, logs.String())
			}
		})
	}
}

// TestBlockDuplicatesStoredOnce sends records more than once in the block
// encoding (a message again under another id, messages that overlap, a
// record twice in one message, and a JSON batch over the same records)
// and checks each is stored once, as sent, and that no stored block holds
// a document no row refers to.
func TestBlockDuplicatesStoredOnce(t *testing.T) {
	execs := storetest.Generate(storetest.GenConfig{Seed: 41, N: 200, Ranks: 4, Steps: 10, Window: 3, Anomaly: true})
	type msg struct {
		id    string
		json  bool
		execs []provenance.Exec
	}
	msgs := []msg{
		{id: "a", execs: execs[:100]},
		{id: "a again", execs: execs[:100]},
		{id: "overlapping", execs: execs[50:150]},
		{id: "a record twice", execs: append(slices.Clone(execs[150:160]), execs[155], execs[0])},
		{id: "JSON over blocks", json: true, execs: execs[140:200]},
	}
	sent := 0
	for _, m := range msgs {
		sent += len(m.execs)
	}
	for _, ts := range append([]testStore{sqliteStore, decodingStore}, ferretStore(t)...) {
		t.Run(ts.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			js := startJS(t)
			if _, err := provstream.EnsureStream(ctx, js, "d"); err != nil {
				t.Fatal(err)
			}
			subj := provstream.Subject("d", provenance.KindAnomalies)
			for _, m := range msgs {
				var err error
				if m.json {
					err = provstream.PublishBatch(ctx, js, subj, m.id, m.execs)
				} else {
					err = provstream.PublishExecBlocks(ctx, js, subj, m.id, m.execs)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			store, path := ts.open(t)
			ingest(t, js, "d", store, int64(sent), int64(len(msgs)), zerolog.Nop())
			want := slices.Clone(execs)
			slices.SortFunc(want, func(a, b provenance.Exec) int {
				return cmp.Or(cmp.Compare(a.PID, b.PID), cmp.Compare(a.EventID, b.EventID))
			})
			if got := stored(t, store, provenance.KindAnomalies); !reflect.DeepEqual(got, want) {
				t.Fatalf("store holds %d records that differ from the %d distinct ones sent", len(got), len(want))
			}
			if path == "" {
				return
			}
			docs, rows := sqliteFile(t, path, provenance.KindAnomalies)
			if len(docs) != len(execs) || len(rows) != len(execs) {
				t.Fatalf("%d documents and %d rows stored for %d records", len(docs), len(rows), len(execs))
			}
		})
	}
}
