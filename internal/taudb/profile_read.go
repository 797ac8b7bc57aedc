package taudb

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// ParseError is a malformed profile file: the file, the 1-based line and what
// was expected there.
type ParseError struct {
	File string
	Line int
	Msg  string
}

func (e *ParseError) Error() string {
	return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
}

// ProfileFile is one parsed profile.N.C.T file, before it is merged into a
// trial.
type ProfileFile struct {
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
func (p *ProfileFile) MetricName() string {
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

const line2Prefix = "# Name Calls Subrs Excl Incl ProfileCalls"

// ParseProfile reads one profile file; name is used in errors.
func ParseProfile(r io.Reader, name string) (*ProfileFile, error) {
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
	p := &ProfileFile{}

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
		return nil, eof(`"` + line2Prefix + `" line`)
	}
	if !strings.HasPrefix(l, line2Prefix) {
		return nil, fail("expected %q, got %q", line2Prefix, clip(l))
	}
	rest := l[len(line2Prefix):]
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
	f.Calls, f.Subrs, f.Exclusive, f.Inclusive = vals[0], vals[1], clampNeg(vals[2]), clampNeg(vals[3])
	if sumExclSqr {
		f.SumExclSqr = &vals[4]
	}
	return f, nil
}

// clampNeg is TAU's reader's rule: negative times become 0.
func clampNeg(v float64) float64 {
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

// ProfileNCT parses "profile.N.C.T" (any prefix) into its three numbers.
func ProfileNCT(base string) (n, c, t int, ok bool) {
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

// ReadDir parses a TAU profile directory into a trial named name: the
// profile.N.C.T files in dir, or, when there are none, one MULTI__<metric>
// subdirectory per metric. Derived threads and metadata rows are computed.
func ReadDir(dir, name string) (*Trial, error) {
	metricDirs, err := profileDirs(dir)
	if err != nil {
		return nil, err
	}
	var sets [][]*ProfileFile
	for _, md := range metricDirs {
		files, err := filepath.Glob(filepath.Join(md, "profile.*"))
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", md, err)
		}
		var set []*ProfileFile
		for _, f := range files {
			n, c, t, ok := ProfileNCT(filepath.Base(f))
			if !ok {
				continue
			}
			data, err := os.ReadFile(f)
			if err != nil {
				return nil, fmt.Errorf("read profile: %w", err)
			}
			p, err := ParseProfile(bytes.NewReader(data), f)
			if err != nil {
				return nil, err
			}
			p.Node, p.Context, p.Thread = n, c, t
			set = append(set, p)
		}
		sets = append(sets, set)
	}
	tr, err := BuildTrial(name, sets)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return tr, nil
}

func profileDirs(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read profile directory: %w", err)
	}
	var multi []string
	for _, e := range entries {
		if !e.IsDir() {
			if _, _, _, ok := ProfileNCT(e.Name()); ok && strings.HasPrefix(e.Name(), "profile.") {
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

// BuildTrial merges parsed profile files into a trial: sets[m] holds the
// files of metric m (one per thread). Metric 0 supplies calls, subroutines,
// groups, user events and metadata, as in TAU's reader. The derived threads,
// percents and the primary/secondary metadata split are computed.
func BuildTrial(name string, sets [][]*ProfileFile) (*Trial, error) {
	if len(sets) == 0 || len(sets[0]) == 0 {
		return nil, errors.New("no profile files")
	}
	tr := NewTrial(name)
	type nct struct{ n, c, t int }
	threads := map[nct]*Thread{}
	for mi, set := range sets {
		sort.Slice(set, func(i, j int) bool {
			a, b := set[i], set[j]
			if a.Node != b.Node {
				return a.Node < b.Node
			}
			if a.Context != b.Context {
				return a.Context < b.Context
			}
			return a.Thread < b.Thread
		})
		if len(set) == 0 {
			return nil, fmt.Errorf("metric %d has no profile files", mi)
		}
		m := tr.AddMetric(set[0].MetricName())
		if m.Index != mi {
			return nil, fmt.Errorf("metric %q appears in two directories", m.Name)
		}
		for _, p := range set {
			key := nct{p.Node, p.Context, p.Thread}
			th := threads[key]
			if th == nil {
				th = tr.AddThread(p.Node, p.Context, p.Thread, len(threads))
				threads[key] = th
			}
			for len(th.Files) <= mi {
				th.Files = append(th.Files, nil)
			}
			th.Files[mi] = &FileLayout{Header: p.Header, Metadata: p.Metadata, NoMetadata: p.NoMetadata}
			if mi == 0 {
				for _, a := range p.Metadata {
					if a.Name != MetricNameKey || a.Context != nil {
						th.Metadata = append(th.Metadata, a)
					}
				}
			}
			for _, f := range p.Functions {
				addFunction(tr, th, m, f)
			}
			if mi == 0 {
				for _, e := range p.UserEvents {
					addUserEvent(tr, th, e)
				}
			}
		}
	}
	tr.UpdateShape()
	tr.ComputeDerived()
	tr.SplitMetadata(LoaderMetadata()...)
	return tr, nil
}

func addFunction(tr *Trial, th *Thread, m *Metric, f FunctionLine) {
	groups := SplitGroups(f.Groups)
	for _, g := range groups {
		if g == "TAU_CALLPATH_DERIVED" {
			return
		}
	}
	norm := NormalizeName(f.Name)
	var c *TimerCallpath
	if strings.Contains(norm, "=>") {
		c = tr.AddCallpath(SplitCallpath(norm))
		if c.Spelling == "" {
			c.Spelling, c.GroupSpelling = f.Name, f.Groups
		}
	} else {
		t := tr.AddTimer(norm)
		if t.Spelling == "" {
			t.Spelling, t.GroupSpelling, t.Groups = f.Name, f.Groups, groups
		}
		c = t.Root()
	}
	existing := th.CallDataFor(c)
	d := tr.AddCallData(th, c)
	if m.Index == 0 {
		d.Calls += f.Calls
		d.Subroutines += f.Subrs
	}
	v := d.Value(m)
	if existing != nil && v != nil {
		// TAU's reader sums duplicate lines of one file.
		v.Inclusive += f.Inclusive
		v.Exclusive += f.Exclusive
		return
	}
	v = d.SetValue(m, f.Inclusive, f.Exclusive)
	v.SumExclusiveSquared = f.SumExclSqr
}

func addUserEvent(tr *Trial, th *Thread, e UserEventLine) {
	c := tr.AddCounter(NormalizeName(e.Name))
	if c.Spelling == "" {
		c.Spelling = e.Name
	}
	existing := th.CounterValueFor(c)
	v := tr.AddCounterValue(th, c)
	if existing == nil {
		v.SampleCount, v.Maximum, v.Minimum, v.Mean, v.SumSquares = e.NumEvents, e.Max, e.Min, e.Mean, e.SumSquare
		return
	}
	// A duplicate name on one thread is combined, as TAU's reader does.
	n := v.SampleCount + e.NumEvents
	if n > 0 {
		v.Mean = (v.Mean*v.SampleCount + e.Mean*e.NumEvents) / n
	}
	v.SampleCount = n
	v.SumSquares += e.SumSquare
	v.Minimum = math.Min(v.Minimum, e.Min)
	v.Maximum = math.Max(v.Maximum, e.Max)
}
