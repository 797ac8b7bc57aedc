package provenance

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// The execution records are the bulk of what provdb ingests, and decoding
// them with encoding/json costs as much as storing them. This file is a
// codec for Exec written for that path, about three times faster than the
// JSON libraries (measured in the package doc): AppendExecJSON
// writes exactly the bytes json.Marshal writes, and decodeExecs accepts
// only documents that encoding/json decodes to the same value (tests and
// fuzzing check both against encoding/json), so the two are
// interchangeable.

// AppendExecJSON appends e's JSON document (the bytes json.Marshal(e) gives)
// to dst. Like json.Marshal it fails on a NaN or infinite number.
func AppendExecJSON(dst []byte, e *Exec) ([]byte, error) {
	w := jw{b: dst}
	w.raw(`{"call_stack":`)
	w.callStack(e.CallStack)
	w.raw(`,"counter_events":`)
	if e.CounterEvents == nil {
		w.raw("null")
	} else {
		w.b = append(w.b, '[')
		for i := range e.CounterEvents {
			c := &e.CounterEvents[i]
			if i > 0 {
				w.b = append(w.b, ',')
			}
			w.raw(`{"counter_idx":`)
			w.uint(uint64(c.CounterIdx))
			w.raw(`,"counter_name":`)
			w.str(c.CounterName)
			w.raw(`,"counter_value":`)
			w.uint(c.CounterValue)
			w.raw(`,"pid":`)
			w.uint(uint64(c.PID))
			w.raw(`,"rid":`)
			w.uint(uint64(c.RID))
			w.raw(`,"tid":`)
			w.uint(uint64(c.TID))
			w.raw(`,"ts":`)
			w.uint(c.TS)
			w.b = append(w.b, '}')
		}
		w.b = append(w.b, ']')
	}
	w.raw(`,"entry":`)
	w.uint(e.Entry)
	w.raw(`,"exit":`)
	w.uint(e.Exit)
	w.raw(`,"event_id":`)
	w.str(e.EventID)
	w.raw(`,"fid":`)
	w.uint(uint64(e.FID))
	w.raw(`,"func":`)
	w.str(e.Func)
	w.raw(`,"func_stats":`)
	w.funcStats(&e.FuncStats)
	w.raw(`,"is_gpu_event":`)
	w.boolean(e.IsGPUEvent)
	w.raw(`,"gpu_location":`)
	if g := e.GPULocation; g == nil {
		w.raw("null")
	} else {
		w.raw(`{"context":`)
		w.uint(uint64(g.Context))
		w.raw(`,"device":`)
		w.uint(uint64(g.Device))
		w.raw(`,"stream":`)
		w.uint(uint64(g.Stream))
		w.raw(`,"thread":`)
		w.uint(uint64(g.Thread))
		w.b = append(w.b, '}')
	}
	w.raw(`,"gpu_parent":`)
	if p := e.GPUParent; p == nil {
		w.raw("null")
	} else {
		w.raw(`{"event_id":`)
		w.str(p.EventID)
		w.raw(`,"tid":`)
		w.uint(uint64(p.TID))
		w.raw(`,"call_stack":`)
		w.callStack(p.CallStack)
		w.b = append(w.b, '}')
	}
	w.raw(`,"pid":`)
	w.uint(uint64(e.PID))
	w.raw(`,"rid":`)
	w.uint(uint64(e.RID))
	w.raw(`,"tid":`)
	w.uint(uint64(e.TID))
	w.raw(`,"runtime_exclusive":`)
	w.uint(e.RuntimeExclusive)
	w.raw(`,"runtime_total":`)
	w.uint(e.RuntimeTotal)
	w.raw(`,"io_step":`)
	w.uint(e.IOStep)
	w.raw(`,"io_step_tstart":`)
	w.uint(e.IOStepTStart)
	w.raw(`,"io_step_tend":`)
	w.uint(e.IOStepTEnd)
	if e.LabelledIOStep != 0 {
		w.raw(`,"labelled_io_step":`)
		w.uint(e.LabelledIOStep)
	}
	w.raw(`,"event_window":{"exec_window":`)
	if ew := e.EventWindow.ExecWindow; ew == nil {
		w.raw("null")
	} else {
		w.b = append(w.b, '[')
		for i := range ew {
			x := &ew[i]
			if i > 0 {
				w.b = append(w.b, ',')
			}
			w.raw(`{"entry":`)
			w.uint(x.Entry)
			w.raw(`,"exit":`)
			w.uint(x.Exit)
			w.raw(`,"fid":`)
			w.uint(uint64(x.FID))
			w.raw(`,"func":`)
			w.str(x.Func)
			w.raw(`,"event_id":`)
			w.str(x.EventID)
			w.raw(`,"parent_event_id":`)
			w.str(x.ParentEventID)
			w.raw(`,"is_anomaly":`)
			w.boolean(x.IsAnomaly)
			w.b = append(w.b, '}')
		}
		w.b = append(w.b, ']')
	}
	w.raw(`,"comm_window":`)
	if cw := e.EventWindow.CommWindow; cw == nil {
		w.raw("null")
	} else {
		w.b = append(w.b, '[')
		for i := range cw {
			c := &cw[i]
			if i > 0 {
				w.b = append(w.b, ',')
			}
			w.raw(`{"type":`)
			w.str(c.Type)
			w.raw(`,"pid":`)
			w.uint(uint64(c.PID))
			w.raw(`,"rid":`)
			w.uint(uint64(c.RID))
			w.raw(`,"tid":`)
			w.uint(uint64(c.TID))
			w.raw(`,"src":`)
			w.uint(uint64(c.Src))
			w.raw(`,"tar":`)
			w.uint(uint64(c.Tar))
			w.raw(`,"bytes":`)
			w.uint(c.Bytes)
			w.raw(`,"tag":`)
			w.uint(uint64(c.Tag))
			w.raw(`,"timestamp":`)
			w.uint(c.Timestamp)
			w.raw(`,"execdata_key":`)
			w.str(c.ExecdataKey)
			w.b = append(w.b, '}')
		}
		w.b = append(w.b, ']')
	}
	w.raw(`},"outlier_score":`)
	w.float(e.OutlierScore)
	w.raw(`,"outlier_severity":`)
	w.float(e.OutlierSeverity)
	if e.Hostname != "" {
		w.raw(`,"hostname":`)
		w.str(e.Hostname)
	}
	if e.Algorithm != "" {
		w.raw(`,"algorithm":`)
		w.str(e.Algorithm)
	}
	if x := e.Explanation; x != nil {
		w.raw(`,"explanation":{"key":`)
		w.str(x.Key)
		w.raw(`,"value":`)
		w.float(x.Value)
		w.raw(`,"natural_min":`)
		w.float(x.NaturalMin)
		w.raw(`,"natural_max":`)
		w.float(x.NaturalMax)
		w.raw(`,"low_threshold":`)
		w.float(x.LowThreshold)
		w.raw(`,"threshold":`)
		w.float(x.Threshold)
		w.raw(`,"ratio":`)
		w.float(x.Ratio)
		w.raw(`,"p99":`)
		w.float(x.P99)
		w.raw(`,"log_sigmas":`)
		w.float(x.LogSigmas)
		w.raw(`,"excess":`)
		w.float(x.Excess)
		w.raw(`,"text":`)
		w.str(x.Text)
		if b := x.Baseline; b != nil {
			w.raw(`,"baseline":{"source":`)
			w.str(b.Source)
			w.raw(`,"bound":`)
			w.float(b.Bound)
			w.raw(`,"baseline_calls":`)
			w.uint(b.BaselineCalls)
			w.raw(`,"baseline_beyond":`)
			w.uint(b.BaselineBeyond)
			w.raw(`,"calls":`)
			w.uint(b.Calls)
			w.raw(`,"beyond":`)
			w.uint(b.Beyond)
			w.raw(`,"p_value":`)
			w.float(b.PValue)
			w.b = append(w.b, '}')
		}
		w.b = append(w.b, '}')
	}
	if e.FinalLabel != "" {
		w.raw(`,"final_label":`)
		w.str(e.FinalLabel)
	}
	w.b = append(w.b, '}')
	if w.err != nil {
		return dst, fmt.Errorf("encode execution %s: %w", e.EventID, w.err)
	}
	return w.b, nil
}

