package sqlitestore

import (
	_ "embed"
	"errors"
	"fmt"

	"github.com/klauspost/compress/s2"
)

// Execution documents are stored compressed. Each is only a few KiB of JSON
// whose keys and shape repeat from record to record, which compresses
// poorly on its own but well against a dictionary of typical records: S2
// with the dictionary below keeps an anomaly with a 5+5 event window in a
// quarter of its JSON size or less, at a cost of a few microseconds. The
// dictionary is seven records, one per line: four from the test generator
// (storetest) and, from detectors on the synthetic workload, an anomaly on a
// CPU thread, a GPU kernel anomaly and a sampled normal execution.
//
// The first byte of a stored document says how it is stored:
//
//	'{'   plain JSON (stores written before compression, and small kinds)
//	0x01  S2 block compressed against dictionary v1 (docdict-v1.json)
//
// A dictionary, once used, can never change: documents written with it
// need it to be read. A new dictionary gets a new format byte.

//go:embed docdict-v1.json
var dictV1Text []byte

var dictV1 = s2.MakeDict(dictV1Text, nil)

const docS2DictV1 = 0x01

// maxDocLen bounds a document's decoded size, so that a corrupt length
// field cannot make a reader allocate gigabytes. No message that carries a
// record can be this large.
const maxDocLen = 64 << 20

// encodeDoc appends the stored form of the JSON document js to dst.
func encodeDoc(dst, js []byte) []byte {
	dst = append(dst, docS2DictV1)
	n := len(dst)
	need := n + s2.MaxEncodedLen(len(js))
	if cap(dst) < need {
		dst = append(dst[:cap(dst)], make([]byte, need-cap(dst))...)
	}
	enc := dictV1.Encode(dst[n:need], js)
	return dst[:n+len(enc)]
}

// decodeDoc returns the JSON document of a stored one, using buf for it
// when it is large enough.
func decodeDoc(buf, doc []byte) ([]byte, error) {
	if len(doc) == 0 {
		return nil, errors.New("empty stored document")
	}
	switch doc[0] {
	case '{':
		return doc, nil
	case docS2DictV1:
		n, err := s2.DecodedLen(doc[1:])
		if err != nil {
			return nil, fmt.Errorf("stored document: %w", err)
		}
		if n > maxDocLen {
			return nil, fmt.Errorf("stored document: decoded length %d exceeds %d", n, maxDocLen)
		}
		if cap(buf) < n {
			buf = make([]byte, n)
		}
		js, err := dictV1.Decode(buf[:n], doc[1:])
		if err != nil {
			return nil, fmt.Errorf("stored document: %w", err)
		}
		return js, nil
	}
	return nil, fmt.Errorf("stored document: unknown format byte 0x%02x", doc[0])
}
