package sqlitestore

import (
	"cmp"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/procstat"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/docblock"
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
		bt, err := provenance.DecodeBatch(provenance.KindAnomalies, msgs[i%len(msgs)])
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
	var blk docblock.Builder
	stored := 0
	for i := range execs {
		d, err := provenance.AppendExecJSON(nil, &execs[i])
		if err != nil {
			b.Fatal(err)
		}
		sizes[i] = len(d)
		blk.Add(d)
		if blk.Len() == execRowsPerInsert {
			stored += len(blk.AppendCompressed(nil))
			blk.Reset()
		}
	}
	slices.Sort(sizes)
	var js, z []byte
	blk.Reset()
	for i := 0; b.Loop(); i++ {
		var err error
		if js, err = provenance.AppendExecJSON(js[:0], &execs[i%len(execs)]); err != nil {
			b.Fatal(err)
		}
		blk.Add(js)
		if blk.Len() == execRowsPerInsert {
			z = blk.AppendCompressed(z[:0])
			blk.Reset()
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
		bt := provenance.Batch{Kind: provenance.KindAnomalies, Execs: execs[lo : lo+batch]}
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

// BenchmarkSQLiteEach streams every record of a store of 50,000 anomalies
// (written in time-ordered batches of 500 from 16 programs, as the detector
// sends them) with Each, as `kipimo query list --limit 0` does, sorted by
// entry (the default, in write order within a batch) and by outlier score
// (random in write order: most records need a block of their own). It
// reports records/s, the bytes allocated per record (alloc-B/record) and
// the live heap's growth at its peak, sampled every 5,000 records after a
// collection, per record of the stream (peak-heap-B/record).
func BenchmarkSQLiteEach(b *testing.B) {
	const n, batch, programs = 50000, 500, 16
	ctx := context.Background()
	path := filepath.Join(b.TempDir(), "prov.db")
	s, err := Open(ctx, path, Options{Synchronous: "OFF"})
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
	for _, sortBy := range []string{provenance.SortEntry, provenance.SortOutlierScore} {
		b.Run("sort="+sortBy, func(b *testing.B) {
			q := provenance.Query{Sort: sortBy, Limit: provenance.NoLimit}
			var records int
			var peak uint64
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			for b.Loop() {
				err := s.Each(ctx, q, func(e provenance.Exec) error {
					records++
					if records%5000 == 0 {
						b.StopTimer()
						var m runtime.MemStats
						runtime.GC()
						runtime.ReadMemStats(&m)
						peak = max(peak, m.HeapAlloc)
						b.StartTimer()
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			runtime.ReadMemStats(&after)
			if records == 0 {
				b.Fatal("no records")
			}
			b.ReportMetric(float64(records)/b.Elapsed().Seconds(), "records/s")
			b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/float64(records), "alloc-B/record")
			b.ReportMetric(float64(int64(peak)-int64(before.HeapAlloc))/float64(n), "peak-heap-B/record")
		})
	}
}
