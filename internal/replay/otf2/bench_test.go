package otf2

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/replay/steps"
)

// BenchmarkRead reads an archive written by OTF2's writer (8 ranks x 2
// threads, 2000 iterations: about 190,000 event records in 2-chunk event
// files) into frames of 10 ms steps.
func BenchmarkRead(b *testing.B) {
	gen := buildGen(b)
	dir := filepath.Join(b.TempDir(), "archive")
	if out, err := exec.Command(gen, dir, "8", "2", "2000").CombinedOutput(); err != nil {
		b.Fatalf("gen: %v: %s", err, out)
	}
	cfg := steps.Config{Step: 10 * time.Millisecond}
	if err := cfg.Validate(); err != nil {
		b.Fatal(err)
	}
	var st steps.Stats
	b.ResetTimer()
	for range b.N {
		bl := steps.New(cfg, func(*frame.Frame) error { return nil })
		if err := Read(context.Background(), []string{dir}, bl); err != nil {
			b.Fatal(err)
		}
		st = bl.Stats()
	}
	sec := b.Elapsed().Seconds()
	b.ReportMetric(float64(st.InputEvents)*float64(b.N)/sec, "records/s")
	b.ReportMetric(float64(st.Events)*float64(b.N)/sec, "events/s")
}
