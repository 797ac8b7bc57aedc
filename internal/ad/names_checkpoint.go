package ad

import (
	"encoding/binary"

	"github.com/kipimo-hpc/kipimo/internal/frame"
)

// The held frames' part of a checkpoint: the frames waiting for their
// names, each in frame's binary encoding behind its length (4 bytes, little
// endian).

// frames writes frames in frame's binary encoding, each length-prefixed.
func (w *ckWriter) frames(fs []*frame.Frame) {
	w.Uvarint(uint64(len(fs)))
	for _, f := range fs {
		start := len(w.B)
		w.B = append(w.B, 0, 0, 0, 0)
		w.B = frame.AppendBinary(w.B, f)
		binary.LittleEndian.PutUint32(w.B[start:], uint32(len(w.B)-start-4))
	}
}

// frames reads frames written by ckWriter.frames.
func (r *ckReader) frames() []*frame.Frame {
	n := r.Count(4 + frame.HeaderSize)
	var fs []*frame.Frame
	for range n {
		b4 := r.Fixed(4)
		if r.Err != nil {
			return nil
		}
		sz := uint64(binary.LittleEndian.Uint32(b4))
		if sz > uint64(len(r.B)-r.Off) {
			r.Fail("held frame of %d bytes with %d left", sz, len(r.B)-r.Off)
			return nil
		}
		b := r.Fixed(int(sz))
		if r.Err != nil {
			return nil
		}
		f := &frame.Frame{}
		if _, err := frame.DecodeBinary(b, f); err != nil {
			r.Off -= len(b)
			r.Fail("held frame: %v", err)
			return nil
		}
		fs = append(fs, f)
	}
	return fs
}
