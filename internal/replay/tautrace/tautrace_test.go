package tautrace

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/replay/steps"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/golden")

// collect reads paths with cfg and returns every frame (deep-copied) and the stats.
func collect(t testing.TB, cfg steps.Config, read func(*steps.Builder) error) ([]frame.Frame, steps.Stats, error) {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var out []frame.Frame
	b := steps.New(cfg, func(f *frame.Frame) error {
		c := *f
		c.Funcs = append([]frame.Name(nil), f.Funcs...)
		c.Counters = append([]frame.Name(nil), f.Counters...)
		c.Metadata = append([]frame.Meta(nil), f.Metadata...)
		c.Events = append([]frame.FuncEvent(nil), f.Events...)
		c.CounterEvents = append([]frame.CounterEvent(nil), f.CounterEvents...)
		c.Comms = append([]frame.CommEvent(nil), f.Comms...)
		out = append(out, c)
		return nil
	})
	err := read(b)
	return out, b.Stats(), err
}

// rawCounts reads .trc records directly, without the package's reader:
// entry (+1) and exit (-1) records of EntryExit events, and message records.
type rawCounts struct {
	Entries, Exits, Messages int
	Matched                  int // exits that close the innermost open entry of the same id
	Threads                  map[[2]uint16]bool
}

var defLine = regexp.MustCompile(`^(-?\d+) \S+ -?\d+ "(.*)" (\S+)\s*$`)

func countRaw(t *testing.T, trc string) rawCounts {
	t.Helper()
	edf := EDFPath(trc)
	text, err := os.ReadFile(edf)
	if err != nil {
		t.Fatal(err)
	}
	entryExit := map[int32]bool{}
	message := map[int32]bool{}
	for _, l := range strings.Split(string(text), "\n") {
		m := defLine.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		id, _ := strconv.Atoi(m[1])
		switch {
		case m[3] == "EntryExit":
			entryExit[int32(id)] = true
		case m[2] == "MESSAGE_SEND" || m[2] == "MESSAGE_RECV":
			message[int32(id)] = true
		}
	}
	data, err := os.ReadFile(trc)
	if err != nil {
		t.Fatal(err)
	}
	c := rawCounts{Threads: map[[2]uint16]bool{}}
	stacks := map[[2]uint16][]int32{}
	for i := 0; i+24 <= len(data); i += 24 {
		ev := int32(binary.LittleEndian.Uint32(data[i:]))
		par := int64(binary.LittleEndian.Uint64(data[i+8:]))
		th := [2]uint16{binary.LittleEndian.Uint16(data[i+4:]), binary.LittleEndian.Uint16(data[i+6:])}
		c.Threads[th] = true
		switch {
		case entryExit[ev] && par == 1:
			c.Entries++
			stacks[th] = append(stacks[th], ev)
		case entryExit[ev] && par == -1:
			c.Exits++
			if s := stacks[th]; len(s) > 0 && s[len(s)-1] == ev {
				stacks[th] = s[:len(s)-1]
				c.Matched++
			}
		case message[ev]:
			c.Messages++
		}
	}
	return c
}

type golden struct {
	Stats  steps.Stats `json:"stats"`
	Frames []struct {
		Rank, Step    uint64
		Events, Comms int
		Counters      int
		Funcs         int
	} `json:"frames"`
}

func summarize(frames []frame.Frame, st steps.Stats) golden {
	g := golden{Stats: st}
	for _, f := range frames {
		g.Frames = append(g.Frames, struct {
			Rank, Step    uint64
			Events, Comms int
			Counters      int
			Funcs         int
		}{uint64(f.Rank), f.Step, len(f.Events), len(f.Comms), len(f.CounterEvents), len(f.Funcs)})
	}
	return g
}

func checkGolden(t *testing.T, name string, g golden) {
	t.Helper()
	got, err := json.MarshalIndent(g, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("testdata", "golden", name+".json")
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file; run go test -update and review the diff", name)
	}
}

