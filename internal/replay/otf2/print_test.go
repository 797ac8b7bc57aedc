package otf2

import (
	"bufio"
	"bytes"
	"context"
	"math"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/replay/steps"
)

// The tests here compare what the reader makes of an archive with what
// otf2-print (Debian's otf2-tools, OTF2's own reader) prints of it.

// pingPong is a Score-P 7.1 (OTF2 2.3) trace of a 2-rank MPI ping-pong, from
// pipit's tests (copied from ../shared/fixtures/traces/otf2).
const pingPong = "testdata/ping-pong/traces.otf2"

// otf2Print returns the path of otf2-print; without it the test is skipped,
// or fails when KIPIMO_REQUIRE_OTF2=1 (CI).
func otf2Print(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("otf2-print")
	if err != nil {
		if os.Getenv("KIPIMO_REQUIRE_OTF2") == "1" {
			t.Fatalf("otf2-print not found and KIPIMO_REQUIRE_OTF2=1: install Debian's otf2-tools")
		}
		t.Skip("otf2-print not found (Debian package otf2-tools)")
	}
	return p
}

type thread struct{ rank, tid uint32 }

type execKey struct {
	th   thread
	name string
}

type msgKey struct {
	th      thread
	kind    frame.CommKind
	partner uint32
	tag     uint32
	bytes   uint64
}

type sampleKey struct {
	th    thread
	name  string
	value uint64
}

// view is what an archive holds, counted the frames' way: executions per
// thread and function, entry times per thread, messages, metric samples.
type view struct {
	entries, exits map[execKey]int
	enterUS        map[thread][]uint64
	msgs           map[msgKey]int
	samples        map[sampleKey]int
	negatives      int // metric values frames cannot hold
	unsupported    int // events frames have no form for
	events         int // event records
}

func newView() *view {
	return &view{entries: map[execKey]int{}, exits: map[execKey]int{}, enterUS: map[thread][]uint64{}, msgs: map[msgKey]int{}, samples: map[sampleKey]int{}}
}

var (
	reClock    = regexp.MustCompile(`^CLOCK_PROPERTIES\s+Ticks per Seconds: (\d+), Global Offset: (\d+),`)
	reGroup    = regexp.MustCompile(`^LOCATION_GROUP\s+(\d+)\s+Name: .*, Creator: (?:UNDEFINED|".*" <(\d+)>)$`)
	reLocation = regexp.MustCompile(`^LOCATION\s+(\d+)\s+Name: .*, Group: ".*" <(\d+)>$`)
	reEvent    = regexp.MustCompile(`^([A-Z_]+)\s+(\d+)\s+(\d+)\s+(.*)$`)
	reRegion   = regexp.MustCompile(`^Region: "(.*)" <\d+>$`)
	reMsg      = regexp.MustCompile(`^(?:Receiver|Sender): \d+ \(".*" <(\d+)>\), Communicator: .*, Tag: (\d+), Length: (\d+)`)
	reValue    = regexp.MustCompile(`\("([^"]*)" <\d+>; (\w+); ([^)]*)\)`)
)

