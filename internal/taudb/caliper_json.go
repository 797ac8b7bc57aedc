package taudb

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"

	"github.com/kipimo-hpc/kipimo/internal/format/tauprofile"
)

// jsonNode is one entry of a json-split "nodes" array.
type jsonNode struct {
	Label  json.RawMessage `json:"label"`
	Column string          `json:"column"`
	Parent *int            `json:"parent"`
}

// ReadCaliperJSON reads Caliper's json-split region profile (the form
// cali-query's "FORMAT json-split" and Caliper's hatchet-region-profile
// write, and Hatchet reads) into a trial named name: the "path" column (or
// the first column the nodes name) gives each row's region path through
// "nodes", mpi.rank the node, omp.thread.num or thread.id the thread, and the
// sum columns the metrics ("time" and sum#time.duration as TIME in
// microseconds, with attribute.unit honoured), as for .cali files. Rows
// without a path are dropped, as Hatchet drops them. Other top-level keys are
// trial metadata. file is used in errors.
func ReadCaliperJSON(r io.Reader, file, name string) (*Trial, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("read caliper json %s: %w", file, err)
	}
	failAt := func(off int64, format string, args ...any) error {
		return &tauprofile.ParseError{File: file, Line: lineAt(data, off), Msg: fmt.Sprintf(format, args...)}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	tokErr := func(err error, what string) error {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			// The decoder's offsets are relative to its buffer; a whole
			// parse gives the offset in the file.
			var v any
			if err := json.Unmarshal(data, &v); errors.As(err, &se) {
				return failAt(se.Offset, "%s: %v", what, err)
			}
			return failAt(dec.InputOffset(), "%s: %v", what, err)
		}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return failAt(te.Offset, "%s: %v", what, err)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return failAt(int64(len(data)), "%s: unexpected end of file", what)
		}
		return failAt(dec.InputOffset(), "%s: %v", what, err)
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, tokErr(err, "expected a JSON object")
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, failAt(dec.InputOffset(), "expected a json-split object {\"data\", \"columns\", \"column_metadata\", \"nodes\"}")
	}
	var (
		rows     [][]json.RawMessage
		rowOff   []int64
		columns  []string
		colMeta  []map[string]any
		nodes    []jsonNode
		nodesOff int64
		globals  []Attribute
		have     = map[string]bool{}
	)
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return nil, tokErr(err, "expected a key")
		}
		key, _ := kt.(string)
		have[key] = true
		off := dec.InputOffset()
		switch key {
		case "data":
			t, err := dec.Token()
			if err != nil {
				return nil, tokErr(err, `"data"`)
			}
			if d, ok := t.(json.Delim); !ok || d != '[' {
				return nil, failAt(off, `"data" must be an array of rows`)
			}
			for dec.More() {
				rowOff = append(rowOff, skipJSONSpace(data, dec.InputOffset()))
				var row []json.RawMessage
				if err := dec.Decode(&row); err != nil {
					return nil, tokErr(err, fmt.Sprintf("data row %d", len(rows)))
				}
				rows = append(rows, row)
			}
			if _, err := dec.Token(); err != nil {
				return nil, tokErr(err, `end of "data"`)
			}
		case "columns":
			if err := dec.Decode(&columns); err != nil {
				return nil, tokErr(err, `"columns" must be an array of strings`)
			}
		case "column_metadata":
			if err := dec.Decode(&colMeta); err != nil {
				return nil, tokErr(err, `"column_metadata" must be an array of objects`)
			}
		case "nodes":
			nodesOff = off
			if err := dec.Decode(&nodes); err != nil {
				return nil, tokErr(err, `"nodes" must be an array of {"label", "column", "parent"}`)
			}
		default:
			var v json.RawMessage
			if err := dec.Decode(&v); err != nil {
				return nil, tokErr(err, fmt.Sprintf("value of %q", key))
			}
			globals = append(globals, Attribute{Name: key, Value: jsonText(v)})
		}
	}
	if _, err := dec.Token(); err != nil {
		return nil, tokErr(err, "end of the object")
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, failAt(dec.InputOffset(), "unexpected data after the json-split object")
	}
	for _, k := range []string{"data", "columns", "column_metadata", "nodes"} {
		if !have[k] {
			return nil, failAt(0, "not a Caliper json-split profile: no %q key", k)
		}
	}
	if len(colMeta) != len(columns) {
		return nil, failAt(0, "%d columns but %d column_metadata entries", len(columns), len(colMeta))
	}
	// Hierarchy column: "path" if the nodes use it, else the first named.
	pathCol := -1
	colIndex := map[string]int{}
	for i, c := range columns {
		colIndex[c] = i
	}
	for _, n := range nodes {
		if n.Column == "path" {
			pathCol = colIndex["path"]
			break
		}
	}
	if pathCol < 0 {
		for _, n := range nodes {
			if i, ok := colIndex[n.Column]; ok {
				pathCol = i
				break
			}
		}
	}
	if pathCol < 0 {
		return nil, failAt(nodesOff, "no column holds the region path (no node's \"column\" is among the columns)")
	}
	// Node paths, parents first (json-split writes a parent before its
	// children).
	paths := make([][]caliRegion, len(nodes))
	for i, n := range nodes {
		label := jsonText(n.Label)
		var p []caliRegion
		if n.Parent != nil {
			if *n.Parent < 0 || *n.Parent >= i {
				return nil, failAt(nodesOff, "node %d has parent %d, which is not an earlier node", i, *n.Parent)
			}
			p = append(p, paths[*n.Parent]...)
		}
		paths[i] = append(p, caliRegion{Attr: columns[pathCol], Name: label})
	}
	type colRole struct {
		metric caliMetric
		ok     bool
	}
	roles := make([]colRole, len(columns))
	for i, c := range columns {
		if i == pathCol {
			continue
		}
		unit, _ := colMeta[i]["attribute.unit"].(string)
		m, ok := caliperMetric(c, unit)
		roles[i] = colRole{m, ok}
	}
	var out []caliRow
	for ri, row := range rows {
		if len(row) != len(columns) {
			return nil, failAt(rowOff[ri], "data row %d has %d cells, want %d (one per column)", ri, len(row), len(columns))
		}
		cell := row[pathCol]
		if isNull(cell) {
			continue
		}
		idx, err := jsonInt(cell)
		if err != nil || idx < 0 || idx >= len(nodes) {
			return nil, failAt(rowOff[ri], "data row %d: path %s is not a node index 0..%d", ri, clip(string(cell)), len(nodes)-1)
		}
		r := caliRow{Line: lineAt(data, rowOff[ri]), Path: paths[idx], Exclusive: map[string]float64{}}
		for ci, c := range columns {
			if ci == pathCol || isNull(row[ci]) {
				continue
			}
			switch c {
			case "mpi.rank", "rank":
				n, err := jsonInt(row[ci])
				if err != nil || n < 0 {
					return nil, failAt(rowOff[ri], "data row %d: %s %s is not a rank", ri, c, clip(string(row[ci])))
				}
				r.Rank = n
				continue
			case "omp.thread.num":
				n, err := jsonInt(row[ci])
				if err != nil || n < 0 {
					return nil, failAt(rowOff[ri], "data row %d: %s %s is not a thread number", ri, c, clip(string(row[ci])))
				}
				r.Thread, r.HasOMP = n, true
				continue
			case "thread.id":
				r.RawThreadID = jsonText(row[ci])
				continue
			}
			if !roles[ci].ok {
				continue
			}
			v, err := jsonFloat(row[ci])
			if err != nil {
				return nil, failAt(rowOff[ri], "data row %d: %s %s is not a number", ri, c, clip(string(row[ci])))
			}
			m := roles[ci].metric
			switch {
			case m.Count:
				r.Count += v
				r.HasCount = true
			case m.Inclusive:
				if r.Inclusive == nil {
					r.Inclusive = map[string]float64{}
				}
				r.Inclusive[m.Name] += v * m.Scale
			default:
				r.Exclusive[m.Name] += v * m.Scale
			}
		}
		out = append(out, r)
	}
	if len(out) == 0 {
		return nil, failAt(0, "no data row has a region path")
	}
	return caliperTrial(name, file, out, globals)
}

