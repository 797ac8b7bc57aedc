package taudb

import (
	"fmt"
	"sort"

	"github.com/kipimo-hpc/kipimo/internal/format/tauprofile"
)

// DataSourceTAUProfiles is the data_source id of TAU profile files, the only
// id that TAU's table and its Java constants agree on besides ppk (0).
const DataSourceTAUProfiles = 1

// Derived thread indexes, as stored in thread.node_rank, context_rank,
// thread_rank and thread_index.
const (
	MeanWithoutNulls   = -1 // MEAN (nulls ignored)
	Total              = -2 // TOTAL
	StddevWithoutNulls = -3 // STDDEV (nulls ignored)
	Min                = -4 // MIN
	Max                = -5 // MAX
	MeanWithNulls      = -6 // MEAN (nulls are 0 value)
	StddevWithNulls    = -7 // STDDEV (nulls are 0 value)
)

// DerivedIndexes lists the derived thread indexes in the order TAU's loader
// inserts their thread rows.
var DerivedIndexes = []int{MeanWithoutNulls, StddevWithoutNulls, Total, Max, Min, MeanWithNulls, StddevWithNulls}

// Trial is one run: the top of the TAUdb tree. Slices keep insertion order,
// which is also the order rows are saved in; the maps are indexes over them
// and are kept current by the Add methods.
type Trial struct {
	ID                int
	Name              string
	DataSource        int
	NodeCount         int
	ContextsPerNode   int
	ThreadsPerContext int
	TotalThreads      int

	Metrics           []*Metric
	Threads           []*Thread // real threads by index, then derived threads
	TimeRanges        []*TimeRange
	Timers            []*Timer
	Callpaths         []*TimerCallpath
	Counters          []*Counter
	PrimaryMetadata   []Attribute // trial-level keys, in order
	SecondaryMetadata []*SecondaryMetadata

	metricsByName   map[string]*Metric
	timersByName    map[string]*Timer
	callpathsByName map[string]*TimerCallpath
	countersByName  map[string]*Counter
	threadsByIndex  map[int]*Thread
}

// NewTrial returns an empty trial named name with data source TAU profiles.
func NewTrial(name string) *Trial {
	return &Trial{Name: name, DataSource: DataSourceTAUProfiles}
}

// Metric is a unit of measurement (TIME, PAPI_TOT_CYC, ...).
type Metric struct {
	ID      int
	Index   int // position in Trial.Metrics
	Name    string
	Derived bool
}

// Thread is a location of measurement; derived threads (Index < 0) hold the
// statistics over the real ones.
type Thread struct {
	ID          int
	NodeRank    int
	ContextRank int
	ThreadRank  int
	Index       int

	// CallData is this thread's timer data in the order it is written to a
	// profile file (the order it was read, for parsed profiles).
	CallData []*TimerCallData
	// CounterValues is this thread's user-event data, in file order.
	CounterValues []*CounterValue
	// Metadata is the thread's own metadata (without "Metric Name"), in
	// file order. Trial-level and thread-level rows in TAUdb are derived
	// from it (see SplitMetadata).
	Metadata []Attribute
	// Files holds, per metric index, what the profile file read for that
	// metric had beyond the TAUdb data, so writing reproduces it. Nil
	// entries (and all of them for trials loaded from TAUdb) are written in
	// the canonical form.
	Files []*FileLayout

	callData      map[*TimerCallpath]*TimerCallData
	counterValues map[*Counter]*CounterValue
}

// IsDerived reports whether t is one of the derived statistics threads.
func (t *Thread) IsDerived() bool { return t.Index < 0 }

// FileLayout is what one profile file held beyond the TAUdb data.
type FileLayout struct {
	Header     string      // line 1 after the count, e.g. "templated_functions_MULTI_TIME"
	Metadata   []Attribute // line 2 attributes in order, with "Metric Name"
	NoMetadata bool        // line 2 had no <metadata> block
}

// Layout returns the layout of th's file for metric index m, or nil.
func (th *Thread) Layout(m int) *FileLayout {
	if m < len(th.Files) {
		return th.Files[m]
	}
	return nil
}