func TestFixtures(t *testing.T) {
	cases := []struct {
		name  string
		files []string
		gpu   int
	}{
		{"opencl-per-thread", []string{"testdata/opencl_course_L5/tautrace.0.0.0.trc", "testdata/opencl_course_L5/tautrace.0.0.1.trc", "testdata/opencl_course_L5/tautrace.0.0.2.trc"}, 1},
		{"opencl-merged", []string{"testdata/opencl_course_L5/tau.trc"}, 1},
		{"hecatoncheir", []string{"testdata/hecatoncheir/tautrace.0.0.0.trc"}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var raw rawCounts
			raw.Threads = map[[2]uint16]bool{}
			for _, f := range tc.files {
				c := countRaw(t, f)
				raw.Entries += c.Entries
				raw.Exits += c.Exits
				raw.Messages += c.Messages
				raw.Matched += c.Matched
				for k := range c.Threads {
					raw.Threads[k] = true
				}
			}
			frames, st, err := collect(t, steps.Config{Step: 100 * time.Millisecond}, func(b *steps.Builder) error {
				return Read(context.Background(), tc.files, b)
			})
			if err != nil {
				t.Fatal(err)
			}
			if st.Executions != raw.Matched || st.Executions+st.Unmatched != raw.Exits {
				t.Errorf("executions = %d (+%d unmatched exits), raw: %d matched of %d exit records", st.Executions, st.Unmatched, raw.Matched, raw.Exits)
			}
			if st.Threads != len(raw.Threads) {
				t.Errorf("threads = %d, raw = %d", st.Threads, len(raw.Threads))
			}
			if st.GPUThreads != tc.gpu {
				t.Errorf("gpu threads = %d, want %d", st.GPUThreads, tc.gpu)
			}
			var comms, funcEvents int
			seen := map[uint32]bool{}
			var lastStep = map[uint32]int64{}
			for _, f := range frames {
				comms += len(f.Comms)
				funcEvents += len(f.Events)
				if int64(f.Step) != lastStep[f.Rank] && !(f.Step == 0 && lastStep[f.Rank] == 0) {
					if int64(f.Step) != lastStep[f.Rank]+1 {
						t.Errorf("rank %d: step %d after %d", f.Rank, f.Step, lastStep[f.Rank])
					}
				}
				lastStep[f.Rank] = int64(f.Step)
				for _, n := range f.Funcs {
					if seen[n.ID] {
						t.Errorf("function %d sent twice", n.ID)
					}
					seen[n.ID] = true
				}
				for _, e := range f.Events {
					if !seen[e.FID] {
						t.Errorf("step %d: function %d used before its name was sent", f.Step, e.FID)
					}
					if e.TS < f.TStart || e.TS > f.TEnd {
						t.Errorf("step %d [%d,%d]: event at %d outside the step", f.Step, f.TStart, f.TEnd, e.TS)
					}
				}
			}
			if funcEvents != raw.Entries+raw.Exits {
				t.Errorf("function events = %d, raw = %d", funcEvents, raw.Entries+raw.Exits)
			}
			if tc.name == "hecatoncheir" && comms < raw.Messages {
				t.Errorf("comm events = %d, raw message records = %d", comms, raw.Messages)
			}
			checkGolden(t, tc.name, summarize(frames, st))
		})
	}
}

func TestMergedMatchesPerThread(t *testing.T) {
	_, a, err := collect(t, steps.Config{}, func(b *steps.Builder) error {
		return Read(context.Background(), []string{"testdata/opencl_course_L5"}, b)
	})
	if err != nil {
		t.Fatal(err)
	}
	_, m, err := collect(t, steps.Config{}, func(b *steps.Builder) error {
		return Read(context.Background(), []string{"testdata/opencl_course_L5/tau.trc"}, b)
	})
	if err != nil {
		t.Fatal(err)
	}
	// The merged file has its own count of records; the rest is the same.
	a.InputEvents, m.InputEvents = 0, 0
	if !reflect.DeepEqual(a, m) {
		t.Errorf("per-thread files give %+v, merged tau.trc gives %+v", a, m)
	}
}

