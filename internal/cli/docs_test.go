package cli

import (
	"bytes"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra/doc"
)

var updateDocs = flag.Bool("update-docs", false, "rewrite docs/cli from the commands' help")

// TestCLIReferenceUpToDate keeps docs/cli identical to what the commands'
// own help generates: run `go test ./internal/cli -run CLIReference -update-docs`
// after changing a command or flag.
func TestCLIReferenceUpToDate(t *testing.T) {
	root := NewRoot(io.Discard, io.Discard)
	root.DisableAutoGenTag = true
	gen := t.TempDir()
	if err := doc.GenMarkdownTree(root, gen); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join("..", "..", "docs", "cli")
	if *updateDocs {
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	generated, err := filepath.Glob(filepath.Join(gen, "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range generated {
		want, err := os.ReadFile(g)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(g)
		if *updateDocs {
			if err := os.WriteFile(filepath.Join(dir, name), want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Errorf("docs/cli/%s is missing; run go test ./internal/cli -run CLIReference -update-docs", name)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("docs/cli/%s differs from the command's help; run go test ./internal/cli -run CLIReference -update-docs", name)
		}
	}
	existing, _ := filepath.Glob(filepath.Join(dir, "*.md"))
	if !*updateDocs && len(existing) != len(generated) {
		t.Errorf("docs/cli has %d files, the commands generate %d; run with -update-docs", len(existing), len(generated))
	}
}

// The LAMMPS commands the README and the quickstart give leave nothing in
// the checkout: LAMMPS writes log.lammps into the current directory unless
// told -log.
func TestDocsLAMMPSCommandsWriteNoLog(t *testing.T) {
	for _, doc := range []string{"../../README.md", "../../docs/quickstart.md"} {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, line := range strings.Split(string(b), "\n") {
			fields := strings.Fields(line)
			for i, f := range fields {
				if f != "lmp" || i == 0 || fields[i-1] != "2" {
					continue // "mpirun -np 2 lmp ...": the command, not prose
				}
				n++
				if !strings.Contains(line, " -log ") {
					t.Errorf("%s: %q writes log.lammps into the current directory: add -log none", doc, strings.TrimSpace(line))
				}
			}
		}
		if n == 0 {
			t.Errorf("%s: no LAMMPS command found", doc)
		}
	}
}
