// Command ad is Kipimo's on-node anomaly detector: see internal/ad.
package main

import (
	"context"
	"os"

	"github.com/kipimo-hpc/kipimo/internal/ad"
	"github.com/kipimo-hpc/kipimo/internal/daemon"
)

func main() {
	daemon.Main("ad", func(ctx context.Context, args []string) error {
		return ad.Main(ctx, args, os.Stdout, os.Stderr)
	})
}
