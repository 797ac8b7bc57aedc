package docblock

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"unicode/utf8"

	"github.com/klauspost/compress/zstd"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// The block encoding of an execution batch (schemas/prov-blocks.md): the
// columns the stores index, one row per execution, then the executions'
// documents in compressed blocks of the stored form. The SQLite store
// keeps the blocks as they came; a store that keeps decoded records reads
// the documents.

// replacement is how AppendExecJSON writes a byte of a string that is not
// valid UTF-8.
var replacement = []byte(`\ufffd`)

// magic and version open a message.
var magic = [5]byte{'K', 'P', 'E', 'B', 1}

// minRowLen is the fewest bytes a row takes: one per varint and per byte
// field, a one-byte length for the event id, 8 for the score.
const minRowLen = 12 + 8

// Row is the indexed columns of one execution: what the stores filter,
// sort and deduplicate on, read without its document.
type Row struct {
	PID              uint32
	EventID          string
	RID, TID, FID    uint32
	Func             string
	IOStep           uint64
	Entry, Exit      uint64
	RuntimeTotal     uint64
	RuntimeExclusive uint64
	OutlierScore     float64
	IsGPUEvent       bool
}

// RowOf is e's row.
func RowOf(e *provenance.Exec) Row {
	return Row{PID: e.PID, EventID: e.EventID, RID: e.RID, TID: e.TID, FID: e.FID, Func: e.Func, IOStep: e.IOStep,
		Entry: e.Entry, Exit: e.Exit, RuntimeTotal: e.RuntimeTotal, RuntimeExclusive: e.RuntimeExclusive,
		OutlierScore: e.OutlierScore, IsGPUEvent: e.IsGPUEvent}
}

// Block is one compressed block of a message: N documents.
type Block struct {
	N    int
	Data []byte
}

// Encoder builds one message of the block encoding, record by record. The
// zero value is an empty encoder. The same records added with the same
// limits give the same bytes.
type Encoder struct {
	n       int
	names   map[string]int
	dict    []byte // the function names, encoded
	nnames  int
	rows    []byte
	blocks  []byte // the closed blocks, framed
	nblocks int
	pending Builder // the block being filled
	doc     []byte  // scratch: the document being added
	row     []byte  // scratch: the row being added
}

// Len is the number of records added since the last Reset.
func (e *Encoder) Len() int { return e.n }

// Reset empties e, keeping its memory.
func (e *Encoder) Reset() {
	e.n, e.nnames, e.nblocks = 0, 0, 0
	clear(e.names)
	e.dict, e.rows, e.blocks = e.dict[:0], e.rows[:0], e.blocks[:0]
	e.pending.Reset()
}

// Add appends x, unless the message would then exceed limit bytes (when
// limit > 0): it returns false then, and the message is to be finished
// before x is added to the next one. A record that alone would exceed
// limit, or one that is not valid (provenance.Exec.Validate, or a number
// JSON cannot hold), is an error. Arrays left nil are sent empty, as a
// JSON batch's decoder would have made them.
func (e *Encoder) Add(x *provenance.Exec, limit int) (bool, error) {
	if err := x.Validate(); err != nil {
		return false, fmt.Errorf("encode execution: %w", err)
	}
	c := normalized(x)
	var err error
	if e.doc, err = provenance.AppendExecJSON(e.doc[:0], &c); err != nil {
		return false, fmt.Errorf("encode execution %s: %w", c.EventID, err)
	}
	if bytes.Contains(e.doc, replacement) {
		// A string that is not valid UTF-8 was written with its bad bytes
		// as \ufffd escapes; a JSON batch's decoder would have read them
		// as U+FFFD and written that character itself. Send what it would
		// have stored, and the columns of the record it would have read.
		var y provenance.Exec
		if err := provenance.DecodeExec(e.doc, &y); err != nil {
			return false, fmt.Errorf("encode execution %s: %w", c.EventID, err)
		}
		y.Normalize()
		c = y
		if e.doc, err = provenance.AppendExecJSON(e.doc[:0], &c); err != nil {
			return false, fmt.Errorf("encode execution %s: %w", c.EventID, err)
		}
	}
	if len(e.doc) > MaxDocLen {
		return false, fmt.Errorf("encode execution %s: its document of %d bytes exceeds the bound of %d: %w", c.EventID, len(e.doc), MaxDocLen, ErrTooLarge)
	}
	fn := c.Func
	idx, known := e.names[fn]
	dictGrow := 0
	if !known {
		idx = e.nnames
		dictGrow = uvarintLen(uint64(len(fn))) + len(fn)
	}
	e.row = appendRow(e.row[:0], &c, fn, idx)
	// A block closes at MaxDocs documents, or before MaxWireLen bytes.
	closeFirst := e.pending.Len() > 0 && rawBound(e.pending.Len()+1, e.pending.DocBytes()+len(e.doc)) > MaxWireLen
	if limit > 0 {
		size := len(magic) + 3*binary.MaxVarintLen64 + len(e.dict) + dictGrow + len(e.rows) + len(e.row) + len(e.blocks)
		if closeFirst {
			size += blockBound(e.pending.Len(), e.pending.DocBytes()) + blockBound(1, len(e.doc))
		} else {
			size += blockBound(e.pending.Len()+1, e.pending.DocBytes()+len(e.doc))
		}
		if size > limit {
			if e.n == 0 {
				return false, fmt.Errorf("encode execution %s: %d bytes exceed the batch limit %d", c.EventID, size, limit)
			}
			return false, nil
		}
	}
	if closeFirst {
		e.closeBlock()
	}
	if !known {
		if e.names == nil {
			e.names = map[string]int{}
		}
		e.names[fn] = idx
		e.nnames++
		e.dict = appendString(e.dict, fn)
	}
	e.rows = append(e.rows, e.row...)
	e.pending.Add(e.doc)
	e.n++
	if e.pending.Len() == MaxDocs {
		e.closeBlock()
	}
	return true, nil
}

