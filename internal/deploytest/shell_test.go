package deploytest

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"
)

// heredoc matches a quoted here-document (<<'NAME' ... NAME): a script the
// batch script writes out and runs elsewhere.
var heredoc = regexp.MustCompile(`<<'([A-Z]+)'\n`)

// shellScripts returns the Slurm script and the scripts it writes for the
// compute nodes, by name.
func shellScripts(t *testing.T, root string) map[string][]byte {
	t.Helper()
	rel := filepath.Join("deploy", "slurm", "kipimo.sbatch")
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatalf("read %s: %v", rel, err)
	}
	out := map[string][]byte{rel: b}
	for _, m := range heredoc.FindAllSubmatchIndex(b, -1) {
		name := string(b[m[2]:m[3]])
		body := b[m[1]:]
		end := bytes.Index(body, []byte("\n"+name+"\n"))
		if end < 0 {
			t.Fatalf("%s: here-document %s has no end line", rel, name)
		}
		out[rel+" (here-document "+name+")"] = body[:end+1]
	}
	if len(out) < 2 {
		t.Fatalf("%s: found no node-agent here-document", rel)
	}
	return out
}

// TestShellSyntax checks the Slurm script and its node agent with bash -n.
func TestShellSyntax(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatalf("bash is needed to check deploy/slurm: %v", err)
	}
	for name, script := range shellScripts(t, repoRoot(t)) {
		t.Run(name, func(t *testing.T) {
			runChecker(t, script, bash, "-n")
		})
	}
}

// TestShellcheck runs shellcheck on the Slurm script and its node agent when
// shellcheck is installed (apt-get install shellcheck).
func TestShellcheck(t *testing.T) {
	sc, err := exec.LookPath("shellcheck")
	if err != nil {
		t.Skip("shellcheck is not installed; install it (apt-get install shellcheck) to lint deploy/slurm")
	}
	for name, script := range shellScripts(t, repoRoot(t)) {
		t.Run(name, func(t *testing.T) {
			runChecker(t, script, sc, "--shell=bash", "--severity=info", "-")
		})
	}
}

func runChecker(t *testing.T, script []byte, prog string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, prog, args...)
	cmd.Stdin = bytes.NewReader(script)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Errorf("%s %v: %v\n%s", filepath.Base(prog), args, err, out.String())
	}
}