func TestDecodeMessage(t *testing.T) {
	cases := []struct {
		name string
		m    Message
	}{
		{"small", Message{Bytes: 40, Tag: 3, Partner: 1}},
		{"wide", Message{Bytes: 0x3FFFFFF, Tag: 0xFFFF, Partner: 0xFFFF, Comm: 0x3F}},
		{"zero", Message{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := DecodeMessage(EncodeMessage(tc.m)); got != tc.m {
				t.Errorf("round trip %+v -> %+v", tc.m, got)
			}
		})
	}
	// Hand-packed: length 0x10020 (low 16 bits 0x0020, next bits 0x1), tag
	// 0x0105, partner 0x0203, communicator 5.
	par := int64(0x0020 | 0x05<<16 | 0x03<<24 | 0x1<<32 | 5<<42 | 0x01<<48 | 0x02<<56)
	want := Message{Bytes: 0x10020, Tag: 0x105, Partner: 0x203, Comm: 5}
	if got := DecodeMessage(par); got != want {
		t.Errorf("DecodeMessage(%#x) = %+v, want %+v", par, got, want)
	}
}

func bigEndian(t *testing.T, src string) []byte {
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]byte, len(data))
	for i := 0; i+24 <= len(data); i += 24 {
		binary.BigEndian.PutUint32(out[i:], binary.LittleEndian.Uint32(data[i:]))
		binary.BigEndian.PutUint16(out[i+4:], binary.LittleEndian.Uint16(data[i+4:]))
		binary.BigEndian.PutUint16(out[i+6:], binary.LittleEndian.Uint16(data[i+6:]))
		binary.BigEndian.PutUint64(out[i+8:], binary.LittleEndian.Uint64(data[i+8:]))
		binary.BigEndian.PutUint64(out[i+16:], binary.LittleEndian.Uint64(data[i+16:]))
	}
	return out
}

func loadEDF(t testing.TB, path string) *EDF {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	e, err := ParseEDF(f, path)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestBigEndian(t *testing.T) {
	const trc = "testdata/hecatoncheir/tautrace.0.0.0.trc"
	e := loadEDF(t, "testdata/hecatoncheir/events.0.edf")
	_, le, err := collect(t, steps.Config{}, func(b *steps.Builder) error {
		return Read(context.Background(), []string{trc}, b)
	})
	if err != nil {
		t.Fatal(err)
	}
	_, be, err := collect(t, steps.Config{}, func(b *steps.Builder) error {
		return ReadInputs(context.Background(), []Input{{Name: "be.trc", R: bytes.NewReader(bigEndian(t, trc)), EDF: e}}, b)
	})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(le, be) {
		t.Errorf("little-endian %+v, big-endian %+v", le, be)
	}
}

func TestTruncated(t *testing.T) {
	const trc = "testdata/hecatoncheir/tautrace.0.0.0.trc"
	data, err := os.ReadFile(trc)
	if err != nil {
		t.Fatal(err)
	}
	e := loadEDF(t, "testdata/hecatoncheir/events.0.edf")
	cut := len(data)*3/4 + 5 // inside a record
	frames, _, err := collect(t, steps.Config{}, func(b *steps.Builder) error {
		return ReadInputs(context.Background(), []Input{{Name: "cut.trc", R: bytes.NewReader(data[:cut]), EDF: e}}, b)
	})
	if !errors.Is(err, ErrTruncated) || !errors.Is(err, steps.ErrStopped) {
		t.Fatalf("err = %v, want a truncation", err)
	}
	var te *Error
	if !errors.As(err, &te) || te.File != "cut.trc" || te.Offset != int64(cut/24*24) {
		t.Fatalf("err = %v, want file cut.trc at offset %d", err, cut/24*24)
	}
	// The steps before the damage are all there, identical to a full read.
	full, _, err := collect(t, steps.Config{}, func(b *steps.Builder) error {
		return Read(context.Background(), []string{trc}, b)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(frames) == 0 || len(frames) >= len(full) {
		t.Fatalf("truncated read gave %d frames, full read %d", len(frames), len(full))
	}
	for i := range frames {
		if len(frames[i].Events) != len(full[i].Events) || frames[i].Step != full[i].Step {
			t.Errorf("frame %d differs from the full read", i)
		}
	}
}

func TestMalformed(t *testing.T) {
	e := loadEDF(t, "testdata/hecatoncheir/events.0.edf")
	rec := func(ev int32, par int64, ts uint64) []byte {
		b := make([]byte, 24)
		binary.LittleEndian.PutUint32(b, uint32(ev))
		binary.LittleEndian.PutUint64(b[8:], uint64(par))
		binary.LittleEndian.PutUint64(b[16:], ts)
		return b
	}
	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"not EV_INIT", rec(57, 1, 10), "byte order"},
		{"unknown id", append(rec(EVInit, 3, 1), rec(99999, 1, 2)...), "event id 99999 is not defined"},
		{"zero entry parameter", append(rec(EVInit, 3, 1), rec(57, 0, 2)...), "parameter is 0"},
		{"time jump", append(append(rec(EVInit, 3, 1), rec(57, 1, 2)...), rec(57, -1, 1<<62)...), "jumps"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := collect(t, steps.Config{}, func(b *steps.Builder) error {
				return ReadInputs(context.Background(), []Input{{Name: "bad.trc", R: bytes.NewReader(tc.data), EDF: e}}, b)
			})
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "bad.trc") {
				t.Errorf("err = %v, want one naming bad.trc and %q", err, tc.want)
			}
		})
	}
}

