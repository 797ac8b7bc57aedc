package instrument

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// BenchmarkHotPath measures what an application pays per recorded event
// pair (entry and exit), through the API and through compiler
// instrumentation, with the collector cutting frames and publishing them to
// a real NATS server meanwhile. The loops are timed in the thread's CPU
// time (the figure holds on a loaded machine too). "disabled" is the same
// instrumented call with the library turned off: the floor of an
// instrumented call;
// "monotonic-clock" reads clock_gettime instead of the invariant TSC. The
// streamed cases raise KIPIMO_SUMMARY_RATE beyond the loop's rate, so every
// call is streamed (the per-call rate accounting still runs);
// "api-summarised" keeps the default rate, so the loop's calls become hot
// leaves and are summarised instead.
func BenchmarkHotPath(b *testing.B) {
	lib := library(b)
	dir := b.TempDir()
	prog := filepath.Join(dir, "hotpath")
	args := append([]string{"-O2"}, strings.Fields(lib.CFlags())...)
	args = append(args, filepath.Join("testdata", "hotpath.c"), "-o", prog)
	args = append(args, strings.Fields(lib.LDFlags())...)
	if out, err := exec.Command("cc", args...).CombinedOutput(); err != nil {
		b.Fatalf("cc: %v\n%s", err, out)
	}
	ns := startNATS(b)
	nc := connect(b, ns)
	if _, err := nc.Subscribe("kipimo.bench.frames.>", func(*nats.Msg) {}); err != nil {
		b.Fatal(err)
	}
	const streamed = "KIPIMO_SUMMARY_RATE=1000000000"
	for _, bc := range []struct {
		name, mode string
		disabled   bool
		summarised bool
		env        []string
	}{
		{"api", "api", false, false, []string{streamed}},
		{"compiler", "compiler", false, false, []string{streamed}},
		{"compiler-disabled", "compiler", true, false, nil},
		{"api-monotonic-clock", "api", false, false, []string{streamed, "KIPIMO_CLOCK=monotonic"}},
		{"api-summarised", "api", false, true, nil},
	} {
		b.Run(bc.name, func(b *testing.B) {
			status := b.TempDir()
			env := lib.Environ(Env{NATSURL: ns.ClientURL(), Run: "bench", StatusDir: status, Period: time.Second}, os.Environ())
			if bc.disabled {
				env = append(env, "KIPIMO_DISABLE=1")
			}
			env = append(env, bc.env...)
			pairs := max(b.N, 200000)
			cmd := exec.Command(prog, bc.mode, fmt.Sprint(pairs))
			cmd.Env = env
			out, err := cmd.Output()
			if err != nil {
				b.Fatalf("hotpath: %v", err)
			}
			var perPair float64
			if _, err := fmt.Sscanf(string(out), "ns_per_pair %f", &perPair); err != nil {
				b.Fatalf("hotpath output %q: %v", out, err)
			}
			if !bc.disabled {
				st, err := ReadStatus(status)
				if err != nil || len(st) != 1 {
					b.Fatalf("status: %v %v", st, err)
				}
				// A dropped event costs less than a recorded one: the figure
				// holds only if none was dropped.
				recorded := st[0].Events/2 + st[0].CallsSummarised
				if st[0].EventsDropped != 0 || recorded < uint64(pairs) || bc.summarised != (st[0].CallsSummarised > 0) {
					b.Fatalf("status %+v: want %d calls recorded (summarised: %v), none dropped", st[0], pairs, bc.summarised)
				}
			}
			b.ReportMetric(perPair, "ns/pair")
			b.ReportMetric(2e9/perPair, "events/s")
			b.ReportMetric(0, "ns/op")
		})
	}
}
