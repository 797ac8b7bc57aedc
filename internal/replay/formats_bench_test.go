package replay

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/replay/steps"
)

// benchInput is one real trace a reader benchmark reads: files written by
// another tool, kept in the readers' testdata (their MANIFESTs say where
// each came from).
type benchInput struct {
	name   string
	format string
	files  []string
}

func benchInputs(b *testing.B) []benchInput {
	b.Helper()
	glob := func(pattern string) []string {
		m, err := filepath.Glob(pattern)
		if err != nil || len(m) == 0 {
			b.Fatalf("no benchmark input %s", pattern)
		}
		return m
	}
	return []benchInput{
		// TAU 2.x binary trace, 12 ranks of one MPI run, per-node files.
		{"tau", FormatTAU, glob("tautrace/testdata/kanika_phase1/tautrace.*.0.0.trc")},
		// TAU trace of rank 0 of an MPI+OpenMP run with message records.
		{"tau-messages", FormatTAU, glob("tautrace/testdata/hecatoncheir/tautrace.0.0.0.trc")},
		// PyTorch profiler (Kineto) trace of one training rank, gzipped JSON.
		{"chrome", FormatChrome, glob("chrome/testdata/field/hta_mtia_trace_single_rank_mtia_rank_0.json.gz")},
		// A Chrome browser trace (catapult) of one main thread, plain JSON.
		{"chrome-plain", FormatChrome, glob("chrome/testdata/field/catapult_main_thread_has_unclosed_slices.json")},
		// Caliper event traces (.cali) from Caliper's documentation and examples.
		{"caliper", FormatCaliper, glob("caliper/testdata/*.cali")},
		// Score-P OTF2 archive of a 2-rank MPI ping-pong.
		{"otf2", FormatOTF2, glob("otf2/testdata/ping-pong/traces.otf2")},
	}
}

// inputBytes is the size of the files a reader reads (compressed size for
// gzipped inputs; for OTF2 the whole archive directory).
func inputBytes(b *testing.B, in benchInput) int64 {
	b.Helper()
	var n int64
	for _, f := range in.files {
		root := f
		if in.format == FormatOTF2 {
			root = filepath.Dir(f)
		}
		err := filepath.Walk(root, func(_ string, info os.FileInfo, err error) error {
			if err == nil && !info.IsDir() {
				n += info.Size()
			}
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	return n
}

// peakRSSMB reads the process's peak resident set (VmHWM) in MiB; it is
// process-wide, so run one format per process (-bench 'Formats/tau$') for a
// figure of that reader alone.
func peakRSSMB() float64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) >= 2 && string(f[0]) == "VmHWM:" {
			kb, err := strconv.ParseFloat(string(f[1]), 64)
			if err != nil {
				return 0
			}
			return kb / 1024
		}
	}
	return 0
}

// BenchmarkFormats reads real traces of every trace format into frames of
// the default io_step, and reports input records read per second (records/s),
// frame events produced per second (events/s), input bytes per second (MB/s)
// and the process's peak RSS.
func BenchmarkFormats(b *testing.B) {
	for _, in := range benchInputs(b) {
		b.Run(in.name, func(b *testing.B) {
			size := inputBytes(b, in)
			var st Stats
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				src, err := Open(in.format, in.files, steps.Config{})
				if err != nil {
					b.Fatal(err)
				}
				st, err = src.Frames(context.Background(), func(*frame.Frame) error { return nil })
				if err != nil {
					b.Fatal(err)
				}
			}
			sec := b.Elapsed().Seconds()
			b.ReportMetric(float64(st.InputEvents)*float64(b.N)/sec, "records/s")
			b.ReportMetric(float64(st.Events)*float64(b.N)/sec, "events/s")
			b.ReportMetric(float64(size)*float64(b.N)/sec/1e6, "MB/s")
			b.ReportMetric(peakRSSMB(), "peak-RSS-MB")
		})
	}
}
