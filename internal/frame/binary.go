package frame

import (
	"encoding/binary"
	"math"
	"math/bits"
	"slices"
	"unicode/utf8"
)

// Binary layout constants. schemas/frame-binary.md specifies the format byte
// by byte; keep the two in step.
const (
	// Magic starts every binary frame.
	Magic = "KPFR"
	// Version is the binary format version this package writes and reads.
	Version = 1
	// HeaderSize is the fixed size of a frame header: magic, version, body length.
	HeaderSize = 9
	// MaxFrameSize bounds the body length a decoder accepts (1 GiB).
	MaxFrameSize = 1 << 30
	// maxThreads bounds the thread table so that a packed event head
	// (fid, kind and thread index) always fits in 64 bits.
	maxThreads = 1 << 31
	// stackThreads is how many threads the codec tracks without allocating.
	stackThreads = 256
)

// threadState is the per-thread state of the timestamp delta coding.
type threadState struct {
	tid  uint32
	prev uint64
}

// AppendBinary appends the binary encoding of f (header and body) to dst and
// returns the extended slice. f must be valid (see Validate): an event kind
// other than 0 or 1 is encoded by its low bit only, and strings must be UTF-8
// for the frame to decode again, and a body above MaxFrameSize bytes is not
// decodable. Writer.Write checks both.
//
// The encoding is deterministic: equal frames give identical bytes.
func AppendBinary(dst []byte, f *Frame) []byte {
	start := len(dst)
	dst = append(dst, Magic...)
	dst = append(dst, Version, 0, 0, 0, 0)
	body := len(dst)

	dst = binary.AppendUvarint(dst, uint64(f.PID))
	dst = binary.AppendUvarint(dst, uint64(f.Rank))
	dst = binary.AppendUvarint(dst, f.Step)
	dst = binary.AppendUvarint(dst, f.TStart)
	dst = binary.AppendUvarint(dst, zigzag(f.TEnd-f.TStart))

	// Thread table: the distinct tids of all events, ascending.
	var idx tidIndex
	tids := f.threads(&idx)
	dst = binary.AppendUvarint(dst, uint64(len(tids)))
	for i, t := range tids {
		if i == 0 {
			dst = binary.AppendUvarint(dst, uint64(t))
		} else {
			dst = binary.AppendUvarint(dst, uint64(t-tids[i-1]-1))
		}
	}
	shift := threadBits(len(tids))

	dst = appendNames(dst, f.Funcs)
	dst = appendNames(dst, f.Counters)
	dst = binary.AppendUvarint(dst, uint64(len(f.Metadata)))
	for _, m := range f.Metadata {
		dst = binary.AppendUvarint(dst, uint64(m.Tid))
		dst = appendString(dst, m.Key)
		dst = appendString(dst, m.Value)
	}

	var stack [stackThreads]uint64
	prev := stack[:0]
	if len(tids) > stackThreads {
		prev = make([]uint64, len(tids))
	} else {
		prev = stack[:len(tids)]
	}
	resetPrev := func() {
		for i := range prev {
			prev[i] = f.TStart
		}
	}

	resetPrev()
	dst = binary.AppendUvarint(dst, uint64(len(f.Events)))
	for _, e := range f.Events {
		t := idx.lookup(e.Tid)
		head := (uint64(e.FID)<<1|uint64(e.Kind&1))<<shift | uint64(t)
		dst = binary.AppendUvarint(dst, head)
		dst = binary.AppendUvarint(dst, zigzag(e.TS-prev[t]))
		prev[t] = e.TS
	}

	resetPrev()
	dst = binary.AppendUvarint(dst, uint64(len(f.CounterEvents)))
	for _, e := range f.CounterEvents {
		t := idx.lookup(e.Tid)
		dst = binary.AppendUvarint(dst, uint64(e.CID)<<shift|uint64(t))
		dst = binary.AppendUvarint(dst, e.Value)
		dst = binary.AppendUvarint(dst, zigzag(e.TS-prev[t]))
		prev[t] = e.TS
	}

	resetPrev()
	dst = binary.AppendUvarint(dst, uint64(len(f.Comms)))
	for _, e := range f.Comms {
		t := idx.lookup(e.Tid)
		head := (uint64(e.Partner)<<1|uint64(e.Kind&1))<<shift | uint64(t)
		dst = binary.AppendUvarint(dst, head)
		dst = binary.AppendUvarint(dst, uint64(e.Tag))
		dst = binary.AppendUvarint(dst, e.Bytes)
		dst = binary.AppendUvarint(dst, zigzag(e.TS-prev[t]))
		prev[t] = e.TS
	}

	binary.LittleEndian.PutUint32(dst[start+5:], uint32(len(dst)-body))
	return dst
}

