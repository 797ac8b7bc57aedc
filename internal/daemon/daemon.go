// Package daemon is the shell every Kipimo daemon (ad, pserver, provdb) is
// built in, so that the three read as one program with different parts:
//
//   - settings: a pflag set read by internal/config (flags, KIPIMO_<FLAG>
//     variables, a --config YAML file) into the daemon's Config, which has a
//     DefaultConfig and a Validate that checks without changing anything;
//   - secrets: --token-file and other *-file flags are read with Secret
//     (internal/config.ReadSecret), never given on the command line, and a
//     secret file every user may read is refused (CheckPrivate);
//   - logging: one zerolog.Logger built by NewLogger from --log-level and
//     passed by value to whatever logs; no package uses zerolog's global;
//   - HTTP: one bearer-token rule (Bearer), one JSON answer and error shape
//     (WriteJSON, WriteError), and one listener lifecycle (Listen, Shutdown
//     bounded by ShutdownTimeout);
//   - the command: Main turns SIGINT/SIGTERM into a cancelled context, exits
//     0 after --help and 1 with "<name>: <error>" on failure.
//
// # Bearer tokens
//
// A daemon given a token (--token-file) requires it on every HTTP request
// that reads run data:
//
//   - every daemon accepts "Authorization: Bearer <token>" (the scheme in any
//     case); when the header is present it alone decides;
//   - the dashboard (pserver, kipimo serve) also accepts the token as the
//     query parameter ?token=<token> on GET and HEAD requests, because its
//     page is opened from a link and its event stream (EventSource) cannot
//     set headers; the parameter is removed before the request is handled,
//     so it never reaches a proxied API or a log line of the handler;
//   - the provdb query API takes the header only: its clients are programs
//     (kipimo query, the dashboard's proxy, scripts) that can set headers;
//   - a refused request gets 401, "WWW-Authenticate: Bearer realm=\"kipimo\""
//     and the JSON error body {"error":"missing or wrong bearer token"};
//   - tokens are compared in constant time.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/rs/zerolog"
	"github.com/spf13/pflag"

	"github.com/kipimo-hpc/kipimo/internal/config"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
)

// LogLevels are the values --log-level takes.
const LogLevels = "debug, info, warn, error"

// Process holds the settings of the process rather than of the daemon's
// work, which every daemon takes alike: --log-level and --memory-limit.
type Process struct {
	LogLevel    string
	MemoryLimit string
}

// AddProcessFlags adds --log-level and --memory-limit to fs and returns
// where their values land once fs is parsed.
func AddProcessFlags(fs *pflag.FlagSet) *Process {
	p := &Process{}
	fs.StringVar(&p.LogLevel, "log-level", "info", "log level: "+LogLevels)
	fs.StringVar(&p.MemoryLimit, "memory-limit", "auto", MemoryLimitUsage)
	return p
}

// Setup builds the daemon's logger on w and applies the memory limit,
// logging the limit in force when there is one.
func (p Process) Setup(w io.Writer) (zerolog.Logger, error) {
	log, err := NewLogger(w, p.LogLevel)
	if err != nil {
		return log, err
	}
	lim, err := ApplyMemoryLimit(p.MemoryLimit)
	if err != nil {
		return log, err
	}
	if lim.Bytes > 0 {
		log.Info().Int64("memory_limit_mib", lim.Bytes>>20).Str("from", lim.Source).Msg("soft memory limit")
	}
	return log, nil
}

// NewLogger returns the logger of a daemon: JSON lines with a timestamp on
// w, at level (a --log-level value: LogLevels, or zerolog's trace and
// disabled). The error names the flag.
func NewLogger(w io.Writer, level string) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil || level == "" {
		return zerolog.Nop(), fmt.Errorf("--log-level %q: use %s", level, LogLevels)
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), nil
}

// Secret reads the secret file named by the value path of flag (token-file,
// password-file) through config.ReadSecret: "" when path is empty, an error
// naming the flag and the file when it cannot be read, holds only
// whitespace, or is readable by every user of the machine (its mode gives
// others read access: the error says to chmod 600 it). The error never
// holds the file's contents.
func Secret(flag, path string) (string, error) {
	if path != "" {
		if err := CheckPrivate(path); err != nil {
			return "", fmt.Errorf("--%s: %w", flag, err)
		}
	}
	s, err := config.ReadSecret(path)
	if err != nil {
		return "", fmt.Errorf("--%s: %w", flag, err)
	}
	return s, nil
}

// CheckPrivate refuses a secret file that every user may read (the
// permission bit "others read"): a token anyone on the machine can read
// guards nothing. Its owner and group may read it (a Kubernetes secret
// mounted with defaultMode 0440 and the pod's fsGroup is accepted). A
// file that cannot be examined is left to its reader to report.
func CheckPrivate(path string) error {
	fi, err := os.Stat(path)
	if err != nil || !fi.Mode().IsRegular() {
		return nil
	}
	if perm := fi.Mode().Perm(); perm&0o004 != 0 {
		return fmt.Errorf("secret file %s is readable by every user (mode %04o): run chmod 600 %s (or chmod 640 for its group), then start again", path, perm, path)
	}
	return nil
}

// ParseFlags is the whole settings step of a daemon named name: fs (with
// its usage line intro) is parsed from args and then filled from the
// environment (lookup, normally os.LookupEnv) and a --config file, as
// internal/config describes. Positional arguments are an error: daemons take
// flags only. It returns pflag.ErrHelp after printing help on stderr.
func ParseFlags(fs *pflag.FlagSet, name, intro string, args []string, lookup func(string) (string, bool), stderr io.Writer) error {
	fs.SetOutput(stderr)
	if fs.Lookup(config.ConfigFlag) == nil {
		config.AddConfigFlag(fs)
	}
	config.SetUsage(fs, stderr, intro)
	if err := config.Parse(fs, args, lookup); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q: %s takes no arguments, only flags", fs.Args(), name)
	}
	return nil
}

// Main runs a daemon's command the way every cmd/<daemon> does: run gets
// os.Args[1:] and a context cancelled on SIGINT or SIGTERM; --help
// (pflag.ErrHelp) exits 0, any other error is printed as "<name>: <error>"
// on stderr and exits 1.
func Main(name string, run func(ctx context.Context, args []string) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if code := ExitCode(err); code != 0 {
		fmt.Fprintf(os.Stderr, "%s: %s\n", name, strings.TrimSpace(err.Error()))
		os.Exit(code)
	}
}

// ExitCode is the exit status of a daemon whose run ended with err: 0 for
// nil and for pflag.ErrHelp (help was asked for and printed), 1 otherwise.
func ExitCode(err error) int {
	if err == nil || errors.Is(err, pflag.ErrHelp) {
		return 0
	}
	return 1
}

// CheckRunAndNATS returns the errors of a daemon's --run (required; need
// says what it is for) and --nats (checked only when set), each naming its
// flag.
func CheckRunAndNATS(run, natsURL, need string) []error {
	var errs []error
	if run == "" {
		errs = append(errs, fmt.Errorf("--run is required: %s", need))
	} else if err := natsx.ValidRun(run); err != nil {
		errs = append(errs, fmt.Errorf("--run: %w", err))
	}
	if natsURL != "" {
		if _, err := natsx.CheckURL(natsURL); err != nil {
			errs = append(errs, fmt.Errorf("--nats: %w", err))
		}
	}
	return errs
}
