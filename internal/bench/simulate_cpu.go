package bench

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// cpuByLabel decodes a CPU profile as runtime/pprof writes it (a gzipped
// profile.proto message) and sums its CPU time, in seconds, per value of
// the sample label key; samples without that label count under "". It
// also returns the profile's total.
func cpuByLabel(data []byte, key string) (map[string]float64, float64, error) {
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, 0, fmt.Errorf("cpu profile: %w", err)
	}
	raw, err := io.ReadAll(io.LimitReader(zr, 1<<30))
	if err != nil {
		return nil, 0, fmt.Errorf("cpu profile: %w", err)
	}
	type label struct{ key, str int64 }
	type sample struct {
		values []int64
		labels []label
	}
	var (
		types   [][2]int64 // sample types: (type, unit) string indices
		samples []sample
		strs    []string
	)
	err = protoFields(raw, 0, func(field int, wire int, v uint64, b []byte, off int) error {
		switch {
		case field == 1 && wire == 2: // sample_type
			var t [2]int64
			err := protoFields(b, off, func(f, w int, v uint64, _ []byte, _ int) error {
				if w == 0 && (f == 1 || f == 2) {
					t[f-1] = int64(v)
				}
				return nil
			})
			types = append(types, t)
			return err
		case field == 2 && wire == 2: // sample
			var s sample
			err := protoFields(b, off, func(f, w int, v uint64, b []byte, off int) error {
				switch {
				case f == 2 && w == 0:
					s.values = append(s.values, int64(v))
				case f == 2 && w == 2: // packed values
					for len(b) > 0 {
						x, n := binary.Uvarint(b)
						if n <= 0 {
							return fmt.Errorf("cpu profile: offset %d: bad packed value", off)
						}
						s.values = append(s.values, int64(x))
						b, off = b[n:], off+n
					}
				case f == 3 && w == 2:
					var l label
					err := protoFields(b, off, func(f, w int, v uint64, _ []byte, _ int) error {
						if w == 0 && f == 1 {
							l.key = int64(v)
						} else if w == 0 && f == 2 {
							l.str = int64(v)
						}
						return nil
					})
					s.labels = append(s.labels, l)
					return err
				}
				return nil
			})
			samples = append(samples, s)
			return err
		case field == 6 && wire == 2: // string_table
			strs = append(strs, string(b))
		}
		return nil
	})
	if err != nil {
		return nil, 0, err
	}
	str := func(i int64) (string, bool) {
		if i < 0 || i >= int64(len(strs)) {
			return "", false
		}
		return strs[i], true
	}
	col := -1
	for i, t := range types {
		if name, ok := str(t[0]); ok && name == "cpu" {
			if unit, ok := str(t[1]); ok && unit == "nanoseconds" {
				col = i
			}
		}
	}
	if col < 0 {
		return nil, 0, errors.New("cpu profile: no cpu/nanoseconds sample type")
	}
	out := map[string]float64{}
	var total float64
	for _, s := range samples {
		if col >= len(s.values) {
			return nil, 0, errors.New("cpu profile: a sample without its cpu value")
		}
		sec := float64(s.values[col]) / 1e9
		name := ""
		for _, l := range s.labels {
			if k, ok := str(l.key); ok && k == key {
				name, _ = str(l.str)
			}
		}
		out[name] += sec
		total += sec
	}
	return out, total, nil
}

// protoFields calls fn with each field of the protocol buffer message b
// (base is b's offset in the whole, for errors): its number, wire type and
// value (varint) or bytes (length-delimited). Fixed-size fields are
// skipped; groups are refused.
func protoFields(b []byte, base int, fn func(field, wire int, v uint64, data []byte, off int) error) error {
	for i := 0; i < len(b); {
		tag, n := binary.Uvarint(b[i:])
		if n <= 0 {
			return fmt.Errorf("cpu profile: offset %d: bad tag", base+i)
		}
		i += n
		field, wire := int(tag>>3), int(tag&7)
		switch wire {
		case 0:
			v, n := binary.Uvarint(b[i:])
			if n <= 0 {
				return fmt.Errorf("cpu profile: offset %d: bad varint", base+i)
			}
			i += n
			if err := fn(field, wire, v, nil, base+i); err != nil {
				return err
			}
		case 1:
			i += 8
		case 5:
			i += 4
		case 2:
			l, n := binary.Uvarint(b[i:])
			if n <= 0 || l > uint64(len(b)-i-n) {
				return fmt.Errorf("cpu profile: offset %d: bad length", base+i)
			}
			i += n
			if err := fn(field, wire, 0, b[i:i+int(l)], base+i); err != nil {
				return err
			}
			i += int(l)
		default:
			return fmt.Errorf("cpu profile: offset %d: wire type %d", base+i, wire)
		}
		if i > len(b) {
			return fmt.Errorf("cpu profile: offset %d: truncated field", base+len(b))
		}
	}
	return nil
}
