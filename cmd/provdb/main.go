// Command provdb consumes a Kipimo run's provenance records (anomalies,
// normal executions, metadata, global statistics, profiles) from NATS
// JetStream into a SQLite file or MongoDB, acknowledging each batch only once
// stored, and serves read-only queries on them over HTTP: see
// internal/provenance/provdb.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/kipimo-hpc/kipimo/internal/daemon"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provdb"
	"github.com/kipimo-hpc/kipimo/internal/version"
)

func main() {
	if version.Requested(os.Args[1:]) {
		fmt.Println(version.String("provdb"))
		return
	}
	daemon.Main("provdb", func(ctx context.Context, args []string) error {
		return provdb.Main(ctx, args, os.Stderr)
	})
}