func appendNames(dst []byte, names []Name) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(names)))
	for _, n := range names {
		dst = binary.AppendUvarint(dst, uint64(n.ID))
		dst = appendString(dst, n.Name)
	}
	return dst
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// zigzag maps a wrapping uint64 difference, read as a signed int64, to an
// unsigned value with small magnitudes near zero: 0,-1,1,-2,... -> 0,1,2,3,...
func zigzag(d uint64) uint64 {
	return d<<1 ^ uint64(int64(d)>>63)
}

// unzigzag inverts zigzag.
func unzigzag(z uint64) uint64 {
	return z>>1 ^ -(z & 1)
}

// threadBits is the number of low bits of an event head that hold the thread
// index, for a table of n threads.
func threadBits(n int) uint {
	if n <= 1 {
		return 0
	}
	return uint(bits.Len64(uint64(n - 1)))
}

// tidIndex maps a tid to its index in the thread table. Small tids use an
// array; others a map built only when needed.
type tidIndex struct {
	small [stackThreads]uint32 // index+1, 0 when absent
	large map[uint32]uint32
}

func (x *tidIndex) add(tid uint32, i int) {
	if tid < stackThreads {
		x.small[tid] = uint32(i) + 1
		return
	}
	if x.large == nil {
		x.large = make(map[uint32]uint32)
	}
	x.large[tid] = uint32(i)
}

func (x *tidIndex) has(tid uint32) bool {
	if tid < stackThreads {
		return x.small[tid] != 0
	}
	_, ok := x.large[tid]
	return ok
}

func (x *tidIndex) lookup(tid uint32) uint32 {
	if tid < stackThreads {
		return x.small[tid] - 1
	}
	return x.large[tid]
}

// threads returns the ascending distinct tids of f's events and fills idx.
func (f *Frame) threads(idx *tidIndex) []uint32 {
	var tids []uint32
	last, haveLast := uint32(0), false
	note := func(t uint32) {
		if haveLast && t == last {
			return
		}
		last, haveLast = t, true
		if !idx.has(t) {
			idx.add(t, 0)
			tids = append(tids, t)
		}
	}
	for i := range f.Events {
		note(f.Events[i].Tid)
	}
	for i := range f.CounterEvents {
		note(f.CounterEvents[i].Tid)
	}
	for i := range f.Comms {
		note(f.Comms[i].Tid)
	}
	slices.Sort(tids)
	for i, t := range tids {
		idx.add(t, i)
	}
	return tids
}

