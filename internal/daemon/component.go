package daemon

import (
	"context"
	"io"
	"os"

	"github.com/rs/zerolog"
)

// Settings is what a daemon's settings type offers: Validate checks them,
// changing nothing, with errors that name the flag.
type Settings interface {
	Validate() error
}

// Command is one daemon's command, the steps every daemon takes in the
// same order: flags (and KIPIMO_* environment, a --config file) into its
// settings, the process settings (logger, memory limit), Validate, then
// Run until ctx is cancelled or the daemon's work ends.
type Command[S Settings] struct {
	// Parse reads the settings from args, then the environment (lookup,
	// normally os.LookupEnv) and a --config file, as internal/config
	// describes (ParseFlags). It returns pflag.ErrHelp after printing help
	// on stderr.
	Parse func(args []string, lookup func(string) (string, bool), stderr io.Writer) (S, Process, error)
	// Run runs the daemon with valid settings; it connects, builds the
	// daemon's Component and serves it (Serve).
	Run func(ctx context.Context, s S, log zerolog.Logger) error
}

// Main runs the command with args, logging on stderr. It returns
// pflag.ErrHelp after printing help.
func (c Command[S]) Main(ctx context.Context, args []string, stderr io.Writer) error {
	s, proc, err := c.Parse(args, os.LookupEnv, stderr)
	if err != nil {
		return err
	}
	log, err := proc.Setup(stderr)
	if err != nil {
		return err
	}
	if err := s.Validate(); err != nil {
		return err
	}
	return c.Run(ctx, s, log)
}

// Component is the work of a daemon (the ad node, the pserver, provdb):
// started once, then shut down once.
type Component interface {
	Start(ctx context.Context) error
	Shutdown(ctx context.Context) error
}

// Finishing is a Component whose work can end by itself (the ad node, once
// every rank's stream has ended): Done is closed then.
type Finishing interface {
	Done() <-chan struct{}
}

// Serve starts c and serves until ctx is cancelled (SIGINT or SIGTERM in
// Main) or, for a Finishing component, its work has ended; then it shuts c
// down within ShutdownTimeout.
func Serve(ctx context.Context, c Component) error {
	if err := c.Start(ctx); err != nil {
		return err
	}
	var done <-chan struct{}
	if f, ok := c.(Finishing); ok {
		done = f.Done()
	}
	select {
	case <-ctx.Done():
	case <-done:
	}
	sctx, cancel := ShutdownContext(ctx)
	defer cancel()
	return c.Shutdown(sctx)
}

// Funcs is a Component made of two functions: the work of a daemon whose
// Start takes more than a context (the pserver's, its NATS connection).
type Funcs struct {
	StartFunc    func(ctx context.Context) error
	ShutdownFunc func(ctx context.Context) error
}

// Start implements Component.
func (f Funcs) Start(ctx context.Context) error { return f.StartFunc(ctx) }

// Shutdown implements Component.
func (f Funcs) Shutdown(ctx context.Context) error { return f.ShutdownFunc(ctx) }
