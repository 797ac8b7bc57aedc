// Command pserver is Kipimo's parameter server: see internal/pserver.
package main

import (
	"context"
	"os"

	"github.com/kipimo-hpc/kipimo/internal/daemon"
	"github.com/kipimo-hpc/kipimo/internal/pserver"
)

func main() {
	daemon.Main("pserver", func(ctx context.Context, args []string) error {
		return pserver.Main(ctx, args, os.Stderr)
	})
}