// DecodeBinary decodes the binary frame at the start of b into f and returns
// the number of bytes it used (header and body). f is Reset first and the
// capacity of its slices is reused: decoding into a long-lived Frame allocates
// only for dictionary and metadata strings, and for slices that must grow.
// Malformed input gives a *DecodeError naming the field and its offset in b;
// on error f holds a partial frame.
func DecodeBinary(b []byte, f *Frame) (n int, err error) {
	f.Reset()
	if len(b) < HeaderSize {
		if len(b) < len(Magic) && string(b) != Magic[:len(b)] {
			return 0, decErr(0, field("header.magic"), ErrMagic)
		}
		if len(b) >= len(Magic) && string(b[:len(Magic)]) != Magic {
			return 0, decErr(0, field("header.magic"), ErrMagic)
		}
		return 0, decErr(len(b), field("header"), ErrTruncated)
	}
	if string(b[:4]) != Magic {
		return 0, decErr(0, field("header.magic"), ErrMagic)
	}
	if b[4] != Version {
		return 0, decErr(4, field("header.version"), fmtErr(ErrVersion, "version %d, this decoder reads %d", b[4], Version))
	}
	end, err := bodyEnd(b)
	if err != nil {
		return 0, err
	}
	if end > len(b) {
		return 0, decErr(len(b), field("body"), fmtErr(ErrTruncated, "header declares %d body bytes, %d present", end-HeaderSize, len(b)-HeaderSize))
	}
	d := decoder{b: b[:end], p: HeaderSize}
	if err := d.frame(f); err != nil {
		return 0, err
	}
	return end, nil
}

// bodyEnd returns the end of the frame whose header (magic and version
// checked) starts b, from its length field.
func bodyEnd(b []byte) (int, error) {
	size := binary.LittleEndian.Uint32(b[5:9])
	if size > MaxFrameSize {
		return 0, decErr(5, field("header.length"), fmtErr(ErrLength, "body length %d exceeds the %d byte limit", size, MaxFrameSize))
	}
	return HeaderSize + int(size), nil
}

// PreludeSize is how many of a binary frame's first bytes DecodePrelude
// needs at most: the header and five varints.
const PreludeSize = HeaderSize + 5*binary.MaxVarintLen64

// DecodePrelude decodes what a binary frame says before its threads and
// events (pid, rank, io_step, its start and end) into f, whose other fields
// it empties, and returns the frame's whole size. b holds the frame's first
// bytes: PreludeSize of them, or the whole frame if it is shorter. Only the
// header and the prelude are checked; DecodeBinary of the whole frame checks
// the rest. It lets a reader order frames without decoding or keeping them.
func DecodePrelude(b []byte, f *Frame) (size int, err error) {
	f.Reset()
	if len(b) < HeaderSize || string(b[:4]) != Magic || b[4] != Version {
		_, err := DecodeBinary(b[:min(len(b), HeaderSize)], f)
		return 0, err
	}
	end, err := bodyEnd(b)
	if err != nil {
		return 0, err
	}
	d := decoder{b: b[:min(end, len(b))], p: HeaderSize}
	if err := d.prelude(f); err != nil {
		if end > len(b) {
			return 0, decErr(len(b), field("body"), fmtErr(ErrTruncated, "header declares %d body bytes, %d present", end-HeaderSize, len(b)-HeaderSize))
		}
		return 0, err
	}
	return end, nil
}

// decoder reads one frame body; b ends at the frame's end as declared by the
// header. The whole body is present when decoding starts, so a field running
// past b's end means the declared length is wrong (ErrLength), not that the
// input is truncated.
type decoder struct {
	b []byte
	p int
}

// uvarint reads an unsigned LEB128 varint (at most 10 bytes).
func (d *decoder) uvarint(field fld) (uint64, error) {
	b, p := d.b, d.p
	if p < len(b) && b[p] < 0x80 {
		d.p = p + 1
		return uint64(b[p]), nil
	}
	return d.uvarintSlow(field)
}

// uvarintSlow decodes a varint at d.p of any length.
func (d *decoder) uvarintSlow(field fld) (uint64, error) {
	var x uint64
	var s uint
	for i := 0; i < binary.MaxVarintLen64; i++ {
		if d.p+i >= len(d.b) {
			return 0, decErr(d.p, field, fmtErr(ErrLength, "field runs past the frame end declared in the header"))
		}
		c := d.b[d.p+i]
		if c < 0x80 {
			if i == binary.MaxVarintLen64-1 && c > 1 {
				return 0, decErr(d.p, field, fmtErr(ErrOverflow, "varint exceeds 64 bits"))
			}
			d.p += i + 1
			return x | uint64(c)<<s, nil
		}
		x |= uint64(c&0x7f) << s
		s += 7
	}
	return 0, decErr(d.p, field, fmtErr(ErrOverflow, "varint longer than %d bytes", binary.MaxVarintLen64))
}

