// Package tauprofile reads TAU's profile files (profile.N.C.T, one per thread
// and metric, as TAU's Profiler.cpp writes them) and the directories that hold
// them: the profile.N.C.T files of a directory or, when there are none, one
// MULTI__<metric> subdirectory per metric.
//
// A file is read into a File: line 1's function count and header, line 2's
// metadata block (the attributes in order, context metadata included), one
// FunctionLine per interval event (the name with TAU's blanks, calls,
// subroutines, exclusive and inclusive time, an optional SumExclSqr column,
// the GROUP text), the aggregates (counted and skipped; TAU writes none) and
// one UserEventLine per atomic event. Negative times are read as 0, as TAU's
// reader reads them. Nothing is merged or derived here: merging the files of
// a run into a trial (duplicate lines summed, derived threads) is
// internal/taudb's BuildTrial, and the ParaProf packed (internal/format/ppk)
// and TAU XML (internal/format/tauxml) readers produce the same File values.
//
// Limits: a line may be up to 64 MiB; the file must follow TAU's grammar line
// by line (errors are *ParseError naming the file and line); the function
// count of line 1 must match the lines that follow.
package tauprofile

import (
	"bufio"
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// MetricNameKey is the metadata key naming a profile file's metric; it is
// always the first attribute TAU writes.
const MetricNameKey = "Metric Name"

// Attribute is one metadata name/value pair; Context, CallNumber and
// Timestamp are set for context metadata (<timer_context>).
type Attribute struct {
	Name       string
	Value      string
	Context    *string
	CallNumber string
	Timestamp  string
}

// ParseError is malformed text input: the file, the 1-based line and what was
// expected there. The TAU XML and Caliper readers report theirs with it too.
type ParseError struct {
	File string
	Line int
	Msg  string
}

func (e *ParseError) Error() string {
	return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
}

// File is one parsed profile.N.C.T file: one thread's values of one metric.
// Node, Context and Thread come from the file name (NCT), not its content.
type File struct {
	Node, Context, Thread int
	Count                 int    // function count on line 1
	Header                string // line 1 after the count
	Metadata              []Attribute
	NoMetadata            bool
	SumExclSqr            bool // line 2 announced a SumExclSqr column
	Functions             []FunctionLine
	UserEvents            []UserEventLine
}

// FunctionLine is one interval-event line of a profile file.
type FunctionLine struct {
	Name       string // as written, with TAU's blanks
	Calls      float64
	Subrs      float64
	Exclusive  float64
	Inclusive  float64
	SumExclSqr *float64
	Groups     string // the GROUP="..." text
}

// UserEventLine is one atomic-event line of a profile file.
type UserEventLine struct {
	Name                      string
	NumEvents                 float64
	Max, Min, Mean, SumSquare float64
}

// MetricName returns the file's metric: its "Metric Name" metadata, else the
// name in the line-1 header, else "Time" (TAU's rule).
func (p *File) MetricName() string {
	for _, a := range p.Metadata {
		if a.Name == MetricNameKey && a.Context == nil {
			return a.Value
		}
	}
	if i := strings.Index(p.Header, "_MULTI_"); i >= 0 {
		return p.Header[i+7:]
	}
	if strings.Contains(p.Header, "hw_counters") {
		return "Hardware Counter"
	}
	return "Time"
}

// ColumnsLine is how line 2 of a profile file starts: the names of a function
// line's columns.
const ColumnsLine = "# Name Calls Subrs Excl Incl ProfileCalls"

// Parse reads one profile file; name is used in errors, which are
// *ParseError for malformed content.
func Parse(r io.Reader, name string) (*File, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 64*1024*1024)
	line := 0
	next := func() (string, bool) {
		if !sc.Scan() {
			return "", false
		}
		line++
		return strings.TrimSuffix(sc.Text(), "\r"), true
	}
	fail := func(format string, args ...any) error {
		return &ParseError{File: name, Line: line, Msg: fmt.Sprintf(format, args...)}
	}
	eof := func(what string) error {
		if err := sc.Err(); err != nil {
			return fmt.Errorf("%s: read: %w", name, err)
		}
		line++
		return fail("unexpected end of file, expected %s", what)
	}
	p := &File{}

	l, ok := next()
	if !ok {
		return nil, eof(`"<nfuncs> templated_functions..." header`)
	}
	countText, header, _ := strings.Cut(l, " ")
	n, err := strconv.Atoi(countText)
	if err != nil || n < 0 {
		return nil, fail("expected \"<nfuncs> templated_functions_MULTI_<metric>\", got %q", clip(l))
	}
	if !strings.HasPrefix(header, "templated_functions") {
		return nil, fail("expected templated_functions after the function count, got %q", clip(header))
	}
	p.Count, p.Header = n, header

	l, ok = next()
	if !ok {
		return nil, eof(`"` + ColumnsLine + `" line`)
	}
	if !strings.HasPrefix(l, ColumnsLine) {
		return nil, fail("expected %q, got %q", ColumnsLine, clip(l))
	}
	rest := l[len(ColumnsLine):]
	p.SumExclSqr = strings.Contains(rest, "SumExclSqr")
	if i := strings.Index(rest, "<metadata>"); i >= 0 {
		j := strings.Index(rest, "</metadata>")
		if j < i {
			return nil, fail("metadata block has no </metadata>")
		}
		attrs, err := parseMetadataXML(rest[i : j+len("</metadata>")])
		if err != nil {
			return nil, fail("%v", err)
		}
		p.Metadata = attrs
	} else {
		p.NoMetadata = true
	}

	for i := 0; i < n; i++ {
		l, ok = next()
		if !ok {
			return nil, eof(fmt.Sprintf("function line %d of %d", i+1, n))
		}
		f, err := parseFunctionLine(l, p.SumExclSqr)
		if err != nil {
			return nil, fail("function line %d of %d: %v", i+1, n, err)
		}
		p.Functions = append(p.Functions, f)
	}

	l, ok = next()
	if !ok {
		return nil, eof(`"<n> aggregates" line`)
	}
	na, err := countLine(l, "aggregates")
	if err != nil {
		return nil, fail("%v", err)
	}
	for i := 0; i < na; i++ {
		if _, ok = next(); !ok {
			return nil, eof(fmt.Sprintf("aggregate line %d of %d", i+1, na))
		}
	}

	l, ok = next()
	if !ok {
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("%s: read: %w", name, err)
		}
		return p, nil
	}
	nu, err := countLine(l, "userevents")
	if err != nil {
		return nil, fail("%v", err)
	}
	if l, ok = next(); !ok {
		return nil, eof(`"# eventname numevents max min mean sumsqr" line`)
	}
	if !strings.HasPrefix(l, "#") {
		return nil, fail("expected \"# eventname numevents max min mean sumsqr\", got %q", clip(l))
	}
	for i := 0; i < nu; i++ {
		l, ok = next()
		if !ok {
			return nil, eof(fmt.Sprintf("user event line %d of %d", i+1, nu))
		}
		e, err := parseEventLine(l)
		if err != nil {
			return nil, fail("user event line %d of %d: %v", i+1, nu, err)
		}
		p.UserEvents = append(p.UserEvents, e)
	}
	for {
		l, ok = next()
		if !ok {
			break
		}
		if strings.TrimSpace(l) != "" {
			return nil, fail("expected end of file after %d user events, got %q", nu, clip(l))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: read: %w", name, err)
	}
	return p, nil
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

func countLine(l, word string) (int, error) {
	f := strings.Fields(l)
	if len(f) != 2 || f[1] != word {
		return 0, fmt.Errorf("expected \"<n> %s\", got %q", word, clip(l))
	}
	n, err := strconv.Atoi(f[0])
	if err != nil || n < 0 {
		return 0, fmt.Errorf("expected a count before %q, got %q", word, f[0])
	}
	return n, nil
}

// quotedName splits `"name" rest` where the name ends at the last quote
// before limit.
func quotedName(l string, limit int) (name, rest string, err error) {
	if !strings.HasPrefix(l, `"`) {
		return "", "", errors.New(`expected a line starting with a quoted name`)
	}
	end := strings.LastIndexByte(l[:limit], '"')
	if end <= 0 {
		return "", "", errors.New("expected a closing quote after the name")
	}
	return l[1:end], l[end+1:], nil
}

func parseFunctionLine(l string, sumExclSqr bool) (FunctionLine, error) {
	var f FunctionLine
	limit := len(l)
	if g := strings.LastIndex(l, `GROUP="`); g > 0 {
		end := strings.IndexByte(l[g+7:], '"')
		if end < 0 {
			return f, errors.New(`expected a closing quote after GROUP="`)
		}
		f.Groups = l[g+7 : g+7+end]
		limit = g
	}
	name, rest, err := quotedName(l, limit)
	if err != nil {
		return f, err
	}
	f.Name = name
	if limit < len(l) {
		rest = rest[:len(rest)-(len(l)-limit)]
	}
	fields := strings.Fields(rest)
	want := 4
	if sumExclSqr {
		want = 5
	}
	if len(fields) < want {
		return f, fmt.Errorf("expected calls, subrs, excl, incl after the name, got %q", clip(rest))
	}
	vals := make([]float64, want)
	for i := range vals {
		v, err := strconv.ParseFloat(fields[i], 64)
		if err != nil {
			return f, fmt.Errorf("expected a number for %s, got %q", [...]string{"calls", "subrs", "excl", "incl", "SumExclSqr"}[i], fields[i])
		}
		vals[i] = v
	}
	f.Calls, f.Subrs, f.Exclusive, f.Inclusive = vals[0], vals[1], ClampNegative(vals[2]), ClampNegative(vals[3])
	if sumExclSqr {
		f.SumExclSqr = &vals[4]
	}
	return f, nil
}

// ClampNegative is TAU's reader's rule for times: a negative one is read as 0.
func ClampNegative(v float64) float64 {
	if v < 0 {
		return 0
	}
	return v
}

func parseEventLine(l string) (UserEventLine, error) {
	var e UserEventLine
	name, rest, err := quotedName(l, len(l))
	if err != nil {
		return e, err
	}
	e.Name = name
	fields := strings.Fields(rest)
	if len(fields) != 5 {
		return e, fmt.Errorf("expected numevents max min mean sumsqr after the name, got %q", clip(rest))
	}
	var v [5]float64
	for i := range v {
		if v[i], err = strconv.ParseFloat(fields[i], 64); err != nil {
			return e, fmt.Errorf("expected a number for %s, got %q", [...]string{"numevents", "max", "min", "mean", "sumsqr"}[i], fields[i])
		}
	}
	e.NumEvents, e.Max, e.Min, e.Mean, e.SumSquare = v[0], v[1], v[2], v[3], v[4]
	return e, nil
}

// NCT parses "profile.N.C.T" (any prefix) into its three numbers; ok is false
// for a name of another shape or a negative number.
func NCT(base string) (n, c, t int, ok bool) {
	parts := strings.Split(base, ".")
	if len(parts) != 4 {
		return 0, 0, 0, false
	}
	var v [3]int
	for i := range v {
		x, err := strconv.Atoi(parts[i+1])
		if err != nil || x < 0 {
			return 0, 0, 0, false
		}
		v[i] = x
	}
	return v[0], v[1], v[2], true
}

// ReadDir reads the TAU profile directory dir: the profile.N.C.T files in
// it, or, when there are none, those of each MULTI__<metric> subdirectory
// (MetricDirs). sets[m] holds the files of metric directory m, each with its
// node, context and thread from its name; files named profile.* without
// three numbers are skipped.
func ReadDir(dir string) (sets [][]*File, err error) {
	metricDirs, err := MetricDirs(dir)
	if err != nil {
		return nil, err
	}
	for _, md := range metricDirs {
		files, err := filepath.Glob(filepath.Join(md, "profile.*"))
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", md, err)
		}
		var set []*File
		for _, f := range files {
			n, c, t, ok := NCT(filepath.Base(f))
			if !ok {
				continue
			}
			data, err := os.ReadFile(f)
			if err != nil {
				return nil, fmt.Errorf("read profile: %w", err)
			}
			p, err := Parse(bytes.NewReader(data), f)
			if err != nil {
				return nil, err
			}
			p.Node, p.Context, p.Thread = n, c, t
			set = append(set, p)
		}
		sets = append(sets, set)
	}
	return sets, nil
}

