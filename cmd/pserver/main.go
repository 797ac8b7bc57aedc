// Command pserver is Kipimo's parameter server: see internal/pserver.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/kipimo-hpc/kipimo/internal/pserver"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := pserver.Run(ctx, os.Args[1:], os.Stderr)
	stop()
	if errors.Is(err, pflag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "pserver:", err)
		os.Exit(1)
	}
}
