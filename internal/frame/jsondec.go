package frame

import (
	"math"
	"unicode/utf16"
	"unicode/utf8"
)

// DecodeJSON decodes one JSON frame (an object, optionally surrounded by white
// space) into f, reusing the capacity of f's slices. It is strict, as
// schemas/frame.schema.json is: unknown or repeated fields, missing required
// fields, null, numbers that are negative, fractional, in exponent form or out
// of range, kinds other than 0 or 1, invalid UTF-8 or lone surrogates in
// strings, and data after the object are errors. Errors are *DecodeError with
// the byte offset in b of the offending token.
func DecodeJSON(b []byte, f *Frame) error {
	f.Reset()
	d := jdec{b: b}
	if err := d.frame(f); err != nil {
		return err
	}
	d.ws()
	if d.p != len(b) {
		return decErr(d.p, field("frame"), fmtErr(ErrTrailing, "data after the frame object"))
	}
	return nil
}

// jdec is a JSON decoder for exactly the frame's shape.
type jdec struct {
	b   []byte
	p   int
	key []byte // scratch for keys with escapes
	str []byte // scratch for strings with escapes
}

func (d *jdec) ws() {
	for d.p < len(d.b) {
		switch d.b[d.p] {
		case ' ', '\t', '\n', '\r':
			d.p++
		default:
			return
		}
	}
}

// tok skips white space and returns the next byte, or an error at the end
// of the input.
func (d *jdec) tok(where fld, want string) (byte, error) {
	d.ws()
	if d.p >= len(d.b) {
		return 0, decErr(d.p, where, fmtErr(ErrTruncated, "input ends where %s was expected", want))
	}
	return d.b[d.p], nil
}

func (d *jdec) unexpected(where fld, want string) error {
	return decErr(d.p, where, fmtErr(ErrInvalid, "expected %s, found %s", want, d.found()))
}

func (d *jdec) found() string {
	c := d.b[d.p]
	switch {
	case c == 'n':
		return "null"
	case c < 0x20 || c >= 0x7f:
		return "byte " + quoteByte(c)
	}
	return "'" + string(c) + "'"
}

func quoteByte(c byte) string {
	return "0x" + string(hexDigits[c>>4]) + string(hexDigits[c&0xf])
}

// object parses an object, calling member for each key with d.p at the
// member's value. keys lists the allowed keys; those in required must appear.
// Keys may come in any order, each at most once.
func (d *jdec) object(where fld, keys []string, required uint32, member func(k int) error) error {
	c, err := d.tok(where, "'{'")
	if err != nil {
		return err
	}
	if c != '{' {
		return d.unexpected(where, "an object")
	}
	d.p++
	var seen uint32
	c, err = d.tok(where, "a key or '}'")
	if err != nil {
		return err
	}
	if c == '}' {
		d.p++
		return d.missing(where, keys, required, seen)
	}
	for {
		c, err = d.tok(where, "a key")
		if err != nil {
			return err
		}
		if c != '"' {
			return d.unexpected(where, "a key")
		}
		at := d.p
		key, err := d.keyBytes(where)
		if err != nil {
			return err
		}
		k := -1
		for i, name := range keys {
			if string(key) == name {
				k = i
				break
			}
		}
		if k < 0 {
			return decErr(at, where, fmtErr(ErrInvalid, "unknown field %q", key))
		}
		if seen&(1<<k) != 0 {
			return decErr(at, where, fmtErr(ErrInvalid, "repeated field %q", key))
		}
		seen |= 1 << k
		if c, err = d.tok(where, "':'"); err != nil {
			return err
		}
		if c != ':' {
			return d.unexpected(where, "':'")
		}
		d.p++
		if err := member(k); err != nil {
			return err
		}
		if c, err = d.tok(where, "',' or '}'"); err != nil {
			return err
		}
		d.p++
		if c == '}' {
			return d.missing(where, keys, required, seen)
		}
		if c != ',' {
			d.p--
			return d.unexpected(where, "',' or '}'")
		}
	}
}

func (d *jdec) missing(where fld, keys []string, required, seen uint32) error {
	if miss := required &^ seen; miss != 0 {
		for i, name := range keys {
			if miss&(1<<i) != 0 {
				return decErr(d.p-1, where, fmtErr(ErrInvalid, "missing field %q", name))
			}
		}
	}
	return nil
}