// rawBound bounds the decompressed size of a block of n documents of
// docBytes bytes in all.
func rawBound(n, docBytes int) int { return (n+1)*binary.MaxVarintLen64 + docBytes }

// blockBound bounds the bytes a block of n documents of docBytes bytes
// takes in a message: its framing and its compressed form, which zstd makes
// at most a little larger than the input when it cannot compress it.
func blockBound(n, docBytes int) int {
	if n == 0 {
		return 0
	}
	raw := rawBound(n, docBytes)
	return 2*binary.MaxVarintLen64 + raw + raw>>7 + 64
}

// closeBlock compresses the pending block into the message.
func (e *Encoder) closeBlock() {
	if e.pending.Len() == 0 {
		return
	}
	e.blocks = binary.AppendUvarint(e.blocks, uint64(e.pending.Len()))
	// The compressed block is appended after room for its length, then
	// moved if the length takes fewer bytes than the room.
	at := len(e.blocks)
	e.blocks = append(e.blocks, make([]byte, binary.MaxVarintLen64)...)
	e.blocks = e.pending.AppendCompressed(e.blocks)
	z := len(e.blocks) - at - binary.MaxVarintLen64
	var l [binary.MaxVarintLen64]byte
	ll := binary.PutUvarint(l[:], uint64(z))
	copy(e.blocks[at:], l[:ll])
	copy(e.blocks[at+ll:], e.blocks[at+binary.MaxVarintLen64:])
	e.blocks = e.blocks[:at+ll+z]
	e.nblocks++
	e.pending.Reset()
}

// Finish closes the block being filled and appends the message of the
// records added so far to dst. The records stay: Reset empties the
// encoder once the message is sent, and records added before that go to
// new blocks of the same message.
func (e *Encoder) Finish(dst []byte) []byte {
	e.closeBlock()
	dst = append(dst, magic[:]...)
	dst = binary.AppendUvarint(dst, uint64(e.n))
	dst = binary.AppendUvarint(dst, uint64(e.nnames))
	dst = append(dst, e.dict...)
	dst = append(dst, e.rows...)
	dst = binary.AppendUvarint(dst, uint64(e.nblocks))
	return append(dst, e.blocks...)
}

// normalized is a copy of x with its nil arrays made empty (x itself, and
// what it points to, are left as they are).
func normalized(x *provenance.Exec) provenance.Exec {
	c := *x
	if c.GPUParent != nil && c.GPUParent.CallStack == nil {
		p := *c.GPUParent
		c.GPUParent = &p
	}
	c.Normalize()
	return c
}

