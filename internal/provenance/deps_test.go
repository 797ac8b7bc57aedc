package provenance_test

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestRecordsKnowNoTransport checks that the records, the stores and the
// summary writer build without any NATS package: the transport lives in
// provstream and natsx only.
func TestRecordsKnowNoTransport(t *testing.T) {
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := exec.LookPath(gobin); err != nil {
		if gobin, err = exec.LookPath("go"); err != nil {
			t.Skip("no go command to list dependencies with")
		}
	}
	pkgs := []string{
		"github.com/kipimo-hpc/kipimo/internal/provenance",
		"github.com/kipimo-hpc/kipimo/internal/provenance/docblock",
		"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore",
		"github.com/kipimo-hpc/kipimo/internal/provenance/mongostore",
		"github.com/kipimo-hpc/kipimo/internal/tauexport",
	}
	for _, pkg := range pkgs {
		t.Run(filepath.Base(pkg), func(t *testing.T) {
			out, err := exec.Command(gobin, "list", "-deps", pkg).CombinedOutput()
			if err != nil {
				t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
			}
			deps := strings.Fields(string(out))
			if len(deps) < 10 || deps[len(deps)-1] != pkg {
				t.Fatalf("go list -deps %s listed %d packages ending in %q: not a dependency list", pkg, len(deps), deps[len(deps)-1])
			}
			for _, d := range deps {
				if strings.Contains(d, "nats-io") || strings.HasSuffix(d, "/internal/natsx") {
					t.Errorf("%s depends on %s", pkg, d)
				}
			}
		})
	}
}