// array parses an array, calling elem for each element with d.p before it.
func (d *jdec) array(where string, elem func(i int) error) error {
	w := field(where)
	c, err := d.tok(w, "'['")
	if err != nil {
		return err
	}
	if c != '[' {
		return d.unexpected(w, "an array")
	}
	d.p++
	if c, err = d.tok(w, "an element or ']'"); err != nil {
		return err
	}
	if c == ']' {
		d.p++
		return nil
	}
	for i := 0; ; i++ {
		if err := elem(i); err != nil {
			return err
		}
		if c, err = d.tok(w, "',' or ']'"); err != nil {
			return err
		}
		d.p++
		if c == ']' {
			return nil
		}
		if c != ',' {
			d.p--
			return d.unexpected(w, "',' or ']'")
		}
	}
}

// uint parses an unsigned integer no larger than max.
func (d *jdec) uint(where fld, max uint64) (uint64, error) {
	c, err := d.tok(where, "an unsigned integer")
	if err != nil {
		return 0, err
	}
	at := d.p
	if c == '-' {
		return 0, decErr(at, where, fmtErr(ErrInvalid, "negative number, want an unsigned integer"))
	}
	if c < '0' || c > '9' {
		return 0, d.unexpected(where, "an unsigned integer")
	}
	b, p := d.b, d.p
	var x uint64
	if c == '0' {
		p++
	} else {
		for p < len(b) && b[p] >= '0' && b[p] <= '9' {
			v := uint64(b[p] - '0')
			if x > (math.MaxUint64-v)/10 {
				return 0, decErr(at, where, fmtErr(ErrOverflow, "number does not fit in 64 bits"))
			}
			x = x*10 + v
			p++
		}
	}
	if p < len(b) {
		switch b[p] {
		case '.', 'e', 'E':
			return 0, decErr(at, where, fmtErr(ErrInvalid, "number is not an integer"))
		case '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
			return 0, decErr(at, where, fmtErr(ErrInvalid, "number has a leading zero"))
		}
	}
	if x > max {
		return 0, decErr(at, where, fmtErr(ErrOverflow, "%d is larger than %d", x, max))
	}
	d.p = p
	return x, nil
}

func (d *jdec) u32(where fld) (uint32, error) {
	x, err := d.uint(where, math.MaxUint32)
	return uint32(x), err
}

func (d *jdec) u64(where fld) (uint64, error) {
	return d.uint(where, math.MaxUint64)
}

// kind parses an event or comm kind: 0 or 1.
func (d *jdec) kind(where fld, names string) (uint8, error) {
	at := d.p
	x, err := d.uint(where, math.MaxUint64)
	if err != nil {
		return 0, err
	}
	if x > 1 {
		return 0, decErr(skipSpaceAt(d.b, at), where, fmtErr(ErrInvalid, "kind %d (want %s)", x, names))
	}
	return uint8(x), nil
}

