package workload

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
)

// WriteTruth writes records as JSON lines, one record per line.
func WriteTruth(w io.Writer, records []Truth) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for i := range records {
		if err := enc.Encode(&records[i]); err != nil {
			return fmt.Errorf("write truth record %d: %w", i, err)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write truth: %w", err)
	}
	return nil
}

// ReadTruth reads JSON lines written by WriteTruth. Blank lines are skipped;
// unknown fields and malformed lines are errors naming the line.
func ReadTruth(r io.Reader) ([]Truth, error) {
	var out []Truth
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if len(b) == 0 {
			continue
		}
		var t Truth
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&t); err != nil {
			return nil, fmt.Errorf("read truth line %d: %w", line, err)
		}
		if dec.More() {
			return nil, fmt.Errorf("read truth line %d: more than one JSON value", line)
		}
		out = append(out, t)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read truth line %d: %w", line+1, err)
	}
	return out, nil
}
