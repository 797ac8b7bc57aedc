package pserver

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/kipimo-hpc/kipimo/internal/config"
)

func TestRunServesUntilCancelled(t *testing.T) {
	ns, nc := startNATS(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var stderr bytes.Buffer
	go func() {
		done <- Main(ctx, []string{"--nats", ns.ClientURL(), "--run", "cmd", "--http", "", "--log-level", "warn"}, &stderr)
	}()
	g := newGenRun(2, 3, 3, 0, 101)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := nc.Request("kipimo.cmd.ps.sync.0", []byte(`{}`), 200*time.Millisecond); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("pserver never answered")
		}
	}
	for _, row := range g.reqs {
		for i := range row {
			doSync(t, nc, "cmd", 0, &row[i])
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Main: %v (%s)", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Main did not return after cancel")
	}
	// A new instance continues from the persisted state.
	s := startServer(t, nc, Config{Run: "cmd"})
	defer s.Shutdown(context.Background())
	want := reference(t, g.all(), DefaultWindow)
	got := state(s)
	compareModels(t, "after Run", want, got)
	compareAggregates(t, "after Run", want, got)
}

func TestRunFlagErrors(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no run", nil, "--run is required"},
		{"bad run", []string{"--run", "a.b"}, "not allowed"},
		{"bad durability", []string{"--run", "a", "--durability", "disk"}, "durability"},
		{"bad shard", []string{"--run", "a", "--shard", "3", "--shards", "2"}, "shard 3"},
		{"empty token file", []string{"--run", "a", "--token-file", empty}, "is empty"},
		{"missing token file", []string{"--run", "a", "--token-file", filepath.Join(dir, "nope")}, "--token-file: read secret"},
		{"bad window", []string{"--run", "a", "--window", "-1"}, "--window -1"},
		{"bad provdb url", []string{"--run", "a", "--provdb-url", "localhost:8081"}, "--provdb-url"},
		{"positional", []string{"--run", "a", "extra"}, "unexpected arguments"},
		{"bad nats", []string{"--run", "a", "--nats", "http://x"}, "scheme"},
		{"bad level", []string{"--run", "a", "--log-level", "loud"}, "--log-level"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			err := Main(context.Background(), append(tc.args, "--http", ""), &stderr)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Main error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// TestParseRunArgs checks pserver's settings against internal/config's
// convention: flag > KIPIMO_<FLAG> > --config YAML key > default, strict
// config keys, and long flags with two dashes only.
func TestParseRunArgs(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cfgFile := write("pserver.yaml", "run: fromfile\nshards: 4\nshard: 2\ndurability: snapshot\nsnapshot-interval: 10s\nhttp: 0.0.0.0:8080\n")
	defaults := Config{
		NATS: "nats://127.0.0.1:4222", HTTPAddr: "127.0.0.1:8080", Shards: 1, Durability: DurabilityWAL, SnapshotInterval: 5 * time.Second,
		SnapshotEvery: 20000, Window: DefaultWindow, MaxRankSeries: 64,
		ProvDBList: "/api/v1/records", ProvDBRecord: "/api/v1/records/anomalies/{pid}/{event_id}",
		SSEBuffer: 16, UpdateEvery: 250 * time.Millisecond, SyncWorkers: 2,
	}
	fromFile := defaults
	fromFile.Run, fromFile.Shards, fromFile.Shard = "fromfile", 4, 2
	fromFile.Durability, fromFile.SnapshotInterval, fromFile.HTTPAddr = DurabilitySnapshot, 10*time.Second, "0.0.0.0:8080"
	with := func(o Config, f func(*Config)) Config { f(&o); return o }
	cases := []struct {
		name    string
		args    []string
		env     map[string]string
		want    Config
		level   string
		wantErr string
	}{
		{name: "defaults", want: defaults},
		{name: "config file", args: []string{"--config", cfgFile}, want: fromFile},
		{name: "env beats config file", args: []string{"--config", cfgFile}, env: map[string]string{"KIPIMO_SHARD": "3", "KIPIMO_PROVDB_URL": "http://p:8081"},
			want: with(fromFile, func(o *Config) { o.Shard, o.ProvDBURL = 3, "http://p:8081" })},
		{name: "flag beats env", args: []string{"--config", cfgFile, "--shard", "1", "--http="}, env: map[string]string{"KIPIMO_SHARD": "3", "KIPIMO_HTTP": "127.0.0.1:1"},
			want: with(fromFile, func(o *Config) { o.Shard, o.HTTPAddr = 1, "" })},
		{name: "config file from env", env: map[string]string{"KIPIMO_CONFIG": cfgFile, "KIPIMO_TOKEN_FILE": "/run/secrets/t"},
			want: with(fromFile, func(o *Config) { o.TokenFile = "/run/secrets/t" })},
		{name: "log level from env", env: map[string]string{"KIPIMO_LOG_LEVEL": "debug"}, want: defaults, level: "debug"},
		{name: "unknown config key", args: []string{"--config", write("typo.yaml", "run: r\nshard-count: 2\n")}, wantErr: `unknown key "shard-count"`},
		{name: "config key for another binary", args: []string{"--config", write("provdb.yaml", "store: x.db\n")}, wantErr: `unknown key "store"`},
		{name: "bad env value", env: map[string]string{"KIPIMO_SHARDS": "many"}, wantErr: "KIPIMO_SHARDS"},
		{name: "single-dash flag", args: []string{"-http", "127.0.0.1:1"}, wantErr: "use --http"},
		{name: "single-dash flag with value", args: []string{"--run", "r", "-nats=nats://h:4222"}, wantErr: "use --nats=nats://h:4222"},
		{name: "unknown flag", args: []string{"--store", "x"}, wantErr: "unknown flag: --store"},
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
			if got != tc.want {
				t.Errorf("options\n got %+v\nwant %+v", got, tc.want)
			}
			if want := cmp.Or(tc.level, "info"); level != want {
				t.Errorf("log level %q, want %q", level, want)
			}
		})
	}
}

// TestRunHelp: --help prints the shared convention line and every flag with
// two dashes, and returns pflag.ErrHelp (cmd/pserver exits 0 on it).
func TestRunHelp(t *testing.T) {
	var stderr bytes.Buffer
	_, _, err := parseArgs([]string{"--help"}, func(string) (string, bool) { return "", false }, &stderr)
	if !errors.Is(err, pflag.ErrHelp) {
		t.Fatalf("error %v, want pflag.ErrHelp", err)
	}
	help := stderr.String()
	for _, want := range []string{"Usage: pserver --run ID [flags]", config.FlagsHeading, "--config string", "--http string", "--provdb-url string", "--snapshot-interval duration"} {
		if !strings.Contains(help, want) {
			t.Errorf("help lacks %q:\n%s", want, help)
		}
	}
}
