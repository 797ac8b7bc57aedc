package provenance

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Sort fields a query may order executions by.
const (
	SortEntry            = "entry"
	SortRuntimeTotal     = "runtime_total"
	SortRuntimeExclusive = "runtime_exclusive"
	SortOutlierScore     = "outlier_score"
)

// SortFields is the whitelist of sort fields.
var SortFields = []string{SortEntry, SortRuntimeTotal, SortRuntimeExclusive, SortOutlierScore}

// MaxLimit bounds the number of records Store.Query returns (it holds them
// all); Store.Each, which streams, takes any limit.
const MaxLimit = 100000

// NoLimit as Query.Limit asks for every matching record. Only Store.Each
// (which streams them) and Store.Aggregate accept it; in URL parameters and
// on the command line it is written "limit=0".
const NoLimit = -1

// DefaultLimit is the number of records a query returns when it sets none.
const DefaultLimit = 100

// Query selects executions. Nil pointers and zero values mean "any".
// Results are ordered by Sort (Desc for descending), ties broken by
// (pid, event_id) ascending so that every query has one answer.
type Query struct {
	Kind       Kind     // anomalies (default) or normalexecs; any kind for Count
	PID        *uint32  // program
	Rank       *uint32  // rid
	TID        *uint32  // thread
	Func       string   // exact function name
	FuncRegexp string   // RE2 regular expression on the function name (unanchored)
	StepMin    *uint64  // io_step >= StepMin
	StepMax    *uint64  // io_step <= StepMax
	From       *uint64  // entry >= From
	To         *uint64  // exit <= To
	MinRuntime uint64   // runtime_total >= MinRuntime
	MinScore   *float64 // outlier_score >= MinScore
	GPUOnly    bool     // is_gpu_event
	Sort       string   // one of SortFields; default entry
	Desc       bool
	// Limit is the maximum number of records: 0 means DefaultLimit,
	// NoLimit every record; Store.Query takes 1..MaxLimit.
	Limit int
	// After, if not nil, selects only the records that come after it in
	// the query's order: a page of a longer result resumes there. Its Sort
	// and Desc must be the query's.
	After *Cursor
}

// Normalize fills defaults and validates q: the kind, the sort field, the
// limit, the step range and the regular expression.
func (q *Query) Normalize() error {
	if q.Kind == "" {
		q.Kind = KindAnomalies
	}
	if !ValidKind(q.Kind) {
		return fmt.Errorf("unknown kind %q (want one of %s)", q.Kind, KindNames())
	}
	if q.Sort == "" {
		q.Sort = SortEntry
	}
	ok := false
	for _, f := range SortFields {
		ok = ok || f == q.Sort
	}
	if !ok {
		return fmt.Errorf("cannot sort by %q (want one of %s)", q.Sort, strings.Join(SortFields, ", "))
	}
	if q.Limit == 0 {
		q.Limit = DefaultLimit
	}
	if q.Limit < NoLimit {
		return fmt.Errorf("limit %d is negative (0 asks for every record)", q.Limit)
	}
	if q.After != nil && (q.After.Sort != q.Sort || q.After.Desc != q.Desc) {
		return fmt.Errorf("cursor is a position in another order (sort %s, descending %v)", q.After.Sort, q.After.Desc)
	}
	if q.StepMin != nil && q.StepMax != nil && *q.StepMin > *q.StepMax {
		return fmt.Errorf("io_step range %d..%d is empty", *q.StepMin, *q.StepMax)
	}
	if q.From != nil && q.To != nil && *q.From > *q.To {
		return fmt.Errorf("time range %d..%d is empty", *q.From, *q.To)
	}
	if q.MinScore != nil && (math.IsNaN(*q.MinScore) || math.IsInf(*q.MinScore, 0)) {
		return fmt.Errorf("min_score %v is not a finite number", *q.MinScore)
	}
	if q.Func != "" && q.FuncRegexp != "" {
		return fmt.Errorf("give func or func_re, not both")
	}
	if q.FuncRegexp != "" {
		if _, err := q.Regexp(); err != nil {
			return err
		}
	}
	return nil
}

// CheckBounded reports an error unless q.Limit is 1..MaxLimit, the limits of
// queries whose whole result is held in memory (Store.Query).
func (q Query) CheckBounded() error {
	if q.Limit < 1 || q.Limit > MaxLimit {
		return fmt.Errorf("limit %d out of range 1..%d (stream larger results)", q.Limit, MaxLimit)
	}
	return nil
}

