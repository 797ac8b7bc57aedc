package deploytest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// Binaries are the programs this repository ships, by their cmd/ directory.
var Binaries = []string{"ad", "pserver", "provdb", "kipimo"}

func isBinary(name string) bool {
	for _, b := range Binaries {
		if b == name {
			return true
		}
	}
	return false
}

// repoRoot is the module root, two levels above this package.
func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatalf("find repository root: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root %s has no go.mod: %v", root, err)
	}
	return root
}

var (
	binDirOnce sync.Once
	binDir     string
	binDirErr  error

	buildMu sync.Mutex
	built   = map[string]buildResult{}

	helpMu    sync.Mutex
	helpCache = map[string]helpResult{}
)

type buildResult struct {
	path string
	err  error
}

type helpResult struct {
	flags map[string]bool
	err   error
}

func TestMain(m *testing.M) {
	if dir := os.Getenv(natsServerEnv); dir != "" {
		runNATSServer(dir, os.Getenv(natsPortEnv))
	}
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// buildBinary builds ./cmd/<name> once per test binary and returns its path.
// A command that does not build is an error naming the package and carrying
// the compiler's output.
func buildBinary(t testing.TB, name string) (string, error) {
	t.Helper()
	root := repoRoot(t)
	binDirOnce.Do(func() { binDir, binDirErr = os.MkdirTemp("", "kipimo-deploytest-") })
	if binDirErr != nil {
		return "", fmt.Errorf("make directory for binaries: %w", binDirErr)
	}
	buildMu.Lock()
	defer buildMu.Unlock()
	if r, ok := built[name]; ok {
		return r.path, r.err
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("find the go command to build ./cmd/%s: %w", name, err)
	}
	out := filepath.Join(binDir, name)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goTool, "build", "-o", out, "./cmd/"+name)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		err = fmt.Errorf("build ./cmd/%s (the deployment files run this binary): %w\n%s", name, err, strings.TrimSpace(stderr.String()))
		built[name] = buildResult{err: err}
		return "", err
	}
	built[name] = buildResult{path: out}
	return out, nil
}

// flagLine matches the flag column of pflag/cobra help ("  -h, --help",
// "      --nats string") and of the standard flag package ("  -nats string").
var flagLine = regexp.MustCompile(`^\s{1,8}(?:-[A-Za-z0-9], )?--?([A-Za-z0-9][A-Za-z0-9_.-]*)\b`)

// parseHelpFlags returns the long flag names listed in a --help text.
func parseHelpFlags(help string) map[string]bool {
	flags := map[string]bool{}
	for _, line := range strings.Split(help, "\n") {
		if m := flagLine.FindStringSubmatch(line); m != nil {
			flags[m[1]] = true
		}
	}
	return flags
}

// commandFlags returns the flags the program (a binary, or "kipimo <sub>")
// accepts, as listed by its own --help.
func commandFlags(t testing.TB, program string) (map[string]bool, error) {
	t.Helper()
	helpMu.Lock()
	if r, ok := helpCache[program]; ok {
		helpMu.Unlock()
		return r.flags, r.err
	}
	helpMu.Unlock()
	flags, err := readCommandFlags(t, program)
	helpMu.Lock()
	helpCache[program] = helpResult{flags, err}
	helpMu.Unlock()
	return flags, err
}

func readCommandFlags(t testing.TB, program string) (map[string]bool, error) {
	words := strings.Fields(program)
	if len(words) == 0 || !isBinary(words[0]) {
		return nil, fmt.Errorf("%q is not one of the binaries %v", program, Binaries)
	}
	path, err := buildBinary(t, words[0])
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args := append(append([]string{}, words[1:]...), "--help")
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = cleanEnv()
	cmd.Dir = t.TempDir()
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	runErr := cmd.Run() // help may exit 0 (cobra) or 2 (flag.ErrHelp); the text decides
	text := out.String()
	// cobra prints the parent's help for an unknown subcommand; the usage line
	// of a real one starts with the full command path.
	if len(words) > 1 && !strings.Contains(text, "\n  "+program) {
		return nil, fmt.Errorf("%s has no subcommand %q:\n%s", words[0], strings.Join(words[1:], " "), text)
	}
	flags := parseHelpFlags(text)
	delete(flags, "h")
	if len(flags) == 0 {
		return nil, fmt.Errorf("%s --help listed no flags (exit: %v):\n%s", program, runErr, text)
	}
	return flags, nil
}

// cleanEnv is the environment without KIPIMO_* settings, so that a developer's
// environment cannot change what --help prints.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KIPIMO_") {
			env = append(env, kv)
		}
	}
	return env
}

func sortedKeys(m map[string]bool) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// TestCommandFlags checks the checker on the real binaries: flags every
// daemon documents are found, a made-up flag is not, and an unknown kipimo
// subcommand is an error rather than the root's flags.
func TestCommandFlags(t *testing.T) {
	for _, tc := range []struct {
		name, program string
		has           []string
		wantErr       bool
	}{
		{"detector", "ad", []string{"nats", "run", "ranks"}, false},
		{"parameter server", "pserver", []string{"nats", "run", "http", "shard", "shards", "token-file"}, false},
		{"provenance service", "provdb", []string{"nats", "run", "store", "http", "token-file"}, false},
		{"subcommand with inherited flags", "kipimo gen", []string{"out", "log-level"}, false},
		{"unknown subcommand", "kipimo no-such-command", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			known, err := commandFlags(t, tc.program)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("%s: no error; flags %v", tc.program, sortedKeys(known))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range tc.has {
				if !known[f] {
					t.Errorf("%s: --%s not found in --help (found %v)", tc.program, f, sortedKeys(known))
				}
			}
			if known["surely-not-a-flag"] {
				t.Errorf("%s: a made-up flag was found", tc.program)
			}
		})
	}
}
