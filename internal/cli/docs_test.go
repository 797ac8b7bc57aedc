package cli

import (
	"bytes"
	"flag"
	"io"
	"os"
	"path/filepath"
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
