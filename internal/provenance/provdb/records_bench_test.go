package provdb

import (
	"cmp"
	"context"
	"encoding/json"
	"io"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
	"github.com/kipimo-hpc/kipimo/internal/provenance/storetest"
)

// BenchmarkHTTPRecordsAll reads every record of a store of 20,000 anomalies
// (time-ordered batches of 500 from 8 programs) from /api/v1/records with
// limit=0, following "next" through pages of ListPage, the client and the
// server in this process. It reports records/s and the bytes allocated per
// record by both sides (alloc-B/record) and of JSON sent (json-B/record).
func BenchmarkHTTPRecordsAll(b *testing.B) {
	const n, batch, programs = 20000, 500, 8
	ctx := context.Background()
	s, err := sqlitestore.Open(ctx, filepath.Join(b.TempDir(), "prov.db"), sqlitestore.Options{Synchronous: "OFF"})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	for p := range programs {
		execs := storetest.Generate(storetest.GenConfig{Seed: uint64(p), N: n / programs, Ranks: 64, Steps: 400, Window: 5, Anomaly: true})
		slices.SortFunc(execs, func(x, y provenance.Exec) int { return cmp.Compare(x.Entry, y.Entry) })
		for i := range execs {
			execs[i].PID = uint32(p)
		}
		for lo := 0; lo < len(execs); lo += batch {
			if err := s.Write(ctx, storetest.ExecBatch(provenance.KindAnomalies, execs[lo:min(lo+batch, len(execs))])); err != nil {
				b.Fatal(err)
			}
		}
	}
	srv := httptest.NewServer(NewHTTPHandler(s, ""))
	defer srv.Close()
	records, sent := 0, int64(0)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for b.Loop() {
		cursor := ""
		for {
			v := url.Values{"limit": {"0"}}
			if cursor != "" {
				v.Set("cursor", cursor)
			}
			resp, err := srv.Client().Get(srv.URL + "/api/v1/records?" + v.Encode())
			if err != nil {
				b.Fatal(err)
			}
			cr := &countingReader{r: resp.Body}
			k, next, err := readPage(cr)
			resp.Body.Close()
			if err != nil {
				b.Fatal(err)
			}
			records += k
			sent += cr.n
			if cursor = next; cursor == "" {
				break
			}
		}
	}
	runtime.ReadMemStats(&after)
	if records == 0 {
		b.Fatal("no records")
	}
	b.ReportMetric(float64(records)/b.Elapsed().Seconds(), "records/s")
	b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/float64(records), "alloc-B/record")
	b.ReportMetric(float64(sent)/float64(records), "json-B/record")
}

// readPage reads an answer of /api/v1/records one record at a time, and
// returns the number of records and "next".
func readPage(r io.Reader) (n int, next string, err error) {
	dec := json.NewDecoder(r)
	if _, err := dec.Token(); err != nil { // {
		return 0, "", err
	}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return 0, "", err
		}
		if key != "records" {
			var v any
			if err := dec.Decode(&v); err != nil {
				return 0, "", err
			}
			next, _ = v.(string)
			continue
		}
		if _, err := dec.Token(); err != nil { // [
			return 0, "", err
		}
		for dec.More() {
			var rec json.RawMessage
			if err := dec.Decode(&rec); err != nil {
				return 0, "", err
			}
			n++
		}
		if _, err := dec.Token(); err != nil { // ]
			return 0, "", err
		}
	}
	return n, next, nil
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
