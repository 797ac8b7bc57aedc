// Package binio is the byte layer of Kipimo's own binary forms (detector
// checkpoints, pserver snapshots, the statistics types): uvarints (signed
// ones zigzag), floats as their IEEE 754 bits little-endian, strings and
// lists as a uvarint length and their elements, booleans as one byte 0 or
// 1. What each form holds, its framing (magic, version, CRC) and its
// versions are its owner's; this package only reads and writes values.
package binio

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Writer appends values to B.
type Writer struct{ B []byte }

// Uvarint appends v.
func (w *Writer) Uvarint(v uint64) { w.B = binary.AppendUvarint(w.B, v) }

// Varint appends v (zigzag).
func (w *Writer) Varint(v int64) { w.B = binary.AppendVarint(w.B, v) }

// U32 appends v as a uvarint.
func (w *Writer) U32(v uint32) { w.Uvarint(uint64(v)) }

// F64 appends v's bits.
func (w *Writer) F64(v float64) { w.B = binary.LittleEndian.AppendUint64(w.B, math.Float64bits(v)) }

// F32 appends v's bits.
func (w *Writer) F32(v float32) { w.B = binary.LittleEndian.AppendUint32(w.B, math.Float32bits(v)) }

// Byte1 appends v.
func (w *Writer) Byte1(v uint8) { w.B = append(w.B, v) }

// Bool appends 1 for true and 0 for false.
func (w *Writer) Bool(v bool) {
	if v {
		w.B = append(w.B, 1)
	} else {
		w.B = append(w.B, 0)
	}
}

// Str appends s's length and bytes.
func (w *Writer) Str(s string) { w.Uvarint(uint64(len(s))); w.B = append(w.B, s...) }

// Reader reads values from B at Off. The first error sticks in Err (every
// later read returns a zero value), so a decoder reads a whole form and
// checks Err once. A Reader never reads past B and never allocates more
// than B could hold (Count).
type Reader struct {
	B   []byte
	Off int
	Err error
	// Wrap, when set, is wrapped by every error (a sentinel such as a
	// checkpoint's ErrBadCheckpoint).
	Wrap error
}

// Fail records an error at the current offset, unless one is recorded.
func (r *Reader) Fail(format string, args ...any) {
	if r.Err != nil {
		return
	}
	if r.Wrap != nil {
		r.Err = fmt.Errorf("%w: offset %d: %s", r.Wrap, r.Off, fmt.Sprintf(format, args...))
	} else {
		r.Err = fmt.Errorf("offset %d: %s", r.Off, fmt.Sprintf(format, args...))
	}
}

// Uvarint reads a uvarint.
func (r *Reader) Uvarint() uint64 {
	if r.Err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.B[r.Off:])
	if n <= 0 {
		r.Fail("bad or truncated integer")
		return 0
	}
	r.Off += n
	return v
}

// Varint reads a zigzag varint.
func (r *Reader) Varint() int64 {
	if r.Err != nil {
		return 0
	}
	v, n := binary.Varint(r.B[r.Off:])
	if n <= 0 {
		r.Fail("bad or truncated integer")
		return 0
	}
	r.Off += n
	return v
}

// U32 reads a uvarint that must fit 32 bits.
func (r *Reader) U32() uint32 {
	v := r.Uvarint()
	if v > math.MaxUint32 {
		r.Fail("value %d does not fit 32 bits", v)
		return 0
	}
	return uint32(v)
}

// Fixed reads the next n bytes (a view of B).
func (r *Reader) Fixed(n int) []byte {
	if r.Err != nil {
		return nil
	}
	if len(r.B)-r.Off < n {
		r.Fail("truncated: %d bytes wanted, %d left", n, len(r.B)-r.Off)
		return nil
	}
	s := r.B[r.Off : r.Off+n]
	r.Off += n
	return s
}

// F64 reads a float64's bits.
func (r *Reader) F64() float64 {
	if b := r.Fixed(8); b != nil {
		return math.Float64frombits(binary.LittleEndian.Uint64(b))
	}
	return 0
}

// F32 reads a float32's bits.
func (r *Reader) F32() float32 {
	if b := r.Fixed(4); b != nil {
		return math.Float32frombits(binary.LittleEndian.Uint32(b))
	}
	return 0
}

// Byte1 reads one byte.
func (r *Reader) Byte1() uint8 {
	if b := r.Fixed(1); b != nil {
		return b[0]
	}
	return 0
}

// Bool reads a boolean byte, refusing anything but 0 and 1.
func (r *Reader) Bool() bool {
	switch v := r.Byte1(); v {
	case 0:
		return false
	case 1:
		return true
	default:
		r.Fail("boolean byte %d", v)
		return false
	}
}

// Str reads a string.
func (r *Reader) Str() string {
	n := r.Count(1)
	return string(r.Fixed(n))
}

// Count reads a list's length whose elements take at least min bytes each,
// refusing one the bytes left cannot hold.
func (r *Reader) Count(min int) int {
	return r.CountOf(r.Uvarint(), min)
}

// CountOf checks a length n read otherwise as Count does.
func (r *Reader) CountOf(n uint64, min int) int {
	if r.Err != nil {
		return 0
	}
	if left := uint64(len(r.B) - r.Off); n > left/uint64(min) {
		r.Fail("list of %d elements of at least %d bytes with %d bytes left", n, min, left)
		return 0
	}
	return int(n)
}

// Decode reads a value with dec, a decoder of a binary form of its own
// (such as a DecodeBinary method) that returns the bytes it took from the
// front of its argument; an error of dec is recorded as Fail's.
func (r *Reader) Decode(dec func([]byte) (int, error)) {
	if r.Err != nil {
		return
	}
	n, err := dec(r.B[r.Off:])
	if err != nil {
		r.Fail("%v", err)
		return
	}
	r.Off += n
}