// TimeRange delimits profile data (snapshots) in iterations and time.
type TimeRange struct {
	ID             int
	IterationStart int
	IterationEnd   *int
	TimeStart      int64
	TimeEnd        *int64
}

// Timer is a flat region of code (function, loop, phase, sample location).
type Timer struct {
	ID              int
	Name            string // normalized full name
	ShortName       string
	SourceFile      string // "" is NULL
	LineNumber      int
	LineNumberEnd   int
	ColumnNumber    int
	ColumnNumberEnd int
	Groups          []string
	Parameters      []Parameter

	// Spelling is the name as found in a profile file (with TAU's blanks);
	// GroupSpelling the GROUP="..." text. Both are empty for timers that
	// did not come from a file, and are not stored in TAUdb.
	Spelling      string
	GroupSpelling string

	root *TimerCallpath
}

// Parameter is one <name> = <value> pair of a parameter timer.
type Parameter struct {
	Name  string
	Value string
}

// TimerCallpath is a node of the merged call graph; flat timers are roots.
type TimerCallpath struct {
	ID     int
	Timer  *Timer
	Parent *TimerCallpath
	Name   string // "a => b => c"; the timer name for roots

	// Spelling and GroupSpelling are the line's name and GROUP text in the
	// profile file, for child nodes (roots use their timer's).
	Spelling      string
	GroupSpelling string
}

// Depth is the number of ancestors of c.
func (c *TimerCallpath) Depth() int {
	d := 0
	for p := c.Parent; p != nil; p = p.Parent {
		d++
	}
	return d
}

// TimerCallData is one call-graph node as seen by one thread.
type TimerCallData struct {
	ID          int
	Callpath    *TimerCallpath
	Thread      *Thread
	Calls       float64
	Subroutines float64
	TimeRange   *TimeRange
	Values      []*TimerValue // indexed by Metric.Index; nil where absent
}

// Value returns the value of metric m, or nil.
func (d *TimerCallData) Value(m *Metric) *TimerValue {
	if m == nil || m.Index >= len(d.Values) {
		return nil
	}
	return d.Values[m.Index]
}

// TimerValue is one metric of one call-graph node on one thread.
type TimerValue struct {
	Metric              *Metric
	Inclusive           float64
	Exclusive           float64
	InclusivePercent    float64
	ExclusivePercent    float64
	SumExclusiveSquared *float64 // NULL unless known
}

// Counter is a TAU user event (atomic event); the name is verbatim, with any
// " : context" suffix.
type Counter struct {
	ID   int
	Name string
	// Spelling is the name as found in a profile file.
	Spelling string
}

// CounterValue is a counter's statistics on one thread. SumSquares is stored
// in counter_value.standard_deviation, as TAU's loaders do.
type CounterValue struct {
	Counter     *Counter
	Thread      *Thread
	Callpath    *TimerCallpath // always nil for TAU profiles
	SampleCount float64
	Maximum     float64
	Minimum     float64
	Mean        float64
	SumSquares  float64
}

// Attribute is one metadata name/value pair, as profile files hold it;
// Context, CallNumber and Timestamp are set for context metadata
// (<timer_context>).
type Attribute = tauprofile.Attribute

// SecondaryMetadata is a thread-level (or nested) metadata row.
type SecondaryMetadata struct {
	ID        string // UUID
	Thread    *Thread
	Callpath  *TimerCallpath
	TimeRange *TimeRange
	Parent    *SecondaryMetadata
	Name      string
	Value     string
	IsArray   bool
}

// Metric returns the metric named name, or nil.
func (tr *Trial) Metric(name string) *Metric { return tr.metricsByName[name] }

// Timer returns the timer named name (normalized), or nil.
func (tr *Trial) Timer(name string) *Timer { return tr.timersByName[name] }

// Callpath returns the call-graph node with full name "a => b", or nil.
func (tr *Trial) Callpath(name string) *TimerCallpath { return tr.callpathsByName[name] }