func (d *decoder) uint32(field fld) (uint32, error) {
	at := d.p
	x, err := d.uvarint(field)
	if err != nil {
		return 0, err
	}
	if x > math.MaxUint32 {
		return 0, decErr(at, field, fmtErr(ErrOverflow, "%d does not fit in 32 bits", x))
	}
	return uint32(x), nil
}

// count reads a count of items each needing at least min bytes, and checks
// the remaining input could hold them.
func (d *decoder) count(field fld, min int) (int, error) {
	at := d.p
	x, err := d.uvarint(field)
	if err != nil {
		return 0, err
	}
	if x > uint64(len(d.b)-d.p)/uint64(min) {
		return 0, decErr(at, field, fmtErr(ErrCount, "%d items need at least %d bytes each, %d bytes left", x, min, len(d.b)-d.p))
	}
	return int(x), nil
}

// string reads a length-prefixed UTF-8 string. When the bytes equal reuse
// (the string previously held by the same slot of a reused Frame) it returns
// reuse instead of allocating, so a repeated dictionary costs nothing.
func (d *decoder) string(field fld, reuse string) (string, error) {
	at := d.p
	n, err := d.uvarint(field)
	if err != nil {
		return "", err
	}
	if n > uint64(len(d.b)-d.p) {
		return "", decErr(at, field, fmtErr(ErrLength, "string of %d bytes runs past the frame end declared in the header (%d bytes left)", n, len(d.b)-d.p))
	}
	s := d.b[d.p : d.p+int(n)]
	if !utf8.Valid(s) {
		return "", decErr(d.p, field, fmtErr(ErrInvalid, "string is not valid UTF-8"))
	}
	d.p += int(n)
	if string(s) == reuse {
		return reuse, nil
	}
	return string(s), nil
}

func (d *decoder) names(section string, dst []Name) ([]Name, error) {
	n, err := d.count(fld{section, -1, "count"}, 2)
	if err != nil {
		return dst, err
	}
	dst = grow(dst, n)
	for i := range dst {
		id, err := d.uint32(fld{section, i, "id"})
		if err != nil {
			return dst, err
		}
		name, err := d.string(fld{section, i, "name"}, dst[i].Name)
		if err != nil {
			return dst, err
		}
		dst[i] = Name{ID: id, Name: name}
	}
	return dst, nil
}

// grow returns s with length n, reusing its capacity when it can.
func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

func (d *decoder) frame(f *Frame) error {
	if err := d.prelude(f); err != nil {
		return err
	}
	nt, err := d.count(field("threads.count"), 1)
	if err != nil {
		return err
	}
	if nt > maxThreads {
		return decErr(d.p, field("threads.count"), fmtErr(ErrInvalid, "%d threads exceed the limit of %d", nt, maxThreads))
	}
	var stack [stackThreads]threadState
	var th []threadState
	if nt > stackThreads {
		th = make([]threadState, nt)
	} else {
		th = stack[:nt]
	}
	var tid uint64
	for i := range th {
		at := d.p
		x, err := d.uvarint(field("threads"))
		if err != nil {
			return err
		}
		if i > 0 {
			x += tid + 1
			if x <= tid { // wrapped
				return decErr(at, fld{"threads", i, ""}, fmtErr(ErrOverflow, "tid beyond 64 bits"))
			}
		}
		if x > math.MaxUint32 {
			return decErr(at, fld{"threads", i, ""}, fmtErr(ErrOverflow, "tid %d does not fit in 32 bits", x))
		}
		tid = x
		th[i].tid = uint32(x)
	}
	shift := threadBits(nt)
	mask := uint64(1)<<shift - 1

	if f.Funcs, err = d.names("funcs", f.Funcs); err != nil {
		return err
	}
	if f.Counters, err = d.names("counters", f.Counters); err != nil {
		return err
	}
	nm, err := d.count(field("metadata.count"), 3)
	if err != nil {
		return err
	}
	f.Metadata = grow(f.Metadata, nm)
	for i := range f.Metadata {
		m := &f.Metadata[i]
		if m.Tid, err = d.uint32(fld{"metadata", i, "tid"}); err != nil {
			return err
		}
		if m.Key, err = d.string(fld{"metadata", i, "key"}, m.Key); err != nil {
			return err
		}
		if m.Value, err = d.string(fld{"metadata", i, "value"}, m.Value); err != nil {
			return err
		}
	}

	if err := d.funcEvents(f, th, shift, mask); err != nil {
		return err
	}
	if err := d.counterEvents(f, th, shift, mask); err != nil {
		return err
	}
	if err := d.commEvents(f, th, shift, mask); err != nil {
		return err
	}
	if d.p != len(d.b) {
		return decErr(d.p, field("body"), fmtErr(ErrTrailing, "%d bytes after the last section", len(d.b)-d.p))
	}
	return nil
}

