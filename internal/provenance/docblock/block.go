// Package docblock is the compressed form of execution documents: blocks of
// up to MaxDocs JSON documents compressed together with zstd, as the SQLite
// store keeps them (sqlitestore) and as producers send them on the wire
// (the block encoding of an execution batch, Encoder and DecodeMessage,
// specified in schemas/prov-blocks.md). Producers compress, provdb checks
// the blocks and stores them as they came.
//
// One document is a few KiB of JSON whose keys and shape repeat from record
// to record and whose values (function names, timestamps, event ids,
// statistics) repeat across the records of one batch: compressed alone it
// keeps most of its size, compressed with its neighbours it takes about an
// eighth.
//
// A block, decompressed, is a uvarint count n, n uvarint lengths, then the
// n documents one after the other.
package docblock

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync"

	"github.com/klauspost/compress/zstd"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// MaxDocs is the most documents a block holds: the executions of one
// multi-row INSERT of the SQLite store, and the bound a wire block must
// keep.
const MaxDocs = 64

// MaxWireLen bounds the decompressed size of a block of a wire message
// (header and documents).
const MaxWireLen = 16 << 20

// MaxDocLen bounds one execution document (its JSON, decompressed): a
// producer refuses to send a larger one and provdb refuses to store it.
// The detectors' documents take a few KiB.
const MaxDocLen = 4 << 20

// MaxMessageRawLen bounds the decompressed bytes of all the blocks of one
// wire message together, so that a small message cannot make provdb
// decompress much: a message of at most provstream.MaxBatchBytes (1 MiB) holds about 8 MiB of
// documents.
const MaxMessageRawLen = 64 << 20

// MaxLen bounds a stored block's decompressed size, so that a corrupt block
// cannot make a reader allocate gigabytes. No write makes one this large.
const MaxLen = 256 << 20

var (
	// encoder serves as many blocks at once as there are processors. Its
	// output is a function of its input and these settings only, so that
	// a producer that encodes the same documents again sends the same
	// bytes.
	encoder, _ = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest),
		zstd.WithEncoderConcurrency(runtime.GOMAXPROCS(0)), zstd.WithEncoderCRC(false), zstd.WithZeroFrames(true))
	decoder, _ = zstd.NewReader(nil, zstd.WithDecoderConcurrency(0),
		zstd.WithDecoderMaxMemory(MaxLen), zstd.WithDecoderMaxWindow(MaxLen))
	// wireDecoder decodes the blocks of wire messages, which are smaller.
	wireDecoder, _ = zstd.NewReader(nil, zstd.WithDecoderConcurrency(0),
		zstd.WithDecoderMaxMemory(MaxWireLen), zstd.WithDecoderMaxWindow(MaxWireLen))
)

// Compress compresses raw, a block's decompressed bytes, with the block
// settings and appends the result to dst.
func Compress(raw, dst []byte) []byte { return encoder.EncodeAll(raw, dst) }

// Builder assembles the documents of one block. The zero value is an empty
// builder; Reset empties it keeping its memory.
//
// The documents go straight after room left for the block's header (its
// count and lengths), which is written in front of them once they are all
// known, so that the block is compressed where it was built, with no copy.
type Builder struct {
	lens []int
	raw  []byte // headerRoom bytes, then the documents
}

// headerRoom is the room left for a block's header: enough for the count
// and the lengths of MaxDocs documents of any size. A block of more
// documents has its header put in front by a copy.
const headerRoom = binary.MaxVarintLen64 * (1 + MaxDocs)

// Reset empties b.
func (b *Builder) Reset() {
	b.lens = b.lens[:0]
	if len(b.raw) < headerRoom {
		b.raw = make([]byte, headerRoom, headerRoom+64<<10)
	}
	b.raw = b.raw[:headerRoom]
}

// Len is the number of documents in b.
func (b *Builder) Len() int { return len(b.lens) }

// DocBytes is the total size of b's documents.
func (b *Builder) DocBytes() int { return max(0, len(b.raw)-headerRoom) }