// Counter returns the counter named name, or nil.
func (tr *Trial) Counter(name string) *Counter { return tr.countersByName[name] }

// Thread returns the thread with thread_index idx (negative for derived
// threads), or nil.
func (tr *Trial) Thread(idx int) *Thread { return tr.threadsByIndex[idx] }

// RealThreads returns the threads with Index >= 0, in index order.
func (tr *Trial) RealThreads() []*Thread {
	var out []*Thread
	for _, t := range tr.Threads {
		if t.Index >= 0 {
			out = append(out, t)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Index < out[j].Index })
	return out
}

// Primary returns the value of trial-level metadata key name.
func (tr *Trial) Primary(name string) (string, bool) {
	for _, a := range tr.PrimaryMetadata {
		if a.Name == name {
			return a.Value, true
		}
	}
	return "", false
}

// AddMetric adds (or returns the existing) metric named name.
func (tr *Trial) AddMetric(name string) *Metric {
	if m := tr.metricsByName[name]; m != nil {
		return m
	}
	if tr.metricsByName == nil {
		tr.metricsByName = map[string]*Metric{}
	}
	m := &Metric{Name: name, Index: len(tr.Metrics)}
	tr.Metrics = append(tr.Metrics, m)
	tr.metricsByName[name] = m
	return m
}

// AddThread adds (or returns the existing) thread with the given ranks and
// index.
func (tr *Trial) AddThread(node, context, thread, index int) *Thread {
	if t := tr.threadsByIndex[index]; t != nil {
		return t
	}
	if tr.threadsByIndex == nil {
		tr.threadsByIndex = map[int]*Thread{}
	}
	t := &Thread{NodeRank: node, ContextRank: context, ThreadRank: thread, Index: index}
	tr.Threads = append(tr.Threads, t)
	tr.threadsByIndex[index] = t
	return t
}

// AddTimer adds (or returns the existing) flat timer with normalized name
// name, filling short name, source location and parameters from the name,
// and its root call-graph node.
func (tr *Trial) AddTimer(name string) *Timer {
	if t := tr.timersByName[name]; t != nil {
		return t
	}
	if tr.timersByName == nil {
		tr.timersByName = map[string]*Timer{}
	}
	t := &Timer{Name: name}
	fillSourceLink(t)
	tr.Timers = append(tr.Timers, t)
	tr.timersByName[name] = t
	t.root = tr.addCallpath(t, nil)
	return t
}

// Root returns the timer's root (flat) call-graph node.
func (t *Timer) Root() *TimerCallpath { return t.root }

func (tr *Trial) addCallpath(t *Timer, parent *TimerCallpath) *TimerCallpath {
	name := t.Name
	if parent != nil {
		name = parent.Name + " => " + t.Name
	}
	if c := tr.callpathsByName[name]; c != nil {
		return c
	}
	if tr.callpathsByName == nil {
		tr.callpathsByName = map[string]*TimerCallpath{}
	}
	c := &TimerCallpath{Timer: t, Parent: parent, Name: name}
	tr.Callpaths = append(tr.Callpaths, c)
	tr.callpathsByName[name] = c
	return c
}

// AddCallpath adds (or returns) the call-graph node for the normalized path
// nodes (outermost first), creating flat timers and intermediate nodes that
// are missing.
func (tr *Trial) AddCallpath(nodes []string) *TimerCallpath {
	var c *TimerCallpath
	for i, n := range nodes {
		t := tr.AddTimer(n)
		if i == 0 {
			c = t.root
			continue
		}
		c = tr.addCallpath(t, c)
	}
	return c
}

// AddCounter adds (or returns the existing) counter named name.
func (tr *Trial) AddCounter(name string) *Counter {
	if c := tr.countersByName[name]; c != nil {
		return c
	}
	if tr.countersByName == nil {
		tr.countersByName = map[string]*Counter{}
	}
	c := &Counter{Name: name}
	tr.Counters = append(tr.Counters, c)
	tr.countersByName[name] = c
	return c
}

