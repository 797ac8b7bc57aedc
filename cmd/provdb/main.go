// Command provdb consumes a Kipimo run's provenance records (anomalies,
// normal executions, metadata, global statistics, profiles) from NATS
// JetStream into a SQLite file or MongoDB, acknowledging each batch only once
// stored, and serves read-only queries on them over HTTP.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/kipimo-hpc/kipimo/internal/provenance/service"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := service.Main(ctx, os.Args[1:], os.Stderr)
	stop()
	if errors.Is(err, pflag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "provdb:", err)
		os.Exit(1)
	}
}
