// Command provdb consumes a Kipimo run's provenance records (anomalies,
// normal executions, metadata, global statistics, profiles) from NATS
// JetStream into a SQLite file or MongoDB, acknowledging each batch only once
// stored, and serves read-only queries on them over HTTP: see
// internal/provenance/service.
package main

import (
	"context"
	"os"

	"github.com/kipimo-hpc/kipimo/internal/daemon"
	"github.com/kipimo-hpc/kipimo/internal/provenance/service"
)

func main() {
	daemon.Main("provdb", func(ctx context.Context, args []string) error {
		return service.Main(ctx, args, os.Stderr)
	})
}
