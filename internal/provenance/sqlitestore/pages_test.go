package sqlitestore

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/storetest"
)

// TestPageSize checks that a new store gets 16 KiB pages in WAL mode, and
// that a store made before with SQLite's 4 KiB pages keeps them and is
// written and read as usual.
func TestPageSize(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		existing bool
		want     int
	}{
		{name: "new file", want: 16384},
		{name: "file made with 4 KiB pages", existing: true, want: 4096},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "p.db")
			if tc.existing {
				db, err := sql.Open("sqlite", "file:"+path)
				if err != nil {
					t.Fatal(err)
				}
				for _, st := range append([]string{"PRAGMA page_size=4096", "PRAGMA journal_mode=WAL"}, schema()...) {
					if _, err := db.Exec(st); err != nil {
						t.Fatal(err)
					}
				}
				db.Close()
			}
			s, err := Open(ctx, path, Options{Synchronous: "OFF"})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			var size int
			var mode string
			if err := s.r.QueryRowContext(ctx, "PRAGMA page_size").Scan(&size); err != nil {
				t.Fatal(err)
			}
			if err := s.r.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
				t.Fatal(err)
			}
			if size != tc.want || mode != "wal" {
				t.Errorf("page size %d in %s mode, want %d in wal", size, mode, tc.want)
			}
			execs := storetest.Generate(storetest.GenConfig{Seed: 1, N: 100, Anomaly: true})
			if err := s.Write(ctx, provenance.Batch{Kind: provenance.KindAnomalies, Execs: execs}); err != nil {
				t.Fatal(err)
			}
			got, err := s.Get(ctx, provenance.KindAnomalies, execs[70].PID, execs[70].EventID)
			if err != nil || got.Func != execs[70].Func || got.Entry != execs[70].Entry {
				t.Errorf("record read back as %s %d (%v), want %s %d", got.Func, got.Entry, err, execs[70].Func, execs[70].Entry)
			}
		})
	}
}
