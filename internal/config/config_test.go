package config

import (
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

func TestCheckDashes(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string // "" for no error
	}{
		{"double dashes", []string{"--nats", "nats://h:4222", "--window=3"}, ""},
		{"one dash", []string{"-nats", "nats://h:4222"}, "use --nats"},
		{"one dash with value", []string{"--run", "r", "-window=3"}, "use --window=3"},
		{"one dash help", []string{"-help"}, "use --help"},
		{"unknown long flag", []string{"-http", "x"}, "flags take two dashes, and t has no flag --http"},
		{"value that starts with a dash", []string{"--run", "-nats"}, ""},
		{"after the end of flags", []string{"--", "-nats"}, ""},
		{"shorthand", []string{"-h"}, ""},
		{"defined shorthand group", []string{"-vv"}, ""},
		{"bool flag takes no next word", []string{"--debug", "-window", "3"}, "use --window"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fs := newFlags()
			fs.CountP("verbose", "v", "")
			fs.Bool("debug", false, "")
			err := CheckDashes(fs, tc.args)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("error %v, want none", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestParse(t *testing.T) {
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "k.yaml")
	if err := os.WriteFile(cfgFile, []byte("run: fromfile\nwindow: 7\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		args    []string
		env     map[string]string
		run     string
		window  string
		wantErr string
	}{
		{"flags env and file", []string{"--config", cfgFile, "--window", "8"}, map[string]string{"KIPIMO_RUN": "fromenv"}, "fromenv", "8", ""},
		{"one dash rejected before parsing", []string{"-run", "x"}, nil, "", "", "use --run"},
		{"help", []string{"--help"}, nil, "", "", pflag.ErrHelp.Error()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fs := newFlags()
			var out strings.Builder
			fs.SetOutput(&out)
			err := Parse(fs, tc.args, func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := fs.Lookup("run").Value.String(); got != tc.run {
				t.Errorf("run = %q, want %q", got, tc.run)
			}
			if got := fs.Lookup("window").Value.String(); got != tc.window {
				t.Errorf("window = %q, want %q", got, tc.window)
			}
		})
	}
}

func TestSetUsage(t *testing.T) {
	fs := newFlags()
	var out strings.Builder
	fs.SetOutput(&out)
	SetUsage(fs, &out, "Usage: t [flags]\n\nDoes things.\n")
	if err := fs.Parse([]string{"--help"}); err != pflag.ErrHelp {
		t.Fatalf("Parse(--help) = %v, want pflag.ErrHelp", err)
	}
	want := "Usage: t [flags]\n\nDoes things.\n\n" + FlagsHeading + "\n      --config string"
	if !strings.HasPrefix(out.String(), want) {
		t.Errorf("help:\n%s\nwant it to start with:\n%s", out.String(), want)
	}
}

// TestReadSecret: a secret file's contents without surrounding whitespace;
// nothing for no file; an error naming the file, never its contents, for a
// file that is missing or holds only whitespace.
func TestReadSecret(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name    string
		path    string
		want    string
		wantErr string
	}{
		{name: "no path", path: "", want: ""},
		{name: "trailing newline", path: write("a", "s3cret\n"), want: "s3cret"},
		{name: "CRLF and spaces", path: write("b", "  s3cret \r\n"), want: "s3cret"},
		{name: "missing", path: filepath.Join(dir, "none"), wantErr: "none"},
		{name: "empty", path: write("empty", ""), wantErr: "empty is empty"},
		{name: "whitespace only", path: write("blank", "\n \t\n"), wantErr: "blank is empty"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ReadSecret(tc.path)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %q, %v; want an error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}
