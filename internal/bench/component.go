package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/kipimo-hpc/kipimo/internal/adnode"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provdb"
	"github.com/kipimo-hpc/kipimo/internal/pserver"
)

// ComponentCommand is the hidden kipimo subcommand that runs one component
// in a process of its own: `kipimo component NAME FLAGS...`. `kipimo bench`
// starts the pipeline's components that way to measure each one's memory.
const ComponentCommand = "component"

// Component names, as given to Component.
const (
	ComponentAD      = "ad"
	ComponentPServer = "pserver"
	ComponentProvDB  = "provdb"
	ComponentNATS    = "nats"
)

// ComponentOptions are the component command's own options, given before
// the component's name.
type ComponentOptions struct {
	// PeakRSSFile, when set, receives the component's peak resident set
	// size in KiB, one decimal number, when it ends.
	PeakRSSFile string
}

// ParseComponentArgs splits the component command's arguments,
// "[--peak-rss-file FILE] NAME [FLAGS...]".
func ParseComponentArgs(args []string) (opt ComponentOptions, name string, rest []string, err error) {
	for len(args) > 0 && strings.HasPrefix(args[0], "-") {
		switch {
		case args[0] == "--peak-rss-file" && len(args) > 1:
			opt.PeakRSSFile, args = args[1], args[2:]
		case strings.HasPrefix(args[0], "--peak-rss-file="):
			opt.PeakRSSFile, args = strings.TrimPrefix(args[0], "--peak-rss-file="), args[1:]
		default:
			return opt, "", nil, fmt.Errorf("unknown option %q before the component's name", args[0])
		}
	}
	if len(args) == 0 {
		return opt, "", nil, fmt.Errorf("no component named: want %s, %s, %s or %s", ComponentAD, ComponentPServer, ComponentProvDB, ComponentNATS)
	}
	return opt, args[0], args[1:], nil
}

// Component runs one component of the pipeline until it ends: "ad",
// "pserver" and "provdb" are the daemons of cmd/ad, cmd/pserver and
// cmd/provdb with their own flags; "nats" is an embedded NATS server with
// JetStream (flags --dir, --port) listening on 127.0.0.1 that prints its
// URL on stdout once it accepts clients. Each ends when ctx is cancelled
// (SIGTERM) and, when stdin is not nil, when stdin ends: a parent holds the
// other end of the pipe, so its component stops when it goes away, however
// it went. The goroutine reading stdin stops at its end or with the
// process.
func Component(ctx context.Context, name string, args []string, opt ComponentOptions, stdin io.Reader, stdout, stderr io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if stdin != nil {
		go func() {
			_, _ = io.Copy(io.Discard, stdin)
			cancel()
		}()
	}
	var err error
	switch name {
	case ComponentAD:
		err = adnode.Main(ctx, args, stdout, stderr)
	case ComponentPServer:
		err = pserver.Main(ctx, args, stderr)
	case ComponentProvDB:
		err = provdb.Main(ctx, args, stderr)
	case ComponentNATS:
		err = serveNATS(ctx, args, stdout, stderr)
	default:
		return fmt.Errorf("unknown component %q: want %s, %s, %s or %s", name, ComponentAD, ComponentPServer, ComponentProvDB, ComponentNATS)
	}
	if errors.Is(err, flag.ErrHelp) || errors.Is(err, pflag.ErrHelp) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if opt.PeakRSSFile != "" {
		kib, ok := peakRSSSelfKiB()
		if !ok {
			return errors.New("this system reports no peak RSS")
		}
		if err := os.WriteFile(opt.PeakRSSFile, []byte(strconv.FormatInt(kib, 10)+"\n"), 0o644); err != nil {
			return fmt.Errorf("write peak RSS: %w", err)
		}
	}
	return nil
}

// peakRSSSelfKiB is this process's peak resident set size in KiB. On Linux
// it is VmHWM of /proc/self/status: the peak of this program's own memory.
// getrusage's ru_maxrss is not, as exec keeps the higher of the process's
// previous peak and the new program's, so a child of a large process
// reports at least its parent's peak; it is the fallback elsewhere.
func peakRSSSelfKiB() (int64, bool) {
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
				n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				return n, err == nil && n > 0
			}
		}
	}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil || ru.Maxrss <= 0 {
		return 0, false
	}
	return int64(maxRSSMiB(&ru) * 1024), true
}

// serveNATS runs an embedded NATS server with JetStream on 127.0.0.1 until
// ctx is done.
func serveNATS(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("nats", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", "", "JetStream store directory (required)")
	port := fs.Int("port", -1, "client port on 127.0.0.1 (-1: a free one)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *dir == "" {
		return errors.New("--dir is required")
	}
	cfg := natsx.DefaultServerConfig(*dir)
	cfg.Port = *port
	ns, err := natsx.StartServer(cfg)
	if err != nil {
		return err
	}
	defer ns.Shutdown()
	if _, err := fmt.Fprintln(stdout, ns.ClientURL()); err != nil {
		return fmt.Errorf("print the server's URL: %w", err)
	}
	<-ctx.Done()
	return nil
}