// jw appends JSON the way encoding/json writes it.
type jw struct {
	b   []byte
	err error
}

func (w *jw) raw(s string)   { w.b = append(w.b, s...) }
func (w *jw) uint(v uint64)  { w.b = strconv.AppendUint(w.b, v, 10) }
func (w *jw) boolean(v bool) { w.b = strconv.AppendBool(w.b, v) }
func (w *jw) str(s string)   { w.b = appendQuoted(w.b, s) }
func (w *jw) callStack(cs []CallFrame) {
	if cs == nil {
		w.raw("null")
		return
	}
	w.b = append(w.b, '[')
	for i := range cs {
		f := &cs[i]
		if i > 0 {
			w.b = append(w.b, ',')
		}
		w.raw(`{"entry":`)
		w.uint(f.Entry)
		w.raw(`,"exit":`)
		w.uint(f.Exit)
		w.raw(`,"fid":`)
		w.uint(uint64(f.FID))
		w.raw(`,"func":`)
		w.str(f.Func)
		w.raw(`,"event_id":`)
		w.str(f.EventID)
		w.raw(`,"is_anomaly":`)
		w.boolean(f.IsAnomaly)
		w.b = append(w.b, '}')
	}
	w.b = append(w.b, ']')
}

func (w *jw) funcStats(s *FuncStats) {
	w.raw(`{"accumulate":`)
	w.float(s.Accumulate)
	w.raw(`,"count":`)
	w.float(s.Count)
	w.raw(`,"kurtosis":`)
	w.float(s.Kurtosis)
	w.raw(`,"maximum":`)
	w.float(s.Maximum)
	w.raw(`,"mean":`)
	w.float(s.Mean)
	w.raw(`,"minimum":`)
	w.float(s.Minimum)
	w.raw(`,"skewness":`)
	w.float(s.Skewness)
	w.raw(`,"stddev":`)
	w.float(s.Stddev)
	w.b = append(w.b, '}')
}

