package caliper

import (
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/replay/steps"
)

// offsetsNS returns, with regular expressions only, the time.offset.ns value
// of every snapshot record of a .cali file, in file order.
func offsetsNS(t *testing.T, path string) []uint64 {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^__rec=node,id=(\d+),attr=8,data=time\.offset\.ns\b`).FindStringSubmatch(string(data))
	if m == nil {
		t.Fatal("no time.offset.ns attribute")
	}
	var out []uint64
	for _, r := range regexp.MustCompile(`(?m)^__rec=ctx,.*?attr=([\d=]+),data=([\d=]+)$`).FindAllStringSubmatch(string(data), -1) {
		attrs, vals := strings.Split(r[1], "="), strings.Split(r[2], "=")
		for i, a := range attrs {
			if a == m[1] {
				v, err := strconv.ParseUint(vals[i], 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, v)
			}
		}
	}
	return out
}

// TestFieldEventTrace reads a trace written by Caliper 2.15 (its
// cxx-example with the event-trace config; testdata/field, copied from
// ../shared/fixtures/field). Issue item 1: times are in time.offset.ns.
// Issue item 9: the 20 iterations of mainloop are one function.
func TestFieldEventTrace(t *testing.T) {
	const path = "testdata/field/cxx-example_event-trace.cali"
	offs := offsetsNS(t, path)
	// Counted by hand from the file: main, init, mainloop, 20 iterations
	// of mainloop and foo in each: 43 regions, each begun and ended.
	const wantExecs = 43
	if len(offs) != 2*wantExecs {
		t.Fatalf("%d snapshots with time.offset.ns, want %d", len(offs), 2*wantExecs)
	}
	frames, st, err := collect(t, steps.Config{}, func(b *steps.Builder) error {
		return Read(context.Background(), []string{path}, b)
	})
	if err != nil {
		t.Fatal(err)
	}
	if st.Executions != wantExecs || len(st.Losses) != 0 {
		t.Errorf("executions %d, losses %v; want %d and none", st.Executions, st.Losses, wantExecs)
	}
	var ts []uint64
	funcs := map[uint32]string{}
	execs := map[string]int{}
	var iters []uint64
	for _, f := range frames {
		for _, n := range f.Funcs {
			funcs[n.ID] = n.Name
		}
		for _, e := range f.Events {
			ts = append(ts, e.TS)
			if e.Kind == frame.Exit {
				execs[funcs[e.FID]]++
			}
		}
		for _, c := range f.CounterEvents {
			iters = append(iters, c.Value)
		}
	}
	// Every event at its snapshot's offset, ns rounded to µs.
	if len(ts) != len(offs) {
		t.Fatalf("%d events, %d snapshots", len(ts), len(offs))
	}
	for i := range ts {
		if want := (offs[i] + 500) / 1000; ts[i] != want {
			t.Errorf("event %d at %d µs, want %d (time.offset.ns %d)", i, ts[i], want, offs[i])
		}
	}
	want := map[string]int{"main": 1, "init": 1, "mainloop": 1, "iteration#mainloop": 20, "foo": 20}
	if len(execs) != len(want) {
		t.Errorf("functions %v, want %v", execs, want)
	}
	for name, n := range want {
		if execs[name] != n {
			t.Errorf("%s: %d executions, want %d", name, execs[name], n)
		}
	}
	if len(iters) != 20 || iters[0] != 0 || iters[19] != 19 {
		t.Errorf("iteration counter samples %v, want 0..19", iters)
	}
}
