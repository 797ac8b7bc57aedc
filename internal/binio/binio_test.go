package binio

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	var w Writer
	w.Uvarint(1 << 40)
	w.Varint(-5)
	w.U32(7)
	w.F64(math.Inf(-1))
	w.F32(1.5)
	w.Byte1(9)
	w.Bool(true)
	w.Str("rank 3")
	r := Reader{B: w.B}
	if v := r.Uvarint(); v != 1<<40 {
		t.Errorf("uvarint %d", v)
	}
	if v := r.Varint(); v != -5 {
		t.Errorf("varint %d", v)
	}
	if v := r.U32(); v != 7 {
		t.Errorf("u32 %d", v)
	}
	if v := r.F64(); !math.IsInf(v, -1) {
		t.Errorf("f64 %v", v)
	}
	if v := r.F32(); v != 1.5 {
		t.Errorf("f32 %v", v)
	}
	if v := r.Byte1(); v != 9 {
		t.Errorf("byte %d", v)
	}
	if !r.Bool() {
		t.Error("bool false")
	}
	if v := r.Str(); v != "rank 3" {
		t.Errorf("str %q", v)
	}
	if r.Err != nil || r.Off != len(w.B) {
		t.Errorf("err %v, read %d of %d bytes", r.Err, r.Off, len(w.B))
	}
}

var errBad = errors.New("bad form")

func TestErrorsStick(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    []byte
		read func(r *Reader)
		want string
	}{
		{"truncated integer", []byte{0x80}, func(r *Reader) { r.Uvarint() }, "offset 0: bad or truncated integer"},
		{"boolean byte", []byte{2}, func(r *Reader) { r.Bool() }, "boolean byte 2"},
		{"count beyond the bytes", []byte{100, 1, 2}, func(r *Reader) { r.Count(1) }, "list of 100 elements"},
		{"u32 overflow", []byte{0xff, 0xff, 0xff, 0xff, 0x1f}, func(r *Reader) { r.U32() }, "does not fit 32 bits"},
		{"short float", []byte{1, 2, 3}, func(r *Reader) { r.F64() }, "truncated: 8 bytes wanted, 3 left"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := Reader{B: tc.b, Wrap: errBad}
			tc.read(&r)
			if r.Err == nil || !errors.Is(r.Err, errBad) || !strings.Contains(r.Err.Error(), tc.want) {
				t.Fatalf("err = %v, want one wrapping %v and saying %q", r.Err, errBad, tc.want)
			}
			first := r.Err
			if r.Uvarint() != 0 || r.Str() != "" || r.Err != first {
				t.Error("a read after an error returned a value or replaced the error")
			}
		})
	}
}

// FuzzReader reads arbitrary bytes as a sequence of values: never a panic,
// never past the end, and a count never larger than the bytes left.
func FuzzReader(f *testing.F) {
	var w Writer
	w.Str("x")
	w.Uvarint(3)
	w.F64(2)
	f.Add(w.B)
	f.Add([]byte{0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := Reader{B: b}
		for r.Err == nil && r.Off < len(b) {
			left := len(b) - r.Off
			if n := r.Count(1); r.Err == nil && n > left {
				t.Fatalf("count %d with %d bytes left", n, left)
			}
			r.Str()
			r.Bool()
			r.F32()
			r.Varint()
		}
		if r.Off > len(b) {
			t.Fatalf("read to %d of %d bytes", r.Off, len(b))
		}
	})
}

func TestDecode(t *testing.T) {
	// a form of its own: a length byte and that many bytes
	var got []string
	dec := func(b []byte) (int, error) {
		if len(b) == 0 || int(b[0]) >= len(b) {
			return 0, errors.New("short form")
		}
		got = append(got, string(b[1:1+b[0]]))
		return 1 + int(b[0]), nil
	}
	r := Reader{B: []byte("\x02ab\x01c\x05de")}
	r.Decode(dec)
	r.Decode(dec)
	if r.Err != nil || r.Off != 5 || strings.Join(got, ",") != "ab,c" {
		t.Fatalf("read %q to offset %d, err %v", got, r.Off, r.Err)
	}
	r.Decode(dec)
	if r.Err == nil || !strings.Contains(r.Err.Error(), "offset 5: short form") || r.Off != 5 {
		t.Fatalf("a refused form: offset %d, err %v", r.Off, r.Err)
	}
	r.Decode(func([]byte) (int, error) { t.Fatal("decoder called after an error"); return 0, nil })
}
