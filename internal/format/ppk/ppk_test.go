package ppk

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/format/tauprofile"
)

// fixtures are TAU's PerfExplorer examples under testdata (SOURCES.txt), with
// the thread count of each one's header.
var fixtures = []struct {
	file    string
	threads int
}{
	{"DrawGraph-4.ppk", 4},
	{"LoadImbalance-16.ppk", 16},
	{"LoadImbalance-32.ppk", 32},
	{"matmult.ppk", 24},
	{"phases.ppk", 1},
	{"wrf-callpath.ppk", 16},
}

func gunzip(t testing.TB, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestPPKErrors damages the real DrawGraph-4.ppk (uncompressed) and checks
// that each error names the file and the byte offset of the damage.
func TestPPKErrors(t *testing.T) {
	good := gunzip(t, filepath.Join("testdata", "DrawGraph-4.ppk"))
	put32 := func(off int, v uint32) []byte {
		b := bytes.Clone(good)
		binary.BigEndian.PutUint32(b[off:], v)
		return b
	}
	hsize := int(binary.BigEndian.Uint32(good[14:]))
	metricsAt := 18 + hsize // int32 metric count after the header
	cases := []struct {
		name   string
		data   []byte
		offset int64
		want   string
	}{
		{"empty", nil, 0, "unexpected end of data"},
		{"bad magic", append([]byte("PPK..."), good[6:]...), 0, `expected "PPK"`},
		{"bad version", put32(6, 9), 6, "ppk version 9"},
		{"newer compatibility", put32(10, 3), 10, "compatibility level 3"},
		{"header size", put32(14, uint32(hsize+4)), 18, "header size field says"},
		{"negative metric count", put32(metricsAt, 0xffffffff), int64(metricsAt), "metric count is -1"},
		{"truncated", good[:len(good)-3], int64(len(good) - 8), "unexpected end of data"},
		{"trailing byte", append(bytes.Clone(good), 0), int64(len(good)), "unexpected data after the last thread"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Read(bytes.NewReader(tc.data), "bad.ppk")
			var oe *OffsetError
			if !errors.As(err, &oe) {
				t.Fatalf("err = %v, want an *OffsetError", err)
			}
			if oe.File != "bad.ppk" || oe.Offset != tc.offset || !strings.Contains(oe.Msg, tc.want) {
				t.Errorf("err = %q; want offset %d mentioning %q", err, tc.offset, tc.want)
			}
			if !strings.Contains(err.Error(), "bad.ppk") {
				t.Errorf("err %q does not name the file", err)
			}
		})
	}
	t.Run("compressed offsets are uncompressed", func(t *testing.T) {
		data, err := os.ReadFile(filepath.Join("testdata", "DrawGraph-4.ppk"))
		if err != nil {
			t.Fatal(err)
		}
		_, err = Read(bytes.NewReader(data[:len(data)-20]), "cut.ppk")
		if err == nil || !strings.Contains(err.Error(), "cut.ppk") {
			t.Fatalf("err = %v, want one naming cut.ppk", err)
		}
	})
}

// TestReadFixtures reads each real file compressed and uncompressed: the same
// files, one per thread of the header and metric, each starting its metadata
// with the metric's name.
func TestReadFixtures(t *testing.T) {
	for _, fx := range fixtures {
		t.Run(fx.file, func(t *testing.T) {
			path := filepath.Join("testdata", fx.file)
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			gz, err := Read(f, path)
			if err != nil {
				t.Fatal(err)
			}
			plain, err := Read(bytes.NewReader(gunzip(t, path)), path)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(gz, plain) {
				t.Error("the uncompressed stream reads differently from the gzip file")
			}
			if len(gz) != 1 || len(gz[0]) != fx.threads {
				t.Fatalf("got %d metrics (first with %d files), want 1 with %d", len(gz), len(gz[0]), fx.threads)
			}
			for _, p := range gz[0] {
				if len(p.Metadata) == 0 || p.Metadata[0].Name != tauprofile.MetricNameKey || p.MetricName() != p.Metadata[0].Value {
					t.Fatalf("thread %d,%d,%d: metadata starts %+v, want %q first", p.Node, p.Context, p.Thread, p.Metadata[:min(1, len(p.Metadata))], tauprofile.MetricNameKey)
				}
				for _, fl := range p.Functions {
					if fl.Exclusive < 0 || fl.Inclusive < 0 {
						t.Fatalf("negative time kept: %+v", fl)
					}
				}
			}
		})
	}
}

// javaStream writes the DataOutputStream values a ppk is made of.
type javaStream struct{ bytes.Buffer }

func (j *javaStream) i32(v int32)   { _ = binary.Write(&j.Buffer, binary.BigEndian, v) }
func (j *javaStream) f64(v float64) { _ = binary.Write(&j.Buffer, binary.BigEndian, v) }
func (j *javaStream) utf(s string) {
	_ = binary.Write(&j.Buffer, binary.BigEndian, uint16(len(s)))
	j.WriteString(s)
}