// float writes f as encoding/json does: the shortest representation, in
// exponent form only below 1e-6 or from 1e21 on, with a one-digit negative
// exponent written without its leading zero.
func (w *jw) float(f float64) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		if w.err == nil {
			w.err = fmt.Errorf("unsupported value %v", f)
		}
		w.b = append(w.b, '0')
		return
	}
	format := byte('f')
	if a := math.Abs(f); a != 0 && (a < 1e-6 || a >= 1e21) {
		format = 'e'
	}
	w.b = strconv.AppendFloat(w.b, f, format, -1, 64)
	if format == 'e' {
		n := len(w.b)
		if n >= 4 && w.b[n-4] == 'e' && w.b[n-3] == '-' && w.b[n-2] == '0' {
			w.b[n-2] = w.b[n-1]
			w.b = w.b[:n-1]
		}
	}
}

const hexDigits = "0123456789abcdef"

// appendQuoted writes s as a JSON string the way encoding/json does with its
// default HTML escaping: <, > and & as \u003c, \u003e and \u0026, invalid
// UTF-8 as \ufffd, and U+2028 and U+2029 escaped.
func appendQuoted(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// errJSON is wrapped by every decoding error of this codec.
var errJSON = errors.New("invalid JSON")

// jr decodes JSON into the record types. It is stricter than encoding/json
// in two ways only, so that a document is never read differently by the
// two: a key that differs from a field's name but matches it
// case-insensitively, and a field given twice, are rejected (encoding/json
// accepts both, with rules no producer should rely on).
type jr struct {
	b   []byte
	i   int
	err error
	// names interns the strings that repeat across records (function
	// names, counter names, hosts), so that a batch holds one copy each.
	names map[string]string
	texts strings.Builder // see text
	// Arenas of the records' arrays (see slice).
	frames   []CallFrame
	counters []CounterEvent
	window   []WindowExec
	comms    []CommRecord
}

func (d *jr) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w at offset %d: %s", errJSON, d.i, fmt.Sprintf(format, args...))
	}
}

func (d *jr) ws() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// peek skips white space and returns the next byte (0 at the end).
func (d *jr) peek() byte {
	d.ws()
	if d.i < len(d.b) {
		return d.b[d.i]
	}
	return 0
}

func (d *jr) expect(c byte) bool {
	if d.err != nil {
		return false
	}
	if d.peek() != c {
		d.fail("expected %q", c)
		return false
	}
	d.i++
	return true
}

// null consumes a null literal if one is next.
func (d *jr) null() bool {
	if d.peek() == 'n' {
		if bytes.HasPrefix(d.b[d.i:], []byte("null")) {
			d.i += 4
			return true
		}
		d.fail("invalid literal")
	}
	return false
}

// begin consumes null, or the opening byte c ('{' or '[') of an object or
// array. members is true when members or elements follow; present is false
// for null (and on an error).
func (d *jr) begin(c byte) (members, present bool) {
	if d.err != nil || d.null() {
		return false, false
	}
	if !d.expect(c) {
		return false, false
	}
	if d.peek() == c+2 { // '}' or ']'
		d.i++
		return false, true
	}
	return true, true
}

// more consumes what follows a member or element: true after a ',', false
// after the closing byte or on an error.
func (d *jr) more(closing byte) bool {
	if d.err != nil {
		return false
	}
	switch d.peek() {
	case ',':
		d.i++
		return true
	case closing:
		d.i++
		return false
	}
	d.fail("expected ',' or %q", closing)
	return false
}

