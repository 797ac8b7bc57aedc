package sqlitestore

import (
	"context"
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
