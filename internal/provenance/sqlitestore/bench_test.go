package sqlitestore

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/procstat"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/storetest"
)

// benchExecs are typical anomaly records: a 5+5 event window, call stacks of
// two to four frames, a few counters and messages, one in ten on a GPU.
func benchExecs(n int) []provenance.Exec {
	return storetest.Generate(storetest.GenConfig{Seed: 42, N: n, Ranks: 64, Steps: 400, Window: 5, Anomaly: true})
}

// BenchmarkSQLiteIngest measures what provdb does per message: decode a JSON
// batch of 500 anomaly records with a 5+5 window and write it in one
// transaction (synchronous FULL; KIPIMO_BENCH_SYNC=NORMAL to compare). It
// reports records/s (wall clock), records per CPU-second (the figure that
// holds on a shared machine), and the bytes the database file (with its
// indexes, after a checkpoint) takes per record.
func BenchmarkSQLiteIngest(b *testing.B) {
	const batch = 500
	ctx := context.Background()
	execs := benchExecs(20000)
	path := filepath.Join(b.TempDir(), "prov.db")
	s, err := Open(ctx, path, Options{Synchronous: os.Getenv("KIPIMO_BENCH_SYNC")})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	// Messages of one pass over the records; each later pass gives them
	// fresh keys (a new pid) so that every write inserts, as in a long run.
	pass := -1
	var msgs [][]byte
	records := 0
	var cpu time.Duration
	for i := 0; b.Loop(); i++ {
		if i%(len(execs)/batch) == 0 {
			b.StopTimer()
			pass++
			msgs = msgs[:0]
			for lo := 0; lo < len(execs); lo += batch {
				part := slices.Clone(execs[lo : lo+batch])
				for j := range part {
					part[j].PID = uint32(pass)
				}
				data, err := json.Marshal(part)
				if err != nil {
					b.Fatal(err)
				}
				msgs = append(msgs, data)
			}
			b.StartTimer()
		}
		c0 := procstat.CPUTime()
		bt, err := provenance.DecodeBatch(natsx.ProvAnomalies, msgs[i%len(msgs)])
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Write(ctx, bt); err != nil {
			b.Fatal(err)
		}
		cpu += procstat.CPUTime() - c0
		records += bt.Len()
	}
	b.StopTimer()
	b.ReportMetric(float64(records)/b.Elapsed().Seconds(), "records/s")
	if cpu > 0 {
		b.ReportMetric(float64(records)/cpu.Seconds(), "records/cpu-s")
	}
	size, err := s.DiskUsage(ctx)
	if err != nil {
		b.Fatal(err)
	}
	n, err := s.Count(ctx, provenance.Query{})
	if err != nil || n != int64(records) {
		b.Fatalf("store holds %d records after writing %d (%v)", n, records, err)
	}
	b.ReportMetric(float64(size)/float64(records), "B/record")
}

// BenchmarkAnomalyJSONSize reports the median size of an anomaly record with
// a 5+5 event window as JSON (json-B/record; the target is at most 1 KiB,
// Chimbuko's records are about 5-8 KiB) and the mean size of a record's
// document as the store keeps it, compressed in a block of
// execRowsPerInsert (B/record). The time per op is that of encoding and
// compressing one record.
func BenchmarkAnomalyJSONSize(b *testing.B) {
	execs := benchExecs(2048)
	sizes := make([]int, len(execs))
	var blk blockBuilder
	stored := 0
	for i := range execs {
		d, err := provenance.AppendExecJSON(nil, &execs[i])
		if err != nil {
			b.Fatal(err)
		}
		sizes[i] = len(d)
		blk.add(d)
		if len(blk.lens) == execRowsPerInsert {
			stored += len(blk.appendCompressed(nil))
			blk.reset()
		}
	}
	slices.Sort(sizes)
	var js, z []byte
	blk.reset()
	for i := 0; b.Loop(); i++ {
		var err error
		if js, err = provenance.AppendExecJSON(js[:0], &execs[i%len(execs)]); err != nil {
			b.Fatal(err)
		}
		blk.add(js)
		if len(blk.lens) == execRowsPerInsert {
			z = blk.appendCompressed(z[:0])
			blk.reset()
		}
	}
	b.ReportMetric(float64(sizes[len(sizes)/2]), "json-B/record")
	b.ReportMetric(float64(stored)/float64(len(execs)), "B/record")
}

// BenchmarkSQLiteWrite measures the store alone: batches of 500 decoded
// anomaly records (5+5 window) written in one transaction each.
func BenchmarkSQLiteWrite(b *testing.B) {
	const batch = 500
	ctx := context.Background()
	execs := benchExecs(20000)
	s, err := Open(ctx, filepath.Join(b.TempDir(), "prov.db"), Options{Synchronous: os.Getenv("KIPIMO_BENCH_SYNC")})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	records := 0
	var cpu time.Duration
	for i := 0; b.Loop(); i++ {
		lo := (i * batch) % len(execs)
		bt := provenance.Batch{Kind: natsx.ProvAnomalies, Execs: execs[lo : lo+batch]}
		if i >= len(execs)/batch {
			b.StopTimer()
			bt.Execs = slices.Clone(bt.Execs)
			for j := range bt.Execs {
				bt.Execs[j].PID = uint32(1 + i/(len(execs)/batch))
			}
			b.StartTimer()
		}
		c0 := procstat.CPUTime()
		if err := s.Write(ctx, bt); err != nil {
			b.Fatal(err)
		}
		cpu += procstat.CPUTime() - c0
		records += batch
	}
	b.ReportMetric(float64(records)/b.Elapsed().Seconds(), "records/s")
	if cpu > 0 {
		b.ReportMetric(float64(records)/cpu.Seconds(), "records/cpu-s")
	}
}
