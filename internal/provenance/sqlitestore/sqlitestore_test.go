package sqlitestore

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/storetest"
)

func TestSharedSuite(t *testing.T) {
	storetest.Run(t, func(t *testing.T) provenance.Store {
		s, err := Open(context.Background(), filepath.Join(t.TempDir(), "prov.db"), Options{Synchronous: "NORMAL"})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}, storetest.Options{N: 1000})
}

func TestDiskUsageCountsCheckpointedLog(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "prov.db")
	s, err := Open(ctx, path, Options{Synchronous: "NORMAL"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	empty, err := s.DiskUsage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	execs := storetest.Generate(storetest.GenConfig{Seed: 1, N: 2000, Anomaly: true})
	if err := s.Write(ctx, storetest.ExecBatch(storetest.Anomalies, execs)); err != nil {
		t.Fatal(err)
	}
	full, err := s.DiskUsage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if wal, err := os.Stat(path + "-wal"); err == nil && wal.Size() != 0 {
		t.Errorf("log holds %d B after the checkpoint", wal.Size())
	}
	// Each record takes at least its compressed document, and the
	// documents are a few hundred bytes.
	if per := float64(full-empty) / float64(len(execs)); per < 200 || per > 2000 {
		t.Errorf("%.0f B per record on disk, want a few hundred", per)
	}
}
