// Command pserver is Kipimo's parameter server: see internal/pserver.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/kipimo-hpc/kipimo/internal/daemon"
	"github.com/kipimo-hpc/kipimo/internal/pserver"
	"github.com/kipimo-hpc/kipimo/internal/version"
)

func main() {
	if version.Requested(os.Args[1:]) {
		fmt.Println(version.String("pserver"))
		return
	}
	daemon.Main("pserver", func(ctx context.Context, args []string) error {
		return pserver.Main(ctx, args, os.Stderr)
	})
}