// field reads a member's key and colon and returns the key's index in keys
// (the field names of the target type). A key that is not a field has its
// value skipped and gives -1, as do errors; a field given twice, or a key
// that equals a field's name only case-insensitively, is an error. seen
// holds the fields read so far in this object.
func (d *jr) field(keys []string, seen *uint64) int {
	if d.err != nil {
		return -1
	}
	if d.peek() != '"' {
		d.fail("expected a key")
		return -1
	}
	// Documents this codec (or encoding/json) wrote have their keys in
	// declaration order and unescaped: first try the field after the last
	// one read.
	if next := bits.Len64(*seen); next < len(keys) {
		k, b := keys[next], d.b[d.i+1:]
		if len(b) > len(k) && b[len(k)] == '"' && string(b[:len(k)]) == k {
			d.i += len(k) + 2
			if !d.expect(':') {
				return -1
			}
			*seen |= 1 << next
			return next
		}
	}
	k := d.key()
	if !d.expect(':') {
		return -1
	}
	for j, n := range keys {
		if len(k) == len(n) && string(k) == n {
			if *seen&(1<<j) != 0 {
				d.fail("duplicate key %q", k)
				return -1
			}
			*seen |= 1 << j
			return j
		}
	}
	for _, n := range keys {
		if bytes.EqualFold(k, []byte(n)) {
			d.fail("key %q differs from field %q only in case", k, n)
			return -1
		}
	}
	d.skip()
	return -1
}

// key returns an object key, unescaped (valid until the next call).
func (d *jr) key() []byte {
	raw, esc := d.scanString()
	if !esc || d.err != nil {
		return raw
	}
	return unescape(raw)
}

// scanString consumes a string and returns its raw content and whether it
// has escapes or bytes that decoding changes (invalid UTF-8).
func (d *jr) scanString() ([]byte, bool) {
	if d.err != nil {
		return nil, false
	}
	if d.peek() != '"' {
		d.fail("expected a string")
		return nil, false
	}
	d.i++
	start, esc := d.i, false
	for d.i < len(d.b) {
		c := d.b[d.i]
		switch {
		case c == '"':
			raw := d.b[start:d.i]
			d.i++
			return raw, esc
		case c == '\\':
			esc = true
			d.i++
			if d.i >= len(d.b) {
				break
			}
			switch d.b[d.i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				d.i++
			case 'u':
				if d.i+5 > len(d.b) {
					d.fail("short \\u escape")
					return nil, false
				}
				for _, h := range d.b[d.i+1 : d.i+5] {
					if !isHex(h) {
						d.fail("bad \\u escape")
						return nil, false
					}
				}
				d.i += 5
			default:
				d.fail("bad escape")
				return nil, false
			}
		case c < 0x20:
			d.fail("control character in string")
			return nil, false
		case c >= utf8.RuneSelf:
			r, size := utf8.DecodeRune(d.b[d.i:])
			if r == utf8.RuneError && size == 1 {
				esc = true
			}
			d.i += size
		default:
			d.i++
		}
	}
	d.fail("unterminated string")
	return nil, false
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

func hexVal(b []byte) rune {
	var r rune
	for _, c := range b {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		default:
			c = c - 'A' + 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

// unescape decodes a scanned string's content as encoding/json does (lone
// surrogates and invalid UTF-8 become U+FFFD).
func unescape(raw []byte) []byte {
	out := make([]byte, 0, len(raw))
	for i := 0; i < len(raw); {
		c := raw[i]
		switch {
		case c == '\\':
			switch raw[i+1] {
			case 'b':
				out = append(out, '\b')
			case 'f':
				out = append(out, '\f')
			case 'n':
				out = append(out, '\n')
			case 'r':
				out = append(out, '\r')
			case 't':
				out = append(out, '\t')
			case 'u':
				r := hexVal(raw[i+2 : i+6])
				i += 6
				if utf16.IsSurrogate(r) {
					if i+6 <= len(raw) && raw[i] == '\\' && raw[i+1] == 'u' {
						if r2 := utf16.DecodeRune(r, hexVal(raw[i+2:i+6])); r2 != utf8.RuneError {
							out = utf8.AppendRune(out, r2)
							i += 6
							continue
						}
					}
					r = utf8.RuneError
				}
				out = utf8.AppendRune(out, r)
				continue
			default: // " \ /
				out = append(out, raw[i+1])
			}
			i += 2
		case c >= utf8.RuneSelf:
			r, size := utf8.DecodeRune(raw[i:])
			if r == utf8.RuneError && size == 1 {
				out = utf8.AppendRune(out, utf8.RuneError)
			} else {
				out = append(out, raw[i:i+size]...)
			}
			i += size
		default:
			out = append(out, c)
			i++
		}
	}
	return out
}

// str decodes a string field; null leaves *dst as it is.
func (d *jr) str(dst *string) {
	if raw := d.strBytes(); raw != nil {
		*dst = d.text(raw)
	}
}

// text returns raw as a string held in the decoder's text buffer: the
// unique strings of a batch (event ids) share a few large allocations
// instead of taking one each. A string handed out is never written again:
// the buffer only grows, and growing moves it to new memory.
func (d *jr) text(raw []byte) string {
	if len(raw) == 0 {
		return ""
	}
	start := d.texts.Len()
	d.texts.Write(raw)
	return d.texts.String()[start:]
}

// strBytes decodes a string (nil for null or on error).
func (d *jr) strBytes() []byte {
	if d.err != nil || d.null() {
		return nil
	}
	raw, esc := d.scanString()
	if d.err != nil {
		return nil
	}
	if esc {
		raw = unescape(raw)
	}
	if raw == nil {
		raw = []byte{}
	}
	return raw
}

// name decodes a string field whose values repeat across records (function,
// counter and host names), keeping one copy of each per decoder.
func (d *jr) name(dst *string) {
	raw := d.strBytes()
	if raw == nil {
		return
	}
	if s, ok := d.names[string(raw)]; ok {
		*dst = s
		return
	}
	s := string(raw)
	if len(d.names) < 4096 {
		d.names[s] = s
	}
	*dst = s
}

// number consumes a JSON number and returns its text.
func (d *jr) number() []byte {
	d.ws()
	start := d.i
	b := d.b
	i := d.i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	default:
		d.fail("expected a number")
		return nil
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			d.fail("bad number")
			return nil
		}
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			d.fail("bad number")
			return nil
		}
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	}
	d.i = i
	return b[start:i]
}

