package taudb

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// DataSourceOther is TAUdb's data_source id for profiles of no listed tool;
// Caliper profiles are stored with it.
const DataSourceOther = 999

// Caliper attribute property bits (Caliper's cali_attr_properties).
const (
	caliPropNested = 256
	caliPropGlobal = 512
)

// caliRegion is one node of a Caliper region path: the region's name and the
// attribute it was annotated with (function, loop, annotation, ...).
type caliRegion struct {
	Attr, Name string
}

// caliRow is one aggregated Caliper snapshot: where it was taken and the
// summed values of the metrics, by TAU metric name.
type caliRow struct {
	Line        int // line (cali) or row index (JSON), for errors
	Rank        int
	Thread      int
	Path        []caliRegion
	Exclusive   map[string]float64
	Inclusive   map[string]float64 // as the file gives it, if it does
	Count       float64
	HasCount    bool
	HasOMP      bool   // Thread is omp.thread.num
	RawThreadID string // thread.id, numbered per rank when there is no omp.thread.num
}

// caliMetric says how a Caliper attribute or json-split column maps to a TAU
// metric: its name, whether the value is inclusive, and the factor to TAU's
// unit (microseconds for time).
type caliMetric struct {
	Name      string
	Inclusive bool
	Scale     float64
	Count     bool
}

// caliperMetric maps an aggregate attribute name (or a json-split column
// name with its unit) to a TAU metric; ok is false for attributes that are
// not summable values (min#, max#, avg#, and everything that is not a sum).
func caliperMetric(name, unit string) (caliMetric, bool) {
	switch name {
	case "count", "sum#count", "Calls", "calls":
		return caliMetric{Count: true, Scale: 1}, true
	case "time", "time (exc)":
		return caliMetric{Name: "TIME", Scale: timeScale(unit, "sec")}, true
	case "time (inc)":
		return caliMetric{Name: "TIME", Inclusive: true, Scale: timeScale(unit, "sec")}, true
	}
	m := caliMetric{Scale: 1}
	base := name
	if strings.HasPrefix(base, "inclusive#") {
		m.Inclusive = true
		base = strings.TrimPrefix(base, "inclusive#")
	}
	if !strings.HasPrefix(base, "sum#") {
		return m, false
	}
	for strings.HasPrefix(base, "sum#") {
		base = strings.TrimPrefix(base, "sum#")
	}
	if strings.HasPrefix(base, "inclusive#") {
		m.Inclusive = true
		base = strings.TrimPrefix(base, "inclusive#")
	}
	switch base {
	case "time.duration", "time.inclusive.duration":
		m.Name, m.Scale = "TIME", timeScale(unit, "sec")
		m.Inclusive = m.Inclusive || base == "time.inclusive.duration"
	case "time.duration.ns", "time.inclusive.duration.ns":
		m.Name, m.Scale = "TIME", timeScale(unit, "nsec")
		m.Inclusive = m.Inclusive || base == "time.inclusive.duration.ns"
	default:
		if strings.Contains(base, "#") {
			return m, false
		}
		m.Name = base
	}
	return m, true
}

// timeScale is the factor from unit (Caliper's attribute.unit; def when
// empty) to microseconds.
func timeScale(unit, def string) float64 {
	if unit == "" {
		unit = def
	}
	switch strings.ToLower(unit) {
	case "nsec", "ns":
		return 1e-3
	case "usec", "us":
		return 1
	case "msec", "ms":
		return 1e3
	}
	return 1e6
}

// caliNode is a node record of a .cali stream.
type caliNode struct {
	attr   uint64
	data   string
	parent int64 // -1 for roots
}

type caliAttr struct {
	name  string
	props int64
}

// caliStream holds a .cali file's context tree while it is read.
type caliStream struct {
	file  string
	nodes map[uint64]*caliNode
	attrs map[uint64]*caliAttr
}

