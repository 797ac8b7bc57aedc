package frame

import (
	"errors"
	"fmt"
	"strconv"
)

// Sentinel causes wrapped by DecodeError; test them with errors.Is.
var (
	// ErrMagic: the bytes at the start of a binary frame are not the frame magic.
	ErrMagic = errors.New("bad magic (not a kipimo binary frame)")
	// ErrVersion: the frame declares a format version this decoder does not know.
	ErrVersion = errors.New("unsupported format version")
	// ErrTruncated: the input ends before the frame (or a field of it) does.
	ErrTruncated = errors.New("truncated input")
	// ErrLength: the declared frame length disagrees with the frame's content,
	// or exceeds MaxFrameSize.
	ErrLength = errors.New("length mismatch")
	// ErrOverflow: a number (a varint, or a JSON number) does not fit its
	// field, or a varint is longer than 10 bytes.
	ErrOverflow = errors.New("number overflow")
	// ErrCount: a count is larger than the remaining input could hold.
	ErrCount = errors.New("count larger than the remaining input")
	// ErrTrailing: bytes are left inside a frame after its last field.
	ErrTrailing = errors.New("trailing bytes inside frame")
	// ErrInvalid: a field holds a value the format does not allow (an unknown
	// event kind, a thread index out of range, invalid UTF-8, an unknown JSON
	// field...).
	ErrInvalid = errors.New("invalid value")
)

// DecodeError reports malformed input: what is wrong (Err, usually wrapping one
// of the sentinel errors above), in which field, and at which byte offset of
// the input. Offsets are relative to the slice given to DecodeBinary or
// DecodeJSON; a Reader reports offsets from the start of its stream.
type DecodeError struct {
	Offset int    // byte offset of the offending field
	Field  string // field path, e.g. "events[12].ts" or "header.version"
	Err    error  // the cause
}

// Error says what is wrong, in which field and at which byte offset.
func (e *DecodeError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("frame: byte offset %d: %v", e.Offset, e.Err)
	}
	return fmt.Sprintf("frame: %s at byte offset %d: %v", e.Field, e.Offset, e.Err)
}

// Unwrap returns the cause.
func (e *DecodeError) Unwrap() error { return e.Err }

// fld names a field without building a string until an error needs it, so
// the decoders' hot loops do not allocate.
type fld struct {
	sec string // section or field name
	i   int    // element index, or -1
	sub string // field within the element
}

// field names a scalar field.
func field(name string) fld { return fld{name, -1, ""} }

func (f fld) String() string {
	if f.i < 0 {
		if f.sub != "" {
			return f.sec + "." + f.sub
		}
		return f.sec
	}
	s := f.sec + "[" + strconv.Itoa(f.i) + "]"
	if f.sub != "" {
		s += "." + f.sub
	}
	return s
}

func decErr(off int, f fld, err error) *DecodeError {
	return &DecodeError{Offset: off, Field: f.String(), Err: err}
}

// fmtErr wraps a sentinel cause with details.
func fmtErr(cause error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", cause, fmt.Sprintf(format, args...))
}
