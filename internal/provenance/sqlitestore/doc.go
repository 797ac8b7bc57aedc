package sqlitestore

import (
	"encoding/binary"
	"errors"
)

// Execution documents are stored compressed, many to a block (package
// docblock has the block format). Each write of up to execRowsPerInsert
// executions stores their documents as one block in the <kind>_docs table;
// each execution's doc column then holds a reference to its place in the
// block. provdb stores the blocks producers send as they came (see
// PrepareBlocks), so a block holds up to execRowsPerInsert documents.
//
// The first byte of a doc column says what it holds:
//
//	'{'   the JSON document itself (stores written before blocks)
//	0x02  a reference: uvarint block id (the rowid in <kind>_docs), uvarint
//	      slot (the document's index in the block)

const docRef = 0x02

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
