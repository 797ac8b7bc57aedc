package config

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func newFlags() *pflag.FlagSet {
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	AddConfigFlag(fs)
	fs.String("nats", "nats://127.0.0.1:4222", "")
	fs.String("run", "default", "")
	fs.Int("window", 5, "")
	fs.StringSlice("ignore", nil, "")
	return fs
}

func TestPrecedence(t *testing.T) {
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "kipimo.yaml")
	if err := os.WriteFile(cfgFile, []byte("nats: nats://file:4222\nrun: fromfile\nwindow: 7\nignore: [a, b]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		args   []string
		env    map[string]string
		nats   string
		run    string
		window string
		ignore string
	}{
		{"defaults", nil, nil, "nats://127.0.0.1:4222", "default", "5", "[]"},
		{"file", []string{"--config", cfgFile}, nil, "nats://file:4222", "fromfile", "7", "[a,b]"},
		{"env beats file", []string{"--config", cfgFile}, map[string]string{"KIPIMO_RUN": "fromenv"}, "nats://file:4222", "fromenv", "7", "[a,b]"},
		{"flag beats env", []string{"--config", cfgFile, "--run", "fromflag"}, map[string]string{"KIPIMO_RUN": "fromenv"}, "nats://file:4222", "fromflag", "7", "[a,b]"},
		{"config from env", nil, map[string]string{"KIPIMO_CONFIG": cfgFile, "KIPIMO_WINDOW": "9"}, "nats://file:4222", "fromfile", "9", "[a,b]"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fs := newFlags()
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			lookup := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
			if err := Apply(fs, lookup); err != nil {
				t.Fatal(err)
			}
			for flag, want := range map[string]string{"nats": tc.nats, "run": tc.run, "window": tc.window, "ignore": tc.ignore} {
				if got := fs.Lookup(flag).Value.String(); got != want {
					t.Errorf("%s = %q, want %q", flag, got, want)
				}
			}
		})
	}
}

func TestErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"unknown key", []string{"--config", write("u.yaml", "nats: x\nwindw: 3\n")}, nil, `unknown key "windw"`},
		{"bad value in file", []string{"--config", write("b.yaml", "window: many\n")}, nil, `key "window"`},
		{"not a mapping", []string{"--config", write("l.yaml", "- a\n- b\n")}, nil, "expected a mapping"},
		{"duplicate key", []string{"--config", write("d.yaml", "run: a\nrun: b\n")}, nil, "given twice"},
		{"missing file", []string{"--config", filepath.Join(dir, "none.yaml")}, nil, "read config"},
		{"bad env", nil, map[string]string{"KIPIMO_WINDOW": "x"}, "KIPIMO_WINDOW"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fs := newFlags()
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			lookup := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
			err := Apply(fs, lookup)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestEnvName(t *testing.T) {
	if got := EnvName("token-file"); got != "KIPIMO_TOKEN_FILE" {
		t.Fatal(got)
	}
}

func TestApplyStd(t *testing.T) {
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "k.yaml")
	if err := os.WriteFile(cfgFile, []byte("run: fromfile\nhttp: 127.0.0.1:9\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	AddConfigFlagStd(fs)
	run := fs.String("run", "default", "")
	httpAddr := fs.String("http", "127.0.0.1:0", "")
	nats := fs.String("nats", "", "")
	if err := fs.Parse([]string{"-config", cfgFile, "-http", "127.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"KIPIMO_NATS": "nats://h:4222", "KIPIMO_RUN": "fromenv"}
	if err := ApplyStd(fs, func(k string) (string, bool) { v, ok := env[k]; return v, ok }); err != nil {
		t.Fatal(err)
	}
	if *run != "fromenv" || *httpAddr != "127.0.0.1:1" || *nats != "nats://h:4222" {
		t.Fatalf("run %q http %q nats %q", *run, *httpAddr, *nats)
	}
}