// ReadCaliper reads a Caliper .cali file written with the aggregate service
// (a region profile) into a trial named name. Each snapshot record's NESTED
// attributes (function, loop, annotation, ...) give its region path;
// mpi.rank the node and omp.thread.num (or thread.id) the thread; sum#
// attributes the metrics (sum#time.duration as TIME in microseconds), count
// the calls. The mapping is documented in schemas/caliper-taudb.md. file is
// used in errors.
func ReadCaliper(r io.Reader, file, name string) (*Trial, error) {
	s := &caliStream{file: file, nodes: map[uint64]*caliNode{}, attrs: map[uint64]*caliAttr{
		8: {name: "cali.attribute.name"}, 9: {name: "cali.attribute.type"}, 10: {name: "cali.attribute.prop"},
	}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 64*1024*1024)
	var rows []caliRow
	var globals []Attribute
	line := 0
	fail := func(format string, args ...any) error {
		return &ParseError{File: file, Line: line, Msg: fmt.Sprintf(format, args...)}
	}
	traceAttr := ""
	for sc.Scan() {
		line++
		l := strings.TrimSuffix(sc.Text(), "\r")
		if strings.TrimSpace(l) == "" {
			continue
		}
		rec, err := parseCaliRecord(l)
		if err != nil {
			return nil, fail("%v", err)
		}
		switch rec["__rec"][0] {
		case "node":
			if err := s.node(rec); err != nil {
				return nil, fail("%v", err)
			}
			if a := s.attrs[s.lastAttr(rec)]; a != nil && traceAttr == "" && isCaliTraceAttr(a.name) {
				traceAttr = a.name
			}
		case "ctx":
			row, ok, err := s.snapshot(rec)
			if err != nil {
				return nil, fail("%v", err)
			}
			if ok {
				row.Line = line
				rows = append(rows, row)
			}
		case "globals":
			entries, err := s.entries(rec)
			if err != nil {
				return nil, fail("%v", err)
			}
			for _, e := range entries {
				globals = append(globals, Attribute{Name: e.attr, Value: e.value})
			}
		default:
			return nil, fail("unknown record type __rec=%s", clip(rec["__rec"][0]))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: read: %w", file, err)
	}
	if line == 0 {
		return nil, &ParseError{File: file, Line: 1, Msg: "empty file, expected __rec= records"}
	}
	if traceAttr != "" {
		return nil, fmt.Errorf("%s is a Caliper event trace (it has %s), not an aggregate region profile; read traces with `kipimo frames convert`", file, traceAttr)
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("%s: no snapshot record has a region path and a sum# value: not a Caliper aggregate region profile", file)
	}
	return caliperTrial(name, file, rows, globals)
}

func isCaliTraceAttr(name string) bool {
	return strings.HasPrefix(name, "event.begin#") || strings.HasPrefix(name, "event.end#") ||
		name == "cali.snapshot.event.begin" || name == "time.offset" || name == "time.offset.ns"
}

func (s *caliStream) lastAttr(rec map[string][]string) uint64 {
	if v := rec["id"]; len(v) == 1 {
		id, _ := strconv.ParseUint(v[0], 10, 64)
		return id
	}
	return 0
}

// parseCaliRecord splits one .cali line into key -> values: '\' escapes the
// next character (\n is a newline), ',' ends an entry, '=' separates a key
// from each of its values.
func parseCaliRecord(line string) (map[string][]string, error) {
	rec := map[string][]string{}
	var parts []string
	var cur strings.Builder
	end := func(pos int) error {
		parts = append(parts, cur.String())
		cur.Reset()
		if len(parts) == 1 {
			if parts[0] == "" {
				parts = parts[:0]
				return nil
			}
			return fmt.Errorf("column %d: entry %q has no '=value'", pos+1, clip(parts[0]))
		}
		rec[parts[0]] = append(rec[parts[0]], parts[1:]...)
		parts = parts[:0]
		return nil
	}
	for i := 0; i < len(line); i++ {
		switch c := line[i]; c {
		case '\\':
			i++
			if i >= len(line) {
				return nil, fmt.Errorf("column %d: the line ends with an escape character", i)
			}
			if line[i] == 'n' {
				cur.WriteByte('\n')
			} else {
				cur.WriteByte(line[i])
			}
		case ',':
			if err := end(i); err != nil {
				return nil, err
			}
		case '=':
			parts = append(parts, cur.String())
			cur.Reset()
		default:
			cur.WriteByte(c)
		}
	}
	if err := end(len(line)); err != nil {
		return nil, err
	}
	if v := rec["__rec"]; len(v) != 1 {
		return nil, errors.New("expected one __rec= entry")
	}
	return rec, nil
}

func caliUint(rec map[string][]string, key string) (uint64, error) {
	v := rec[key]
	if len(v) != 1 {
		return 0, fmt.Errorf("expected one %s= entry", key)
	}
	n, err := strconv.ParseUint(v[0], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s=%q is not a node id", key, clip(v[0]))
	}
	return n, nil
}

func (s *caliStream) node(rec map[string][]string) error {
	id, err := caliUint(rec, "id")
	if err != nil {
		return err
	}
	attr, err := caliUint(rec, "attr")
	if err != nil {
		return err
	}
	data := rec["data"]
	if len(data) != 1 {
		return errors.New("expected one data= entry")
	}
	n := &caliNode{attr: attr, data: data[0], parent: -1}
	if _, ok := rec["parent"]; ok {
		p, err := caliUint(rec, "parent")
		if err != nil {
			return err
		}
		if p >= id {
			return fmt.Errorf("node %d has parent %d, which is not an earlier node", id, p)
		}
		n.parent = int64(p)
	}
	if id <= 11 {
		// Caliper's bootstrap nodes (types and the three meta attributes)
		// are known; old files write them out.
		return nil
	}
	if _, dup := s.nodes[id]; dup {
		return fmt.Errorf("node %d is defined twice", id)
	}
	s.nodes[id] = n
	if attr == 8 { // cali.attribute.name: this node defines an attribute
		a := &caliAttr{name: n.data}
		for p := n.parent; p > 11; {
			pn := s.nodes[uint64(p)]
			if pn == nil {
				return fmt.Errorf("attribute node %d has undefined ancestor %d", id, p)
			}
			if pn.attr == 10 {
				a.props, _ = strconv.ParseInt(pn.data, 10, 64)
			}
			p = pn.parent
		}
		s.attrs[id] = a
	}
	return nil
}

type caliEntry struct {
	attr, value string
	props       int64
}

// path expands node id into its entries, root first.
func (s *caliStream) path(id uint64) ([]caliEntry, error) {
	var out []caliEntry
	for depth := 0; ; depth++ {
		if depth > len(s.nodes)+1 {
			return nil, fmt.Errorf("node %d: parent chain has a cycle", id)
		}
		n := s.nodes[id]
		if n == nil {
			return nil, fmt.Errorf("ref to undefined node %d", id)
		}
		a := s.attrs[n.attr]
		if a == nil {
			return nil, fmt.Errorf("node %d has attr=%d, which is not an attribute", id, n.attr)
		}
		out = append(out, caliEntry{attr: a.name, value: n.data, props: a.props})
		if n.parent < 0 || n.parent <= 11 {
			break
		}
		id = uint64(n.parent)
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out, nil
}

// entries lists a record's reference entries (expanded) then its immediate
// attr/data pairs.
func (s *caliStream) entries(rec map[string][]string) ([]caliEntry, error) {
	var out []caliEntry
	for _, r := range rec["ref"] {
		id, err := strconv.ParseUint(r, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("ref=%q is not a node id", clip(r))
		}
		p, err := s.path(id)
		if err != nil {
			return nil, err
		}
		out = append(out, p...)
	}
	attrs, data := rec["attr"], rec["data"]
	if len(attrs) != len(data) {
		return nil, fmt.Errorf("%d attr= values but %d data= values", len(attrs), len(data))
	}
	for i, a := range attrs {
		id, err := strconv.ParseUint(a, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("attr=%q is not an attribute id", clip(a))
		}
		at := s.attrs[id]
		if at == nil {
			return nil, fmt.Errorf("attr=%d is not a defined attribute", id)
		}
		out = append(out, caliEntry{attr: at.name, value: data[i], props: at.props})
	}
	return out, nil
}

func (s *caliStream) snapshot(rec map[string][]string) (caliRow, bool, error) {
	entries, err := s.entries(rec)
	if err != nil {
		return caliRow{}, false, err
	}
	row := caliRow{Exclusive: map[string]float64{}}
	hasValue := false
	for _, e := range entries {
		switch {
		case e.props&caliPropNested != 0:
			row.Path = append(row.Path, caliRegion{Attr: e.attr, Name: e.value})
		case e.attr == "mpi.rank":
			n, err := strconv.Atoi(e.value)
			if err != nil || n < 0 {
				return row, false, fmt.Errorf("mpi.rank=%q is not a rank", clip(e.value))
			}
			row.Rank = n
		case e.attr == "omp.thread.num":
			n, err := strconv.Atoi(e.value)
			if err != nil || n < 0 {
				return row, false, fmt.Errorf("omp.thread.num=%q is not a thread number", clip(e.value))
			}
			row.Thread, row.HasOMP = n, true
		case e.attr == "thread.id":
			row.RawThreadID = e.value
		default:
			m, ok := caliperMetric(e.attr, "")
			if !ok {
				continue
			}
			v, err := strconv.ParseFloat(e.value, 64)
			if err != nil {
				return row, false, fmt.Errorf("%s=%q is not a number", e.attr, clip(e.value))
			}
			if m.Count {
				row.Count += v
				row.HasCount = true
				continue
			}
			hasValue = true
			if m.Inclusive {
				if row.Inclusive == nil {
					row.Inclusive = map[string]float64{}
				}
				row.Inclusive[m.Name] += v * m.Scale
			} else {
				row.Exclusive[m.Name] += v * m.Scale
			}
		}
	}
	return row, len(row.Path) > 0 && (hasValue || row.HasCount), nil
}