// Regexp compiles FuncRegexp (nil when empty).
func (q Query) Regexp() (*regexp.Regexp, error) {
	if q.FuncRegexp == "" {
		return nil, nil
	}
	if len(q.FuncRegexp) > 1024 {
		return nil, fmt.Errorf("func_re is longer than 1024 bytes")
	}
	re, err := regexp.Compile(q.FuncRegexp)
	if err != nil {
		return nil, fmt.Errorf("func_re %q: %w", q.FuncRegexp, err)
	}
	return re, nil
}

// Match reports whether e passes q's filters, After included (not its sort
// or limit). Stores that cannot express a filter natively use it, and the
// shared test suite uses it as the reference.
func (q Query) Match(e *Exec, re *regexp.Regexp) bool {
	switch {
	case q.PID != nil && e.PID != *q.PID,
		q.Rank != nil && e.RID != *q.Rank,
		q.TID != nil && e.TID != *q.TID,
		q.Func != "" && e.Func != q.Func,
		re != nil && !re.MatchString(e.Func),
		q.StepMin != nil && e.IOStep < *q.StepMin,
		q.StepMax != nil && e.IOStep > *q.StepMax,
		q.From != nil && e.Entry < *q.From,
		q.To != nil && e.Exit > *q.To,
		e.RuntimeTotal < q.MinRuntime,
		q.MinScore != nil && e.OutlierScore < *q.MinScore,
		q.GPUOnly && !e.IsGPUEvent:
		return false
	}
	if q.After != nil {
		c := q.After.exec()
		return q.Less(&c, e)
	}
	return true
}

// Cursor is a position in the order of a query: just after the record with
// key (PID, EventID) whose sort field has Value (entry, runtime_total,
// runtime_exclusive) or Score (outlier_score). The record key breaks ties of
// the sort field, so a cursor resumes a listing exactly, each record once,
// even when many records share a sort value. Its String form is the token
// the HTTP API passes as "cursor".
type Cursor struct {
	Sort    string // the query's sort field
	Desc    bool   // and direction
	Value   uint64
	Score   float64
	PID     uint32
	EventID string
}

// CursorAfter is the position just after e in q's order (q normalized).
func CursorAfter(q Query, e *Exec) *Cursor {
	c := &Cursor{Sort: q.Sort, Desc: q.Desc, PID: e.PID, EventID: e.EventID}
	switch q.Sort {
	case SortRuntimeTotal:
		c.Value = e.RuntimeTotal
	case SortRuntimeExclusive:
		c.Value = e.RuntimeExclusive
	case SortOutlierScore:
		c.Score = e.OutlierScore
	default:
		c.Value = e.Entry
	}
	return c
}

// SortArg is the cursor's sort value as a database argument: an int64 (as
// the stores keep the integer fields) or, for outlier_score, a float64.
func (c *Cursor) SortArg() any {
	if c.Sort == SortOutlierScore {
		return c.Score
	}
	return int64(c.Value)
}

// exec is a record with the cursor's sort value and key, to compare with.
func (c *Cursor) exec() Exec {
	x := Exec{PID: c.PID, EventID: c.EventID, OutlierScore: c.Score}
	switch c.Sort {
	case SortRuntimeTotal:
		x.RuntimeTotal = c.Value
	case SortRuntimeExclusive:
		x.RuntimeExclusive = c.Value
	default:
		x.Entry = c.Value
	}
	return x
}

// cursorToken is the JSON form of a Cursor inside its token.
type cursorToken struct {
	Sort    string `json:"s"`
	Desc    bool   `json:"d,omitempty"`
	Value   string `json:"v"`
	PID     uint32 `json:"p"`
	EventID string `json:"e"`
}

// String is the cursor as an opaque URL-safe token (ParseCursor reads it).
func (c *Cursor) String() string {
	v := strconv.FormatUint(c.Value, 10)
	if c.Sort == SortOutlierScore {
		v = strconv.FormatFloat(c.Score, 'g', -1, 64)
	}
	b, _ := json.Marshal(cursorToken{Sort: c.Sort, Desc: c.Desc, Value: v, PID: c.PID, EventID: c.EventID})
	return base64.RawURLEncoding.EncodeToString(b)
}