// uint decodes an unsigned integer of at most bits bits; null leaves *dst.
func (d *jr) uint(dst *uint64, bits int) {
	if d.err != nil || d.null() {
		return
	}
	if d.peek() == '"' {
		d.fail("expected a number, found a string")
		return
	}
	// Fast path: up to 19 digits without a leading zero, ending the number.
	b, i := d.b, d.i
	var v uint64
	for i < len(b) && i-d.i < 19 && b[i] >= '0' && b[i] <= '9' {
		v = v*10 + uint64(b[i]-'0')
		i++
	}
	n := b[d.i:i]
	if len(n) == 0 || len(n) > 1 && n[0] == '0' || i < len(b) && (b[i] >= '0' && b[i] <= '9' || b[i] == '.' || b[i] == 'e' || b[i] == 'E') {
		if n = d.number(); d.err != nil {
			return
		}
		var err error
		if v, err = strconv.ParseUint(string(n), 10, 64); err != nil {
			d.fail("%s is not an unsigned integer", n)
			return
		}
	} else {
		d.i = i
	}
	if bits < 64 && v>>bits != 0 {
		d.fail("%s overflows %d bits", n, bits)
		return
	}
	*dst = v
}

func (d *jr) u64(dst *uint64) { d.uint(dst, 64) }

func (d *jr) u32(dst *uint32) {
	v := uint64(*dst)
	d.uint(&v, 32)
	*dst = uint32(v)
}

// float decodes a float64; null leaves *dst.
func (d *jr) float(dst *float64) {
	if d.err != nil || d.null() {
		return
	}
	if d.peek() == '"' {
		d.fail("expected a number, found a string")
		return
	}
	n := d.number()
	if d.err != nil {
		return
	}
	v, err := strconv.ParseFloat(string(n), 64)
	if err != nil {
		d.fail("%s is out of range", n)
		return
	}
	*dst = v
}

// boolean decodes a bool; null leaves *dst.
func (d *jr) boolean(dst *bool) {
	if d.err != nil || d.null() {
		return
	}
	switch {
	case bytes.HasPrefix(d.b[d.i:], []byte("true")):
		*dst = true
		d.i += 4
	case bytes.HasPrefix(d.b[d.i:], []byte("false")):
		*dst = false
		d.i += 5
	default:
		d.fail("expected true or false")
	}
}

