package sqlitestore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"

	"github.com/klauspost/compress/zstd"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// Execution documents are stored compressed, many to a block. One is a few
// KiB of JSON whose keys and shape repeat from record to record and whose
// values (function names, timestamps, event ids, statistics) repeat across
// the records of one batch: compressed alone it keeps most of its size,
// compressed with its neighbours it takes about an eighth. Each write of up
// to execRowsPerInsert executions stores their documents as one zstd block
// in the <kind>_docs table; each execution's doc column then holds a
// reference to its place in the block.
//
// The first byte of a doc column says what it holds:
//
//	'{'   the JSON document itself (stores written before blocks)
//	0x02  a reference: uvarint block id (the rowid in <kind>_docs), uvarint
//	      slot (the document's index in the block)
//
// A block, decompressed, is a uvarint count n, n uvarint lengths, then the
// n documents one after the other.

const docRef = 0x02

// maxBlockLen bounds a block's decompressed size, so that a corrupt block
// cannot make a reader allocate gigabytes. No write makes one this large.
const maxBlockLen = 256 << 20

var (
	// blockEncoder serves as many blocks at once as there are processors
	// (Prepare runs on several goroutines).
	blockEncoder, _ = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest),
		zstd.WithEncoderConcurrency(runtime.GOMAXPROCS(0)), zstd.WithEncoderCRC(false), zstd.WithZeroFrames(true))
	blockDecoder, _ = zstd.NewReader(nil, zstd.WithDecoderConcurrency(0),
		zstd.WithDecoderMaxMemory(maxBlockLen), zstd.WithDecoderMaxWindow(maxBlockLen))
)

// blockBuilder assembles the documents of one block. The zero value is an
// empty builder; reset empties it keeping its memory.
//
// The documents go straight after room left for the block's header (its
// count and lengths), which is written in front of them once they are all
// known, so that the block is compressed where it was built, with no copy.
type blockBuilder struct {
	lens []int
	raw  []byte // headerRoom bytes, then the documents
}

// headerRoom is the room left for a block's header: enough for the count
// and the lengths of execRowsPerInsert documents of any size. A block of
// more documents has its header put in front by a copy.
const headerRoom = binary.MaxVarintLen64 * (1 + execRowsPerInsert)

func (b *blockBuilder) reset() {
	b.lens = b.lens[:0]
	if len(b.raw) < headerRoom {
		b.raw = make([]byte, headerRoom, headerRoom+64<<10)
	}
	b.raw = b.raw[:headerRoom]
}

// add appends a document and returns its slot.
func (b *blockBuilder) add(doc []byte) int {
	if len(b.raw) < headerRoom {
		b.reset()
	}
	b.lens = append(b.lens, len(doc))
	b.raw = append(b.raw, doc...)
	return len(b.lens) - 1
}

// appendExec appends e's JSON document and returns its slot.
func (b *blockBuilder) appendExec(e *provenance.Exec) (int, error) {
	if len(b.raw) < headerRoom {
		b.reset()
	}
	n := len(b.raw)
	var err error
	if b.raw, err = provenance.AppendExecJSON(b.raw, e); err != nil {
		b.raw = b.raw[:n]
		return 0, err
	}
	b.lens = append(b.lens, len(b.raw)-n)
	return len(b.lens) - 1, nil
}

// appendCompressed appends the compressed block to dst.
func (b *blockBuilder) appendCompressed(dst []byte) []byte {
	if len(b.raw) < headerRoom {
		b.reset()
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
	return blockEncoder.EncodeAll(raw, dst)
}

// build encodes the documents of group (at most execRowsPerInsert
// executions) into b, appends their compressed block to dst and returns it.
func (b *blockBuilder) build(dst []byte, group []provenance.Exec) ([]byte, error) {
	b.reset()
	for i := range group {
		if _, err := b.appendExec(&group[i]); err != nil {
			return dst, err
		}
	}
	return b.appendCompressed(dst), nil
}

// appendRef appends the doc column value referring to slot of block id.
func appendRef(dst []byte, id int64, slot int) []byte {
	dst = append(dst, docRef)
	dst = binary.AppendUvarint(dst, uint64(id))
	return binary.AppendUvarint(dst, uint64(slot))
}

// parseRef reads a doc column value that refers to a block.
func parseRef(doc []byte) (id int64, slot int, err error) {
	if len(doc) == 0 || doc[0] != docRef {
		return 0, 0, errors.New("stored document: not a block reference")
	}
	v, n := binary.Uvarint(doc[1:])
	if n <= 0 || v > 1<<62 {
		return 0, 0, errors.New("stored document: bad block id in reference")
	}
	s, m := binary.Uvarint(doc[1+n:])
	if m <= 0 || 1+n+m != len(doc) || s >= 1<<31 {
		return 0, 0, errors.New("stored document: bad slot in reference")
	}
	return int64(v), int(s), nil
}

// decodeBlock decompresses a block and returns its documents, which share
// one allocation.
func decodeBlock(data []byte) ([][]byte, error) {
	raw, err := blockDecoder.DecodeAll(data, nil)
	if err != nil {
		return nil, fmt.Errorf("stored document block: %w", err)
	}
	n, k := binary.Uvarint(raw)
	// Every document takes at least its length's byte.
	if k <= 0 || n > uint64(len(raw)) {
		return nil, errors.New("stored document block: bad document count")
	}
	docs := make([][]byte, n)
	off := k
	lens := make([]int, n)
	for i := range lens {
		l, k := binary.Uvarint(raw[off:])
		if k <= 0 || l > uint64(len(raw)) {
			return nil, fmt.Errorf("stored document block: bad length of document %d", i)
		}
		lens[i] = int(l)
		off += k
	}
	for i, l := range lens {
		if l > len(raw)-off {
			return nil, fmt.Errorf("stored document block: document %d runs past the block", i)
		}
		docs[i] = raw[off : off+l : off+l]
		off += l
	}
	if off != len(raw) {
		return nil, errors.New("stored document block: bytes after the last document")
	}
	return docs, nil
}