// prelude reads the fields before the threads: pid, rank, io_step and its
// start and end.
func (d *decoder) prelude(f *Frame) error {
	var err error
	if f.PID, err = d.uint32(field("pid")); err != nil {
		return err
	}
	if f.Rank, err = d.uint32(field("rank")); err != nil {
		return err
	}
	if f.Step, err = d.uvarint(field("io_step")); err != nil {
		return err
	}
	if f.TStart, err = d.uvarint(field("t_start")); err != nil {
		return err
	}
	dz, err := d.uvarint(field("t_end"))
	if err != nil {
		return err
	}
	f.TEnd = f.TStart + unzigzag(dz)
	return nil
}

// funcEvents decodes the function event section. It is the hot loop of the
// codec: varints of one or two bytes are read inline.
func (d *decoder) funcEvents(f *Frame, th []threadState, shift uint, mask uint64) error {
	n, err := d.count(field("events.count"), 2)
	if err != nil {
		return err
	}
	for i := range th {
		th[i].prev = f.TStart
	}
	evs := grow(f.Events, n)
	f.Events = evs
	b, p := d.b, d.p
	nt := uint64(len(th))
	for i := range evs {
		// Fast path: with 8 bytes at hand, read a head and a delta of up to
		// 3 bytes each from one little-endian word.
		if len(b)-p >= 8 {
			w := binary.LittleEndian.Uint64(b[p:])
			var head, z uint64
			n := 0
			switch {
			case w&0x80 == 0:
				head, n = w&0x7f, 1
			case w&0x8000 == 0:
				head, n = w&0x7f|(w>>1)&0x3f80, 2
			case w&0x800000 == 0:
				head, n = w&0x7f|(w>>1)&0x3f80|(w>>2)&0x1fc000, 3
			}
			if n > 0 {
				v := w >> (8 * n)
				m := 0
				switch {
				case v&0x80 == 0:
					z, m = v&0x7f, 1
				case v&0x8000 == 0:
					z, m = v&0x7f|(v>>1)&0x3f80, 2
				case v&0x800000 == 0:
					z, m = v&0x7f|(v>>1)&0x3f80|(v>>2)&0x1fc000, 3
				}
				if t := head & mask; m > 0 && t < nt {
					s := &th[t]
					ts := s.prev + (z>>1 ^ -(z & 1))
					s.prev = ts
					fk := head >> shift
					evs[i] = FuncEvent{Tid: s.tid, Kind: EventKind(fk & 1), FID: uint32(fk >> 1), TS: ts}
					p += n + m
					continue
				}
			}
		}
		at := p
		var head uint64
		if p < len(b) && b[p] < 0x80 {
			head = uint64(b[p])
			p++
		} else if p+1 < len(b) && b[p+1] < 0x80 {
			head = uint64(b[p]&0x7f) | uint64(b[p+1])<<7
			p += 2
		} else {
			d.p = p
			if head, err = d.uvarintSlow(fld{"events", i, "head"}); err != nil {
				return err
			}
			p = d.p
		}
		t := head & mask
		if t >= nt {
			return decErr(at, fld{"events", i, "head"}, fmtErr(ErrInvalid, "thread index %d, table has %d threads", t, nt))
		}
		fk := head >> shift
		if fk>>1 > math.MaxUint32 {
			return decErr(at, fld{"events", i, "head"}, fmtErr(ErrOverflow, "fid %d does not fit in 32 bits", fk>>1))
		}
		var z uint64
		if p < len(b) && b[p] < 0x80 {
			z = uint64(b[p])
			p++
		} else if p+1 < len(b) && b[p+1] < 0x80 {
			z = uint64(b[p]&0x7f) | uint64(b[p+1])<<7
			p += 2
		} else {
			d.p = p
			if z, err = d.uvarintSlow(fld{"events", i, "ts"}); err != nil {
				return err
			}
			p = d.p
		}
		s := &th[t]
		ts := s.prev + (z>>1 ^ -(z & 1))
		s.prev = ts
		evs[i] = FuncEvent{Tid: s.tid, Kind: EventKind(fk & 1), FID: uint32(fk >> 1), TS: ts}
	}
	d.p = p
	return nil
}

