package caliper

import (
	"bufio"
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/replay/steps"
)

func collect(t testing.TB, cfg steps.Config, read func(*steps.Builder) error) ([]frame.Frame, steps.Stats, error) {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var out []frame.Frame
	b := steps.New(cfg, func(f *frame.Frame) error {
		c := *f
		c.Funcs = append([]frame.Name(nil), f.Funcs...)
		c.Metadata = append([]frame.Meta(nil), f.Metadata...)
		c.Events = append([]frame.FuncEvent(nil), f.Events...)
		c.Counters = append([]frame.Name(nil), f.Counters...)
		c.CounterEvents = append([]frame.CounterEvent(nil), f.CounterEvents...)
		out = append(out, c)
		return nil
	})
	err := read(b)
	return out, b.Stats(), err
}

// closedIn counts, with regular expressions and counters only, the regions a
// trace closes: snapshots referencing an event.end#A node, plus event.set#A
// snapshots while a region of A is open.
func closedIn(t *testing.T, path string) int {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	attrName := map[string]string{}
	nodeAttr := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^__rec=node,id=(\d+),attr=(\d+),data=([^,\n]*)`).FindAllStringSubmatch(string(data), -1) {
		if m[2] == "8" {
			attrName[m[1]] = m[3]
		}
		nodeAttr[m[1]] = m[2]
	}
	open := map[string]int{}
	closed := 0
	for _, m := range regexp.MustCompile(`(?m)^__rec=ctx,ref=([\d=]+)`).FindAllStringSubmatch(string(data), -1) {
		for _, ref := range strings.Split(m[1], "=") {
			a := attrName[nodeAttr[ref]]
			switch {
			case strings.HasPrefix(a, "event.begin#"):
				open[a[len("event.begin#"):]]++
			case strings.HasPrefix(a, "event.end#"):
				if x := a[len("event.end#"):]; open[x] > 0 {
					open[x]--
					closed++
				}
			case strings.HasPrefix(a, "event.set#"):
				if x := a[len("event.set#"):]; open[x] > 0 {
					closed++
				} else {
					open[x]++
				}
			}
		}
	}
	return closed
}

func TestFixture(t *testing.T) {
	files, _ := filepath.Glob("testdata/*.cali")
	if len(files) != 1 {
		t.Fatalf("fixtures: %v", files)
	}
	want := closedIn(t, files[0])
	frames, st, err := collect(t, steps.Config{}, func(b *steps.Builder) error {
		return Read(context.Background(), files, b)
	})
	if err != nil {
		t.Fatal(err)
	}
	if st.Executions != want {
		t.Errorf("executions = %d, regions closed in the file = %d", st.Executions, want)
	}
	names := map[string]bool{}
	meta := map[string]string{}
	var last uint64
	for _, f := range frames {
		for _, n := range f.Funcs {
			names[n.Name] = true
		}
		for _, m := range f.Metadata {
			meta[m.Key] = m.Value
		}
		for _, e := range f.Events {
			if e.TS < last {
				t.Errorf("time goes back: %d after %d", e.TS, last)
			}
			last = e.TS
		}
	}
	for _, n := range []string{"main=init", "main=body", "main=loop", "factorial=comp", "iteration=0"} {
		if !names[n] {
			t.Errorf("region %q missing from %v", n, names)
		}
	}
	if meta["cali.caliper.version"] != "1.5.dev" {
		t.Errorf("context metadata %v lacks cali.caliper.version=1.5.dev", meta)
	}
	// The first region (main=init) lasts its recorded inclusive duration.
	if e := frames[0].Events; len(e) < 2 || e[1].Kind != frame.Exit || e[1].TS-e[0].TS != 1813 {
		t.Errorf("first events %+v, want main=init lasting 1813 µs", e[:2])
	}
}

func TestTruncatedAndMalformed(t *testing.T) {
	files, _ := filepath.Glob("testdata/*.cali")
	data, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	cut := string(data[:len(data)*3/4])
	_, _, err = collect(t, steps.Config{}, func(b *steps.Builder) error {
		return ReadFile(context.Background(), strings.NewReader(cut), "cut.cali", 0, b)
	})
	if !errors.Is(err, steps.ErrStopped) || !strings.Contains(err.Error(), "cut.cali:") || !strings.Contains(err.Error(), "truncated") {
		t.Errorf("truncated: err = %v", err)
	}
	lines := 0
	for sc := bufio.NewScanner(strings.NewReader(cut)); sc.Scan(); {
		lines++
	}
	if !strings.Contains(err.Error(), "cut.cali:"+strconv.Itoa(lines)+" ") {
		t.Errorf("truncated: err = %v, want line %d", err, lines)
	}
	cases := []struct{ name, text, want string }{
		{"undefined node", "__rec=ctx,ref=99\n", "undefined node 99"},
		{"undefined attr", "__rec=node,id=20,attr=77,data=x\n__rec=ctx,ref=20\n", "attribute 77 is not defined"},
		{"bad id", "__rec=node,id=x,attr=8,data=a\n", "not a number"},
		{"pairs", "__rec=ctx,attr=8,data=1=2\n", "immediate attributes"},
		{"cycle", "__rec=node,id=20,attr=8,data=a,parent=21\n__rec=node,id=21,attr=8,data=b,parent=20\n__rec=ctx,ref=20\n", "cycle"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := collect(t, steps.Config{}, func(b *steps.Builder) error {
				return ReadFile(context.Background(), strings.NewReader(tc.text), "bad.cali", 0, b)
			})
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "bad.cali:") {
				t.Errorf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestOffsetsRanksThreads: snapshots with time.offset, mpi.rank and thread.id
// give those times, that rank and one thread per thread.id; globals become
// metadata.
func TestOffsetsRanksThreads(t *testing.T) {
	text := `__rec=node,id=20,attr=8,data=event.begin#function,parent=3
__rec=node,id=21,attr=8,data=event.end#function,parent=3
__rec=node,id=22,attr=8,data=time.offset,parent=2
__rec=node,id=23,attr=8,data=mpi.rank,parent=1
__rec=node,id=24,attr=8,data=thread.id,parent=1
__rec=node,id=25,attr=8,data=cluster,parent=3
__rec=node,id=26,attr=25,data=quartz
__rec=globals,ref=26
__rec=node,id=30,attr=20,data=main
__rec=node,id=31,attr=21,data=main
__rec=node,id=32,attr=20,data=solve
__rec=node,id=33,attr=21,data=solve
__rec=ctx,ref=30,attr=22=23=24,data=100=5=1
__rec=ctx,ref=32,attr=22=23=24,data=150=5=2
__rec=ctx,ref=33,attr=22=23=24,data=400=5=2
__rec=ctx,ref=31,attr=22=23=24,data=900=5=1
__rec=node,id=27,attr=8,data=user,parent=3
__rec=node,id=28,attr=27,data=alice
__rec=globals,ref=28
`
	frames, st, err := collect(t, steps.Config{}, func(b *steps.Builder) error {
		b.SetOrigin(0)
		if err := ReadFile(context.Background(), strings.NewReader(text), "t.cali", 9, b); err != nil {
			return err
		}
		return b.Finish()
	})
	if err != nil {
		t.Fatal(err)
	}
	if st.Executions != 2 || st.Threads != 2 || len(frames) != 1 {
		t.Fatalf("stats %+v, %d frames", st, len(frames))
	}
	f := frames[0]
	if f.Rank != 5 {
		t.Errorf("rank %d, want mpi.rank 5", f.Rank)
	}
	want := []frame.FuncEvent{{Tid: 0, Kind: frame.Entry, FID: 0, TS: 100}, {Tid: 1, Kind: frame.Entry, FID: 1, TS: 150}, {Tid: 1, Kind: frame.Exit, FID: 1, TS: 400}, {Tid: 0, Kind: frame.Exit, FID: 0, TS: 900}}
	if len(f.Events) != len(want) {
		t.Fatalf("events %+v", f.Events)
	}
	for i := range want {
		if f.Events[i] != want[i] {
			t.Errorf("event %d = %+v, want %+v", i, f.Events[i], want[i])
		}
	}
	var cluster, user bool
	for _, m := range f.Metadata {
		cluster = cluster || (m.Key == "cluster" && m.Value == "quartz")
		user = user || (m.Key == "user" && m.Value == "alice")
	}
	if !cluster || !user {
		t.Errorf("globals not kept as metadata: %+v", f.Metadata)
	}
}