// Add appends a document and returns its slot.
func (b *Builder) Add(doc []byte) int {
	if len(b.raw) < headerRoom {
		b.Reset()
	}
	b.lens = append(b.lens, len(doc))
	b.raw = append(b.raw, doc...)
	return len(b.lens) - 1
}

// AppendExec appends e's JSON document (provenance.AppendExecJSON) and
// returns its slot; a document over MaxDocLen is refused (ErrTooLarge).
func (b *Builder) AppendExec(e *provenance.Exec) (int, error) {
	if len(b.raw) < headerRoom {
		b.Reset()
	}
	n := len(b.raw)
	var err error
	if b.raw, err = provenance.AppendExecJSON(b.raw, e); err != nil {
		b.raw = b.raw[:n]
		return 0, err
	}
	if l := len(b.raw) - n; l > MaxDocLen {
		b.raw = b.raw[:n]
		return 0, fmt.Errorf("execution %s: its document of %d bytes exceeds the bound of %d: %w", e.EventID, l, MaxDocLen, ErrTooLarge)
	}
	b.lens = append(b.lens, len(b.raw)-n)
	return len(b.lens) - 1, nil
}

// AppendCompressed appends the compressed block to dst.
func (b *Builder) AppendCompressed(dst []byte) []byte {
	if len(b.raw) < headerRoom {
		b.Reset()
	}
	var h [headerRoom]byte
	hdr := binary.AppendUvarint(h[:0], uint64(len(b.lens)))
	for _, n := range b.lens {
		hdr = binary.AppendUvarint(hdr, uint64(n))
	}
	var raw []byte
	if len(hdr) <= headerRoom {
		raw = b.raw[headerRoom-len(hdr):]
		copy(raw, hdr)
	} else {
		raw = append(hdr, b.raw[headerRoom:]...)
	}
	return encoder.EncodeAll(raw, dst)
}

// Build encodes the documents of group (at most MaxDocs executions) into b,
// appends their compressed block to dst and returns it.
func (b *Builder) Build(dst []byte, group []provenance.Exec) ([]byte, error) {
	b.Reset()
	for i := range group {
		if _, err := b.AppendExec(&group[i]); err != nil {
			return dst, err
		}
	}
	return b.AppendCompressed(dst), nil
}

// Decode decompresses a block and returns its documents, which share one
// allocation.
func Decode(data []byte) ([][]byte, error) {
	raw, err := decoder.DecodeAll(data, nil)
	if err != nil {
		return nil, fmt.Errorf("stored document block: %w", err)
	}
	lens, off, err := header(raw, -1)
	if err != nil {
		return nil, fmt.Errorf("stored document block: %w", err)
	}
	docs := make([][]byte, len(lens))
	for i, l := range lens {
		docs[i] = raw[off : off+l : off+l]
		off += l
	}
	return docs, nil
}

// header reads the header of raw, a decompressed block, and checks that
// its lengths frame the documents exactly: it returns the documents'
// lengths and the offset of the first. want, unless negative, is the count
// the block must have.
func header(raw []byte, want int) ([]int, int, error) {
	n, k := binary.Uvarint(raw)
	// Every document takes at least its length's byte.
	if k <= 0 || n > uint64(len(raw)) {
		return nil, 0, errors.New("bad document count")
	}
	if want >= 0 && n != uint64(want) {
		return nil, 0, fmt.Errorf("%d documents, want %d", n, want)
	}
	lens := make([]int, n)
	off := k
	total := 0
	for i := range lens {
		l, k := binary.Uvarint(raw[off:])
		if k <= 0 || l > uint64(len(raw)) {
			return nil, 0, fmt.Errorf("bad length of document %d", i)
		}
		lens[i] = int(l)
		off += k
		if total += int(l); total > len(raw)-off {
			return nil, 0, fmt.Errorf("document %d runs past the block", i)
		}
	}
	if off+total != len(raw) {
		return nil, 0, errors.New("bytes after the last document")
	}
	return lens, off, nil
}

// rawBufs holds the buffers Message.Check decompresses into.
var rawBufs = sync.Pool{New: func() any { return new([]byte) }}