// skipJSONSpace moves off past white space and a value separator, to the
// start of the next value.
func skipJSONSpace(data []byte, off int64) int64 {
	for off < int64(len(data)) {
		switch data[off] {
		case ' ', '\t', '\r', '\n', ',':
			off++
		default:
			return off
		}
	}
	return off
}

// lineAt is the 1-based line of byte offset off in data.
func lineAt(data []byte, off int64) int {
	if off > int64(len(data)) {
		off = int64(len(data))
	}
	if off < 0 {
		off = 0
	}
	return bytes.Count(data[:off], []byte("\n")) + 1
}

func isNull(v json.RawMessage) bool { return len(v) == 0 || string(bytes.TrimSpace(v)) == "null" }

// jsonText is a JSON value as metadata text: strings unquoted, anything else
// as written.
func jsonText(v json.RawMessage) string {
	var s string
	if json.Unmarshal(v, &s) == nil {
		return s
	}
	return string(bytes.TrimSpace(v))
}

// jsonFloat reads a number, or a string holding one (Caliper's quote-all).
func jsonFloat(v json.RawMessage) (float64, error) {
	var n json.Number
	if err := json.Unmarshal(v, &n); err != nil {
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return 0, err
		}
		n = json.Number(s)
	}
	f, err := strconv.ParseFloat(string(n), 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("not a finite number: %s", n)
	}
	return f, nil
}

func jsonInt(v json.RawMessage) (int, error) {
	f, err := jsonFloat(v)
	if err != nil {
		return 0, err
	}
	if f != math.Trunc(f) || f > math.MaxInt32 || f < math.MinInt32 {
		return 0, fmt.Errorf("not an integer: %v", f)
	}
	return int(f), nil
}