func appendRow(dst []byte, x *provenance.Exec, fn string, idx int) []byte {
	dst = binary.AppendUvarint(dst, uint64(x.PID))
	dst = appendString(dst, x.EventID)
	dst = binary.AppendUvarint(dst, uint64(x.RID))
	dst = binary.AppendUvarint(dst, uint64(x.TID))
	dst = binary.AppendUvarint(dst, uint64(x.FID))
	dst = binary.AppendUvarint(dst, uint64(idx))
	dst = binary.AppendUvarint(dst, x.IOStep)
	dst = binary.AppendUvarint(dst, x.Entry)
	dst = binary.AppendUvarint(dst, zigzag(x.Exit-x.Entry))
	dst = binary.AppendUvarint(dst, x.RuntimeTotal)
	dst = binary.AppendUvarint(dst, x.RuntimeExclusive)
	dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(x.OutlierScore))
	if x.IsGPUEvent {
		return append(dst, 1)
	}
	return append(dst, 0)
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func uvarintLen(v uint64) int {
	var b [binary.MaxVarintLen64]byte
	return binary.PutUvarint(b[:], v)
}

// zigzag maps the difference d (of two uint64, modulo 2^64, read as an
// int64) to a uvarint's value: 0, -1, 1, -2 … to 0, 1, 2, 3 ….
func zigzag(d uint64) uint64 { return d<<1 ^ uint64(int64(d)>>63) }

func unzigzag(z uint64) uint64 { return z>>1 ^ -(z & 1) }

// Message is a decoded message of the block encoding: its rows and, in
// their order, the blocks of their documents (the first block holds the
// documents of the first Blocks[0].N rows, and so on). Blocks alias the
// message's bytes.
type Message struct {
	Rows    []Row
	Blocks  []Block
	checked bool
}

// Checked reports whether Check passed on m.
func (m *Message) Checked() bool { return m.checked }

// reader reads a message, remembering the first error.
type reader struct {
	b   []byte
	i   int
	err error
}

func (r *reader) fail(field string, format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("decode block batch: %s at offset %d: %s", field, r.i, fmt.Sprintf(format, args...))
	}
}

func (r *reader) uvarint(field string) uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b[r.i:])
	if n <= 0 {
		if n == 0 {
			r.fail(field, "truncated")
		} else {
			r.fail(field, "varint beyond 64 bits")
		}
		return 0
	}
	r.i += n
	return v
}

func (r *reader) u32(field string) uint32 {
	v := r.uvarint(field)
	if v > math.MaxUint32 {
		r.fail(field, "%d does not fit in 32 bits", v)
	}
	return uint32(v)
}

// count reads a count of items of at least minLen bytes each.
func (r *reader) count(field string, minLen int) int {
	v := r.uvarint(field)
	if r.err == nil && v > uint64((len(r.b)-r.i)/minLen) {
		r.fail(field, "%d items cannot fit in the %d bytes left", v, len(r.b)-r.i)
		return 0
	}
	return int(v)
}

func (r *reader) bytes(field string) []byte {
	n := r.uvarint(field)
	if r.err == nil && n > uint64(len(r.b)-r.i) {
		r.fail(field, "%d bytes run past the message", n)
	}
	if r.err != nil {
		return nil
	}
	b := r.b[r.i : r.i+int(n) : r.i+int(n)]
	r.i += int(n)
	return b
}

