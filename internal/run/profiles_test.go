package run

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/hatchetread"
	"github.com/kipimo-hpc/kipimo/internal/taudb"
	"github.com/kipimo-hpc/kipimo/internal/taudb/pgtest"
)

// Every profile file of a run satisfies what Hatchet's TAU reader needs: the
// thread's one root first, every call path from that root with each prefix
// a line of its own, and no function only on a flat line (Hatchet would drop
// it silently).
func TestProfilesReadAsHatchetReadsThem(t *testing.T) {
	tests := []struct {
		name  string
		gpu   bool
		taudb bool // also through a TAUdb trial and back (kipimo taudb export)
	}{
		{"default run", false, false},
		{"GPU run", true, false},
		{"GPU run through TAUdb", true, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := smallRun(t)
			cfg.Workload.GPU = tc.gpu
			if tc.taudb {
				cfg.TaudbDSN = pgtest.Isolated(t)
			}
			_, sum := execute(t, cfg, nil, nil)
			dir := sum.ProfilesDir
			if tc.taudb {
				// What kipimo taudb export writes: the trial as stored.
				ctx := context.Background()
				s, err := taudb.Open(ctx, cfg.TaudbDSN)
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				tr, err := s.LoadTrial(ctx, int(sum.TaudbTrial))
				if err != nil {
					t.Fatal(err)
				}
				dir = t.TempDir()
				if err := taudb.WriteDir(dir, tr); err != nil {
					t.Fatal(err)
				}
			}
			g, err := hatchetread.Read(dir)
			if err != nil {
				t.Fatal(err)
			}
			if len(g.Unread) > 0 {
				t.Errorf("functions Hatchet would not read: %v", g.Unread)
			}
			files, _ := filepath.Glob(filepath.Join(dir, "profile.*"))
			// One root per thread: every file's root is a root of the tree,
			// and each node's path starts at one.
			for _, f := range files {
				b, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				lines := strings.Split(string(b), "\n")
				root := strings.SplitN(lines[2], `"`, 3)[1]
				for _, l := range lines[3:] {
					if strings.HasPrefix(l, `"`) && strings.Contains(l, "=>") && !strings.HasPrefix(l, `"`+root+" => ") {
						t.Errorf("%s: %q does not start at the thread's root %q", filepath.Base(f), l, root)
						break
					}
				}
			}
			if testing.Verbose() {
				tree := g.Tree()
				if len(tree) > 3000 {
					tree = tree[:3000]
				}
				t.Logf("%s: the tree as Hatchet's rules read it:\n%s", tc.name, tree)
			}
		})
	}
}