// CallDataFor returns th's data for call-graph node c, or nil.
func (th *Thread) CallDataFor(c *TimerCallpath) *TimerCallData { return th.callData[c] }

// CounterValueFor returns th's value of counter c, or nil.
func (th *Thread) CounterValueFor(c *Counter) *CounterValue { return th.counterValues[c] }

// AddCallData adds (or returns the existing) data of node c on thread th.
func (tr *Trial) AddCallData(th *Thread, c *TimerCallpath) *TimerCallData {
	if d := th.callData[c]; d != nil {
		return d
	}
	if th.callData == nil {
		th.callData = map[*TimerCallpath]*TimerCallData{}
	}
	d := &TimerCallData{Callpath: c, Thread: th}
	th.CallData = append(th.CallData, d)
	th.callData[c] = d
	return d
}

// SetValue sets metric m's inclusive and exclusive values of d and returns
// the value row.
func (d *TimerCallData) SetValue(m *Metric, inclusive, exclusive float64) *TimerValue {
	for len(d.Values) <= m.Index {
		d.Values = append(d.Values, nil)
	}
	v := d.Values[m.Index]
	if v == nil {
		v = &TimerValue{Metric: m}
		d.Values[m.Index] = v
	}
	v.Inclusive, v.Exclusive = inclusive, exclusive
	return v
}

// AddCounterValue adds (or returns the existing) value of counter c on th.
func (tr *Trial) AddCounterValue(th *Thread, c *Counter) *CounterValue {
	if v := th.counterValues[c]; v != nil {
		return v
	}
	if th.counterValues == nil {
		th.counterValues = map[*Counter]*CounterValue{}
	}
	v := &CounterValue{Counter: c, Thread: th}
	th.CounterValues = append(th.CounterValues, v)
	th.counterValues[c] = v
	return v
}

// UpdateShape sets node_count, contexts_per_node, threads_per_context and
// total_threads from the real threads (max id + 1, as TAU does), and
// renumbers thread indexes densely as node*C*T + context*T + thread.
func (tr *Trial) UpdateShape() {
	maxN, maxC, maxT, n := -1, -1, -1, 0
	for _, t := range tr.Threads {
		if t.IsDerived() {
			continue
		}
		n++
		maxN = max(maxN, t.NodeRank)
		maxC = max(maxC, t.ContextRank)
		maxT = max(maxT, t.ThreadRank)
	}
	tr.NodeCount, tr.ContextsPerNode, tr.ThreadsPerContext, tr.TotalThreads = maxN+1, maxC+1, maxT+1, n
	tr.threadsByIndex = map[int]*Thread{}
	for _, t := range tr.Threads {
		if !t.IsDerived() {
			t.Index = t.NodeRank*tr.ContextsPerNode*tr.ThreadsPerContext + t.ContextRank*tr.ThreadsPerContext + t.ThreadRank
		}
		tr.threadsByIndex[t.Index] = t
	}
	sort.SliceStable(tr.Threads, func(i, j int) bool {
		a, b := tr.Threads[i], tr.Threads[j]
		if a.IsDerived() != b.IsDerived() {
			return !a.IsDerived()
		}
		if a.IsDerived() {
			return derivedOrder(a.Index) < derivedOrder(b.Index)
		}
		return a.Index < b.Index
	})
}

func derivedOrder(idx int) int {
	for i, d := range DerivedIndexes {
		if d == idx {
			return i
		}
	}
	return len(DerivedIndexes)
}

// String names the thread the way TAU does: "n,c,t" or the derived name.
func (t *Thread) String() string {
	switch t.Index {
	case MeanWithoutNulls:
		return "mean"
	case Total:
		return "total"
	case StddevWithoutNulls:
		return "stddev"
	case Min:
		return "min"
	case Max:
		return "max"
	case MeanWithNulls:
		return "mean (nulls as 0)"
	case StddevWithNulls:
		return "stddev (nulls as 0)"
	}
	return fmt.Sprintf("%d,%d,%d", t.NodeRank, t.ContextRank, t.ThreadRank)
}
