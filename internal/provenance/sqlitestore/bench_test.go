package sqlitestore

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/storetest"
)

// BenchmarkSQLiteIngest measures what provdb does per message: decode a JSON
// batch of 500 anomaly records with a 5+5 window and write it in one
// transaction (synchronous FULL; KIPIMO_BENCH_SYNC=NORMAL to compare). It reports records/s and the bytes the
// database file takes per record.
func BenchmarkSQLiteIngest(b *testing.B) {
	const batch = 500
	ctx := context.Background()
	execs := storetest.Generate(storetest.GenConfig{Seed: 42, N: 20000, Ranks: 64, Steps: 400, Window: 5, Anomaly: true})
	var msgs [][]byte
	for i := 0; i < len(execs); i += batch {
		data, err := json.Marshal(execs[i:min(i+batch, len(execs))])
		if err != nil {
			b.Fatal(err)
		}
		msgs = append(msgs, data)
	}
	path := filepath.Join(b.TempDir(), "prov.db")
	s, err := Open(ctx, path, Options{Synchronous: os.Getenv("KIPIMO_BENCH_SYNC")})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	b.ResetTimer()
	records := 0
	for i := 0; b.Loop(); i++ {
		m := msgs[i%len(msgs)]
		if i >= len(msgs) {
			// Past the first pass, give the records fresh keys so every
			// write inserts (as a long run would).
			bt, err := provenance.DecodeBatch(natsx.ProvAnomalies, m)
			if err != nil {
				b.Fatal(err)
			}
			for j := range bt.Execs {
				bt.Execs[j].PID = uint32(1 + i/len(msgs))
			}
			b.StopTimer()
			m, _ = json.Marshal(bt.Execs)
			b.StartTimer()
		}
		bt, err := provenance.DecodeBatch(natsx.ProvAnomalies, m)
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Write(ctx, bt); err != nil {
			b.Fatal(err)
		}
		records += bt.Len()
	}
	b.StopTimer()
	b.ReportMetric(float64(records)/b.Elapsed().Seconds(), "records/s")
	if _, err := s.w.ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
		b.Fatal(err)
	}
	var size int64
	for _, suffix := range []string{"", "-wal"} {
		if fi, err := os.Stat(path + suffix); err == nil {
			size += fi.Size()
		}
	}
	n, err := s.Count(ctx, provenance.Query{})
	if err != nil || n != int64(records) {
		b.Fatalf("store holds %d records after writing %d (%v)", n, records, err)
	}
	b.ReportMetric(float64(size)/float64(records), "B/record")
}

// BenchmarkAnomalyJSONSize reports the median JSON size of an anomaly record
// with a 5+5 event window (the target is at most 1 KiB; Chimbuko's records
// are about 5-8 KiB). The time per op is that of encoding one record.
func BenchmarkAnomalyJSONSize(b *testing.B) {
	execs := storetest.Generate(storetest.GenConfig{Seed: 42, N: 2000, Ranks: 64, Steps: 400, Window: 5, Anomaly: true})
	sizes := make([]int, len(execs))
	for i := range execs {
		d, err := json.Marshal(&execs[i])
		if err != nil {
			b.Fatal(err)
		}
		sizes[i] = len(d)
	}
	sort.Ints(sizes)
	for i := 0; b.Loop(); i++ {
		if _, err := json.Marshal(&execs[i%len(execs)]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(sizes[len(sizes)/2]), "B/record")
}

// BenchmarkSQLiteWrite measures the store alone: batches of 500 decoded
// anomaly records (5+5 window) written in one transaction each.
func BenchmarkSQLiteWrite(b *testing.B) {
	const batch = 500
	ctx := context.Background()
	execs := storetest.Generate(storetest.GenConfig{Seed: 42, N: 20000, Ranks: 64, Steps: 400, Window: 5, Anomaly: true})
	s, err := Open(ctx, filepath.Join(b.TempDir(), "prov.db"), Options{Synchronous: os.Getenv("KIPIMO_BENCH_SYNC")})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	records := 0
	for i := 0; b.Loop(); i++ {
		lo := (i * batch) % len(execs)
		bt := provenance.Batch{Kind: natsx.ProvAnomalies, Execs: execs[lo : lo+batch]}
		if i >= len(execs)/batch {
			b.StopTimer()
			bt.Execs = append([]provenance.Exec(nil), bt.Execs...)
			for j := range bt.Execs {
				bt.Execs[j].PID = uint32(1 + i/(len(execs)/batch))
			}
			b.StartTimer()
		}
		if err := s.Write(ctx, bt); err != nil {
			b.Fatal(err)
		}
		records += batch
	}
	b.ReportMetric(float64(records)/b.Elapsed().Seconds(), "records/s")
}