func skipSpaceAt(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// keyBytes parses a key string at d.p. The result aliases the input or the
// key scratch buffer and is valid until the next key.
func (d *jdec) keyBytes(where fld) ([]byte, error) {
	raw, esc, err := d.scanString(where)
	if err != nil || !esc {
		return raw, err
	}
	d.key, err = d.unescape(d.key[:0], raw, d.p-len(raw)-1, where)
	return d.key, err
}

// string parses a string value. When it equals reuse (the string the same
// slot of a reused Frame held) it returns reuse instead of allocating.
func (d *jdec) string(where fld, reuse string) (string, error) {
	c, err := d.tok(where, "a string")
	if err != nil {
		return "", err
	}
	if c != '"' {
		return "", d.unexpected(where, "a string")
	}
	raw, esc, err := d.scanString(where)
	if err != nil {
		return "", err
	}
	if esc {
		if d.str, err = d.unescape(d.str[:0], raw, d.p-len(raw)-1, where); err != nil {
			return "", err
		}
		raw = d.str
	}
	if string(raw) == reuse {
		return reuse, nil
	}
	return string(raw), nil
}

// scanString scans the string starting at the quote at d.p, checks its raw
// bytes (no control characters, valid UTF-8), and returns its content
// between the quotes and whether it holds escapes. d.p ends after the closing
// quote.
func (d *jdec) scanString(where fld) (raw []byte, esc bool, err error) {
	b := d.b
	start := d.p + 1
	p := start
	for {
		if p >= len(b) {
			return nil, false, decErr(len(b), where, fmtErr(ErrTruncated, "input ends inside a string"))
		}
		c := b[p]
		switch {
		case c == '"':
			d.p = p + 1
			return b[start:p], esc, nil
		case c == '\\':
			esc = true
			p += 2
		case c < 0x20:
			return nil, false, decErr(p, where, fmtErr(ErrInvalid, "control character %s in a string", quoteByte(c)))
		case c < utf8.RuneSelf:
			p++
		default:
			r, size := utf8.DecodeRune(b[p:])
			if r == utf8.RuneError && size == 1 {
				return nil, false, decErr(p, where, fmtErr(ErrInvalid, "string is not valid UTF-8"))
			}
			p += size
		}
	}
}

// unescape appends the content of raw (a string's bytes between the quotes,
// starting at input offset off) with its escapes resolved.
func (d *jdec) unescape(dst, raw []byte, off int, where fld) ([]byte, error) {
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' {
			dst = append(dst, c)
			i++
			continue
		}
		if i+1 >= len(raw) {
			return dst, decErr(off+i, where, fmtErr(ErrInvalid, "bad escape"))
		}
		switch raw[i+1] {
		case '"', '\\', '/':
			dst = append(dst, raw[i+1])
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r, ok := hex4(raw, i+2)
			if !ok {
				return dst, decErr(off+i, where, fmtErr(ErrInvalid, "bad \\u escape"))
			}
			if utf16.IsSurrogate(r) {
				r2, ok2 := rune(0), false
				if i+12 <= len(raw) && raw[i+6] == '\\' && raw[i+7] == 'u' {
					r2, ok2 = hex4(raw, i+8)
				}
				dec := utf16.DecodeRune(r, r2)
				if !ok2 || dec == utf8.RuneError {
					return dst, decErr(off+i, where, fmtErr(ErrInvalid, "lone surrogate in \\u escape"))
				}
				dst = utf8.AppendRune(dst, dec)
				i += 12
				continue
			}
			dst = utf8.AppendRune(dst, r)
			i += 6
			continue
		default:
			return dst, decErr(off+i, where, fmtErr(ErrInvalid, "bad escape \\%c", raw[i+1]))
		}
		i += 2
	}
	return dst, nil
}

func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

var (
	frameKeys   = []string{"pid", "rank", "io_step", "t_start", "t_end", "funcs", "counters", "metadata", "events", "counter_events", "comms"}
	nameKeys    = []string{"id", "name"}
	metaKeys    = []string{"tid", "key", "value"}
	eventKeys   = []string{"tid", "kind", "fid", "ts"}
	counterKeys = []string{"tid", "cid", "value", "ts"}
	commKeys    = []string{"tid", "kind", "tag", "partner", "bytes", "ts"}
)

func (d *jdec) frame(f *Frame) error {
	return d.object(field("frame"), frameKeys, 0b11111, func(k int) error {
		var err error
		switch k {
		case 0:
			f.PID, err = d.u32(field("pid"))
		case 1:
			f.Rank, err = d.u32(field("rank"))
		case 2:
			f.Step, err = d.u64(field("io_step"))
		case 3:
			f.TStart, err = d.u64(field("t_start"))
		case 4:
			f.TEnd, err = d.u64(field("t_end"))
		case 5:
			f.Funcs, err = d.names("funcs", f.Funcs)
		case 6:
			f.Counters, err = d.names("counters", f.Counters)
		case 7:
			err = d.metadata(f)
		case 8:
			err = d.events(f)
		case 9:
			err = d.counterEvents(f)
		case 10:
			err = d.comms(f)
		}
		return err
	})
}

func (d *jdec) names(sec string, dst []Name) ([]Name, error) {
	dst = dst[:0]
	err := d.array(sec, func(i int) error {
		var n Name
		if i < cap(dst) {
			n.Name = dst[:i+1][i].Name // string of the reused slot
		}
		reuse := n.Name
		err := d.object(fld{sec, i, ""}, nameKeys, 0b11, func(k int) error {
			var err error
			switch k {
			case 0:
				n.ID, err = d.u32(fld{sec, i, "id"})
			case 1:
				n.Name, err = d.string(fld{sec, i, "name"}, reuse)
			}
			return err
		})
		dst = append(dst, n)
		return err
	})
	return dst, err
}

