package frame

import (
	"bytes"
	"errors"
	"io"
	"runtime"
	"testing"
	"testing/iotest"
)

func TestWriterReader(t *testing.T) {
	frames := testFrames()
	var out bytes.Buffer
	w := NewWriter(&out)
	var want []byte
	for _, tc := range frames {
		if err := w.Write(tc.f); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		want = AppendBinary(want, tc.f)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), want) {
		t.Fatalf("Writer output differs from the concatenated AppendBinary frames")
	}
	readers := map[string]func(io.Reader) io.Reader{
		"plain":    func(r io.Reader) io.Reader { return r },
		"one byte": iotest.OneByteReader,
		"half":     iotest.HalfReader,
	}
	for name, wrap := range readers {
		t.Run(name, func(t *testing.T) {
			r := NewReader(wrap(bytes.NewReader(want)))
			var g Frame
			off := int64(0)
			for i, tc := range frames {
				if err := r.Next(&g); err != nil {
					t.Fatalf("frame %d (%s): %v", i, tc.name, err)
				}
				if !equalFrames(&g, tc.f) {
					t.Fatalf("frame %d (%s) differs", i, tc.name)
				}
				if r.Offset() != off {
					t.Fatalf("frame %d at offset %d, want %d", i, r.Offset(), off)
				}
				off += int64(len(AppendBinary(nil, tc.f)))
			}
			for range 2 {
				if err := r.Next(&g); err != io.EOF {
					t.Fatalf("after the last frame: %v, want io.EOF", err)
				}
			}
			if r.Frames() != len(frames) {
				t.Fatalf("Frames() = %d, want %d", r.Frames(), len(frames))
			}
		})
	}
}

func TestWriterRejectsInvalidFrame(t *testing.T) {
	cases := []struct {
		name string
		f    *Frame
	}{
		{"event kind", &Frame{Events: []FuncEvent{{Kind: 2}}}},
		{"comm kind", &Frame{Comms: []CommEvent{{Kind: 9}}}},
		{"name not UTF-8", &Frame{Funcs: []Name{{1, "a\xff"}}}},
		{"metadata not UTF-8", &Frame{Metadata: []Meta{{0, "k", "\xc3"}}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			w := NewWriter(&out)
			if err := w.Write(tc.f); !errors.Is(err, ErrInvalid) {
				t.Fatalf("Write: %v, want ErrInvalid", err)
			}
			if _, err := AppendJSON(nil, tc.f); !errors.Is(err, ErrInvalid) {
				t.Fatalf("AppendJSON: %v, want ErrInvalid", err)
			}
			_ = w.Flush()
			if out.Len() != 0 {
				t.Fatalf("an invalid frame wrote %d bytes", out.Len())
			}
		})
	}
}

func TestReaderDamage(t *testing.T) {
	first := AppendBinary(nil, testFrames()[3].f)
	second := AppendBinary(nil, testFrames()[2].f)
	file := append(append([]byte(nil), first...), second...)
	badMagic := append([]byte(nil), file...)
	badMagic[len(first)] = 'X'
	badVersion := append([]byte(nil), file...)
	badVersion[len(first)+4] = 9
	badBody := append(append([]byte(nil), first...), framed(cat(okHead, body(1, 2), []byte{0x80}))...)
	cases := []struct {
		name   string
		in     []byte
		offset int
		err    error
	}{
		{"truncated header", file[:len(first)+5], len(first) + 5, ErrTruncated},
		{"truncated body", file[:len(file)-3], len(file) - 3, ErrTruncated},
		{"bad magic", badMagic, len(first), ErrMagic},
		{"unknown version", badVersion, len(first) + 4, ErrVersion},
		{"damaged body", badBody, len(first) + 21, ErrLength},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := NewReader(bytes.NewReader(tc.in))
			var g Frame
			if err := r.Next(&g); err != nil {
				t.Fatalf("first frame: %v", err)
			}
			err := r.Next(&g)
			var de *DecodeError
			if !errors.As(err, &de) || !errors.Is(err, tc.err) {
				t.Fatalf("second frame: %v, want a DecodeError with %v", err, tc.err)
			}
			if de.Offset != tc.offset {
				t.Fatalf("error at stream offset %d, want %d (%v)", de.Offset, tc.offset, err)
			}
			if r.Offset() != int64(len(first)) {
				t.Fatalf("Offset() = %d, want %d", r.Offset(), len(first))
			}
			if err2 := r.Next(&g); err2 != err {
				t.Fatalf("errors are not sticky: %v then %v", err, err2)
			}
		})
	}
}

// TestReaderBoundsAllocation: a header declaring a huge body followed by a
// few bytes costs about what is present, not what is declared.
func TestReaderBoundsAllocation(t *testing.T) {
	in := withHeader(make([]byte, 100), MaxFrameSize)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	var g Frame
	err := NewReader(bytes.NewReader(in)).Next(&g)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrTruncated) {
		t.Fatalf("Next: %v, want ErrTruncated", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
		t.Fatalf("reading a 109 byte stream allocated %d bytes", grew)
	}
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("disk on fire") }

func TestReaderIOError(t *testing.T) {
	var g Frame
	err := NewReader(failingReader{}).Next(&g)
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte("disk on fire")) {
		t.Fatalf("Next: %v, want the read error", err)
	}
}

func TestDecodePrelude(t *testing.T) {
	f := Frame{PID: 3, Rank: 70000, Step: 12, TStart: 1 << 40, TEnd: 1<<40 + 999,
		Events: []FuncEvent{{Tid: 0, Kind: Entry, FID: 1, TS: 1 << 40}, {Tid: 0, Kind: Exit, FID: 1, TS: 1<<40 + 5}}}
	whole := AppendBinary(nil, &f)
	tests := []struct {
		name string
		data []byte
		err  error
	}{
		{"whole frame", whole, nil},
		{"its first PreludeSize bytes", whole[:min(len(whole), PreludeSize)], nil},
		{"header and prelude only", whole[:HeaderSize+13], nil},
		{"cut inside the prelude", whole[:HeaderSize+4], ErrTruncated},
		{"cut inside the header", whole[:5], ErrTruncated},
		{"bad magic", append([]byte("XXXX"), whole[4:]...), ErrMagic},
		{"bad version", append(append([]byte(Magic), Version+1), whole[5:]...), ErrVersion},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got Frame
			got.Events = []FuncEvent{{FID: 9}}
			size, err := DecodePrelude(tc.data, &got)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("error %v, want %v", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if size != len(whole) {
				t.Errorf("size %d, want %d", size, len(whole))
			}
			if got.PID != f.PID || got.Rank != f.Rank || got.Step != f.Step || got.TStart != f.TStart || got.TEnd != f.TEnd {
				t.Errorf("prelude %+v, want that of %+v", got, f)
			}
			if len(got.Events) != 0 {
				t.Errorf("events left from before: %v", got.Events)
			}
		})
	}
}
