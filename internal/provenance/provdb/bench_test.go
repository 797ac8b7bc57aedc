package provdb

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/procstat"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provstream"
	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
	"github.com/kipimo-hpc/kipimo/internal/provenance/storetest"
)

// BenchmarkProvdbIngest measures provdb end to end on an embedded NATS
// server: 10,000 anomaly records (5+5 event window) waiting in JetStream in
// batches of 250 are fetched, decoded, written to a SQLite store
// (synchronous FULL; KIPIMO_BENCH_SYNC=NORMAL to compare) and
// acknowledged. The batches are in the block encoding producers publish
// (wire=blocks: columns and compressed documents, about 100 KB) or JSON
// arrays (wire=json: about 700 KB, under MaxBatchBytes). Each iteration
// starts a provdb on the waiting records and stops it when all are
// written; publishing is not timed, nor is the stop (which waits for the
// last fetch to expire, FetchWait). It reports records/s and records per
// CPU-second (the NATS server runs in the same process and is counted),
// the bytes the process wrote while ingesting, per record
// (written-B/record: the store's write-ahead log and checkpoints, and the
// stream's acknowledgements; Linux only), which the machine's load does
// not change, the store's size on disk per record (B/record) and the bytes
// the stream holds per record (wire-B/record: bodies, headers and
// subjects).
func BenchmarkProvdbIngest(b *testing.B) {
	for _, wire := range []string{"json", "blocks"} {
		b.Run("wire="+wire, func(b *testing.B) { benchProvdbIngest(b, wire == "blocks") })
	}
}

func benchProvdbIngest(b *testing.B, blocks bool) {
	const perIter, batch = 10000, 250
	ctx := context.Background()
	srv, err := natsx.StartServer(natsx.DefaultServerConfig(b.TempDir()))
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := natsx.Connect(ctx, srv.ClientURL(), "bench")
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	store, err := sqlitestore.Open(ctx, filepath.Join(b.TempDir(), "p.db"), sqlitestore.Options{Synchronous: os.Getenv("KIPIMO_BENCH_SYNC")})
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	execs := storetest.Generate(storetest.GenConfig{Seed: 42, N: perIter, Ranks: 64, Steps: 400, Window: 5, Anomaly: true})
	subj := provstream.Subject("bench", provenance.KindAnomalies)
	stream, err := provstream.EnsureStream(ctx, js, "bench")
	if err != nil {
		b.Fatal(err)
	}
	log := zerolog.Nop()
	var cpu time.Duration
	var written, wrote int64
	var wireBytes uint64
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		info, err := stream.Info(ctx)
		if err != nil {
			b.Fatal(err)
		}
		before := info.State.Bytes
		for lo := 0; lo < perIter; lo += batch {
			part := slices.Clone(execs[lo : lo+batch])
			for j := range part {
				part[j].PID = uint32(i) // fresh keys: every record inserts
			}
			id := fmt.Sprintf("%d.%d", i, lo)
			if blocks {
				err = provstream.PublishExecBlocks(ctx, js, subj, id, part)
			} else {
				err = provstream.PublishBatch(ctx, js, subj, id, part)
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		if info, err = stream.Info(ctx); err != nil {
			b.Fatal(err)
		}
		wireBytes += info.State.Bytes - before
		b.StartTimer()
		c0, w0 := procstat.CPUTime(), wroteBytes()
		svc := New(Config{Run: "bench", FetchWait: 100 * time.Millisecond}, store, js, log)
		if err := svc.Start(ctx); err != nil {
			b.Fatal(err)
		}
		for svc.Stats().Written[provenance.KindAnomalies] < perIter {
			time.Sleep(time.Millisecond)
		}
		cpu += procstat.CPUTime() - c0
		wrote += wroteBytes() - w0
		b.StopTimer()
		if err := svc.Shutdown(ctx); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		written += svc.Stats().Written[provenance.KindAnomalies]
	}
	b.ReportMetric(float64(written)/b.Elapsed().Seconds(), "records/s")
	if cpu > 0 {
		b.ReportMetric(float64(written)/cpu.Seconds(), "records/cpu-s")
	}
	if wrote > 0 {
		b.ReportMetric(float64(wrote)/float64(written), "written-B/record")
	}
	if n, err := store.DiskUsage(ctx); err == nil && written > 0 {
		b.ReportMetric(float64(n)/float64(written), "B/record")
	}
	if written > 0 {
		b.ReportMetric(float64(wireBytes)/float64(written), "wire-B/record")
	}
}

// wroteBytes is the number of bytes the process has passed to write
// system calls so far (wchar of /proc/self/io), or 0 where there is no
// such file.
func wroteBytes() int64 {
	data, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "wchar: "); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}
