package deploytest

import (
	"bytes"
	"context"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/config"
)

// runProgram runs a binary of ours (or "kipimo <sub>") with args and a clean
// environment and returns its combined output and exit error.
func runProgram(t *testing.T, program string, args ...string) (string, error) {
	t.Helper()
	words := strings.Fields(program)
	path, err := buildBinary(t, words[0])
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, append(words[1:], args...)...)
	cmd.Env = cleanEnv()
	cmd.Dir = t.TempDir()
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err = cmd.Run()
	return out.String(), err
}

// oneDashHelpLine is a flag listed the standard flag package's way (-http).
var oneDashHelpLine = regexp.MustCompile(`(?m)^\s{1,8}-[A-Za-z0-9][A-Za-z0-9_.-]+\s`)

// TestHelpConventions: every binary's --help shows the one settings
// convention of internal/config (flags with two dashes, also KIPIMO_<FLAG>
// variables and --config YAML keys), and exits 0.
func TestHelpConventions(t *testing.T) {
	for _, tc := range []struct {
		name, program string
		want          []string
	}{
		{"detector", "ad", []string{config.FlagsHeading, "--config string"}},
		{"parameter server", "pserver", []string{config.FlagsHeading, "--config string"}},
		{"provenance service", "provdb", []string{config.FlagsHeading, "--config string"}},
		{"kipimo", "kipimo", []string{"KIPIMO_<FLAG>", "--config YAML key", "two dashes"}},
		{"kipimo run", "kipimo run", []string{config.FlagsHeading, "--config string"}},
		{"kipimo exec", "kipimo exec", []string{config.FlagsHeading, "--config string"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			help, err := runProgram(t, tc.program, "--help")
			if err != nil {
				t.Errorf("%s --help: %v", tc.program, err)
			}
			for _, w := range tc.want {
				if !strings.Contains(help, w) {
					t.Errorf("%s --help lacks %q:\n%s", tc.program, w, help)
				}
			}
			if m := oneDashHelpLine.FindString(help); m != "" {
				t.Errorf("%s --help lists a flag with one dash (%q):\n%s", tc.program, strings.TrimSpace(m), help)
			}
		})
	}
}

// TestOneDashFlagsRejected: a long flag given with one dash is an error that
// names its two-dash spelling, in every daemon (pflag alone would read -http
// as -h, help, and exit 0).
func TestOneDashFlagsRejected(t *testing.T) {
	for _, tc := range []struct {
		name, program string
		args          []string
		want          string
	}{
		{"detector", "ad", []string{"-nats", "nats://127.0.0.1:1"}, "use --nats"},
		{"parameter server", "pserver", []string{"-http", "127.0.0.1:0"}, "use --http"},
		{"provenance service", "provdb", []string{"--run", "r", "-http=127.0.0.1:0"}, "use --http=127.0.0.1:0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := runProgram(t, tc.program, tc.args...)
			if err == nil {
				t.Fatalf("%s %v succeeded:\n%s", tc.program, tc.args, out)
			}
			if !strings.Contains(out, tc.want) {
				t.Errorf("%s %v: output lacks %q:\n%s", tc.program, tc.args, tc.want, out)
			}
		})
	}
}
