package sqlitestore

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/procstat"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/docblock"
	"github.com/kipimo-hpc/kipimo/internal/provenance/storetest"
)

// preparedStore is a Store whose Write goes through Prepare and
// WritePrepared, the way provdb writes, and splits each batch in two
// prepared halves written in one transaction, so that the shared suite
// checks the prepared path as it checks Write.
type preparedStore struct{ *Store }

func (p preparedStore) Write(ctx context.Context, b provenance.Batch) error {
	var ps []*Prepared
	for _, half := range splitBatch(b) {
		pb, err := p.Prepare(half)
		if err != nil {
			return err
		}
		ps = append(ps, pb)
	}
	return p.WritePrepared(ctx, ps)
}

// splitBatch splits b's records in two batches (the first one may be empty).
func splitBatch(b provenance.Batch) []provenance.Batch {
	x, y := provenance.Batch{Kind: b.Kind}, provenance.Batch{Kind: b.Kind}
	h := len(b.Execs) / 2
	x.Execs, y.Execs = b.Execs[:h], b.Execs[h:]
	x.Metadata, y.Metadata = b.Metadata[:len(b.Metadata)/2], b.Metadata[len(b.Metadata)/2:]
	x.FuncStats, y.FuncStats = b.FuncStats[:len(b.FuncStats)/2], b.FuncStats[len(b.FuncStats)/2:]
	x.CounterStats, y.CounterStats = b.CounterStats[:len(b.CounterStats)/2], b.CounterStats[len(b.CounterStats)/2:]
	x.Profiles, y.Profiles = b.Profiles[:len(b.Profiles)/2], b.Profiles[len(b.Profiles)/2:]
	return []provenance.Batch{x, y}
}

func TestSharedSuitePrepared(t *testing.T) {
	storetest.Run(t, func(t *testing.T) provenance.Store {
		s, err := Open(context.Background(), filepath.Join(t.TempDir(), "prov.db"), Options{Synchronous: "NORMAL"})
		if err != nil {
			t.Fatal(err)
		}
		return preparedStore{s}
	}, storetest.Options{N: 1000})
}

// TestWritePreparedAllOrNothing checks that a failed WritePrepared (its last
// batch of no known kind) keeps none of its batches' records, and that the same
// batches written again, overlapping and one given twice, store each record
// once with no document left over.
func TestWritePreparedAllOrNothing(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "prov.db"), Options{Synchronous: "NORMAL"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	execs := storetest.Generate(storetest.GenConfig{Seed: 3, N: 300, Ranks: 4, Steps: 10, Window: 2, Anomaly: true})
	a, err := s.Prepare(provenance.Batch{Kind: provenance.KindAnomalies, Execs: execs[:200]})
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Prepare(provenance.Batch{Kind: provenance.KindAnomalies, Execs: execs[150:]})
	if err != nil {
		t.Fatal(err)
	}
	if len(a.blocks) != 4 || len(b.blocks) != 3 {
		t.Fatalf("%d and %d blocks for 200 and 150 records, want 4 and 3", len(a.blocks), len(b.blocks))
	}
	// The third batch fails, after the first two were inserted.
	bogus := &Prepared{kind: "bogus"}
	if err := s.WritePrepared(ctx, []*Prepared{a, b, bogus}); err == nil {
		t.Fatal("a write with a batch of no known kind succeeded")
	}
	count := func() int64 {
		n, err := s.Count(ctx, provenance.Query{Kind: provenance.KindAnomalies})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count(); n != 0 {
		t.Fatalf("%d records kept by a failed write, want 0", n)
	}
	if err := s.WritePrepared(ctx, []*Prepared{a, b, a}); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 300 {
		t.Fatalf("%d records after writing 300 distinct ones, some twice, want 300", n)
	}
	var got []string
	if err := s.Each(ctx, provenance.Query{Kind: provenance.KindAnomalies, Limit: provenance.NoLimit, Sort: "entry"}, func(e provenance.Exec) error {
		got = append(got, provenance.ExecKey(e.PID, e.EventID))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, e := range execs {
		want = append(want, provenance.ExecKey(e.PID, e.EventID))
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("stored keys differ from the records written")
	}
	// Every document in a block belongs to a stored row.
	rows, err := s.r.QueryContext(ctx, "SELECT data FROM anomalies_docs")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var docs int
	for rows.Next() {
		var data []byte
		if err := rows.Scan(&data); err != nil {
			t.Fatal(err)
		}
		d, err := docblock.Decode(data)
		if err != nil {
			t.Fatal(err)
		}
		docs += len(d)
	}
	if docs != 300 {
		t.Errorf("blocks hold %d documents for 300 records", docs)
	}
}

// BenchmarkSQLiteWritePrepared measures what provdb's writer does, apart
// from the work Prepare does on other goroutines: prepared batches of 250
// anomaly records (5+5 window), 16 of them (4,000 records) per transaction,
// each record new. It reports records/s and records/cpu-s of the writer
// alone, and of Prepare alone (prepare-records/cpu-s, on one goroutine).
func BenchmarkSQLiteWritePrepared(b *testing.B) {
	const batch, perTx = 250, 16
	ctx := context.Background()
	execs := benchExecs(20000)
	s, err := Open(ctx, filepath.Join(b.TempDir(), "prov.db"), Options{Synchronous: os.Getenv("KIPIMO_BENCH_SYNC")})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	records := 0
	var cpu, prepCPU time.Duration
	var prepared int
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		ps := make([]*Prepared, perTx)
		c0 := procstat.CPUTime()
		for j := range ps {
			lo := ((i*perTx + j) * batch) % len(execs)
			part := slices.Clone(execs[lo : lo+batch])
			for k := range part {
				part[k].PID = uint32(i*perTx+j) / uint32(len(execs)/batch) // fresh keys once all were written
			}
			if ps[j], err = s.Prepare(provenance.Batch{Kind: provenance.KindAnomalies, Execs: part}); err != nil {
				b.Fatal(err)
			}
		}
		prepCPU += procstat.CPUTime() - c0
		prepared += perTx * batch
		b.StartTimer()
		c0 = procstat.CPUTime()
		if err := s.WritePrepared(ctx, ps); err != nil {
			b.Fatal(err)
		}
		cpu += procstat.CPUTime() - c0
		records += perTx * batch
	}
	b.ReportMetric(float64(records)/b.Elapsed().Seconds(), "records/s")
	if cpu > 0 {
		b.ReportMetric(float64(records)/cpu.Seconds(), "records/cpu-s")
	}
	if prepCPU > 0 {
		b.ReportMetric(float64(prepared)/prepCPU.Seconds(), "prepare-records/cpu-s")
	}
}
