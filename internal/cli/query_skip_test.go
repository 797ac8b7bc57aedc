package cli

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provdb"
	"github.com/kipimo-hpc/kipimo/internal/provenance/storetest"
)

// TestQueryListSkipsBadDocuments lists a store that holds records whose
// documents are bad (written by SQL of the test's own, as the documents a
// provdb without checks stored): kipimo query list --limit 0, on the store
// and through provdb's API, lists the good records and warns on stderr
// how many it left out.
func TestQueryListSkipsBadDocuments(t *testing.T) {
	ctx := context.Background()
	path, s := tempStore(ctx, t)
	defer s.Close()
	execs := storetest.Generate(storetest.GenConfig{Seed: 77, N: 30, Anomaly: true})
	if err := s.Write(ctx, provenance.Batch{Kind: provenance.KindAnomalies, Execs: execs}); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	e := execs[3]
	if _, err := db.Exec(`INSERT INTO anomalies (pid, event_id, rid, tid, fid, func, io_step, entry, exit, runtime_total, runtime_exclusive, outlier_score, is_gpu_event, doc)
		VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)`, e.PID, "0:0:999999", e.RID, e.TID, e.FID, e.Func, e.IOStep, e.Entry, e.Exit,
		e.RuntimeTotal, e.RuntimeExclusive, e.OutlierScore, e.IsGPUEvent, []byte(`{not json}`)); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(provdb.NewHTTPHandler(s, ""))
	defer srv.Close()
	for name, from := range map[string][]string{"store": {"--store", path}, "provdb": {"--url", srv.URL}} {
		t.Run(name, func(t *testing.T) {
			var out, errb bytes.Buffer
			root := NewRoot(&out, &errb)
			root.SetArgs(append([]string{"query", "list", "--limit", "0", "--labels", "all"}, from...))
			if err := root.ExecuteContext(ctx); err != nil {
				t.Fatalf("kipimo query list: %v\n%s", err, errb.String())
			}
			if !strings.Contains(out.String(), "30 records") {
				t.Errorf("the listing does not hold the 30 good records:\n%s", out.String())
			}
			if !strings.Contains(errb.String(), "warning: 1 stored records left out") {
				t.Errorf("no warning on stderr: %q", errb.String())
			}
		})
	}
}

// FuzzReadRecords checks that no answer crashes the reader of
// /api/v1/records, and that what it reads of an answer it accepts is what
// the answer holds: as many records, its cursor and its count of skipped
// records.
func FuzzReadRecords(f *testing.F) {
	f.Add([]byte(`{"records":[{"event_id":"0:1:2","pid":3}],"skipped":2,"next":"abc"}`))
	f.Add([]byte(`{"records":[]}`))
	f.Add([]byte(`{"records":[{}],"skipped":-1,"other":[1,{"a":2}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		n := 0
		next, skipped, err := readRecords(bytes.NewReader(data), func(provenance.Exec) error { n++; return nil })
		if err != nil {
			return
		}
		// The answer read as a whole, its keys matched exactly (as the
		// reader does, and unlike encoding/json's struct fields).
		var fields map[string]json.RawMessage
		if json.Unmarshal(data, &fields) != nil || repeatsKey(data) {
			return // the reader stops at the first value; the rest may be anything
		}
		var records []json.RawMessage
		var wantSkipped int64
		var wantNext string
		if json.Unmarshal(fields["records"], &records) != nil && fields["records"] != nil {
			t.Fatalf("read records %q the whole answer cannot", fields["records"])
		}
		if v, ok := fields["skipped"]; ok && json.Unmarshal(v, &wantSkipped) != nil {
			t.Fatalf("read skipped %q the whole answer cannot", v)
		}
		if v, ok := fields["next"]; ok && json.Unmarshal(v, &wantNext) != nil {
			t.Fatalf("read next %q the whole answer cannot", v)
		}
		if n != len(records) || skipped != wantSkipped || next != wantNext {
			t.Fatalf("read %d records, skipped %d, next %q; the answer holds %d, %d, %q", n, skipped, next, len(records), wantSkipped, wantNext)
		}
	})
}

// repeatsKey reports whether the JSON object data has a key twice at its
// top level.
func repeatsKey(data []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(data))
	if _, err := dec.Token(); err != nil {
		return false
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		k, _ := tok.(string)
		if seen[k] {
			return true
		}
		seen[k] = true
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return false
		}
	}
	return false
}
