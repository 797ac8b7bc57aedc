package taudb

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/kipimo-hpc/kipimo/internal/format/cali"
	"github.com/kipimo-hpc/kipimo/internal/format/tauprofile"
)

// DataSourceOther is TAUdb's data_source id for profiles of no listed tool;
// Caliper profiles are stored with it.
const DataSourceOther = 999

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

// caliStream holds a .cali file's context tree while it is read.
type caliStream struct {
	file string
	tree *cali.Tree
}

// ReadCaliper reads a Caliper .cali file written with the aggregate service
// (a region profile) into a trial named name. Each snapshot record's NESTED
// attributes (function, loop, annotation, ...) give its region path;
// mpi.rank the node and omp.thread.num (or thread.id) the thread; sum#
// attributes the metrics (sum#time.duration as TIME in microseconds), count
// the calls. The mapping is documented in schemas/caliper-taudb.md. file is
// used in errors.
func ReadCaliper(r io.Reader, file, name string) (*Trial, error) {
	s := &caliStream{file: file, tree: cali.NewTree()}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 64*1024*1024)
	var rows []caliRow
	var globals []Attribute
	line := 0
	fail := func(format string, args ...any) error {
		return &tauprofile.ParseError{File: file, Line: line, Msg: fmt.Sprintf(format, args...)}
	}
	traceAttr := ""
	for sc.Scan() {
		line++
		l := strings.TrimSuffix(sc.Text(), "\r")
		if strings.TrimSpace(l) == "" {
			continue
		}
		rec, err := cali.ParseRecord(l)
		if err != nil {
			return nil, fail("%v", err)
		}
		switch rec.Kind() {
		case "node":
			n, err := s.node(rec)
			if err != nil {
				return nil, fail("%v", err)
			}
			if n.Attr == cali.AttrName && traceAttr == "" && isCaliTraceAttr(n.Data) {
				traceAttr = n.Data
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
			entries, err := s.tree.Entries(rec, nil)
			if err != nil {
				return nil, fail("%v", err)
			}
			for _, e := range entries {
				globals = append(globals, Attribute{Name: e.Attr, Value: e.Value})
			}
		default:
			return nil, fail("unknown record type __rec=%s", clip(rec.Kind()))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: read: %w", file, err)
	}
	if line == 0 {
		return nil, &tauprofile.ParseError{File: file, Line: 1, Msg: "empty file, expected __rec= records"}
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

// node adds a node record to the tree. Caliper writes a node after its
// parent and once; a stream that does not is refused.
func (s *caliStream) node(rec cali.Record) (cali.Node, error) {
	id, n, err := cali.NodeOf(rec)
	if err != nil {
		return n, err
	}
	if len(rec["data"]) != 1 {
		return n, errors.New("expected one data= entry")
	}
	if n.Parent >= 0 && uint64(n.Parent) >= id {
		return n, fmt.Errorf("node %d has parent %d, which is not an earlier node", id, n.Parent)
	}
	if id > cali.LastBootstrap {
		if _, dup := s.tree.Node(id); dup {
			return n, fmt.Errorf("node %d is defined twice", id)
		}
	}
	s.tree.Add(id, n)
	return n, nil
}

func (s *caliStream) snapshot(rec cali.Record) (caliRow, bool, error) {
	entries, err := s.tree.Entries(rec, nil)
	if err != nil {
		return caliRow{}, false, err
	}
	row := caliRow{Exclusive: map[string]float64{}}
	hasValue := false
	for _, e := range entries {
		switch {
		case e.Props&cali.PropNested != 0:
			row.Path = append(row.Path, caliRegion{Attr: e.Attr, Name: e.Value})
		case e.Attr == "mpi.rank":
			n, err := strconv.Atoi(e.Value)
			if err != nil || n < 0 {
				return row, false, fmt.Errorf("mpi.rank=%q is not a rank", clip(e.Value))
			}
			row.Rank = n
		case e.Attr == "omp.thread.num":
			n, err := strconv.Atoi(e.Value)
			if err != nil || n < 0 {
				return row, false, fmt.Errorf("omp.thread.num=%q is not a thread number", clip(e.Value))
			}
			row.Thread, row.HasOMP = n, true
		case e.Attr == "thread.id":
			row.RawThreadID = e.Value
		default:
			m, ok := caliperMetric(e.Attr, "")
			if !ok {
				continue
			}
			v, err := strconv.ParseFloat(e.Value, 64)
			if err != nil {
				return row, false, fmt.Errorf("%s=%q is not a number", e.Attr, clip(e.Value))
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

// clip cuts s to its first 80 bytes for an error message.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
