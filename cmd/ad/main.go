// Command ad is Kipimo's on-node anomaly detector: see internal/adnode
// (the node) and internal/ad (the detector).
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/kipimo-hpc/kipimo/internal/adnode"
	"github.com/kipimo-hpc/kipimo/internal/daemon"
	"github.com/kipimo-hpc/kipimo/internal/version"
)

func main() {
	if version.Requested(os.Args[1:]) {
		fmt.Println(version.String("ad"))
		return
	}
	daemon.Main("ad", func(ctx context.Context, args []string) error {
		return adnode.Main(ctx, args, os.Stdout, os.Stderr)
	})
}
