package otf2

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/replay/steps"
)

func TestDecodeCompressed(t *testing.T) {
	cases := []struct {
		name    string
		in      []byte
		little  bool
		size    int
		want    uint64
		wantErr string
	}{
		{"zero", []byte{0}, true, 4, 0, ""},
		{"undefined uint32", []byte{0xff}, true, 4, math.MaxUint32, ""},
		{"undefined uint64", []byte{0xff}, true, 8, math.MaxUint64, ""},
		{"one byte", []byte{1, 0x94}, true, 4, 0x94, ""},
		{"three bytes little endian", []byte{3, 0x00, 0x00, 0x01}, true, 4, 0x10000, ""},
		{"three bytes big endian", []byte{3, 0x01, 0x00, 0x00}, false, 4, 0x10000, ""},
		{"clock resolution", []byte{4, 0x20, 0x2c, 0xe2, 0x7c}, true, 8, 2095197216, ""},
		{"eight bytes", []byte{8, 1, 2, 3, 4, 5, 6, 7, 8}, true, 8, 0x0807060504030201, ""},
		{"five bytes in a uint32", []byte{5, 1, 2, 3, 4, 5}, true, 4, 0, "invalid size 5"},
		{"nine bytes", []byte{9, 1, 2, 3, 4, 5, 6, 7, 8, 9}, true, 8, 0, "invalid size 9"},
		{"short", []byte{4, 1, 2}, true, 8, 0, "record too short"},
		{"empty", nil, true, 8, 0, "record too short"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := &dec{b: c.in, little: c.little}
			got := d.uint(c.size, "value")
			if c.wantErr != "" {
				if d.err == nil || !strings.Contains(d.err.Error(), c.wantErr) {
					t.Fatalf("error %v, want %q", d.err, c.wantErr)
				}
				return
			}
			if d.err != nil || got != c.want {
				t.Fatalf("got %d (%v), want %d", got, d.err, c.want)
			}
		})
	}
}

func TestDecodeSigned(t *testing.T) {
	cases := []struct {
		name string
		in   []byte
		want int64
		ok   bool
	}{
		{"zero", []byte{0}, 0, true},
		{"positive", []byte{2, 0x10, 0x27}, 10000, true},
		{"negative is written in full", []byte{8, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, -2, true},
		{"0xff is not a signed length", []byte{0xff}, 0, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := &dec{b: c.in, little: true}
			got := d.i64("value")
			if (d.err == nil) != c.ok || (c.ok && got != c.want) {
				t.Fatalf("got %d (%v), want %d (ok %v)", got, d.err, c.want, c.ok)
			}
		})
	}
}

// TestAnchor checks the anchor file of the Score-P trace against what
// otf2-print -I shows of it (OTF2 2.3.0, chunk sizes 1 MiB and 256 KiB, 2
// locations, 533 global definitions, Score-P 7.1).
func TestAnchor(t *testing.T) {
	a, err := ReadAnchor(pingPong)
	if err != nil {
		t.Fatal(err)
	}
	if a.Major != 2 || a.Minor != 3 || a.Bugfix != 0 || a.ChunkEvents != 1<<20 || a.ChunkDefs != 256<<10 || a.Locations != 2 || a.GlobalDefs != 533 || a.Creator != "Score-P 7.1" {
		t.Errorf("anchor %+v", a)
	}
	if a.Properties["OTF2::MPI_COMMUNICATION_COMPLETE"] != "true" || len(a.Properties) != 5 {
		t.Errorf("properties %v", a.Properties)
	}
	d, err := ReadDefs(strings.TrimSuffix(pingPong, ".otf2")+".def", int64(a.ChunkDefs))
	if err != nil {
		t.Fatal(err)
	}
	if d.Records != int(a.GlobalDefs) {
		t.Errorf("%d global definition records read, the anchor file counts %d", d.Records, a.GlobalDefs)
	}
}