// skip consumes any value, checking it is well formed.
func (d *jr) skip() {
	if d.err != nil {
		return
	}
	switch c := d.peek(); {
	case c == '{':
		for members, _ := d.begin('{'); members; members = d.more('}') {
			if d.peek() != '"' {
				d.fail("expected a key")
				return
			}
			d.scanString()
			if !d.expect(':') {
				return
			}
			d.skip()
		}
	case c == '[':
		for members, _ := d.begin('['); members; members = d.more(']') {
			d.skip()
		}
	case c == '"':
		d.scanString()
	case c == 't', c == 'f':
		var b bool
		d.boolean(&b)
	case c == 'n':
		d.null()
	case c == '-' || c >= '0' && c <= '9':
		d.number()
	default:
		d.fail("expected a value")
	}
}

// The field names of each record type, in declaration order; their
// positions are the cases of the decoders' switches.
var (
	callFrameKeys   = []string{"entry", "exit", "fid", "func", "event_id", "is_anomaly"}
	counterKeys     = []string{"counter_idx", "counter_name", "counter_value", "pid", "rid", "tid", "ts"}
	funcStatsKeys   = []string{"accumulate", "count", "kurtosis", "maximum", "mean", "minimum", "skewness", "stddev"}
	gpuLocationKeys = []string{"context", "device", "stream", "thread"}
	gpuParentKeys   = []string{"event_id", "tid", "call_stack"}
	windowExecKeys  = []string{"entry", "exit", "fid", "func", "event_id", "parent_event_id", "is_anomaly"}
	commKeys        = []string{"type", "pid", "rid", "tid", "src", "tar", "bytes", "tag", "timestamp", "execdata_key"}
	eventWindowKeys = []string{"exec_window", "comm_window"}
	execKeys        = []string{
		"call_stack", "counter_events", "entry", "exit", "event_id", "fid", "func", "func_stats",
		"is_gpu_event", "gpu_location", "gpu_parent", "pid", "rid", "tid", "runtime_exclusive",
		"runtime_total", "io_step", "io_step_tstart", "io_step_tend", "labelled_io_step", "event_window",
		"outlier_score", "outlier_severity", "hostname", "algorithm", "explanation", "final_label",
	}
	explanationKeys = []string{"key", "value", "natural_min", "natural_max", "low_threshold", "threshold", "ratio", "p99", "log_sigmas", "excess", "text", "baseline"}
	baselineKeys    = []string{"source", "bound", "baseline_calls", "baseline_beyond", "calls", "beyond", "p_value"}
)

// slice decodes an array into *dst: elem decodes one element, which starts
// from its zero value. Elements are appended to arena, one per element type
// and decoder, and *dst is the part of it they take (capacity limited to
// it), so that a batch of records takes a few large allocations instead of
// several small ones per record. null gives a nil slice, [] an empty one.
func slice[T any](d *jr, dst *[]T, arena *[]T, elem func(d *jr, v *T)) {
	members, present := d.begin('[')
	start := len(*arena)
	for ; members; members = d.more(']') {
		var zero T
		*arena = append(*arena, zero)
		elem(d, &(*arena)[len(*arena)-1])
	}
	switch {
	case !present:
		*dst = nil
	case len(*arena) == start:
		*dst = []T{}
	default:
		*dst = (*arena)[start:len(*arena):len(*arena)]
	}
}

func (d *jr) callFrame(f *CallFrame) {
	var seen uint64
	for members, _ := d.begin('{'); members; members = d.more('}') {
		switch d.field(callFrameKeys, &seen) {
		case 0:
			d.u64(&f.Entry)
		case 1:
			d.u64(&f.Exit)
		case 2:
			d.u32(&f.FID)
		case 3:
			d.name(&f.Func)
		case 4:
			d.str(&f.EventID)
		case 5:
			d.boolean(&f.IsAnomaly)
		}
	}
}

func (d *jr) counterEvent(c *CounterEvent) {
	var seen uint64
	for members, _ := d.begin('{'); members; members = d.more('}') {
		switch d.field(counterKeys, &seen) {
		case 0:
			d.u32(&c.CounterIdx)
		case 1:
			d.name(&c.CounterName)
		case 2:
			d.u64(&c.CounterValue)
		case 3:
			d.u32(&c.PID)
		case 4:
			d.u32(&c.RID)
		case 5:
			d.u32(&c.TID)
		case 6:
			d.u64(&c.TS)
		}
	}
}

func (d *jr) funcStats(s *FuncStats) {
	var seen uint64
	for members, _ := d.begin('{'); members; members = d.more('}') {
		switch d.field(funcStatsKeys, &seen) {
		case 0:
			d.float(&s.Accumulate)
		case 1:
			d.float(&s.Count)
		case 2:
			d.float(&s.Kurtosis)
		case 3:
			d.float(&s.Maximum)
		case 4:
			d.float(&s.Mean)
		case 5:
			d.float(&s.Minimum)
		case 6:
			d.float(&s.Skewness)
		case 7:
			d.float(&s.Stddev)
		}
	}
}

