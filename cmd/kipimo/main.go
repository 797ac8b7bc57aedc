// Command kipimo is Kipimo's command-line tool: it generates and converts event
// streams, runs the whole pipeline, and queries what a run stored.
package main

import (
	"context"
	"errors"
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
	// A command run under kipimo (run --exec) that failed: exit with its
	// status, as if it had run alone.
	var ec interface{ ExitCode() int }
	if errors.As(err, &ec) {
		os.Exit(ec.ExitCode())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kipimo:", err)
		os.Exit(1)
	}
}