func TestEDFMalformed(t *testing.T) {
	cases := []struct{ name, text, want string }{
		{"header", "hello\n", "not a TAU event definition file"},
		{"no quotes", "2 dynamic_trace_events\n1 G 0 name EntryExit\n", ":2: event definition without a quoted name"},
		{"bad id", "2 dynamic_trace_events\nx G 0 \"a \" EntryExit\n", "not a 32-bit integer"},
		{"bad type", "2 dynamic_trace_events\n1 G 0 \"a \" Other\n", "unknown event type"},
		{"empty", "", "empty"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseEDF(strings.NewReader(tc.text), "x.edf")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestTwoNodes merges the per-thread files of two nodes (ranks) that exchange
// a message: both ranks get the same steps, and the message parameter
// decodes to its partner, tag and size.
func TestTwoNodes(t *testing.T) {
	dir := t.TempDir()
	edf, err := os.ReadFile("testdata/hecatoncheir/events.0.edf")
	if err != nil {
		t.Fatal(err)
	}
	rec := func(buf *bytes.Buffer, ev int32, nid uint16, par int64, ts uint64) {
		var b [24]byte
		binary.LittleEndian.PutUint32(b[:], uint32(ev))
		binary.LittleEndian.PutUint16(b[4:], nid)
		binary.LittleEndian.PutUint64(b[8:], uint64(par))
		binary.LittleEndian.PutUint64(b[16:], ts)
		buf.Write(b[:])
	}
	const t0 = 1_000_000_000
	for node := uint16(0); node < 2; node++ {
		if err := os.WriteFile(filepath.Join(dir, "events."+strconv.Itoa(int(node))+".edf"), edf, 0o644); err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		peer := uint32(1 - node)
		rec(&b, EVInit, node, 3, t0+uint64(node))
		rec(&b, 57, node, 1, t0+10)
		kind := int32(60007) // MESSAGE_SEND on node 0, RECV on node 1
		if node == 1 {
			kind = 60008
		}
		rec(&b, kind, node, EncodeMessage(Message{Bytes: 70000, Tag: 300, Partner: peer}), t0+2_500_000)
		rec(&b, 57, node, -1, t0+3_200_000)
		if err := os.WriteFile(filepath.Join(dir, "tautrace."+strconv.Itoa(int(node))+".0.0.trc"), b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	frames, st, err := collect(t, steps.Config{}, func(b *steps.Builder) error {
		return Read(context.Background(), []string{dir}, b)
	})
	if err != nil {
		t.Fatal(err)
	}
	perRank := map[uint32][]uint64{}
	var comms []frame.CommEvent
	for _, f := range frames {
		perRank[f.Rank] = append(perRank[f.Rank], f.Step)
		comms = append(comms, f.Comms...)
	}
	if len(perRank[0]) != 4 || len(perRank[1]) != 4 {
		t.Errorf("steps per rank %v, want 0..3 for both", perRank)
	}
	if st.Executions != 2 || st.Threads != 2 || len(comms) != 2 {
		t.Fatalf("stats %+v, %d comms", st, len(comms))
	}
	for _, c := range comms {
		if c.Bytes != 70000 || c.Tag != 300 || c.Partner > 1 {
			t.Errorf("comm %+v, want 70000 bytes, tag 300", c)
		}
	}
}
