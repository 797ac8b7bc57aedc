package cli

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
)

// tempStore opens a new SQLite provenance store in t's temporary directory
// and returns its path; the caller closes it (before a command opens the
// file, where it must).
func tempStore(ctx context.Context, t *testing.T) (string, *sqlitestore.Store) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "prov.db")
	s, err := sqlitestore.Open(ctx, path, sqlitestore.Options{Synchronous: "OFF"})
	if err != nil {
		t.Fatal(err)
	}
	return path, s
}