// MetricDirs returns the directories of dir's profiles: dir itself when it
// holds a profile.N.C.T file, else its MULTI_* subdirectories sorted by name.
// It fails when there are neither.
func MetricDirs(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read profile directory: %w", err)
	}
	var multi []string
	for _, e := range entries {
		if !e.IsDir() {
			if _, _, _, ok := NCT(e.Name()); ok && strings.HasPrefix(e.Name(), "profile.") {
				return []string{dir}, nil
			}
			continue
		}
		if strings.HasPrefix(e.Name(), "MULTI_") {
			multi = append(multi, filepath.Join(dir, e.Name()))
		}
	}
	if len(multi) == 0 {
		return nil, fmt.Errorf("%s holds no profile.N.C.T files and no MULTI__<metric> directories", dir)
	}
	sort.Strings(multi)
	return multi, nil
}

type xmlAttribute struct {
	Name       string  `xml:"name"`
	Context    *string `xml:"timer_context"`
	CallNumber string  `xml:"call_number"`
	Timestamp  string  `xml:"timestamp"`
	Value      string  `xml:"value"`
}

type xmlMetadata struct {
	Attributes []xmlAttribute `xml:"attribute"`
}

// parseMetadataXML decodes a "<metadata>...</metadata>" block.
func parseMetadataXML(s string) ([]Attribute, error) {
	var m xmlMetadata
	dec := xml.NewDecoder(strings.NewReader(s))
	dec.Strict = true
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("metadata XML: %w", err)
	}
	out := make([]Attribute, 0, len(m.Attributes))
	for _, a := range m.Attributes {
		out = append(out, Attribute{Name: a.Name, Value: a.Value, Context: a.Context, CallNumber: a.CallNumber, Timestamp: a.Timestamp})
	}
	return out, nil
}
