// Command kipimo is Kipimo's command-line tool: it generates and converts event
// streams, runs the whole pipeline, and queries what a run stored.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kipimo-hpc/kipimo/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := cli.Execute(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "kipimo:", err)
		os.Exit(1)
	}
}
