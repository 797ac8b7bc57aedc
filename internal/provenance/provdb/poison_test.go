package provdb

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/docblock"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provstream"
	"github.com/kipimo-hpc/kipimo/internal/provenance/storetest"
)

// recordsAnswer is an answer of /api/v1/records.
type recordsAnswer struct {
	Records []provenance.Exec `json:"records"`
	Skipped int64             `json:"skipped"`
	Next    string            `json:"next"`
}

// listAll asks /api/v1/records?limit=0 and fails the test unless it
// answers 200 with a whole JSON body.
func listAll(t *testing.T, srv *httptest.Server) recordsAnswer {
	t.Helper()
	code, body, _ := get(t, srv, "/api/v1/records?limit=0", "")
	if code != 200 {
		t.Fatalf("/api/v1/records?limit=0 answered %d: %s", code, body)
	}
	var a recordsAnswer
	if err := json.Unmarshal(body, &a); err != nil {
		t.Fatalf("/api/v1/records?limit=0: %v in %q", err, body)
	}
	return a
}

// TestPoisonMessagesRefused publishes, among good messages of the block
// encoding, messages a detector would never send: a document that is
// braced but not JSON, one that decompresses to 15 MB from a few hundred
// bytes, one whose fields disagree with its row, and a JSON batch with a
// document past the bound. Each is refused, counted by reason and logged
// with its reason; the good ones are stored, and the API lists them all.
func TestPoisonMessagesRefused(t *testing.T) {
	execs := storetest.Generate(storetest.GenConfig{Seed: 51, N: 64, Anomaly: true})
	one := func(e provenance.Exec) []byte {
		data, err := provstream.EncodeExecBlocks(nil, []provenance.Exec{e})
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	block := func(doc []byte) []byte {
		var b docblock.Builder
		b.Add(doc)
		return b.AppendCompressed(nil)
	}
	bomb := append([]byte(`{"event_id":"0:0:1","hostname":"`), strings.Repeat("a", 15<<20)...)
	bomb = append(bomb, `"}`...)
	other, err := provenance.AppendExecJSON(nil, &execs[1])
	if err != nil {
		t.Fatal(err)
	}
	huge := execs[2]
	huge.EventID = "0:0:999"
	huge.Hostname = strings.Repeat("h", docblock.MaxDocLen)
	hugeJSON, err := json.Marshal([]provenance.Exec{huge})
	if err != nil {
		t.Fatal(err)
	}
	blocks := nats.Header{provstream.EncodingHeader: {provstream.EncodingBlocks}}
	poison := []struct {
		name, reason string
		h            nats.Header
		data         []byte
	}{
		{"braced, not JSON", RejectDocument, blocks, withBlock(t, one(execs[0]), block([]byte(`{"pid":0,"event_id":"0:0:1",not JSON}`)))},
		{"15 MB from a small message", RejectSize, blocks, withBlock(t, one(execs[0]), block(bomb))},
		{"another record's document", RejectColumns, blocks, withBlock(t, one(execs[0]), block(other))},
		{"JSON with a document past the bound", RejectSize, nil, hugeJSON},
	}
	if n := len(poison[1].data); n > 4096 {
		t.Fatalf("the 15 MB message takes %d bytes", n)
	}
	for _, ts := range append([]testStore{sqliteStore, decodingStore}, ferretStore(t)...) {
		t.Run(ts.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			js := startJS(t)
			if _, err := provstream.EnsureStream(ctx, js, "p"); err != nil {
				t.Fatal(err)
			}
			subj := provstream.Subject("p", provenance.KindAnomalies)
			// Each poison message goes before a good one, so that once
			// the last good one is written every poison one is counted.
			for i, p := range poison {
				m := &nats.Msg{Subject: subj, Data: p.data, Header: nats.Header{}}
				for k, v := range p.h {
					m.Header[k] = v
				}
				m.Header.Set(jetstream.MsgIDHeader, p.name)
				if _, err := js.PublishMsg(ctx, m); err != nil {
					t.Fatal(err)
				}
				if err := provstream.PublishExecBlocks(ctx, js, subj, fmt.Sprint("good", i), execs[i*16:i*16+16]); err != nil {
					t.Fatal(err)
				}
			}
			store, _ := ts.open(t)
			var logs syncBuffer
			st := ingest(t, js, "p", store, int64(len(execs)), int64(len(poison)), zerolog.New(&logs))
			want := map[string]int64{RejectUndecodable: 0, RejectDocument: 1, RejectColumns: 1, RejectSize: 2}
			if st.Bad != int64(len(poison)) || fmt.Sprint(st.Rejected) != fmt.Sprint(want) {
				t.Errorf("%d bad, rejected %v; want %d bad, rejected %v", st.Bad, st.Rejected, len(poison), want)
			}
			if got := stored(t, store, provenance.KindAnomalies); len(got) != len(execs) {
				t.Errorf("store holds %d records, want the %d good ones", len(got), len(execs))
			}
			// One line for the first; the rest of the same kind within a
			// minute are counted, not logged.
			if n := strings.Count(logs.String(), "bad provenance batch refused"); n != 1 {
				t.Errorf("%d log lines about refused batches, want 1:\n%s", n, logs.String())
			}
			// The batches are decoded concurrently: the first refusal
			// logged may be any of them, and must say why.
			why := false
			for _, r := range []string{`"reason":"document","bad"`, `"reason":"size","bad"`, `"reason":"columns","bad"`} {
				why = why || strings.Contains(logs.String(), r)
			}
			if !why || !strings.Contains(logs.String(), `"error":"decode anomalies batch: `) {
				t.Errorf("the log does not say why:\n%s", logs.String())
			}
			srv := httptest.NewServer(NewHTTPHandler(store, ""))
			defer srv.Close()
			if a := listAll(t, srv); len(a.Records) != len(execs) || a.Skipped != 0 {
				t.Errorf("the API lists %d records (%d skipped), want %d", len(a.Records), a.Skipped, len(execs))
			}
		})
	}
}

