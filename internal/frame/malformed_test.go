package frame

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"
)

// body builds a frame body from unsigned varints (uint64 values) and raw
// byte strings ([]byte values).
func body(parts ...any) []byte {
	var b []byte
	for _, p := range parts {
		switch v := p.(type) {
		case int:
			b = binary.AppendUvarint(b, uint64(v))
		case uint64:
			b = binary.AppendUvarint(b, v)
		case []byte:
			b = append(b, v...)
		case string:
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		default:
			panic("body: bad part")
		}
	}
	return b
}

// framed puts a header declaring len(b) body bytes in front of b.
func framed(b []byte) []byte {
	return withHeader(b, len(b))
}

func withHeader(b []byte, size int) []byte {
	h := []byte(Magic)
	h = append(h, Version)
	h = binary.LittleEndian.AppendUint32(h, uint32(size))
	return append(h, b...)
}

// okHead is the start of a small valid body: pid 1, rank 2, step 3, t_start
// 100, t_end 100, one thread (tid 0), no dictionary or metadata; body offsets
// 0 to 9, so the events count that follows is at frame offset 19. okHead3 is
// the same with three threads (tids 0, 1, 2) and ends at frame offset 20.
// okFull is okHead with three empty event sections.
var (
	okHead  = body(1, 2, 3, 100, 0, 1, 0, 0, 0, 0)
	okHead3 = body(1, 2, 3, 100, 0, 3, 0, 0, 0, 0, 0, 0)
	okFull  = cat(okHead, body(0, 0, 0))
)

func cat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

func TestDecodeBinaryMalformed(t *testing.T) {
	valid := AppendBinary(nil, testFrames()[3].f) // counters_comms
	overlong := []byte{0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01}
	tenth := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02}
	badVersion := append([]byte(nil), valid...)
	badVersion[4] = 2
	cases := []struct {
		name   string
		in     []byte
		offset int
		field  string
		err    error
	}{
		{"empty input", nil, 0, "header", ErrTruncated},
		{"short header", []byte("KPF"), 3, "header", ErrTruncated},
		{"bad magic", []byte("KPFX\x01\x00\x00\x00\x00"), 0, "header.magic", ErrMagic},
		{"short bad magic", []byte("XY"), 0, "header.magic", ErrMagic},
		{"unknown version", badVersion, 4, "header.version", ErrVersion},
		{"length over limit", withHeader(nil, MaxFrameSize+1), 5, "header.length", ErrLength},
		{"truncated body", valid[:len(valid)-1], len(valid) - 1, "body", ErrTruncated},
		{"declared length too short", withHeader(okHead[:3], 3), 12, "t_start", ErrLength},
		{"declared length too long", cat(withHeader(okFull, len(okFull)+9), framed(okFull)), 22, "body", ErrTrailing},
		{"pid varint overflow", framed(cat(overlong, okFull)), 9, "pid", ErrOverflow},
		{"tenth byte overflow", framed(cat(body(1), tenth, okFull)), 10, "rank", ErrOverflow},
		{"pid beyond 32 bits", framed(cat(body(1<<32), okFull)), 9, "pid", ErrOverflow},
		{"thread count beyond input", framed(body(1, 2, 3, 100, 0, 1000, 0)), 14, "threads.count", ErrCount},
		{"tid beyond 32 bits", framed(body(1, 2, 3, 100, 0, 2, 5, uint64(1)<<32, 0, 0, 0, 0, 0, 0)), 16, "threads[1]", ErrOverflow},
		{"func count beyond input", framed(body(1, 2, 3, 100, 0, 0, 50, 1, "a")), 15, "funcs.count", ErrCount},
		{"name past frame end", framed(body(1, 2, 3, 100, 0, 0, 1, 1, 200)), 17, "funcs[0].name", ErrLength},
		{"name not UTF-8", framed(body(1, 2, 3, 100, 0, 0, 1, 1, "a\xffb", 0, 0, 0, 0, 0)), 18, "funcs[0].name", ErrInvalid},
		{"metadata count beyond input", framed(body(1, 2, 3, 100, 0, 0, 0, 0, 9, 0, "", "")), 17, "metadata.count", ErrCount},
		{"event count beyond input", framed(cat(okHead, body(1000, 0, 0))), 19, "events.count", ErrCount},
		{"thread index out of range", framed(cat(okHead3, body(1, 0b111, 0, 0, 0))), 22, "events[0].head", ErrInvalid},
		{"event fid beyond 32 bits", framed(cat(okHead, body(1, uint64(1)<<34, 0, 0, 0))), 20, "events[0].head", ErrOverflow},
		{"event ts overflow", framed(cat(okHead, body(1, 2), overlong, body(0, 0))), 21, "events[0].ts", ErrOverflow},
		{"event past frame end", framed(cat(okHead, body(1, 2), []byte{0x80})), 21, "events[0].ts", ErrLength},
		{"counter thread index out of range", framed(cat(okHead3, body(0, 1, 0b111, 0, 0, 0))), 23, "counter_events[0].head", ErrInvalid},
		{"comm tag beyond 32 bits", framed(cat(okHead, body(0, 0, 1, 0, uint64(1)<<32, 0, 0))), 23, "comms[0].tag", ErrOverflow},
		{"trailing garbage inside frame", framed(cat(okFull, []byte{0})), 22, "body", ErrTrailing},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var f Frame
			n, err := DecodeBinary(tc.in, &f)
			if err == nil {
				t.Fatalf("decoded %d bytes without error, want %v", n, tc.err)
			}
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("error %T %v is not a *DecodeError", err, err)
			}
			if !errors.Is(err, tc.err) {
				t.Errorf("error %q, want cause %q", err, tc.err)
			}
			if de.Offset != tc.offset || de.Field != tc.field {
				t.Errorf("error at offset %d field %q, want offset %d field %q (%v)", de.Offset, de.Field, tc.offset, tc.field, err)
			}
			msg := err.Error()
			if !strings.Contains(msg, "offset") || !strings.Contains(msg, tc.field) {
				t.Errorf("message %q does not name the field and offset", msg)
			}
		})
	}
}

