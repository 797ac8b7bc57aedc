package chrome

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// The event objects of a trace are read as raw JSON by the decoder (which
// checks their syntax) and then picked apart here without reflection: only
// the handful of fields the reader uses are converted.

var errSyntax = errors.New("malformed JSON object")

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\t' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string starting at b[i] == '"'.
func skipString(b []byte, i int) (int, bool, error) {
	esc := false
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			esc = true
			j++
		case '"':
			return j + 1, esc, nil
		}
	}
	return 0, false, errSyntax
}

// skipValue returns the index after the value starting at b[i].
func skipValue(b []byte, i int) (int, error) {
	if i >= len(b) {
		return 0, errSyntax
	}
	switch b[i] {
	case '"':
		j, _, err := skipString(b, i)
		return j, err
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				k, _, err := skipString(b, j)
				if err != nil {
					return 0, err
				}
				j = k - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1, nil
				}
			}
		}
		return 0, errSyntax
	default:
		j := i
		for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\n' && b[j] != '\t' && b[j] != '\r' {
			j++
		}
		if j == i {
			return 0, errSyntax
		}
		return j, nil
	}
}

// fields calls fn with each key and raw value of the object in b.
func fields(b []byte, fn func(key, val []byte) error) error {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return errSyntax
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return nil
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return errSyntax
		}
		end, esc, err := skipString(b, i)
		if err != nil {
			return err
		}
		key := b[i+1 : end-1]
		if esc {
			var s string
			if err := json.Unmarshal(b[i:end], &s); err != nil {
				return err
			}
			key = []byte(s)
		}
		i = skipWS(b, end)
		if i >= len(b) || b[i] != ':' {
			return errSyntax
		}
		i = skipWS(b, i+1)
		vend, err := skipValue(b, i)
		if err != nil {
			return err
		}
		if err := fn(key, b[i:vend]); err != nil {
			return err
		}
		i = skipWS(b, vend)
		if i >= len(b) {
			return errSyntax
		}
		if b[i] == '}' {
			return nil
		}
		if b[i] != ',' {
			return errSyntax
		}
		i = skipWS(b, i+1)
	}
}

func str(v []byte) (string, error) {
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' && bytes.IndexByte(v, '\\') < 0 {
		return string(v[1 : len(v)-1]), nil
	}
	if len(v) > 0 && v[0] == '"' {
		var s string
		err := json.Unmarshal(v, &s)
		return s, err
	}
	if string(v) == "null" {
		return "", nil
	}
	return "", fmt.Errorf("want a string, got %.20s", v)
}

// num reads a number, or a string holding one (as TAU's tau_trace2json and
// other exporters write times); ok is false for anything else.
func num(v []byte) (float64, bool) {
	if string(v) == "null" {
		return 0, true
	}
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		v = bytes.TrimSpace(v[1 : len(v)-1])
	}
	f, err := strconv.ParseFloat(string(v), 64)
	return f, err == nil
}

// copyRaw keeps a raw value beyond the decoder's buffer.
func copyRaw(v []byte) json.RawMessage { return append(json.RawMessage(nil), v...) }

// parseEvent fills e from one raw event object.
func parseEvent(b []byte, e *event) error {
	return fields(b, func(k, v []byte) error {
		var err error
		switch string(k) {
		case "ph":
			e.Ph, err = str(v)
		case "cat":
			e.Cat, err = str(v)
		case "name":
			e.Name, err = str(v)
		case "bp":
			e.Bp, err = str(v)
		case "pid":
			e.Pid = copyRaw(v)
		case "tid":
			e.Tid = copyRaw(v)
		case "id":
			e.ID = copyRaw(v)
		case "ts":
			var ok bool
			if e.Ts, ok = num(v); !ok {
				e.badTime = fmt.Sprintf("ts %.20s", v)
			}
		case "dur":
			var ok bool
			if e.Dur, ok = num(v); !ok {
				e.badTime = fmt.Sprintf("dur %.20s", v)
			}
		case "id2":
			if len(v) > 0 && v[0] == '{' {
				err = fields(v, func(k, v []byte) error {
					if e.ID == nil && (string(k) == "global" || string(k) == "local") {
						e.ID = copyRaw(v)
					}
					return nil
				})
			}
		case "args":
			if len(v) == 0 || v[0] != '{' {
				return nil
			}
			e.rawArgs = v
			err = fields(v, func(k, v []byte) error {
				switch string(k) {
				case "correlation":
					e.Args.Correlation = copyRaw(v)
				case "device":
					e.Args.Device = copyRaw(v)
				case "stream":
					e.Args.Stream = copyRaw(v)
				case "context":
					e.Args.Context = copyRaw(v)
				case "name":
					e.Args.Name = copyRaw(v)
				}
				return nil
			})
		}
		if err != nil {
			return fmt.Errorf("field %q: %w", k, err)
		}
		return nil
	})
}
