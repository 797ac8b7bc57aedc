// Package cli implements the kipimo command: one subcommand per file, each
// built by a newXxxCmd function and listed in NewRoot.
package cli

import (
	"context"
	"io"
	"os"
	"strings"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kipimo-hpc/kipimo/internal/config"
	"github.com/kipimo-hpc/kipimo/internal/version"
)

// NewRoot builds the kipimo command tree. Output goes to stdout and stderr as
// given, so tests can capture it.
func NewRoot(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "kipimo",
		Short: "Streaming performance-anomaly detection for parallel applications",
		Long: `Kipimo reads the function, counter and communication events of every rank of a
parallel application one io_step at a time, learns each function's runtime
distribution across all ranks, flags abnormal executions with their call stack
and context, and keeps them for queries, dashboards and TAU profiles.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version.String("kipimo"),
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetOut(stdout)
	root.SetErr(stderr)
	cobra.AddTemplateFunc("flagsHeading", flagsHeading)
	root.SetUsageTemplate(strings.Replace(root.UsageTemplate(), "\n\nFlags:\n", "\n\n{{flagsHeading .}}\n", 1) +
		"{{if not .HasParent}}\n" + rootConventions + "\n{{end}}")
	root.PersistentFlags().String("log-level", "info", "log level: debug, info, warn, error")
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		lvl, _ := cmd.Flags().GetString("log-level")
		return setupLogging(cmd.ErrOrStderr(), lvl)
	}
	root.AddCommand(
		// subcommands, one file each
		newFramesCmd(),
		newGenCmd(),
		newCallstackCmd(),
		newReplayCmd(),
		newQueryCmd(),
		newTaudbCmd(),
		newRunCmd(),
		newBenchCmd(),
		newComponentCmd(),
		newExecCmd(),
		newLibCmd(),
		newServeCmd(),
		newDiffCmd(),
		newExportCmd(),
	)
	return root
}

// rootConventions ends kipimo's own help: the settings convention every
// Kipimo binary shares (internal/config).
const rootConventions = `Flags take two dashes (--name). Commands with a --config flag (run, exec),
like the ad, pserver and provdb daemons, also read every flag from a
KIPIMO_<FLAG> environment variable and a --config YAML key (precedence:
flag > environment > config file > default).`

// flagsHeading is the heading of a command's flags in its help: the shared
// convention line of internal/config for commands that read KIPIMO_<FLAG>
// variables and --config files, plain "Flags:" for the others.
func flagsHeading(c *cobra.Command) string {
	if c.Flags().Lookup(config.ConfigFlag) != nil {
		return config.FlagsHeading
	}
	return "Flags:"
}

// Execute runs the kipimo command with args and returns its error; main prints
// it and chooses the exit code.
func Execute(ctx context.Context, args []string) error {
	root := NewRoot(os.Stdout, os.Stderr)
	if err := checkDashes(root, args); err != nil {
		return err
	}
	root.SetArgs(args)
	return root.ExecuteContext(ctx)
}

// checkDashes rejects a long flag given with one dash (-http for --http)
// before cobra reads it as a group of one-letter flags, "-h" among them,
// and prints help instead of an error: the daemons' rule (config.CheckDashes).
func checkDashes(root *cobra.Command, args []string) error {
	cmd, rest, err := root.Find(args)
	if err != nil || cmd == nil {
		return nil // cobra reports unknown commands itself
	}
	fs := pflag.NewFlagSet(cmd.CommandPath(), pflag.ContinueOnError)
	fs.AddFlagSet(cmd.Flags())
	fs.AddFlagSet(cmd.InheritedFlags())
	return config.CheckDashes(fs, rest)
}

func setupLogging(w io.Writer, level string) error {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil {
		return err
	}
	zerolog.SetGlobalLevel(lvl)
	return nil
}