// DecodeMessage decodes a message of the block encoding: the rows, each
// checked as DecodeBatch checks a record (its event id, exit not before
// entry) and the blocks' framing. The blocks themselves are checked by
// Check, or read by Execs.
func DecodeMessage(data []byte) (*Message, error) {
	if len(data) < len(magic) || [4]byte(data[:4]) != [4]byte(magic[:4]) {
		return nil, errors.New("decode block batch: not a block batch (magic)")
	}
	if data[4] != magic[4] {
		return nil, fmt.Errorf("decode block batch: unknown version %d", data[4])
	}
	r := &reader{b: data, i: len(magic)}
	n := r.count("records", minRowLen)
	if r.err == nil && n == 0 {
		r.fail("records", "no records")
	}
	nf := r.count("funcs", 1)
	names := make([]string, nf)
	for i := range names {
		s := r.bytes("funcs")
		if r.err == nil && !utf8.Valid(s) {
			r.fail("funcs", "name %d is not UTF-8", i)
		}
		names[i] = string(s)
	}
	if r.err == nil && n > (len(data)-r.i)/minRowLen {
		r.fail("records", "%d records cannot fit in the %d bytes left", n, len(data)-r.i)
	}
	if r.err != nil {
		return nil, r.err
	}
	rows := make([]Row, n)
	// The event ids share one allocation.
	ids := make([]byte, 0, 16*n)
	ends := make([]int, n)
	for i := range rows {
		if r.err != nil {
			break
		}
		w := &rows[i]
		w.PID = r.u32("pid")
		ids = append(ids, r.bytes("event_id")...)
		ends[i] = len(ids)
		w.RID = r.u32("rid")
		w.TID = r.u32("tid")
		w.FID = r.u32("fid")
		f := r.uvarint("func")
		if r.err == nil && f >= uint64(len(names)) {
			r.fail("func", "index %d beyond the %d names", f, len(names))
		}
		if r.err == nil {
			w.Func = names[f]
		}
		w.IOStep = r.uvarint("io_step")
		w.Entry = r.uvarint("entry")
		w.Exit = w.Entry + unzigzag(r.uvarint("exit"))
		w.RuntimeTotal = r.uvarint("runtime_total")
		w.RuntimeExclusive = r.uvarint("runtime_exclusive")
		if r.err == nil && len(data)-r.i < 9 {
			r.fail("outlier_score", "truncated")
		}
		if r.err != nil {
			break
		}
		w.OutlierScore = math.Float64frombits(binary.LittleEndian.Uint64(data[r.i:]))
		if math.IsNaN(w.OutlierScore) || math.IsInf(w.OutlierScore, 0) {
			r.fail("outlier_score", "not a finite number")
		}
		r.i += 8
		switch data[r.i] {
		case 0:
		case 1:
			w.IsGPUEvent = true
		default:
			r.fail("is_gpu_event", "byte %d is neither 0 nor 1", data[r.i])
		}
		r.i++
	}
	if r.err != nil {
		return nil, r.err
	}
	all := string(ids)
	start := 0
	for i := range rows {
		rows[i].EventID = all[start:ends[i]]
		start = ends[i]
		e := provenance.Exec{EventID: rows[i].EventID, Entry: rows[i].Entry, Exit: rows[i].Exit}
		if err := e.Validate(); err != nil {
			return nil, fmt.Errorf("decode block batch: record %d: %w", i, err)
		}
	}
	nb := r.count("blocks", 3)
	m := &Message{Rows: rows, Blocks: make([]Block, 0, nb)}
	total := 0
	for i := 0; i < nb && r.err == nil; i++ {
		c := r.uvarint("blocks.count")
		if r.err == nil && (c == 0 || c > MaxDocs || c > uint64(n-total)) {
			r.fail("blocks.count", "%d documents in a block (at most %d, and %d records left)", c, MaxDocs, n-total)
		}
		z := r.bytes("blocks.data")
		if r.err == nil && len(z) == 0 {
			r.fail("blocks.data", "empty block")
		}
		total += int(c)
		m.Blocks = append(m.Blocks, Block{N: int(c), Data: z})
	}
	if r.err == nil && total != n {
		r.fail("blocks", "the blocks hold %d documents for %d records", total, n)
	}
	if r.err == nil && r.i != len(data) {
		r.fail("end", "%d bytes after the last block", len(data)-r.i)
	}
	if r.err != nil {
		return nil, r.err
	}
	return m, nil
}

// Check checks every block of m so that a store can keep them as they
// came: each one decompresses within the bounds (MaxWireLen a block,
// MaxMessageRawLen the message, MaxDocLen a document), holds its count of
// documents framed exactly, and each document is a JSON object that decodes
// as an execution (as DecodeBatch decodes a record) whose fields equal its
// row. The error wraps ErrTooLarge, ErrDocument or ErrColumns where one of
// those is why.
func (m *Message) Check() error {
	c := checkers.Get().(*provenance.ExecChecker)
	defer checkers.Put(c)
	if err := m.walk(func(_ int, doc []byte) (*provenance.Exec, error) { return c.Check(doc) }); err != nil {
		return err
	}
	m.checked = true
	return nil
}

// checkers are the decoders Check reads documents with, keeping nothing.
var checkers = sync.Pool{New: func() any { return new(provenance.ExecChecker) }}

// Execs decodes the documents of m into executions, validated and
// normalized as DecodeBatch leaves them, with the checks of Check.
func (m *Message) Execs() ([]provenance.Exec, error) {
	out := make([]provenance.Exec, len(m.Rows))
	if err := m.walk(func(i int, doc []byte) (*provenance.Exec, error) {
		return &out[i], provenance.DecodeExec(doc, &out[i])
	}); err != nil {
		return nil, err
	}
	return out, nil
}

