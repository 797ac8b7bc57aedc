package cli

import (
	"github.com/spf13/cobra"

	"github.com/kipimo-hpc/kipimo/internal/bench"
)

// newComponentCmd is the hidden command that runs one component of the
// pipeline in a process of its own; `kipimo bench` starts its children with
// it.
func newComponentCmd() *cobra.Command {
	return &cobra.Command{
		Use:   bench.ComponentCommand + " [--peak-rss-file FILE] ad|pserver|provdb|nats [FLAGS]",
		Short: "Run one component of the pipeline in this process (kipimo bench's child processes)",
		Long: `Component runs one component until it is stopped (SIGINT, SIGTERM) or its
standard input ends: ad, pserver and provdb take the flags of their own
commands; nats is an embedded NATS server with JetStream on 127.0.0.1 (--dir,
--port) that prints its URL once it accepts clients. --peak-rss-file receives
the process's peak resident memory in KiB when it ends.`,
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			opt, name, rest, err := bench.ParseComponentArgs(args)
			if err != nil {
				return err
			}
			return bench.Component(cmd.Context(), name, rest, opt, cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
}
