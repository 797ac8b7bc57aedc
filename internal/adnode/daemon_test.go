package adnode

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/kipimo-hpc/kipimo/internal/config"
)

// TestDaemonConfigValidate: the default configuration with a run id is
// valid, and each invalid setting is refused with an error naming its flag.
// Validate changes nothing.
func TestDaemonConfigValidate(t *testing.T) {
	valid := DefaultDaemonConfig()
	valid.Run = "r"
	with := func(f func(c *DaemonConfig)) DaemonConfig {
		c := valid
		f(&c)
		return c
	}
	tests := []struct {
		name string
		cfg  DaemonConfig
		want string // "" when valid, else a substring of the error
	}{
		{"default with a run", valid, ""},
		{"rank list", with(func(c *DaemonConfig) { c.Ranks = "0-7,9" }), ""},
		{"discovered ranks", with(func(c *DaemonConfig) { c.Ranks = "auto" }), ""},
		{"discovered ranks with durable frames", with(func(c *DaemonConfig) { c.Ranks, c.Frames = "auto", FramesDurable }), "cannot be used with --ranks auto"},
		{"unknown frame transport", with(func(c *DaemonConfig) { c.Frames = "jetstream" }), "--frames"},
		{"checkpoint every 0 steps", with(func(c *DaemonConfig) { c.CheckpointEvery = 0 }), "--checkpoint-every"},
		{"tiny frame stream", with(func(c *DaemonConfig) { c.FrameStream.MaxBytes = 1000 }), "--frame-stream-max-bytes"},
		{"drop on overflow", with(func(c *DaemonConfig) { c.Overflow = "drop" }), ""},
		{"metrics listener", with(func(c *DaemonConfig) { c.MetricsAddr = "127.0.0.1:9464" }), ""},
		{"ignored functions", with(func(c *DaemonConfig) { c.Detector.Ignore = []string{"MPI_Wait"} }), ""},
		{"no run", with(func(c *DaemonConfig) { c.Run = "" }), "--run"},
		{"dotted run", with(func(c *DaemonConfig) { c.Run = "a.b" }), "--run: run id"},
		{"bad nats scheme", with(func(c *DaemonConfig) { c.NATS = "http://x" }), "--nats"},
		{"bad rank list", with(func(c *DaemonConfig) { c.Ranks = "3-1" }), "--ranks"},
		{"empty rank list", with(func(c *DaemonConfig) { c.Ranks = "" }), "--ranks"},
		{"unknown overflow", with(func(c *DaemonConfig) { c.Overflow = "spill" }), `--overflow "spill"`},
		{"zero queue", with(func(c *DaemonConfig) { c.Queue = 0 }), "--queue 0"},
		{"zero pending frames", with(func(c *DaemonConfig) { c.PendingFrames = 0 }), "--pending-frames 0"},
		{"metrics address without port", with(func(c *DaemonConfig) { c.MetricsAddr = "localhost" }), "--metrics-addr"},
		{"negative rank labels", with(func(c *DaemonConfig) { c.RankLabels = -1 }), "--rank-labels"},
		{"zero shards", with(func(c *DaemonConfig) { c.Detector.Shards = 0 }), "--shards 0"},
		{"zero sync wait", with(func(c *DaemonConfig) { c.Detector.SyncWait = 0 }), "--sync-wait"},
		{"zero sync timeout", with(func(c *DaemonConfig) { c.Detector.SyncTimeout = 0 }), "--sync-timeout"},
		{"unknown algorithm", with(func(c *DaemonConfig) { c.Detector.Algorithm = "magic" }), "magic"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.cfg
			before.Detector.Ignore = append([]string(nil), tc.cfg.Detector.Ignore...)
			err := tc.cfg.Validate()
			if !reflect.DeepEqual(tc.cfg, before) {
				t.Errorf("Validate changed the config:\n got %+v\nwant %+v", tc.cfg, before)
			}
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate() = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Validate() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestParseArgs checks ad's daemon settings against internal/config's
// convention (flag > KIPIMO_<FLAG> > --config key > default) and that the
// flags land in the DaemonConfig's fields.
func TestParseArgs(t *testing.T) {
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "ad.yaml")
	if err := os.WriteFile(cfgFile, []byte("run: fromfile\nranks: 0-3\nqueue: 8\nsync-wait: 3s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		check   func(c DaemonConfig, level string, jsonOut bool) bool
		wantErr string
	}{
		{name: "defaults", check: func(c DaemonConfig, level string, jsonOut bool) bool {
			return c.NATS == "nats://127.0.0.1:4222" && c.Run == "" && c.Ranks == "0" && c.Queue == 64 && c.Overflow == "block" &&
				c.PendingFrames == 256 && c.RankLabels == 64 && c.Detector.Shards == 1 && c.Detector.SyncWait == time.Second &&
				c.Detector.SyncTimeout == 2*time.Second && !c.NoPServer && level == "info" && !jsonOut
		}},
		{name: "config file", args: []string{"--config", cfgFile}, check: func(c DaemonConfig, _ string, _ bool) bool {
			return c.Run == "fromfile" && c.Ranks == "0-3" && c.Queue == 8 && c.Detector.SyncWait == 3*time.Second
		}},
		{name: "env beats config file", args: []string{"--config", cfgFile}, env: map[string]string{"KIPIMO_RANKS": "auto", "KIPIMO_NO_PSERVER": "true"},
			check: func(c DaemonConfig, _ string, _ bool) bool {
				return c.Ranks == "auto" && c.NoPServer && c.Run == "fromfile"
			}},
		{name: "flags", args: []string{"--run", "r", "--pid", "2", "--shards", "4", "--overflow", "drop", "--metrics-addr", "127.0.0.1:0", "--json", "--log-level", "warn"},
			check: func(c DaemonConfig, level string, jsonOut bool) bool {
				return c.Run == "r" && c.PID == 2 && c.Detector.Shards == 4 && c.Overflow == "drop" && c.MetricsAddr == "127.0.0.1:0" && jsonOut && level == "warn"
			}},
		{name: "positional", args: []string{"--run", "r", "extra"}, wantErr: "no arguments"},
		{name: "single-dash flag", args: []string{"-nats", "nats://h:4222"}, wantErr: "use --nats"},
		{name: "missing config file", args: []string{"--config", filepath.Join(dir, "none.yaml")}, wantErr: "read config"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			c, proc, jsonOut, err := parseArgs(tc.args, func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }, &stderr)
			level := proc.LogLevel
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(c, level, jsonOut) {
				t.Errorf("settings %+v, level %q, json %v", c, level, jsonOut)
			}
		})
	}
}

// TestMainHelpAndErrors: --help prints the shared convention and returns
// pflag.ErrHelp; invalid settings fail before connecting, naming the flag.
func TestMainHelpAndErrors(t *testing.T) {
	var stderr, stdout bytes.Buffer
	if err := Main(context.Background(), []string{"--help"}, &stdout, &stderr); !errors.Is(err, pflag.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	for _, want := range []string{"Usage: ad --run ID [flags]", config.FlagsHeading, "--config string", "--ranks string", "--log-level string", EndOfStreamHeader} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("help lacks %q", want)
		}
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no run", nil, "--run"},
		{"bad log level", []string{"--run", "r", "--log-level", "loud"}, "--log-level"},
		{"bad ranks", []string{"--run", "r", "--ranks", "x"}, "--ranks"},
		{"bad nats scheme", []string{"--run", "r", "--nats", "http://x"}, "--nats"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			err := Main(context.Background(), tc.args, &out, &errb)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
			// The program's name comes once, from its main ("ad: --run ...").
			if err != nil && strings.Contains(err.Error(), "ad ") {
				t.Errorf("error %q repeats the program's name", err)
			}
			if out.Len() > 0 {
				t.Errorf("stdout %q before serving", out.String())
			}
		})
	}
}
