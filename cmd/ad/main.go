// Command ad is Kipimo's on-node anomaly detector: see internal/ad.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/kipimo-hpc/kipimo/internal/ad"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := ad.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, pflag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ad:", err)
		os.Exit(1)
	}
}