// TestReadLayout reads a ppk written field by field: two metrics, a
// function in two groups, a user event, metadata of the trial and thread.
func TestReadLayout(t *testing.T) {
	var j javaStream
	j.WriteString(Magic)
	j.i32(2) // version
	j.i32(1) // compatibility level
	var h javaStream
	h.i32(0) // skip field
	h.i32(1) // trial metadata
	h.utf("Host")
	h.utf("a")
	h.i32(1) // header threads
	h.i32(3)
	h.i32(0)
	h.i32(1)
	h.i32(1)
	h.utf("Rank")
	h.utf("3")
	j.i32(int32(h.Len()))
	j.Write(h.Bytes())
	j.i32(2) // metrics
	j.utf("TIME")
	j.utf("PAPI_FP_OPS")
	j.i32(2) // groups
	j.utf("MPI")
	j.utf("TAU_USER")
	j.i32(1) // functions
	j.utf("MPI_Send()")
	j.i32(2)
	j.i32(1)
	j.i32(0)
	j.i32(1) // user events
	j.utf("bytes")
	j.i32(1) // threads
	j.i32(3)
	j.i32(0)
	j.i32(1)
	j.i32(1) // function profiles
	j.i32(0)
	j.f64(4)  // calls
	j.f64(0)  // subroutines
	j.f64(-2) // TIME exclusive, read as 0
	j.f64(9)
	j.f64(100)
	j.f64(150)
	j.i32(1) // user event profiles
	j.i32(0)
	j.i32(2) // samples
	for _, v := range []float64{4, 8, 6, 80} {
		j.f64(v)
	}
	sets, err := Read(bytes.NewReader(j.Bytes()), "layout.ppk")
	if err != nil {
		t.Fatal(err)
	}
	ev := []tauprofile.UserEventLine{{Name: "bytes", NumEvents: 2, Min: 4, Max: 8, Mean: 6, SumSquare: 80}}
	file := func(metric string, excl, incl float64) []*tauprofile.File {
		return []*tauprofile.File{{Node: 3, Thread: 1, Header: "templated_functions_MULTI_" + metric,
			Metadata:   []tauprofile.Attribute{{Name: tauprofile.MetricNameKey, Value: metric}, {Name: "Host", Value: "a"}, {Name: "Rank", Value: "3"}},
			Functions:  []tauprofile.FunctionLine{{Name: "MPI_Send()", Groups: "TAU_USER | MPI", Calls: 4, Exclusive: excl, Inclusive: incl}},
			UserEvents: ev}}
	}
	want := [][]*tauprofile.File{file("TIME", 0, 9), file("PAPI_FP_OPS", 100, 150)}
	if !reflect.DeepEqual(sets, want) {
		for m := range sets {
			for _, p := range sets[m] {
				t.Logf("metric %d: %+v", m, *p)
			}
		}
		t.Fatal("the ppk was not read as written")
	}
}

func TestModifiedUTF8(t *testing.T) {
	cases := []struct {
		name string
		in   []byte
		want string
		bad  int
	}{
		{"ascii", []byte("MPI_Send()"), "MPI_Send()", -1},
		{"NUL as C0 80", []byte{'a', 0xC0, 0x80, 'b'}, "a\x00b", -1},
		{"two bytes", []byte{0xC3, 0xA9}, "\u00e9", -1},
		{"surrogate pair", []byte{0xED, 0xA0, 0xBD, 0xED, 0xB8, 0x80}, "\U0001F600", -1},
		{"raw NUL", []byte{'a', 0}, "", 1},
		{"cut sequence", []byte{'a', 0xE2, 0x82}, "", 1},
		{"four-byte UTF-8", []byte{0xF0, 0x9F, 0x98, 0x80}, "", 0},
	}
	for _, tc := range cases {
		got, bad := decodeModifiedUTF8(tc.in)
		if got != tc.want || bad != tc.bad {
			t.Errorf("%s: decodeModifiedUTF8(% x) = %q, %d; want %q, %d", tc.name, tc.in, got, bad, tc.want, tc.bad)
		}
	}
}

// FuzzRead feeds bytes to Read, seeded with the real files compressed and
// uncompressed: an error names the file and an offset >= 0, or every metric
// has the same threads.
func FuzzRead(f *testing.F) {
	for _, fx := range fixtures {
		path := filepath.Join("testdata", fx.file)
		data, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
		f.Add(gunzip(f, path))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		sets, err := Read(bytes.NewReader(data), "fuzz-input")
		if err != nil {
			var oe *OffsetError
			if errors.As(err, &oe) && oe.Offset < 0 {
				t.Fatalf("offset %d in %v", oe.Offset, err)
			}
			if !strings.Contains(err.Error(), "fuzz-input") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		if len(sets) == 0 || len(sets[0]) == 0 {
			t.Fatalf("read without metrics or threads: %d metrics", len(sets))
		}
		for m, set := range sets {
			if len(set) != len(sets[0]) {
				t.Fatalf("metric %d has %d threads, metric 0 has %d", m, len(set), len(sets[0]))
			}
			for i, p := range set {
				if q := sets[0][i]; p.Node != q.Node || p.Context != q.Context || p.Thread != q.Thread || len(p.Functions) != len(q.Functions) {
					t.Fatalf("metric %d file %d is not metric 0's thread", m, i)
				}
			}
		}
	})
}