func (d *jr) gpuLocation(dst **GPULocation) {
	if d.null() {
		*dst = nil
		return
	}
	g := new(GPULocation)
	*dst = g
	var seen uint64
	for members, _ := d.begin('{'); members; members = d.more('}') {
		switch d.field(gpuLocationKeys, &seen) {
		case 0:
			d.u32(&g.Context)
		case 1:
			d.u32(&g.Device)
		case 2:
			d.u32(&g.Stream)
		case 3:
			d.u32(&g.Thread)
		}
	}
}

func (d *jr) gpuParent(dst **GPUParent) {
	if d.null() {
		*dst = nil
		return
	}
	p := new(GPUParent)
	*dst = p
	var seen uint64
	for members, _ := d.begin('{'); members; members = d.more('}') {
		switch d.field(gpuParentKeys, &seen) {
		case 0:
			d.str(&p.EventID)
		case 1:
			d.u32(&p.TID)
		case 2:
			slice(d, &p.CallStack, &d.frames, (*jr).callFrame)
		}
	}
}

func (d *jr) windowExec(x *WindowExec) {
	var seen uint64
	for members, _ := d.begin('{'); members; members = d.more('}') {
		switch d.field(windowExecKeys, &seen) {
		case 0:
			d.u64(&x.Entry)
		case 1:
			d.u64(&x.Exit)
		case 2:
			d.u32(&x.FID)
		case 3:
			d.name(&x.Func)
		case 4:
			d.str(&x.EventID)
		case 5:
			d.str(&x.ParentEventID)
		case 6:
			d.boolean(&x.IsAnomaly)
		}
	}
}

func (d *jr) commRecord(c *CommRecord) {
	var seen uint64
	for members, _ := d.begin('{'); members; members = d.more('}') {
		switch d.field(commKeys, &seen) {
		case 0:
			d.name(&c.Type)
		case 1:
			d.u32(&c.PID)
		case 2:
			d.u32(&c.RID)
		case 3:
			d.u32(&c.TID)
		case 4:
			d.u32(&c.Src)
		case 5:
			d.u32(&c.Tar)
		case 6:
			d.u64(&c.Bytes)
		case 7:
			d.u32(&c.Tag)
		case 8:
			d.u64(&c.Timestamp)
		case 9:
			d.str(&c.ExecdataKey)
		}
	}
}

func (d *jr) eventWindow(w *EventWindow) {
	var seen uint64
	for members, _ := d.begin('{'); members; members = d.more('}') {
		switch d.field(eventWindowKeys, &seen) {
		case 0:
			slice(d, &w.ExecWindow, &d.window, (*jr).windowExec)
		case 1:
			slice(d, &w.CommWindow, &d.comms, (*jr).commRecord)
		}
	}
}

func (d *jr) exec(e *Exec) {
	var seen uint64
	for members, _ := d.begin('{'); members; members = d.more('}') {
		switch d.field(execKeys, &seen) {
		case 0:
			slice(d, &e.CallStack, &d.frames, (*jr).callFrame)
		case 1:
			slice(d, &e.CounterEvents, &d.counters, (*jr).counterEvent)
		case 2:
			d.u64(&e.Entry)
		case 3:
			d.u64(&e.Exit)
		case 4:
			d.str(&e.EventID)
		case 5:
			d.u32(&e.FID)
		case 6:
			d.name(&e.Func)
		case 7:
			d.funcStats(&e.FuncStats)
		case 8:
			d.boolean(&e.IsGPUEvent)
		case 9:
			d.gpuLocation(&e.GPULocation)
		case 10:
			d.gpuParent(&e.GPUParent)
		case 11:
			d.u32(&e.PID)
		case 12:
			d.u32(&e.RID)
		case 13:
			d.u32(&e.TID)
		case 14:
			d.u64(&e.RuntimeExclusive)
		case 15:
			d.u64(&e.RuntimeTotal)
		case 16:
			d.u64(&e.IOStep)
		case 17:
			d.u64(&e.IOStepTStart)
		case 18:
			d.u64(&e.IOStepTEnd)
		case 19:
			d.u64(&e.LabelledIOStep)
		case 20:
			d.eventWindow(&e.EventWindow)
		case 21:
			d.float(&e.OutlierScore)
		case 22:
			d.float(&e.OutlierSeverity)
		case 23:
			d.name(&e.Hostname)
		case 24:
			d.name(&e.Algorithm)
		case 25:
			d.explanation(&e.Explanation)
		case 26:
			d.name(&e.FinalLabel)
		}
	}
}