func (d *jdec) metadata(f *Frame) error {
	ms := f.Metadata[:0]
	err := d.array("metadata", func(i int) error {
		var m, old Meta
		if i < cap(ms) {
			old = ms[:i+1][i]
		}
		err := d.object(fld{"metadata", i, ""}, metaKeys, 0b111, func(k int) error {
			var err error
			switch k {
			case 0:
				m.Tid, err = d.u32(fld{"metadata", i, "tid"})
			case 1:
				m.Key, err = d.string(fld{"metadata", i, "key"}, old.Key)
			case 2:
				m.Value, err = d.string(fld{"metadata", i, "value"}, old.Value)
			}
			return err
		})
		ms = append(ms, m)
		return err
	})
	f.Metadata = ms
	return err
}

// The fast paths below parse an event object written exactly as AppendJSON
// writes it (canonical key order, no white space, numbers of at most 19
// digits). Anything else, including every error, goes to the general parser,
// which starts over at the same element.

// lit reports whether b[p:] starts with s, and the offset after it.
func lit(b []byte, p int, s string) (int, bool) {
	if len(b)-p >= len(s) && string(b[p:p+len(s)]) == s {
		return p + len(s), true
	}
	return p, false
}

// fastUint parses a canonical unsigned integer of 1 to 19 digits at b[p:].
func fastUint(b []byte, p int) (uint64, int, bool) {
	var x uint64
	q := p
	for q < len(b) && q-p < 19 {
		c := b[q] - '0'
		if c > 9 {
			break
		}
		x = x*10 + uint64(c)
		q++
	}
	if q == p || q-p >= 19 || (b[p] == '0' && q-p > 1) {
		return 0, p, false
	}
	return x, q, true
}

func fastU32(b []byte, p int) (uint32, int, bool) {
	x, q, ok := fastUint(b, p)
	if !ok || x > math.MaxUint32 {
		return 0, p, false
	}
	return uint32(x), q, true
}

// fastKind parses a kind digit, 0 or 1.
func fastKind(b []byte, p int) (uint8, int, bool) {
	if p < len(b) && (b[p] == '0' || b[p] == '1') {
		return b[p] - '0', p + 1, true
	}
	return 0, p, false
}

func fastEvent(b []byte, p int) (e FuncEvent, q int, ok bool) {
	var k uint8
	if p, ok = lit(b, p, `{"tid":`); !ok {
		return
	}
	if e.Tid, p, ok = fastU32(b, p); !ok {
		return
	}
	if p, ok = lit(b, p, `,"kind":`); !ok {
		return
	}
	if k, p, ok = fastKind(b, p); !ok {
		return
	}
	e.Kind = EventKind(k)
	if p, ok = lit(b, p, `,"fid":`); !ok {
		return
	}
	if e.FID, p, ok = fastU32(b, p); !ok {
		return
	}
	if p, ok = lit(b, p, `,"ts":`); !ok {
		return
	}
	if e.TS, p, ok = fastUint(b, p); !ok {
		return
	}
	p, ok = lit(b, p, `}`)
	return e, p, ok
}

func fastCounter(b []byte, p int) (e CounterEvent, q int, ok bool) {
	if p, ok = lit(b, p, `{"tid":`); !ok {
		return
	}
	if e.Tid, p, ok = fastU32(b, p); !ok {
		return
	}
	if p, ok = lit(b, p, `,"cid":`); !ok {
		return
	}
	if e.CID, p, ok = fastU32(b, p); !ok {
		return
	}
	if p, ok = lit(b, p, `,"value":`); !ok {
		return
	}
	if e.Value, p, ok = fastUint(b, p); !ok {
		return
	}
	if p, ok = lit(b, p, `,"ts":`); !ok {
		return
	}
	if e.TS, p, ok = fastUint(b, p); !ok {
		return
	}
	p, ok = lit(b, p, `}`)
	return e, p, ok
}