func (d *decoder) counterEvents(f *Frame, th []threadState, shift uint, mask uint64) error {
	n, err := d.count(field("counter_events.count"), 3)
	if err != nil {
		return err
	}
	for i := range th {
		th[i].prev = f.TStart
	}
	evs := grow(f.CounterEvents, n)
	f.CounterEvents = evs
	nt := uint64(len(th))
	for i := range evs {
		at := d.p
		head, err := d.uvarint(fld{"counter_events", i, "head"})
		if err != nil {
			return err
		}
		t := head & mask
		if t >= nt {
			return decErr(at, fld{"counter_events", i, "head"}, fmtErr(ErrInvalid, "thread index %d, table has %d threads", t, nt))
		}
		cid := head >> shift
		if cid > math.MaxUint32 {
			return decErr(at, fld{"counter_events", i, "head"}, fmtErr(ErrOverflow, "cid %d does not fit in 32 bits", cid))
		}
		v, err := d.uvarint(fld{"counter_events", i, "value"})
		if err != nil {
			return err
		}
		z, err := d.uvarint(fld{"counter_events", i, "ts"})
		if err != nil {
			return err
		}
		s := &th[t]
		s.prev += unzigzag(z)
		evs[i] = CounterEvent{Tid: s.tid, CID: uint32(cid), Value: v, TS: s.prev}
	}
	return nil
}

func (d *decoder) commEvents(f *Frame, th []threadState, shift uint, mask uint64) error {
	n, err := d.count(field("comms.count"), 4)
	if err != nil {
		return err
	}
	for i := range th {
		th[i].prev = f.TStart
	}
	evs := grow(f.Comms, n)
	f.Comms = evs
	nt := uint64(len(th))
	for i := range evs {
		at := d.p
		head, err := d.uvarint(fld{"comms", i, "head"})
		if err != nil {
			return err
		}
		t := head & mask
		if t >= nt {
			return decErr(at, fld{"comms", i, "head"}, fmtErr(ErrInvalid, "thread index %d, table has %d threads", t, nt))
		}
		pk := head >> shift
		if pk>>1 > math.MaxUint32 {
			return decErr(at, fld{"comms", i, "head"}, fmtErr(ErrOverflow, "partner %d does not fit in 32 bits", pk>>1))
		}
		tag, err := d.uint32(fld{"comms", i, "tag"})
		if err != nil {
			return err
		}
		nb, err := d.uvarint(fld{"comms", i, "bytes"})
		if err != nil {
			return err
		}
		z, err := d.uvarint(fld{"comms", i, "ts"})
		if err != nil {
			return err
		}
		s := &th[t]
		s.prev += unzigzag(z)
		evs[i] = CommEvent{Tid: s.tid, Kind: CommKind(pk & 1), Tag: tag, Partner: uint32(pk >> 1), Bytes: nb, TS: s.prev}
	}
	return nil
}