func (d *jr) explanation(dst **Explanation) {
	if d.null() {
		*dst = nil
		return
	}
	x := new(Explanation)
	*dst = x
	var seen uint64
	for members, _ := d.begin('{'); members; members = d.more('}') {
		switch d.field(explanationKeys, &seen) {
		case 0:
			d.str(&x.Key)
		case 1:
			d.float(&x.Value)
		case 2:
			d.float(&x.NaturalMin)
		case 3:
			d.float(&x.NaturalMax)
		case 4:
			d.float(&x.LowThreshold)
		case 5:
			d.float(&x.Threshold)
		case 6:
			d.float(&x.Ratio)
		case 7:
			d.float(&x.P99)
		case 8:
			d.float(&x.LogSigmas)
		case 9:
			d.float(&x.Excess)
		case 10:
			d.str(&x.Text)
		case 11:
			d.baseline(&x.Baseline)
		}
	}
}

func (d *jr) baseline(dst **BaselineEvidence) {
	if d.null() {
		*dst = nil
		return
	}
	b := new(BaselineEvidence)
	*dst = b
	var seen uint64
	for members, _ := d.begin('{'); members; members = d.more('}') {
		switch d.field(baselineKeys, &seen) {
		case 0:
			d.str(&b.Source)
		case 1:
			d.float(&b.Bound)
		case 2:
			d.u64(&b.BaselineCalls)
		case 3:
			d.u64(&b.BaselineBeyond)
		case 4:
			d.u64(&b.Calls)
		case 5:
			d.u64(&b.Beyond)
		case 6:
			d.float(&b.PValue)
		}
	}
}

// decodeExecs decodes a JSON array of execution records.
func decodeExecs(data []byte) ([]Exec, error) {
	d := jr{b: data, names: map[string]string{}}
	if d.peek() != '[' {
		return nil, fmt.Errorf("%w: not a JSON array", errJSON)
	}
	// Size the arenas for records like the detectors' (about 3 KB of JSON
	// with an 11-execution window), so that they seldom grow.
	n := len(data)
	d.window = make([]WindowExec, 0, n/256)
	d.frames = make([]CallFrame, 0, n/640)
	d.texts.Grow(n / 6)
	arena := make([]Exec, 0, n/2048+1)
	var out []Exec
	slice(&d, &out, &arena, (*jr).exec)
	if d.err == nil && d.peek() != 0 {
		d.fail("data after the array")
	}
	if d.err != nil {
		return nil, d.err
	}
	return out, nil
}

// DecodeExec decodes one execution document (as stored), with the same
// rules as DecodeBatch.
func DecodeExec(data []byte, e *Exec) error {
	d := jr{b: data, names: map[string]string{}}
	if d.peek() != '{' {
		return fmt.Errorf("%w: not a JSON object", errJSON)
	}
	d.exec(e)
	if d.err == nil && d.peek() != 0 {
		d.fail("data after the document")
	}
	return d.err
}

// ExecChecker decodes execution documents one after another with the rules
// of DecodeExec, reusing its memory across documents: what Check returns
// is valid only until its next call. It serves readers that check
// documents without keeping them. The zero value is ready; it is not safe
// for concurrent use.
type ExecChecker struct {
	d jr
	e Exec
}

// Check decodes data as DecodeExec does and returns the execution.
func (c *ExecChecker) Check(data []byte) (*Exec, error) {
	d := &c.d
	if d.names == nil || len(d.names) >= 4096 {
		d.names = map[string]string{}
	}
	d.b, d.i, d.err = data, 0, nil
	// Strings handed out are never written again (see text), so the text
	// buffer is kept across documents until it is large.
	if d.texts.Len() > 1<<20 {
		d.texts = strings.Builder{}
	}
	if d.texts.Cap() == 0 {
		d.texts.Grow(64 << 10)
	}
	d.frames, d.counters, d.window, d.comms = d.frames[:0], d.counters[:0], d.window[:0], d.comms[:0]
	c.e = Exec{}
	if d.peek() != '{' {
		return nil, fmt.Errorf("%w: not a JSON object", errJSON)
	}
	d.exec(&c.e)
	if d.err == nil && d.peek() != 0 {
		d.fail("data after the document")
	}
	if d.err != nil {
		return nil, d.err
	}
	return &c.e, nil
}
