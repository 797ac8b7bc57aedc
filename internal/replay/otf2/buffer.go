package otf2

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
)

// Error is a problem at a place in an OTF2 file.
type Error struct {
	File   string
	Offset int64 // byte offset of the record (or field) that is wrong
	Err    error
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s: byte offset %d: %v", e.File, e.Offset, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// ErrTruncated is wrapped when a file ends inside a chunk header or record.
var ErrTruncated = errors.New("file ends inside a record (truncated)")

// Buffer records every OTF2 file is made of, below the definition and event
// records.
const (
	recEndOfChunk  = 0
	recEndOfBuffer = 1
	recEndOfFile   = 2
	recChunkHeader = 3
	recTimestamp   = 5
	recAttributes  = 6
)

// Endianness bytes of a chunk header.
const (
	bigEndian    = 0x23
	littleEndian = 0x42
)

// chunkHeaderSize is the size of the header of a chunked file's chunk: record
// id, endianness, first and last event number.
const chunkHeaderSize = 18

// chunkReader reads the records of one chunked OTF2 file (definitions or
// events) in order, through a small buffer: records never span chunks, the
// unused tail of each chunk is skipped.
type chunkReader struct {
	name    string
	r       *bufio.Reader
	chunk   int64 // chunk size
	off     int64 // file offset of the next byte
	start   int64 // file offset of the current chunk
	little  bool
	begun   bool
	recOff  int64 // file offset of the current record
	scratch []byte
	small   [9]byte // a singleton record's compressed integer
}

func newChunkReader(name string, r io.Reader, chunkSize int64, buf int) *chunkReader {
	return &chunkReader{name: name, r: bufio.NewReaderSize(r, buf), chunk: chunkSize}
}

func (c *chunkReader) fail(off int64, format string, args ...any) error {
	return &Error{File: c.name, Offset: off, Err: fmt.Errorf(format, args...)}
}

func (c *chunkReader) truncated(off int64) error {
	return &Error{File: c.name, Offset: off, Err: ErrTruncated}
}

// left is the number of bytes of the current chunk after off.
func (c *chunkReader) left() int64 { return c.start + c.chunk - c.off }

func (c *chunkReader) readByte() (byte, error) {
	if c.left() <= 0 {
		return 0, c.fail(c.recOff, "record runs past the end of its %d-byte chunk", c.chunk)
	}
	b, err := c.r.ReadByte()
	if err != nil {
		return 0, c.truncated(c.recOff)
	}
	c.off++
	return b, nil
}

func (c *chunkReader) readFull(n int64) ([]byte, error) {
	if n > c.left() {
		return nil, c.fail(c.recOff, "record of %d bytes runs past the end of its %d-byte chunk", n, c.chunk)
	}
	if n > bigRecord {
		// Grow with the data actually read, so a corrupt length cannot
		// allocate more than the file holds.
		var buf bytes.Buffer
		if k, err := io.CopyN(&buf, c.r, n); err != nil || k < n {
			return nil, c.truncated(c.recOff)
		}
		c.off += n
		return buf.Bytes(), nil
	}
	if int64(cap(c.scratch)) < n {
		c.scratch = make([]byte, n)
	}
	buf := c.scratch[:n]
	if _, err := io.ReadFull(c.r, buf); err != nil {
		return nil, c.truncated(c.recOff)
	}
	c.off += n
	return buf, nil
}

// bigRecord is the size above which a record is read without allocating
// its whole length first.
const bigRecord = 1 << 20

func (c *chunkReader) u64full() (uint64, error) {
	b, err := c.readFull(8)
	if err != nil {
		return 0, err
	}
	if c.little {
		return binary.LittleEndian.Uint64(b), nil
	}
	return binary.BigEndian.Uint64(b), nil
}

// header reads the chunk header at the start of a chunk; io.EOF when the
// file ends cleanly before it.
func (c *chunkReader) header() error {
	c.start = c.off
	c.recOff = c.off
	b, err := c.r.ReadByte()
	if err == io.EOF {
		return io.EOF
	}
	if err != nil {
		return &Error{File: c.name, Offset: c.off, Err: err}
	}
	c.off++
	if b != recChunkHeader {
		return c.fail(c.recOff, "chunk %d does not start with a chunk header (record id %d, want %d): not an OTF2 file, or a wrong chunk size", c.start/c.chunk, b, recChunkHeader)
	}
	e, err := c.readByte()
	if err != nil {
		return err
	}
	switch e {
	case littleEndian:
		c.little = true
	case bigEndian:
		c.little = false
	default:
		return c.fail(c.recOff+1, "invalid endianness byte 0x%02x", e)
	}
	// First and last event number of the chunk.
	if _, err := c.readFull(16); err != nil {
		return err
	}
	return nil
}

// next returns the id of the next record (after any timestamp record, whose
// value is stored in ts when events is set) or io.EOF at the end of the file.
func (c *chunkReader) next(events bool, ts *uint64) (byte, error) {
	if !c.begun {
		c.begun = true
		if err := c.header(); err != nil {
			if err == io.EOF {
				return 0, c.fail(0, "empty file")
			}
			return 0, err
		}
	}
	for {
		if c.left() <= 0 {
			if err := c.header(); err != nil {
				return 0, err
			}
		}
		c.recOff = c.off
		b, err := c.readByte()
		if err != nil {
			return 0, err
		}
		switch {
		case b == recEndOfChunk:
			// Skip the unused rest of the chunk; a short last chunk ends
			// the file.
			n := c.left()
			d, _ := c.r.Discard(int(n))
			c.off += int64(d)
			if int64(d) < n {
				return 0, io.EOF
			}
		case b == recEndOfFile:
			return 0, io.EOF
		case b == recTimestamp && events:
			v, err := c.u64full()
			if err != nil {
				return 0, err
			}
			*ts = v
		case b == recEndOfBuffer || b == recChunkHeader:
			return 0, c.fail(c.recOff, "unexpected buffer record %d", b)
		default:
			return b, nil
		}
	}
}

// payload reads the body of a record with a length (one byte, or 0xff and
// eight bytes).
func (c *chunkReader) payload() ([]byte, error) {
	l, err := c.readByte()
	if err != nil {
		return nil, err
	}
	n := int64(l)
	if l == 0xff {
		v, err := c.u64full()
		if err != nil {
			return nil, err
		}
		if v > uint64(max(c.left(), 0)) {
			return nil, c.fail(c.recOff, "record of %d bytes runs past the end of its %d-byte chunk", v, c.chunk)
		}
		n = int64(v)
	}
	return c.readFull(n)
}

// compressed reads the one compressed integer of a record without a length
// (the singleton events: Enter, Leave...), as a payload of its own.
func (c *chunkReader) compressed() ([]byte, error) {
	l, err := c.readByte()
	if err != nil {
		return nil, err
	}
	c.small[0] = l
	if l == 0 || l == 0xff {
		return c.small[:1], nil
	}
	if l > 8 {
		return nil, c.fail(c.recOff, "invalid size %d in compressed length byte", l)
	}
	b, err := c.readFull(int64(l))
	if err != nil {
		return nil, err
	}
	return c.small[:1+copy(c.small[1:], b)], nil
}

// errShort is wrapped when a record ends before its fields do.
var errShort = errors.New("record too short")

// dec decodes the fields of one record payload. The first error sticks;
// reading past the end is an error.
type dec struct {
	b      []byte
	i      int
	little bool
	err    error
}

func (d *dec) short(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w for its %s (%d bytes)", errShort, what, len(d.b))
	}
}

