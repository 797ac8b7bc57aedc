package otf2

import (
	"errors"
	"fmt"
	"os"
)

// anchorMagic is the string after the anchor file's header.
const anchorMagic = "OTF2"

// Substrates and compressions an anchor file names.
const (
	substratePOSIX  = 1
	compressionNone = 1
)

// maxAnchor bounds the size of an anchor file read into memory.
const maxAnchor = 16 << 20

// Anchor is what an archive's anchor file (traces.otf2) says about it.
type Anchor struct {
	// Version of the OTF2 library that wrote the archive.
	Major, Minor, Bugfix uint8
	// ChunkEvents and ChunkDefs are the chunk sizes of the event and
	// definition files.
	ChunkEvents, ChunkDefs uint64
	// Locations is the number of locations; GlobalDefs the number of
	// global definitions.
	Locations, GlobalDefs uint64
	Machine, Creator      string
	Description           string
	// Properties are the archive's key/value properties (anchor format 2
	// and later).
	Properties map[string]string
}

// ReadAnchor parses the anchor file at path.
func ReadAnchor(path string) (*Anchor, error) {
	ar, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("otf2 anchor: %w", err)
	}
	return ParseAnchor(ar, path)
}

// ParseAnchor parses the bytes of an anchor file; name is for messages.
func ParseAnchor(data []byte, name string) (*Anchor, error) {
	fail := func(off int, err error) error { return &Error{File: name, Offset: int64(off), Err: err} }
	if len(data) < 2 {
		return nil, fail(0, ErrTruncated)
	}
	if data[0] != recChunkHeader {
		return nil, fail(0, fmt.Errorf("not an OTF2 anchor file (first byte 0x%02x, want 0x%02x)", data[0], recChunkHeader))
	}
	d := &dec{b: data, i: 2}
	switch data[1] {
	case littleEndian:
		d.little = true
	case bigEndian:
	default:
		return nil, fail(1, fmt.Errorf("not an OTF2 anchor file (endianness byte 0x%02x)", data[1]))
	}
	at := d.i
	if magic := d.str("magic"); d.err != nil || magic != anchorMagic {
		return nil, fail(at, fmt.Errorf("not an OTF2 anchor file (no %q magic)", anchorMagic))
	}
	a := &Anchor{Properties: map[string]string{}}
	format := d.u8("anchor format")
	d.u8("trace format")
	a.Major, a.Minor, a.Bugfix = d.u8("version"), d.u8("version"), d.u8("version")
	a.ChunkEvents = d.u64full("event chunk size")
	a.ChunkDefs = d.u64full("definition chunk size")
	at = d.i
	substrate := d.u8("file substrate")
	compression := d.u8("compression")
	a.Locations = d.u64full("number of locations")
	a.GlobalDefs = d.u64full("number of global definitions")
	a.Machine = d.str("machine name")
	a.Creator = d.str("creator")
	a.Description = d.str("description")
	if format > 1 && d.err == nil {
		n := d.u32full("number of properties")
		for i := uint32(0); i < n && d.err == nil; i++ {
			k := d.str("property name")
			a.Properties[k] = d.str("property value")
		}
		d.u64full("trace id")
	}
	if d.err != nil {
		if errors.Is(d.err, errShort) {
			return nil, fail(d.i, ErrTruncated)
		}
		return nil, fail(d.i, d.err)
	}
	switch {
	case format == 0:
		return nil, fail(7, errors.New("anchor format 0 is not a valid format"))
	case a.ChunkEvents < chunkHeaderSize+16 || a.ChunkDefs < chunkHeaderSize+16:
		return nil, fail(12, fmt.Errorf("chunk sizes %d (events) and %d (definitions) are too small", a.ChunkEvents, a.ChunkDefs))
	case a.ChunkEvents > 1<<32 || a.ChunkDefs > 1<<32:
		return nil, fail(12, fmt.Errorf("chunk sizes %d (events) and %d (definitions) are absurd", a.ChunkEvents, a.ChunkDefs))
	case substrate != substratePOSIX:
		return nil, fail(at, fmt.Errorf("file substrate %d is not supported (only POSIX files, one per location; SIONlib containers are not read)", substrate))
	case compression != compressionNone:
		return nil, fail(at+1, fmt.Errorf("compression %d is not supported (only uncompressed archives are read)", compression))
	}
	return a, nil
}
