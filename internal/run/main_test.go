package run

import (
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/taudb/pgtest"
)

// TestMain stops the PostgreSQL server the TAUdb tests share once they end.
func TestMain(m *testing.M) { pgtest.Main(m) }