// TestDecodeBinaryEveryTruncation cuts a valid file at every length: every
// prefix fails with a *DecodeError, none panics.
func TestDecodeBinaryEveryTruncation(t *testing.T) {
	valid := AppendBinary(nil, testFrames()[5].f) // max_values
	for i := range len(valid) {
		var f Frame
		_, err := DecodeBinary(valid[:i], &f)
		var de *DecodeError
		if !errors.As(err, &de) || !errors.Is(err, ErrTruncated) {
			t.Fatalf("prefix of %d bytes: error %v, want a truncation DecodeError", i, err)
		}
	}
}

func TestDecodeJSONMalformed(t *testing.T) {
	cases := []struct {
		name   string
		in     string
		offset int
		field  string
		err    error
	}{
		{"empty input", "", 0, "frame", ErrTruncated},
		{"only space", "  \n", 3, "frame", ErrTruncated},
		{"not an object", `[1,2]`, 0, "frame", ErrInvalid},
		{"null", `null`, 0, "frame", ErrInvalid},
		{"syntax error", `{"pid":1,,}`, 9, "frame", ErrInvalid},
		{"truncated", `{"pid":1,"events":[{"tid":0`, 27, "events[0]", ErrTruncated},
		{"truncated string", `{"funcs":[{"id":0,"name":"ab`, 28, "funcs[0].name", ErrTruncated},
		{"truncated in escape", `{"funcs":[{"id":0,"name":"ab\`, 29, "funcs[0].name", ErrTruncated},
		{"missing field", `{"pid":1,"rank":2,"io_step":0,"t_start":0}`, 41, "frame", ErrInvalid},
		{"missing event field", `{"events":[{"tid":0,"kind":0,"ts":5}]}`, 35, "events[0]", ErrInvalid},
		{"repeated field", `{"pid":1,"pid":2}`, 9, "frame", ErrInvalid},
		{"null array", `{"events":null}`, 10, "events", ErrInvalid},
		{"leading zero", `{"pid":01}`, 7, "pid", ErrInvalid},
		{"exponent", `{"pid":1e3}`, 7, "pid", ErrInvalid},
		{"beyond 64 bits", `{"io_step":18446744073709551616}`, 11, "io_step", ErrOverflow},
		{"ts beyond 64 bits", `{"events":[{"ts":18446744073709551616}]}`, 17, "events[0].ts", ErrOverflow},
		{"control character in string", "{\"funcs\":[{\"id\":0,\"name\":\"a\tb\"}]}", 27, "funcs[0].name", ErrInvalid},
		{"invalid UTF-8", "{\"funcs\":[{\"id\":0,\"name\":\"a\xffb\"}]}", 27, "funcs[0].name", ErrInvalid},
		{"bad escape", `{"funcs":[{"id":0,"name":"a\qb"}]}`, 27, "funcs[0].name", ErrInvalid},
		{"lone surrogate", `{"funcs":[{"id":0,"name":"\ud800x"}]}`, 26, "funcs[0].name", ErrInvalid},
		{"unknown field", `{"pid":1,"ranks":2}`, 9, "frame", ErrInvalid},
		{"unknown nested field", `{"events":[{"tid":0,"kind":0,"fid":1,"ts":5,"x":1}]}`, 44, "events[0]", ErrInvalid},
		{"trailing data", `{"pid":1,"rank":2,"io_step":0,"t_start":0,"t_end":0} {}`, 53, "frame", ErrTrailing},
		{"negative number", `{"pid":-1}`, 7, "pid", ErrInvalid},
		{"pid beyond 32 bits", `{"pid":4294967296}`, 7, "pid", ErrOverflow},
		{"string for number", `{"rank":"2"}`, 8, "rank", ErrInvalid},
		{"fraction", `{"t_start":1.5}`, 11, "t_start", ErrInvalid},
		{"event kind 2", `{"events":[{"tid":0,"kind":2,"fid":1,"ts":5}]}`, 27, "events[0].kind", ErrInvalid},
		{"comm kind 7", `{"comms":[{"tid":0,"kind":0,"tag":0,"partner":0,"bytes":0,"ts":0},{"tid":0,"kind":7,"tag":0,"partner":0,"bytes":0,"ts":0}]}`, 82, "comms[1].kind", ErrInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var f Frame
			err := DecodeJSON([]byte(tc.in), &f)
			if err == nil {
				t.Fatalf("decoded without error, want %v", tc.err)
			}
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("error %T %v is not a *DecodeError", err, err)
			}
			if !errors.Is(err, tc.err) {
				t.Errorf("error %q, want cause %q", err, tc.err)
			}
			if de.Offset != tc.offset || de.Field != tc.field {
				t.Errorf("error at offset %d field %q, want offset %d field %q (%v)", de.Offset, de.Field, tc.offset, tc.field, err)
			}
		})
	}
}