// copyArchive copies the ping-pong archive into a temporary directory and
// returns the directory.
func copyArchive(t *testing.T) string {
	t.Helper()
	src := filepath.Dir(pingPong)
	dst := filepath.Join(t.TempDir(), "pp")
	for _, name := range []string{"traces.otf2", "traces.def", "traces/0.evt", "traces/0.def", "traces/1.evt", "traces/1.def"} {
		data, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dst, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

func readDir(dir string) (steps.Stats, int, error) {
	cfg := steps.Config{Step: time.Millisecond}
	_ = cfg.Validate()
	frames := 0
	b := steps.New(cfg, func(*frame.Frame) error { frames++; return nil })
	err := Read(context.Background(), []string{dir}, b)
	return b.Stats(), frames, err
}

// TestDamagedArchives breaks one file of the archive at a time: every error
// names the file and the byte offset of the bad record.
func TestDamagedArchives(t *testing.T) {
	cases := []struct {
		name    string
		file    string
		damage  func([]byte) []byte
		wantErr []string
		offset  [2]int64 // range the reported offset must fall in
		is      error
		stopped bool // the error came after frames were emitted
	}{
		{
			name: "events truncated in a record", file: "traces/0.evt",
			damage:  func(b []byte) []byte { return b[:0x95] },
			wantErr: []string{"0.evt", "byte offset"}, offset: [2]int64{0x80, 0x95}, is: ErrTruncated, stopped: true,
		},
		{
			name: "events with a bad chunk header", file: "traces/1.evt",
			damage:  func(b []byte) []byte { b[0] = 7; return b },
			wantErr: []string{"1.evt", "does not start with a chunk header"}, offset: [2]int64{0, 0},
		},
		{
			name: "events with a bad endianness byte", file: "traces/1.evt",
			damage:  func(b []byte) []byte { b[1] = 0x11; return b },
			wantErr: []string{"1.evt", "endianness"}, offset: [2]int64{1, 1},
		},
		{
			name: "events with a record longer than its chunk", file: "traces/0.evt",
			damage: func(b []byte) []byte {
				// The MpiSend record at 0x93: its length byte says 0xff,
				// then an eight-byte length.
				b[0x94] = 0xff
				return b
			},
			wantErr: []string{"0.evt", "byte offset 147", "runs past the end of its 1048576-byte chunk"}, offset: [2]int64{0x93, 0x93}, stopped: true,
		},
		{
			name: "global definitions truncated", file: "traces.def",
			damage:  func(b []byte) []byte { return b[:5000] },
			wantErr: []string{"traces.def", "byte offset"}, offset: [2]int64{4900, 5000}, is: ErrTruncated,
		},
		{
			name: "not an anchor file", file: "traces.otf2",
			damage:  func(b []byte) []byte { return []byte("{\"traceEvents\": []}") },
			wantErr: []string{"traces.otf2", "not an OTF2 anchor file"}, offset: [2]int64{0, 0},
		},
		{
			name: "compressed archive", file: "traces.otf2",
			damage:  func(b []byte) []byte { b[29] = 2; return b },
			wantErr: []string{"traces.otf2", "compression 2 is not supported"}, offset: [2]int64{29, 29},
		},
		{
			name: "SIONlib archive", file: "traces.otf2",
			damage:  func(b []byte) []byte { b[28] = 2; return b },
			wantErr: []string{"traces.otf2", "substrate 2 is not supported"}, offset: [2]int64{28, 28},
		},
		{
			name: "anchor truncated", file: "traces.otf2",
			damage:  func(b []byte) []byte { return b[:40] },
			wantErr: []string{"traces.otf2", "truncated"}, offset: [2]int64{30, 40}, is: ErrTruncated,
		},
		{
			name: "location file missing", file: "traces/1.evt",
			damage:  nil,
			wantErr: []string{"1.evt", "location 1", "60 events"}, offset: [2]int64{-1, -1},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := copyArchive(t)
			p := filepath.Join(dir, c.file)
			if c.damage == nil {
				if err := os.Remove(p); err != nil {
					t.Fatal(err)
				}
			} else {
				data, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, c.damage(data), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			_, _, err := readDir(dir)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range c.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if c.offset[0] >= 0 {
				var e *Error
				if !errors.As(err, &e) {
					t.Fatalf("error %q is not an *otf2.Error", err)
				}
				if e.Offset < c.offset[0] || e.Offset > c.offset[1] {
					t.Errorf("offset %d, want %d..%d", e.Offset, c.offset[0], c.offset[1])
				}
			}
			if c.is != nil && !errors.Is(err, c.is) {
				t.Errorf("error %q is not %v", err, c.is)
			}
			if c.stopped != errors.Is(err, steps.ErrStopped) {
				t.Errorf("error %q: stopped %v, want %v", err, !c.stopped, c.stopped)
			}
		})
	}
}

func TestFindAnchor(t *testing.T) {
	dir := copyArchive(t)
	two := t.TempDir()
	for _, n := range []string{"a.otf2", "b.otf2"} {
		if err := os.WriteFile(filepath.Join(two, n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name    string
		in      []string
		want    string
		wantErr string
	}{
		{"anchor file", []string{filepath.Join(dir, "traces.otf2")}, filepath.Join(dir, "traces.otf2"), ""},
		{"directory", []string{dir}, filepath.Join(dir, "traces.otf2"), ""},
		{"the same archive twice", []string{dir, filepath.Join(dir, "traces.otf2")}, filepath.Join(dir, "traces.otf2"), ""},
		{"the directory's files, as a glob gives them", []string{filepath.Join(dir, "traces.def"), filepath.Join(dir, "traces.otf2"), filepath.Join(dir, "traces", "0.evt")}, filepath.Join(dir, "traces.otf2"), ""},
		{"a file of another directory", []string{filepath.Join(dir, "traces.otf2"), pingPong + "x"}, "", "no such file"},
		{"a file outside the archive", []string{filepath.Join(dir, "traces.otf2"), filepath.Join(filepath.Dir(pingPong), "scorep.cfg")}, "", "is not a file of the archive"},
		{"two archives", []string{dir, filepath.Dir(pingPong)}, "", "name 2 anchor files"},
		{"no anchor", []string{t.TempDir()}, "", "no anchor file"},
		{"two anchors", []string{two}, "", "holds 2 anchor files"},
		{"missing", []string{filepath.Join(dir, "nope")}, "", "no such file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := FindAnchor(c.in)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("got %q, %v; want %q", got, err, c.want)
			}
		})
	}
}

// TestLosses checks what the ping-pong holds that frames do not: the
// ProgramBegin and ProgramEnd events of its two locations (otf2-print shows
// 4), and nothing else.
func TestLosses(t *testing.T) {
	st, frames, err := readDir(filepath.Dir(pingPong))
	if err != nil {
		t.Fatal(err)
	}
	if n := st.Losses.Count(steps.LossUnsupported); n != 4 || len(st.Losses) != 1 {
		t.Errorf("losses %v, want 4 unsupported", st.Losses)
	}
	if !strings.Contains(st.Losses[0].Example, "ProgramBegin") {
		t.Errorf("example %q does not name the event", st.Losses[0].Example)
	}
	if st.InputEvents != 120 || frames == 0 {
		t.Errorf("%d input events (want 120, the two locations' 60 each), %d frames", st.InputEvents, frames)
	}
}

func TestMetricValue(t *testing.T) {
	cases := []struct {
		name string
		typ  uint8
		raw  uint64
		want uint64
		ok   bool
	}{
		{"uint64", typeUint64, 1 << 40, 1 << 40, true},
		{"int64", typeInt64, 12, 12, true},
		{"negative int64", typeInt64, uint64(math.MaxUint64), 0, false},
		{"double rounds", typeDouble, math.Float64bits(2.5), 3, true},
		{"negative double", typeDouble, math.Float64bits(-0.5), 0, false},
		{"NaN", typeDouble, math.Float64bits(math.NaN()), 0, false},
		{"string", 11, 3, 0, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, ok, why := metricValue(c.typ, c.raw)
			if ok != c.ok || got != c.want || (!ok && why == "") {
				t.Fatalf("got %d %v %q, want %d %v", got, ok, why, c.want, c.ok)
			}
		})
	}
}
