package frame

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Writer writes binary frames to an io.Writer through a buffer. A binary frame
// file is the plain concatenation of the frames written. Call Flush when done.
// A Writer is not safe for concurrent use.
type Writer struct {
	w   *bufio.Writer
	buf []byte
}

// NewWriter returns a Writer that buffers its output to w.
func NewWriter(w io.Writer) *Writer {
	return &Writer{w: bufio.NewWriterSize(w, 256<<10)}
}

// Write validates f and writes its binary encoding. A frame whose body would
// exceed MaxFrameSize is refused: readers could not take it.
func (w *Writer) Write(f *Frame) error {
	if err := f.Validate(); err != nil {
		return fmt.Errorf("write frame: %w", err)
	}
	w.buf = AppendBinary(w.buf[:0], f)
	if body := len(w.buf) - HeaderSize; body > MaxFrameSize {
		return fmt.Errorf("write frame: %w: body of %d bytes exceeds the %d byte limit", ErrLength, body, MaxFrameSize)
	}
	if _, err := w.w.Write(w.buf); err != nil {
		return fmt.Errorf("write frame: %w", err)
	}
	return nil
}

// Flush writes any buffered data to the underlying writer.
func (w *Writer) Flush() error {
	if err := w.w.Flush(); err != nil {
		return fmt.Errorf("flush frames: %w", err)
	}
	return nil
}

// Reader reads binary frames one at a time from an io.Reader, reusing one
// buffer for all of them. A Reader is not safe for concurrent use.
type Reader struct {
	r      io.Reader
	buf    []byte
	off    int64 // stream offset of the next frame
	last   int64 // stream offset of the frame last returned (or failed)
	frames int   // frames returned so far
	err    error // sticky error
}

// NewReader returns a Reader of the frames in r. It does its own buffering
// per frame; r need not be buffered.
func NewReader(r io.Reader) *Reader {
	return &Reader{r: r}
}

// Offset is the stream offset of the frame last returned by Next, or of the
// frame that failed to decode.
func (r *Reader) Offset() int64 { return r.last }

// Frames is the number of frames Next has returned without error.
func (r *Reader) Frames() int { return r.frames }

// Next decodes the next frame into f (see DecodeBinary for how f is reused).
// It returns io.EOF when the stream ends cleanly between frames, and a
// *DecodeError whose Offset counts from the start of the stream when the
// stream is damaged or ends inside a frame. Errors are sticky.
func (r *Reader) Next(f *Frame) error {
	if r.err != nil {
		return r.err
	}
	r.last = r.off
	err := r.next(f)
	if err != nil {
		var de *DecodeError
		if errors.As(err, &de) {
			c := *de
			c.Offset += int(r.off)
			err = &c
		}
		r.err = err
		return err
	}
	return nil
}

func (r *Reader) next(f *Frame) error {
	if cap(r.buf) < HeaderSize {
		r.buf = make([]byte, HeaderSize, 64<<10)
	}
	hdr := r.buf[:HeaderSize]
	n, err := io.ReadFull(r.r, hdr)
	switch {
	case err == io.EOF:
		return io.EOF
	case err == io.ErrUnexpectedEOF:
		// Let DecodeBinary say whether the magic or the length is short.
		_, derr := DecodeBinary(hdr[:n], f)
		return derr
	case err != nil:
		return fmt.Errorf("read frame header at offset %d: %w", r.off, err)
	}
	size := int(binary.LittleEndian.Uint32(hdr[5:9]))
	if string(hdr[:4]) != Magic || hdr[4] != Version || size > MaxFrameSize {
		_, derr := DecodeBinary(hdr, f)
		return derr
	}
	total := HeaderSize + size
	// Grow in bounded steps so that a damaged length field costs at most
	// about twice the bytes actually present.
	have := HeaderSize
	for have < total {
		if cap(r.buf) == have {
			next := min(total, 2*cap(r.buf))
			nb := make([]byte, have, next)
			copy(nb, r.buf[:have])
			r.buf = nb
		}
		want := min(total, cap(r.buf))
		m, err := io.ReadFull(r.r, r.buf[have:want])
		have += m
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			_, derr := DecodeBinary(r.buf[:have], f)
			return derr
		}
		if err != nil {
			return fmt.Errorf("read frame at offset %d: %w", r.off, err)
		}
	}
	if _, err := DecodeBinary(r.buf[:total], f); err != nil {
		return err
	}
	r.off += int64(total)
	r.frames++
	return nil
}