// walk decompresses m's blocks, one at a time into a pooled buffer, and
// decodes (with decode, given the record's index) and checks each
// document.
func (m *Message) walk(decode func(int, []byte) (*provenance.Exec, error)) error {
	buf := rawBufs.Get().(*[]byte)
	defer rawBufs.Put(buf)
	total, lo := 0, 0
	for bi, b := range m.Blocks {
		raw, err := wireDecoder.DecodeAll(b.Data, (*buf)[:0])
		if cap(raw) <= 1<<20 {
			*buf = raw[:0]
		}
		if errors.Is(err, zstd.ErrDecoderSizeExceeded) || errors.Is(err, zstd.ErrWindowSizeExceeded) {
			return fmt.Errorf("decode block batch: block %d: decompresses past %d bytes: %w", bi, MaxWireLen, ErrTooLarge)
		}
		if err != nil {
			return fmt.Errorf("decode block batch: block %d: document block: %w", bi, err)
		}
		if total += len(raw); total > MaxMessageRawLen {
			return fmt.Errorf("decode block batch: block %d: the blocks decompress past %d bytes: %w", bi, MaxMessageRawLen, ErrTooLarge)
		}
		lens, off, err := header(raw, b.N)
		if err != nil {
			return fmt.Errorf("decode block batch: block %d: document block: %w", bi, err)
		}
		for i, l := range lens {
			doc := raw[off : off+l]
			off += l
			if err := checkDoc(doc, &m.Rows[lo+i], func(doc []byte) (*provenance.Exec, error) { return decode(lo+i, doc) }); err != nil {
				return fmt.Errorf("decode block batch: block %d, document %d (record %d, event %s): %w", bi, i, lo+i, m.Rows[lo+i].EventID, err)
			}
		}
		lo += b.N
	}
	return nil
}

// Why a document is refused (Message.Check and Execs wrap one of these).
var (
	// ErrTooLarge: a document, a block or a message decompresses past its
	// bound (MaxDocLen, MaxWireLen, MaxMessageRawLen).
	ErrTooLarge = errors.New("over the size bound")
	// ErrDocument: a document is not a JSON object that decodes as a valid
	// execution.
	ErrDocument = errors.New("not an execution document")
	// ErrColumns: a document's fields differ from its row's columns.
	ErrColumns = errors.New("document disagrees with its indexed columns")
)

// checkDoc decodes doc with decode, validates and normalizes it as
// DecodeBatch does a record, and checks it against its row w.
func checkDoc(doc []byte, w *Row, decode func([]byte) (*provenance.Exec, error)) error {
	if len(doc) > MaxDocLen {
		return fmt.Errorf("%d bytes, at most %d: %w", len(doc), MaxDocLen, ErrTooLarge)
	}
	if len(doc) < 2 || doc[0] != '{' || doc[len(doc)-1] != '}' {
		return fmt.Errorf("not a JSON object: %w", ErrDocument)
	}
	e, err := decode(doc)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrDocument, err)
	}
	if err := e.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrDocument, err)
	}
	e.Normalize()
	if f := RowDiff(RowOf(e), *w); f != "" {
		return fmt.Errorf("%w: %s", ErrColumns, f)
	}
	return nil
}

// RowDiff names the first column in which a and b differ (the scores
// compared by their bits), or is "" when they are equal.
func RowDiff(a, b Row) string {
	switch {
	case a.PID != b.PID:
		return "pid"
	case a.EventID != b.EventID:
		return "event_id"
	case a.RID != b.RID:
		return "rid"
	case a.TID != b.TID:
		return "tid"
	case a.FID != b.FID:
		return "fid"
	case a.Func != b.Func:
		return "func"
	case a.IOStep != b.IOStep:
		return "io_step"
	case a.Entry != b.Entry:
		return "entry"
	case a.Exit != b.Exit:
		return "exit"
	case a.RuntimeTotal != b.RuntimeTotal:
		return "runtime_total"
	case a.RuntimeExclusive != b.RuntimeExclusive:
		return "runtime_exclusive"
	case math.Float64bits(a.OutlierScore) != math.Float64bits(b.OutlierScore):
		return "outlier_score"
	case a.IsGPUEvent != b.IsGPUEvent:
		return "is_gpu_event"
	}
	return ""
}