// ParseCursor reads a token made by Cursor.String.
func ParseCursor(s string) (*Cursor, error) {
	bad := func() (*Cursor, error) { return nil, fmt.Errorf("cursor %q is not one this API gave", s) }
	if len(s) > 512 {
		return bad()
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return bad()
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var t cursorToken
	if err := dec.Decode(&t); err != nil || dec.More() {
		return bad()
	}
	if !slices.Contains(SortFields, t.Sort) {
		return bad()
	}
	if _, _, _, err := ParseEventID(t.EventID); err != nil {
		return bad()
	}
	c := &Cursor{Sort: t.Sort, Desc: t.Desc, PID: t.PID, EventID: t.EventID}
	if t.Sort == SortOutlierScore {
		c.Score, err = strconv.ParseFloat(t.Value, 64)
		if err == nil && (math.IsNaN(c.Score) || math.IsInf(c.Score, 0)) {
			err = errors.New("not finite")
		}
	} else {
		c.Value, err = strconv.ParseUint(t.Value, 10, 64)
	}
	if err != nil {
		return bad()
	}
	return c, nil
}

// Less orders executions as q sorts them.
func (q Query) Less(a, b *Exec) bool {
	var c int
	switch q.Sort {
	case SortRuntimeTotal:
		c = cmpU(a.RuntimeTotal, b.RuntimeTotal)
	case SortRuntimeExclusive:
		c = cmpU(a.RuntimeExclusive, b.RuntimeExclusive)
	case SortOutlierScore:
		switch {
		case a.OutlierScore < b.OutlierScore:
			c = -1
		case a.OutlierScore > b.OutlierScore:
			c = 1
		}
	default:
		c = cmpU(a.Entry, b.Entry)
	}
	if q.Desc {
		c = -c
	}
	if c != 0 {
		return c < 0
	}
	if a.PID != b.PID {
		return a.PID < b.PID
	}
	return a.EventID < b.EventID
}

func cmpU(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// GroupBy is how Aggregate groups executions.
type GroupBy string

// Groupings Aggregate supports.
const (
	ByRank     GroupBy = "rank"
	ByFunc     GroupBy = "func"
	ByStep     GroupBy = "step"
	ByRankFunc GroupBy = "rank,func"
)

// ParseGroupBy checks a grouping name.
func ParseGroupBy(s string) (GroupBy, error) {
	switch g := GroupBy(strings.ReplaceAll(s, " ", "")); g {
	case ByRank, ByFunc, ByStep, ByRankFunc:
		return g, nil
	}
	return "", fmt.Errorf("cannot group by %q (want rank, func, step or rank,func)", s)
}

// Group is one group of an aggregate: the key fields of the grouping and the
// number of executions.
type Group struct {
	Rank  *uint32 `json:"rank,omitempty"`
	Func  string  `json:"func,omitempty"`
	Step  *uint64 `json:"io_step,omitempty"`
	Count int64   `json:"count"`
}

// GroupKeyLess orders groups by key (rank, func, step).
func GroupKeyLess(a, b Group) bool {
	if a.Rank != nil && b.Rank != nil && *a.Rank != *b.Rank {
		return *a.Rank < *b.Rank
	}
	if a.Func != b.Func {
		return a.Func < b.Func
	}
	if a.Step != nil && b.Step != nil {
		return *a.Step < *b.Step
	}
	return false
}

// SortGroups orders groups largest count first, ties by key, and applies
// limit (0: no limit).
func SortGroups(gs []Group, limit int) []Group {
	sort.SliceStable(gs, func(i, j int) bool {
		if gs[i].Count != gs[j].Count {
			return gs[i].Count > gs[j].Count
		}
		return GroupKeyLess(gs[i], gs[j])
	})
	if limit > 0 && len(gs) > limit {
		gs = gs[:limit]
	}
	return gs
}

// MakeGroup builds the group of by with the given key fields.
func MakeGroup(by GroupBy, rank uint32, fn string, step uint64, n int64) Group {
	g := Group{Count: n}
	switch by {
	case ByRank:
		g.Rank = &rank
	case ByFunc:
		g.Func = fn
	case ByStep:
		g.Step = &step
	case ByRankFunc:
		g.Rank, g.Func = &rank, fn
	}
	return g
}

// Query parameters understood by ParseQuery.
var queryParams = map[string]bool{
	"kind": true, "pid": true, "rank": true, "tid": true, "func": true, "func_re": true,
	"step_min": true, "step_max": true, "from": true, "to": true, "min_runtime": true,
	"min_score": true, "gpu": true, "sort": true, "order": true, "limit": true, "by": true,
	"cursor": true,
}

// ParseQuery reads a Query from URL parameters: kind, pid, rank, tid, func,
// func_re, step_min, step_max, from, to, min_runtime, min_score, gpu
// (true/false), sort, order (asc/desc), limit (0: every record, NoLimit),
// cursor (a Cursor's token); "by" is accepted and left to the caller. An unknown parameter, a repeated one or a malformed value is
// an error naming it.
func ParseQuery(v url.Values) (Query, error) {
	var q Query
	for k, vs := range v {
		if !queryParams[k] {
			return q, fmt.Errorf("unknown query parameter %q", k)
		}
		if len(vs) != 1 {
			return q, fmt.Errorf("query parameter %q given %d times", k, len(vs))
		}
	}
	var err error
	u32 := func(name string) *uint32 {
		s := v.Get(name)
		if s == "" || err != nil {
			return nil
		}
		n, e := strconv.ParseUint(s, 10, 32)
		if e != nil {
			err = fmt.Errorf("%s %q is not a non-negative 32-bit integer", name, s)
			return nil
		}
		x := uint32(n)
		return &x
	}
	u64 := func(name string) *uint64 {
		s := v.Get(name)
		if s == "" || err != nil {
			return nil
		}
		n, e := strconv.ParseUint(s, 10, 64)
		if e != nil {
			err = fmt.Errorf("%s %q is not a non-negative integer", name, s)
			return nil
		}
		return &n
	}
	q.Kind = Kind(v.Get("kind"))
	q.PID, q.Rank, q.TID = u32("pid"), u32("rank"), u32("tid")
	q.Func, q.FuncRegexp = v.Get("func"), v.Get("func_re")
	q.StepMin, q.StepMax = u64("step_min"), u64("step_max")
	q.From, q.To = u64("from"), u64("to")
	if p := u64("min_runtime"); p != nil {
		q.MinRuntime = *p
	}
	if s := v.Get("min_score"); s != "" && err == nil {
		f, e := strconv.ParseFloat(s, 64)
		if e != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			err = fmt.Errorf("min_score %q is not a finite number", s)
		}
		q.MinScore = &f
	}
	if s := v.Get("gpu"); s != "" && err == nil {
		b, e := strconv.ParseBool(s)
		if e != nil {
			err = fmt.Errorf("gpu %q is not true or false", s)
		}
		q.GPUOnly = b
	}
	q.Sort = v.Get("sort")
	switch o := v.Get("order"); o {
	case "", "asc":
	case "desc":
		q.Desc = true
	default:
		if err == nil {
			err = fmt.Errorf("order %q is not asc or desc", o)
		}
	}
	if s := v.Get("limit"); s != "" && err == nil {
		n, e := strconv.Atoi(s)
		if e != nil || n < 0 {
			err = fmt.Errorf("limit %q is not a non-negative integer", s)
		}
		q.Limit = n
		if n == 0 {
			q.Limit = NoLimit
		}
	}
	if s := v.Get("cursor"); s != "" && err == nil {
		q.After, err = ParseCursor(s)
	}
	if err != nil {
		return q, err
	}
	return q, q.Normalize()
}

// Values is the inverse of ParseQuery: the URL parameters of q.
func (q Query) Values() url.Values {
	v := url.Values{}
	set := func(k, s string) {
		if s != "" {
			v.Set(k, s)
		}
	}
	set("kind", string(q.Kind))
	if q.PID != nil {
		set("pid", strconv.FormatUint(uint64(*q.PID), 10))
	}
	if q.Rank != nil {
		set("rank", strconv.FormatUint(uint64(*q.Rank), 10))
	}
	if q.TID != nil {
		set("tid", strconv.FormatUint(uint64(*q.TID), 10))
	}
	set("func", q.Func)
	set("func_re", q.FuncRegexp)
	for k, p := range map[string]*uint64{"step_min": q.StepMin, "step_max": q.StepMax, "from": q.From, "to": q.To} {
		if p != nil {
			set(k, strconv.FormatUint(*p, 10))
		}
	}
	if q.MinRuntime > 0 {
		set("min_runtime", strconv.FormatUint(q.MinRuntime, 10))
	}
	if q.MinScore != nil {
		set("min_score", strconv.FormatFloat(*q.MinScore, 'g', -1, 64))
	}
	if q.GPUOnly {
		set("gpu", "true")
	}
	set("sort", q.Sort)
	if q.Desc {
		set("order", "desc")
	}
	if q.Limit > 0 {
		set("limit", strconv.Itoa(q.Limit))
	}
	if q.Limit == NoLimit {
		set("limit", "0")
	}
	if q.After != nil {
		set("cursor", q.After.String())
	}
	return v
}
