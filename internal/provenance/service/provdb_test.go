package service

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

// TestParseMainArgs checks provdb's settings against internal/config's
// convention: flag > KIPIMO_<FLAG> > --config YAML key > default, strict
// config keys, and long flags with two dashes only.
func TestParseMainArgs(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cfgFile := write("provdb.yaml", "run: fromfile\nstore: /data/file.db\nhttp: 127.0.0.1:9001\nack-wait: 2m\n")
	cases := []struct {
		name    string
		args    []string
		env     map[string]string
		want    mainOptions
		wantErr string
	}{
		{name: "defaults", want: mainOptions{natsURL: "nats://127.0.0.1:4222", storeSpec: "./kipimo-prov.db", httpAddr: "127.0.0.1:8081", durable: "provdb", ackWait: time.Minute, level: "info"}},
		{name: "config file", args: []string{"--config", cfgFile},
			want: mainOptions{natsURL: "nats://127.0.0.1:4222", storeSpec: "/data/file.db", run: "fromfile", httpAddr: "127.0.0.1:9001", durable: "provdb", ackWait: 2 * time.Minute, level: "info"}},
		{name: "env beats config file", args: []string{"--config", cfgFile}, env: map[string]string{"KIPIMO_STORE": "mongodb://m:27017/k", "KIPIMO_RUN": "fromenv"},
			want: mainOptions{natsURL: "nats://127.0.0.1:4222", storeSpec: "mongodb://m:27017/k", run: "fromenv", httpAddr: "127.0.0.1:9001", durable: "provdb", ackWait: 2 * time.Minute, level: "info"}},
		{name: "flag beats env", args: []string{"--config", cfgFile, "--run", "fromflag", "--http="}, env: map[string]string{"KIPIMO_RUN": "fromenv", "KIPIMO_HTTP": "127.0.0.1:1"},
			want: mainOptions{natsURL: "nats://127.0.0.1:4222", storeSpec: "/data/file.db", run: "fromflag", httpAddr: "", durable: "provdb", ackWait: 2 * time.Minute, level: "info"}},
		{name: "config file from env", env: map[string]string{"KIPIMO_CONFIG": cfgFile, "KIPIMO_ALLOW_ORIGIN": "http://d"},
			want: mainOptions{natsURL: "nats://127.0.0.1:4222", storeSpec: "/data/file.db", run: "fromfile", httpAddr: "127.0.0.1:9001", durable: "provdb", origin: "http://d", ackWait: 2 * time.Minute, level: "info"}},
		{name: "unknown config key", args: []string{"--config", write("typo.yaml", "run: r\nstor: x\n")}, wantErr: `unknown key "stor"`},
		{name: "config key for another binary", args: []string{"--config", write("ad.yaml", "ranks: 0-3\n")}, wantErr: `unknown key "ranks"`},
		{name: "bad env value", env: map[string]string{"KIPIMO_ACK_WAIT": "soon"}, wantErr: "KIPIMO_ACK_WAIT"},
		{name: "single-dash flag", args: []string{"-http", "127.0.0.1:1"}, wantErr: "use --http"},
		{name: "single-dash flag with value", args: []string{"-run=r"}, wantErr: "use --run=r"},
		{name: "unknown flag", args: []string{"--shards", "2"}, wantErr: "unknown flag: --shards"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			got, err := parseMainArgs(tc.args, func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }, &stderr)
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
		})
	}
}

// TestMainHelp: --help prints the shared convention line and every flag with
// two dashes, and returns pflag.ErrHelp (cmd/provdb exits 0 on it).
func TestMainHelp(t *testing.T) {
	var stderr bytes.Buffer
	_, err := parseMainArgs([]string{"--help"}, func(string) (string, bool) { return "", false }, &stderr)
	if !errors.Is(err, pflag.ErrHelp) {
		t.Fatalf("error %v, want pflag.ErrHelp", err)
	}
	help := stderr.String()
	for _, want := range []string{"Usage: provdb --run ID [flags]", config.FlagsHeading, "--config string", "--http string", "--store string", "--ack-wait duration"} {
		if !strings.Contains(help, want) {
			t.Errorf("help lacks %q:\n%s", want, help)
		}
	}
}
