package provdb

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/kipimo-hpc/kipimo/internal/config"
)

// TestParseArgs checks provdb's settings against internal/config's
// convention: flag > KIPIMO_<FLAG> > --config YAML key > default, strict
// config keys, and long flags with two dashes only.
func TestParseArgs(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cfgFile := write("provdb.yaml", "run: fromfile\nstore: /data/file.db\nhttp: 127.0.0.1:9001\nack-wait: 2m\n")
	defaults := Config{
		NATS: "nats://127.0.0.1:4222", Store: "./kipimo-prov.db", HTTPAddr: "127.0.0.1:8081", Durable: "provdb",
		Fetch: 16, FetchWait: time.Second, AckWait: 10 * time.Second, RetryDelay: 2 * time.Second,
	}
	fromFile := defaults
	fromFile.Store, fromFile.Run, fromFile.HTTPAddr, fromFile.AckWait = "/data/file.db", "fromfile", "127.0.0.1:9001", 2*time.Minute
	with := func(c Config, f func(*Config)) Config { f(&c); return c }
	cases := []struct {
		name    string
		args    []string
		env     map[string]string
		want    Config
		level   string
		wantErr string
	}{
		{name: "defaults", want: defaults, level: "info"},
		{name: "config file", args: []string{"--config", cfgFile}, want: fromFile, level: "info"},
		{name: "env beats config file", args: []string{"--config", cfgFile}, env: map[string]string{"KIPIMO_STORE": "mongodb://m:27017/k", "KIPIMO_RUN": "fromenv"},
			want: with(fromFile, func(c *Config) { c.Store, c.Run = "mongodb://m:27017/k", "fromenv" }), level: "info"},
		{name: "flag beats env", args: []string{"--config", cfgFile, "--run", "fromflag", "--http="}, env: map[string]string{"KIPIMO_RUN": "fromenv", "KIPIMO_HTTP": "127.0.0.1:1"},
			want: with(fromFile, func(c *Config) { c.Run, c.HTTPAddr = "fromflag", "" }), level: "info"},
		{name: "config file from env", env: map[string]string{"KIPIMO_CONFIG": cfgFile, "KIPIMO_ALLOW_ORIGIN": "http://d", "KIPIMO_TOKEN_FILE": "/run/secrets/t"},
			want: with(fromFile, func(c *Config) { c.AllowOrigin, c.TokenFile = "http://d", "/run/secrets/t" }), level: "info"},
		{name: "log level from env", env: map[string]string{"KIPIMO_LOG_LEVEL": "warn"}, want: defaults, level: "warn"},
		{name: "durable flag", args: []string{"--durable", "second"}, want: with(defaults, func(c *Config) { c.Durable = "second" }), level: "info"},
		{name: "unknown config key", args: []string{"--config", write("typo.yaml", "run: r\nstor: x\n")}, wantErr: `unknown key "stor"`},
		{name: "config key for another binary", args: []string{"--config", write("ad.yaml", "ranks: 0-3\n")}, wantErr: `unknown key "ranks"`},
		{name: "bad env value", env: map[string]string{"KIPIMO_ACK_WAIT": "soon"}, wantErr: "KIPIMO_ACK_WAIT"},
		{name: "single-dash flag", args: []string{"-http", "127.0.0.1:1"}, wantErr: "use --http"},
		{name: "single-dash flag with value", args: []string{"-run=r"}, wantErr: "use --run=r"},
		{name: "unknown flag", args: []string{"--shards", "2"}, wantErr: "unknown flag: --shards"},
		{name: "positional", args: []string{"--run", "r", "extra"}, wantErr: "no arguments"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			got, proc, err := parseArgs(tc.args, func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }, &stderr)
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
			if got != tc.want || level != tc.level {
				t.Errorf("options\n got %+v %q\nwant %+v %q", got, level, tc.want, tc.level)
			}
		})
	}
}

// TestMainHelp: --help prints the shared convention line and every flag with
// two dashes, and returns pflag.ErrHelp (cmd/provdb exits 0 on it).
func TestMainHelp(t *testing.T) {
	var stderr bytes.Buffer
	_, _, err := parseArgs([]string{"--help"}, func(string) (string, bool) { return "", false }, &stderr)
	if !errors.Is(err, pflag.ErrHelp) {
		t.Fatalf("error %v, want pflag.ErrHelp", err)
	}
	help := stderr.String()
	for _, want := range []string{"Usage: provdb --run ID [flags]", config.FlagsHeading, "--config string", "--http string", "--store string", "--ack-wait duration", "--log-level string"} {
		if !strings.Contains(help, want) {
			t.Errorf("help lacks %q:\n%s", want, help)
		}
	}
}

// TestConfigValidate: the default configuration with a run id is valid, and
// each invalid setting is refused with an error naming its flag (or field,
// for settings without one). Validate changes nothing.
func TestConfigValidate(t *testing.T) {
	valid := DefaultConfig()
	valid.Run = "r"
	with := func(f func(c *Config)) Config { c := valid; f(&c); return c }
	tests := []struct {
		name string
		cfg  Config
		want string // "" when valid, else a substring of the error
	}{
		{"default with a run", valid, ""},
		{"no query API", with(func(c *Config) { c.HTTPAddr = "" }), ""},
		{"mongodb store", with(func(c *Config) { c.Store = "mongodb://m:27017/kipimo" }), ""},
		{"any origin", with(func(c *Config) { c.AllowOrigin = "*" }), ""},
		{"one origin", with(func(c *Config) { c.AllowOrigin = "http://dash:8080" }), ""},
		{"embedded: no nats, no store", with(func(c *Config) { c.NATS, c.Store = "", "" }), ""},
		{"no run", with(func(c *Config) { c.Run = "" }), "--run is required"},
		{"dotted run", with(func(c *Config) { c.Run = "a.b" }), "--run: run id"},
		{"bad nats scheme", with(func(c *Config) { c.NATS = "http://x" }), "--nats"},
		{"bad mongodb uri", with(func(c *Config) { c.Store = "mongodb://m:badport" }), "--store"},
		{"http without port", with(func(c *Config) { c.HTTPAddr = "localhost" }), "--http"},
		{"origin with a path", with(func(c *Config) { c.AllowOrigin = "http://dash:8080/page" }), "--allow-origin"},
		{"origin without scheme", with(func(c *Config) { c.AllowOrigin = "dash:8080" }), "--allow-origin"},
		{"empty durable", with(func(c *Config) { c.Durable = "" }), "--durable"},
		{"dotted durable", with(func(c *Config) { c.Durable = "a.b" }), `--durable "a.b"`},
		{"zero fetch", with(func(c *Config) { c.Fetch = 0 }), "Fetch 0"},
		{"zero fetch wait", with(func(c *Config) { c.FetchWait = 0 }), "FetchWait"},
		{"zero ack wait", with(func(c *Config) { c.AckWait = 0 }), "--ack-wait"},
		{"negative retry delay", with(func(c *Config) { c.RetryDelay = -time.Second }), "RetryDelay"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.cfg
			err := tc.cfg.Validate()
			if tc.cfg != before {
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

// TestWithDefaults: a Service built from a literal with only a run id gets
// DefaultConfig's consumer settings, and keeps those given.
func TestWithDefaults(t *testing.T) {
	got := Config{Run: "r", Fetch: 4}.withDefaults()
	want := Config{Run: "r", Durable: "provdb", Fetch: 4, FetchWait: time.Second, AckWait: 10 * time.Second, RetryDelay: 2 * time.Second}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if err := got.Validate(); err != nil {
		t.Errorf("filled config: %v", err)
	}
}