func fastComm(b []byte, p int) (e CommEvent, q int, ok bool) {
	var k uint8
	if p, ok = lit(b, p, `{"tid":`); !ok {
		return
	}
	if e.Tid, p, ok = fastU32(b, p); !ok {
		return
	}
	if p, ok = lit(b, p, `,"kind":`); !ok {
		return
	}
	if k, p, ok = fastKind(b, p); !ok {
		return
	}
	e.Kind = CommKind(k)
	if p, ok = lit(b, p, `,"tag":`); !ok {
		return
	}
	if e.Tag, p, ok = fastU32(b, p); !ok {
		return
	}
	if p, ok = lit(b, p, `,"partner":`); !ok {
		return
	}
	if e.Partner, p, ok = fastU32(b, p); !ok {
		return
	}
	if p, ok = lit(b, p, `,"bytes":`); !ok {
		return
	}
	if e.Bytes, p, ok = fastUint(b, p); !ok {
		return
	}
	if p, ok = lit(b, p, `,"ts":`); !ok {
		return
	}
	if e.TS, p, ok = fastUint(b, p); !ok {
		return
	}
	p, ok = lit(b, p, `}`)
	return e, p, ok
}

func (d *jdec) events(f *Frame) error {
	evs := f.Events[:0]
	err := d.array("events", func(i int) error {
		d.ws()
		if e, q, ok := fastEvent(d.b, d.p); ok {
			evs = append(evs, e)
			d.p = q
			return nil
		}
		var e FuncEvent
		err := d.object(fld{"events", i, ""}, eventKeys, 0b1111, func(k int) error {
			var err error
			switch k {
			case 0:
				e.Tid, err = d.u32(fld{"events", i, "tid"})
			case 1:
				var kind uint8
				kind, err = d.kind(fld{"events", i, "kind"}, "0 entry or 1 exit")
				e.Kind = EventKind(kind)
			case 2:
				e.FID, err = d.u32(fld{"events", i, "fid"})
			case 3:
				e.TS, err = d.u64(fld{"events", i, "ts"})
			}
			return err
		})
		evs = append(evs, e)
		return err
	})
	f.Events = evs
	return err
}

func (d *jdec) counterEvents(f *Frame) error {
	evs := f.CounterEvents[:0]
	err := d.array("counter_events", func(i int) error {
		d.ws()
		if e, q, ok := fastCounter(d.b, d.p); ok {
			evs = append(evs, e)
			d.p = q
			return nil
		}
		var e CounterEvent
		err := d.object(fld{"counter_events", i, ""}, counterKeys, 0b1111, func(k int) error {
			var err error
			switch k {
			case 0:
				e.Tid, err = d.u32(fld{"counter_events", i, "tid"})
			case 1:
				e.CID, err = d.u32(fld{"counter_events", i, "cid"})
			case 2:
				e.Value, err = d.u64(fld{"counter_events", i, "value"})
			case 3:
				e.TS, err = d.u64(fld{"counter_events", i, "ts"})
			}
			return err
		})
		evs = append(evs, e)
		return err
	})
	f.CounterEvents = evs
	return err
}

func (d *jdec) comms(f *Frame) error {
	evs := f.Comms[:0]
	err := d.array("comms", func(i int) error {
		d.ws()
		if e, q, ok := fastComm(d.b, d.p); ok {
			evs = append(evs, e)
			d.p = q
			return nil
		}
		var e CommEvent
		err := d.object(fld{"comms", i, ""}, commKeys, 0b111111, func(k int) error {
			var err error
			switch k {
			case 0:
				e.Tid, err = d.u32(fld{"comms", i, "tid"})
			case 1:
				var kind uint8
				kind, err = d.kind(fld{"comms", i, "kind"}, "0 send or 1 recv")
				e.Kind = CommKind(kind)
			case 2:
				e.Tag, err = d.u32(fld{"comms", i, "tag"})
			case 3:
				e.Partner, err = d.u32(fld{"comms", i, "partner"})
			case 4:
				e.Bytes, err = d.u64(fld{"comms", i, "bytes"})
			case 5:
				e.TS, err = d.u64(fld{"comms", i, "ts"})
			}
			return err
		})
		evs = append(evs, e)
		return err
	})
	f.Comms = evs
	return err
}