// TestAPISkipsBadStoredDocuments lists, through the API, a store that
// already holds records whose documents are bad (put there by SQL of the
// test's own): the answer is whole, holds the good records and says how
// many it left out; the log says why and the health answer counts them.
func TestAPISkipsBadStoredDocuments(t *testing.T) {
	ctx := context.Background()
	store, path := openSQLite(t)
	execs := storetest.Generate(storetest.GenConfig{Seed: 52, N: 40, Anomaly: true})
	if err := store.Write(ctx, storetest.ExecBatch(provenance.KindAnomalies, execs)); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// Rows as the store writes them, with documents that are not JSON.
	for i, doc := range []string{`{not json}`, `{"pid":0,"event_id":"0:0:1",}`} {
		e := execs[i]
		if _, err := db.Exec(`INSERT INTO anomalies (pid, event_id, rid, tid, fid, func, io_step, entry, exit, runtime_total, runtime_exclusive, outlier_score, is_gpu_event, doc)
			VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)`, e.PID, fmt.Sprintf("%d:%d:%d", e.RID, e.IOStep, 800000+i), e.RID, e.TID, e.FID, e.Func,
			e.IOStep, e.Entry, e.Exit, e.RuntimeTotal, e.RuntimeExclusive, e.OutlierScore, e.IsGPUEvent, []byte(doc)); err != nil {
			t.Fatal(err)
		}
	}
	var logs syncBuffer
	srv := httptest.NewServer(NewHTTPHandler(store, "", WithLogger(zerolog.New(&logs)), WithListPage(15)))
	defer srv.Close()
	var got []provenance.Exec
	var skipped int64
	for cursor := ""; ; {
		path := "/api/v1/records?limit=0"
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		code, body, _ := get(t, srv, path, "")
		if code != 200 {
			t.Fatalf("%s answered %d: %s", path, code, body)
		}
		var a recordsAnswer
		if err := json.Unmarshal(body, &a); err != nil {
			t.Fatalf("%s: %v in %q", path, err, body)
		}
		got = append(got, a.Records...)
		skipped += a.Skipped
		if cursor = a.Next; cursor == "" {
			break
		}
	}
	if len(got) != len(execs) {
		t.Errorf("%d records listed, want the %d good ones", len(got), len(execs))
	}
	if skipped < 2 {
		t.Errorf("the answers say %d records were left out, want at least 2", skipped)
	}
	if !strings.Contains(logs.String(), "bad stored documents left out") || !strings.Contains(logs.String(), "stored document is bad") {
		t.Errorf("nothing logged about the bad documents:\n%s", logs.String())
	}
	code, body, _ := get(t, srv, "/api/v1/health", "")
	var h struct{ Skipped int64 }
	if code != 200 || json.Unmarshal(body, &h) != nil || h.Skipped != skipped {
		t.Errorf("health answered %d %s, want skipped %d", code, body, skipped)
	}
}
