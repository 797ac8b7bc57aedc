package frame

import (
	"fmt"
	"strconv"
	"unicode/utf8"
)

// AppendJSON appends the JSON form of f to dst as one line without a trailing
// newline. Fields appear in the order of the struct tags; empty dictionary,
// metadata and event lists are omitted. Kinds are numbers (0 entry or send,
// 1 exit or recv). It fails only when f is not valid (see Validate).
func AppendJSON(dst []byte, f *Frame) ([]byte, error) {
	if err := f.Validate(); err != nil {
		return dst, fmt.Errorf("encode frame as JSON: %w", err)
	}
	dst = append(dst, `{"pid":`...)
	dst = strconv.AppendUint(dst, uint64(f.PID), 10)
	dst = append(dst, `,"rank":`...)
	dst = strconv.AppendUint(dst, uint64(f.Rank), 10)
	dst = append(dst, `,"io_step":`...)
	dst = strconv.AppendUint(dst, f.Step, 10)
	dst = append(dst, `,"t_start":`...)
	dst = strconv.AppendUint(dst, f.TStart, 10)
	dst = append(dst, `,"t_end":`...)
	dst = strconv.AppendUint(dst, f.TEnd, 10)
	dst = appendJSONNames(dst, `,"funcs":[`, f.Funcs)
	dst = appendJSONNames(dst, `,"counters":[`, f.Counters)
	if len(f.Metadata) > 0 {
		dst = append(dst, `,"metadata":[`...)
		for i, m := range f.Metadata {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, `{"tid":`...)
			dst = strconv.AppendUint(dst, uint64(m.Tid), 10)
			dst = append(dst, `,"key":`...)
			dst = appendJSONString(dst, m.Key)
			dst = append(dst, `,"value":`...)
			dst = appendJSONString(dst, m.Value)
			dst = append(dst, '}')
		}
		dst = append(dst, ']')
	}
	if len(f.Events) > 0 {
		dst = append(dst, `,"events":[`...)
		for i, e := range f.Events {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, `{"tid":`...)
			dst = strconv.AppendUint(dst, uint64(e.Tid), 10)
			dst = append(dst, `,"kind":`...)
			dst = strconv.AppendUint(dst, uint64(e.Kind), 10)
			dst = append(dst, `,"fid":`...)
			dst = strconv.AppendUint(dst, uint64(e.FID), 10)
			dst = append(dst, `,"ts":`...)
			dst = strconv.AppendUint(dst, e.TS, 10)
			dst = append(dst, '}')
		}
		dst = append(dst, ']')
	}
	if len(f.CounterEvents) > 0 {
		dst = append(dst, `,"counter_events":[`...)
		for i, e := range f.CounterEvents {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, `{"tid":`...)
			dst = strconv.AppendUint(dst, uint64(e.Tid), 10)
			dst = append(dst, `,"cid":`...)
			dst = strconv.AppendUint(dst, uint64(e.CID), 10)
			dst = append(dst, `,"value":`...)
			dst = strconv.AppendUint(dst, e.Value, 10)
			dst = append(dst, `,"ts":`...)
			dst = strconv.AppendUint(dst, e.TS, 10)
			dst = append(dst, '}')
		}
		dst = append(dst, ']')
	}
	if len(f.Comms) > 0 {
		dst = append(dst, `,"comms":[`...)
		for i, e := range f.Comms {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, `{"tid":`...)
			dst = strconv.AppendUint(dst, uint64(e.Tid), 10)
			dst = append(dst, `,"kind":`...)
			dst = strconv.AppendUint(dst, uint64(e.Kind), 10)
			dst = append(dst, `,"tag":`...)
			dst = strconv.AppendUint(dst, uint64(e.Tag), 10)
			dst = append(dst, `,"partner":`...)
			dst = strconv.AppendUint(dst, uint64(e.Partner), 10)
			dst = append(dst, `,"bytes":`...)
			dst = strconv.AppendUint(dst, e.Bytes, 10)
			dst = append(dst, `,"ts":`...)
			dst = strconv.AppendUint(dst, e.TS, 10)
			dst = append(dst, '}')
		}
		dst = append(dst, ']')
	}
	return append(dst, '}'), nil
}

func appendJSONNames(dst []byte, open string, names []Name) []byte {
	if len(names) == 0 {
		return dst
	}
	dst = append(dst, open...)
	for i, n := range names {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"id":`...)
		dst = strconv.AppendUint(dst, uint64(n.ID), 10)
		dst = append(dst, `,"name":`...)
		dst = appendJSONString(dst, n.Name)
		dst = append(dst, '}')
	}
	return append(dst, ']')
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s (valid UTF-8) as a JSON string, escaping quotes,
// backslashes, control characters and U+2028/U+2029.
func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			i++
			continue
		}
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r != '\u2028' && r != '\u2029' {
				i += size
				continue
			}
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\u202`...)
			dst = append(dst, hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		i++
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
