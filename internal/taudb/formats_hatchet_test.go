package taudb

import (
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/hatchetread"
)

// TestCaliperExportReadsInHatchet writes the lulesh Caliper trial as TAU
// profiles and reads them by Hatchet's TAU-reader rules: Hatchet must see
// the Caliper call tree (every region path a node, main the root) with each
// path's exclusive and inclusive time as the file scan gives them, which is
// what Hatchet's Caliper reader shows as "time" and "time (inc)".
func TestCaliperExportReadsInHatchet(t *testing.T) {
	s := scanLulesh(t)
	tr := loadFixture(t, "caliper/lulesh-annotation-profile.cali", "")
	dir := t.TempDir()
	if err := WriteDir(dir, tr); err != nil {
		t.Fatal(err)
	}
	g, err := hatchetread.Read(dir)
	if err != nil {
		t.Fatalf("Hatchet's rules refuse the exported Caliper profile: %v", err)
	}
	if len(g.Roots) != 1 || strings.Join(g.Roots[0].Path, "/") != "main" {
		t.Fatalf("roots %d (%v), want main alone", len(g.Roots), g.Roots)
	}
	if len(g.Nodes) != len(s.paths) {
		t.Errorf("Hatchet sees %d nodes, the file has %d region paths", len(g.Nodes), len(s.paths))
	}
	for _, p := range s.paths {
		key := strings.ReplaceAll(strings.Join(p, "=>"), " ", "")
		n := g.Nodes[key]
		if n == nil {
			t.Errorf("path %v is not a Hatchet node", p)
			continue
		}
		key = strings.Join(p, " => ")
		var incl float64
		for k, v := range s.sum {
			if k == key || strings.HasPrefix(k, key+" => ") {
				incl += v
			}
		}
		want := s.sum[key] * 1e6
		r := n.Rows[[2]int{0, 0}]
		if !writeClose(r.Exclusive, want) || !writeClose(r.Inclusive, incl*1e6) || r.Calls != s.count[key] {
			t.Errorf("%v: Hatchet time %v, time (inc) %v, calls %v; file %v, %v, count %v", p, r.Exclusive, r.Inclusive, r.Calls, want, incl*1e6, s.count[key])
		}
	}
}