func (d *dec) more() bool { return d.err == nil && d.i < len(d.b) }

func (d *dec) u8(what string) uint8 {
	if d.err != nil || d.i >= len(d.b) {
		d.short(what)
		return 0
	}
	v := d.b[d.i]
	d.i++
	return v
}

// uint reads a compressed unsigned integer of at most size bytes: a length
// byte (0: zero, 0xff: all ones) and that many low-order bytes.
func (d *dec) uint(size int, what string) uint64 {
	l := d.u8(what)
	if d.err != nil {
		return 0
	}
	switch {
	case l == 0:
		return 0
	case l == 0xff:
		if size == 4 {
			return math.MaxUint32
		}
		return math.MaxUint64
	case int(l) > size:
		d.err = fmt.Errorf("invalid size %d in the compressed length byte of its %s", l, what)
		return 0
	case d.i+int(l) > len(d.b):
		d.short(what)
		return 0
	}
	var v uint64
	raw := d.b[d.i : d.i+int(l)]
	d.i += int(l)
	if d.little {
		for k := len(raw) - 1; k >= 0; k-- {
			v = v<<8 | uint64(raw[k])
		}
	} else {
		for _, x := range raw {
			v = v<<8 | uint64(x)
		}
	}
	return v
}

func (d *dec) u32(what string) uint32 { return uint32(d.uint(4, what)) }
func (d *dec) u64(what string) uint64 { return d.uint(8, what) }

// i64 reads a compressed signed integer: negative values are written in
// full, so the bytes read are the value's two's complement.
func (d *dec) i64(what string) int64 {
	if d.err == nil && d.i < len(d.b) && d.b[d.i] == 0xff {
		d.err = fmt.Errorf("invalid size 255 in the compressed length byte of its %s", what)
		return 0
	}
	return int64(d.uint(8, what))
}

func (d *dec) full(n int, what string) []byte {
	if d.err != nil || d.i+n > len(d.b) {
		d.short(what)
		return make([]byte, n)
	}
	v := d.b[d.i : d.i+n]
	d.i += n
	return v
}

func (d *dec) u64full(what string) uint64 {
	b := d.full(8, what)
	if d.little {
		return binary.LittleEndian.Uint64(b)
	}
	return binary.BigEndian.Uint64(b)
}

func (d *dec) u32full(what string) uint32 {
	b := d.full(4, what)
	if d.little {
		return binary.LittleEndian.Uint32(b)
	}
	return binary.BigEndian.Uint32(b)
}

// str reads a NUL-terminated string.
func (d *dec) str(what string) string {
	if d.err != nil {
		return ""
	}
	for k := d.i; k < len(d.b); k++ {
		if d.b[k] == 0 {
			s := string(d.b[d.i:k])
			d.i = k + 1
			return s
		}
	}
	d.err = fmt.Errorf("its %s has no terminating NUL byte", what)
	return ""
}