// printed runs otf2-print on an archive and counts what it prints. Locations
// become (rank, thread) by the reader's documented rule: the rank is the
// location group (its creator's, for a group another created), threads are
// numbered in location id order within their rank.
func printed(t *testing.T, anchor string) *view {
	t.Helper()
	bin := otf2Print(t)
	defs, err := exec.Command(bin, "-G", anchor).Output()
	if err != nil {
		t.Fatalf("otf2-print -G %s: %v", anchor, err)
	}
	var res, offset uint64
	creator := map[uint32]uint32{}
	type loc struct {
		id    uint64
		group uint32
	}
	var locs []loc
	for _, line := range strings.Split(string(defs), "\n") {
		if m := reClock.FindStringSubmatch(line); m != nil {
			res, _ = strconv.ParseUint(m[1], 10, 64)
			offset, _ = strconv.ParseUint(m[2], 10, 64)
		}
		if m := reGroup.FindStringSubmatch(line); m != nil && m[2] != "" {
			g, _ := strconv.ParseUint(m[1], 10, 32)
			c, _ := strconv.ParseUint(m[2], 10, 32)
			creator[uint32(g)] = uint32(c)
		}
		if m := reLocation.FindStringSubmatch(line); m != nil {
			id, _ := strconv.ParseUint(m[1], 10, 64)
			g, _ := strconv.ParseUint(m[2], 10, 32)
			locs = append(locs, loc{id, uint32(g)})
		}
	}
	if res == 0 || len(locs) == 0 {
		t.Fatalf("otf2-print -G %s: no clock properties or locations in:\n%.2000s", anchor, defs)
	}
	slices.SortFunc(locs, func(a, b loc) int { return cmpU64(a.id, b.id) })
	where := map[uint64]thread{}
	next := map[uint32]uint32{}
	for _, l := range locs {
		rank := l.group
		if c, ok := creator[rank]; ok {
			rank = c
		}
		where[l.id] = thread{rank, next[rank]}
		next[rank]++
	}
	us := func(ticks uint64) uint64 {
		d := new(big.Int).SetUint64(ticks - min(ticks, offset))
		d.Mul(d, big.NewInt(1_000_000))
		q, r := new(big.Int).QuoRem(d, new(big.Int).SetUint64(res), new(big.Int))
		if r.Mul(r, big.NewInt(2)).Cmp(new(big.Int).SetUint64(res)) >= 0 {
			q.Add(q, big.NewInt(1))
		}
		return q.Uint64()
	}

	cmd := exec.Command(bin, anchor)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	v := newView()
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := reEvent.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		id, err1 := strconv.ParseUint(m[2], 10, 64)
		ticks, err2 := strconv.ParseUint(m[3], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		th, ok := where[id]
		if !ok {
			t.Fatalf("otf2-print: event on undefined location %d: %s", id, sc.Text())
		}
		v.events++
		kind, rest := m[1], m[4]
		switch kind {
		case "ENTER", "LEAVE":
			r := reRegion.FindStringSubmatch(rest)
			if r == nil {
				t.Fatalf("otf2-print: cannot read %q", sc.Text())
			}
			if kind == "ENTER" {
				v.entries[execKey{th, r[1]}]++
				v.enterUS[th] = append(v.enterUS[th], us(ticks))
			} else {
				v.exits[execKey{th, r[1]}]++
			}
		case "MPI_SEND", "MPI_ISEND", "MPI_RECV", "MPI_IRECV":
			r := reMsg.FindStringSubmatch(rest)
			if r == nil {
				t.Fatalf("otf2-print: cannot read %q", sc.Text())
			}
			peer, _ := strconv.ParseUint(r[1], 10, 64)
			tag, _ := strconv.ParseUint(r[2], 10, 32)
			n, _ := strconv.ParseUint(r[3], 10, 64)
			k := frame.Send
			if strings.HasSuffix(kind, "RECV") {
				k = frame.Recv
			}
			v.msgs[msgKey{th, k, where[peer].rank, uint32(tag), n}]++
		case "METRIC":
			for _, val := range reValue.FindAllStringSubmatch(rest, -1) {
				var x uint64
				switch val[2] {
				case "UINT64":
					x, err = strconv.ParseUint(val[3], 10, 64)
				case "INT64":
					var s int64
					s, err = strconv.ParseInt(val[3], 10, 64)
					if s < 0 {
						v.negatives++
						continue
					}
					x = uint64(s)
				case "DOUBLE":
					var f float64
					f, err = strconv.ParseFloat(val[3], 64)
					if f < 0 {
						v.negatives++
						continue
					}
					x = uint64(math.Round(f))
				default:
					t.Fatalf("otf2-print: metric value type %s in %q", val[2], sc.Text())
				}
				if err != nil {
					t.Fatalf("otf2-print: metric value in %q: %v", sc.Text(), err)
				}
				v.samples[sampleKey{th, val[1], x}]++
			}
		default:
			v.unsupported++
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("otf2-print %s: %v: %s", anchor, err, stderr.String())
	}
	return v
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// read runs the reader on an archive with 10 ms steps and counts the frames'
// events the same way.
func read(t *testing.T, paths ...string) (*view, steps.Stats, []*frame.Frame) {
	t.Helper()
	cfg := steps.Config{Step: 10 * time.Millisecond}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	v := newView()
	funcs := map[uint32]map[uint32]string{}
	counters := map[uint32]map[uint32]string{}
	var first []*frame.Frame
	b := steps.New(cfg, func(f *frame.Frame) error {
		if err := f.Validate(); err != nil {
			t.Fatalf("invalid frame rank %d step %d: %v", f.Rank, f.Step, err)
		}
		if f.Step == 0 {
			c := *f
			c.Metadata = slices.Clone(f.Metadata)
			first = append(first, &c)
		}
		if funcs[f.Rank] == nil {
			funcs[f.Rank], counters[f.Rank] = map[uint32]string{}, map[uint32]string{}
		}
		for _, n := range f.Funcs {
			funcs[f.Rank][n.ID] = n.Name
		}
		for _, n := range f.Counters {
			counters[f.Rank][n.ID] = n.Name
		}
		for _, e := range f.Events {
			th := thread{f.Rank, e.Tid}
			k := execKey{th, funcs[f.Rank][e.FID]}
			if e.Kind == frame.Entry {
				v.entries[k]++
				v.enterUS[th] = append(v.enterUS[th], e.TS)
			} else {
				v.exits[k]++
			}
		}
		for _, c := range f.Comms {
			v.msgs[msgKey{thread{f.Rank, c.Tid}, c.Kind, c.Partner, c.Tag, c.Bytes}]++
		}
		for _, c := range f.CounterEvents {
			v.samples[sampleKey{thread{f.Rank, c.Tid}, counters[f.Rank][c.CID], c.Value}]++
		}
		return nil
	})
	if err := Read(context.Background(), paths, b); err != nil {
		t.Fatalf("read %v: %v", paths, err)
	}
	st := b.Stats()
	v.events = st.InputEvents
	v.unsupported = st.Losses.Count(steps.LossUnsupported)
	v.negatives = st.Losses.Count(steps.LossCounterValue)
	return v, st, first
}

// compare reports every difference between what otf2-print shows and what
// the frames hold.
func compare(t *testing.T, want, got *view) {
	t.Helper()
	diffMap(t, "entries", want.entries, got.entries)
	diffMap(t, "exits", want.exits, got.exits)
	diffMap(t, "messages", want.msgs, got.msgs)
	diffMap(t, "metric samples", want.samples, got.samples)
	for th, w := range want.enterUS {
		if g := got.enterUS[th]; !slices.Equal(w, g) {
			i := 0
			for i < min(len(w), len(g)) && w[i] == g[i] {
				i++
			}
			t.Errorf("rank %d thread %d: entry times differ from entry %d (of %d printed, %d in frames)", th.rank, th.tid, i, len(w), len(g))
		}
	}
	if len(got.enterUS) != len(want.enterUS) {
		t.Errorf("frames have entries on %d threads, otf2-print on %d", len(got.enterUS), len(want.enterUS))
	}
	for _, c := range []struct {
		what      string
		want, got int
	}{
		{"event records", want.events, got.events},
		{"unsupported events", want.unsupported, got.unsupported},
		{"negative metric values", want.negatives, got.negatives},
	} {
		if c.want != c.got {
			t.Errorf("%s: otf2-print %d, reader %d", c.what, c.want, c.got)
		}
	}
}

func diffMap[K comparable](t *testing.T, what string, want, got map[K]int) {
	t.Helper()
	n := 0
	for k, w := range want {
		if got[k] != w && n < 5 {
			t.Errorf("%s %+v: otf2-print %d, frames %d", what, k, w, got[k])
			n++
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok && n < 5 {
			t.Errorf("%s %+v: frames %d, otf2-print none", what, k, g)
			n++
		}
	}
	if len(want) == 0 && len(got) == 0 {
		return
	}
	if n > 0 {
		t.Errorf("%s: %d kinds printed, %d in frames", what, len(want), len(got))
	}
}

func total[K comparable](m map[K]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// TestPingPongMatchesOTF2Print reads the Score-P trace, by anchor file and by
// directory, and compares executions, messages and entry times with
// otf2-print.
func TestPingPongMatchesOTF2Print(t *testing.T) {
	want := printed(t, pingPong)
	for _, in := range []string{pingPong, filepath.Dir(pingPong)} {
		t.Run(in, func(t *testing.T) {
			got, st, first := read(t, in)
			compare(t, want, got)
			t.Logf("%d event records: %d entries, %d exits, %d messages; %d frames, %d executions",
				got.events, total(got.entries), total(got.exits), total(got.msgs), st.Frames, st.Executions)
			names := map[string]bool{}
			for _, f := range first {
				for _, m := range f.Metadata {
					names[m.Key+"="+m.Value] = true
				}
			}
			for _, m := range []string{"Process Name=MPI Rank 0", "Process Name=MPI Rank 1", "Thread Name=Master thread"} {
				if !names[m] {
					t.Errorf("metadata %s missing from the first frames (have %v)", m, names)
				}
			}
		})
	}
}

// TestGeneratedMatchesOTF2Print writes archives with OTF2's own writer (a C
// program built against Debian's libopen-trace-format2-dev) and compares.
// The archives have several ranks and threads, a GPU stream in an
// accelerator location group, blocking and non-blocking messages on two
// communicators, a three-member metric (uint64, double, int64 with negative
// values), a metric instance recorded by a metric location, clock offsets, a
// region mapping table and event files of more than one chunk.
func TestGeneratedMatchesOTF2Print(t *testing.T) {
	otf2Print(t)
	gen := buildGen(t)
	cases := []struct {
		name                  string
		ranks, threads, iters int
	}{
		{"5 ranks x 3 threads, 2 chunks per main thread", 5, 3, 1500},
		{"3 ranks x 1 thread, one chunk", 3, 1, 40},
		{"300 ranks: more event files than are held open at once", 300, 1, 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if testing.Short() && (c.iters > 100 || c.ranks > 100) {
				t.Skip("large archive: not in -short")
			}
			dir := filepath.Join(t.TempDir(), "archive")
			out, err := exec.Command(gen, dir, strconv.Itoa(c.ranks), strconv.Itoa(c.threads), strconv.Itoa(c.iters)).CombinedOutput()
			if err != nil {
				t.Fatalf("gen: %v: %s", err, out)
			}
			anchor := filepath.Join(dir, "traces.otf2")
			want := printed(t, anchor)
			got, st, _ := read(t, dir)
			compare(t, want, got)
			// With two files open at a time the others are closed and
			// reopened where they were: the same frames.
			defer func(n int) { maxOpenFiles = n }(maxOpenFiles)
			maxOpenFiles = 2
			few, _, _ := read(t, dir)
			compare(t, want, few)
			fi, _ := os.Stat(filepath.Join(dir, "traces", "0.evt"))
			t.Logf("%d event records: %d entries, %d messages, %d metric values; %d frames, %d threads; 0.evt %d bytes",
				got.events, total(got.entries), total(got.msgs), total(got.samples), st.Frames, st.Threads, fi.Size())
			if st.Threads != c.ranks*c.threads+2 {
				t.Errorf("%d threads, want %d (with the GPU stream on rank 0 and the metric location on rank 1)", st.Threads, c.ranks*c.threads+2)
			}
		})
	}
}

// buildGen compiles testdata/gen/gen.c against OTF2's writer library.
func buildGen(t testing.TB) string {
	t.Helper()
	require := os.Getenv("KIPIMO_REQUIRE_OTF2") == "1"
	skip := func(why string) {
		if require {
			t.Fatalf("%s and KIPIMO_REQUIRE_OTF2=1: install Debian's libopen-trace-format2-dev and gcc", why)
		}
		t.Skip(why)
	}
	cc, err := exec.LookPath("gcc")
	if err != nil {
		skip("gcc not found")
	}
	if _, err := os.Stat("/usr/include/otf2/otf2.h"); err != nil {
		skip("OTF2 writer headers not found (Debian package libopen-trace-format2-dev)")
	}
	bin := filepath.Join(t.TempDir(), "gen")
	out, err := exec.Command(cc, "-O1", "-o", bin, "testdata/gen/gen.c", "-lopen-trace-format2").CombinedOutput()
	if err != nil {
		t.Fatalf("build gen: %v: %s", err, out)
	}
	return bin
}
