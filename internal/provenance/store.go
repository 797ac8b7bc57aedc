package provenance

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
)

// ErrNotFound is returned by Store.Get when no record has the key.
var ErrNotFound = errors.New("provenance record not found")

// ErrBadDocument is wrapped by the errors that report a stored record whose
// document is bad: not JSON, not a record of its kind, over its size bound,
// or disagreeing with the columns the store indexes it by. Store.Get
// returns it for such a record; the other reads leave the record out and
// report it (Skips).
var ErrBadDocument = errors.New("stored document is bad")

// Skips collects what reads left out: the stored records whose documents
// are bad. A caller who wants to know attaches one to the context of its
// reads (WithSkips); the stores report to it (Skip). Safe for concurrent
// use; the zero value is empty.
type Skips struct {
	n     atomic.Int64
	mu    sync.Mutex
	first error
}

// Count is the number of records left out.
func (s *Skips) Count() int64 { return s.n.Load() }

// First is why the first record was left out (nil when none was).
func (s *Skips) First() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.first
}

// Add counts n records left out, err saying why.
func (s *Skips) Add(n int64, err error) {
	if n <= 0 {
		return
	}
	s.mu.Lock()
	if s.first == nil {
		s.first = err
	}
	s.mu.Unlock()
	s.n.Add(n)
}

type skipsKey struct{}

// WithSkips returns ctx carrying s: reads under it report the records they
// leave out to s.
func WithSkips(ctx context.Context, s *Skips) context.Context {
	return context.WithValue(ctx, skipsKey{}, s)
}

// Skip reports n records a read under ctx left out, err (wrapping
// ErrBadDocument) saying why, to the Skips ctx carries, if any.
func Skip(ctx context.Context, n int64, err error) {
	if s, ok := ctx.Value(skipsKey{}).(*Skips); ok {
		s.Add(n, err)
	}
}

// Store keeps provenance records durably and answers queries on them.
//
// Implementations (sqlitestore, mongostore) are safe for concurrent use by
// several goroutines: writes may run concurrently with queries. Write is
// idempotent: writing a record whose natural key (see Batch.Keys) is already
// stored leaves one record, the first one written.
//
// Reads never fail on a bad stored document (ErrBadDocument): Query, Each,
// Profiles, Metadata and FuncStats leave such a record out, report it to
// the Skips of their context (WithSkips) and return the rest; Get returns
// an error wrapping ErrBadDocument. A Store is owned by whoever
// opened it, who calls Close once when no call is in flight; no method may be
// called after Close.
type Store interface {
	// Write stores every record of b, all or nothing: when it returns nil
	// the records are durable.
	Write(ctx context.Context, b Batch) error
	// Query returns the executions (q.Kind anomalies or normalexecs) that
	// match q, sorted and limited as q says; q.Limit is 1..MaxLimit.
	Query(ctx context.Context, q Query) ([]Exec, error)
	// Each streams the executions Query would return, in the same order,
	// to fn, one at a time, holding only a bounded number of them whatever
	// the size of the result: q.Limit may be NoLimit (every match) or any
	// positive number.
	//
	// fn is called from the goroutine that called Each, never concurrently
	// with itself; the Exec it gets is its own (nothing in it is reused).
	// fn may call the store's other methods, Each included. The store holds
	// a read snapshot or server cursor (a SQLite read connection, a MongoDB
	// cursor) until Each returns, so a slow fn keeps it. Each returns when
	// every record has been passed, when ctx is done, or when fn returns an
	// error, which Each returns unwrapped; to stop early, return a sentinel
	// error and test for it with errors.Is.
	Each(ctx context.Context, q Query, fn func(Exec) error) error
	// Get returns the execution of kind with key (pid, eventID), or
	// ErrNotFound.
	Get(ctx context.Context, kind Kind, pid uint32, eventID string) (Exec, error)
	// Count returns how many records of q.Kind match q. For kinds other
	// than executions only the program, rank and thread filters apply.
	Count(ctx context.Context, q Query) (int64, error)
	// Aggregate counts the executions that match q grouped by by, largest
	// count first (ties by key); q.Limit bounds the number of groups.
	Aggregate(ctx context.Context, q Query, by GroupBy) ([]Group, error)
	// Profiles streams every stored thread profile to fn, ordered by
	// (pid, rank, tid, io_step), holding a bounded number at a time; fn
	// and the way to stop early are as for Each.
	Profiles(ctx context.Context, fn func(ThreadProfile) error) error
	// Metadata streams every stored metadata record to fn, ordered by
	// (pid, rid, tid, descr); fn and stopping are as for Each.
	Metadata(ctx context.Context, fn func(Metadata) error) error
	// FuncStats streams every stored func_stats record to fn, ordered by
	// (pid, func); fn and stopping are as for Each.
	FuncStats(ctx context.Context, fn func(GlobalFuncStats) error) error
	// Close releases the store's resources.
	Close() error
}

// Batch is the records of one message: a kind and its records. Exactly the
// slice matching Kind is used.
type Batch struct {
	Kind         Kind
	Execs        []Exec // anomalies or normalexecs
	Metadata     []Metadata
	FuncStats    []GlobalFuncStats
	CounterStats []GlobalCounterStats
	Profiles     []ThreadProfile
}

// Len is the number of records in b.
func (b Batch) Len() int {
	switch b.Kind {
	case KindAnomalies, KindNormalExecs:
		return len(b.Execs)
	case KindMetadata:
		return len(b.Metadata)
	case KindFuncStats:
		return len(b.FuncStats)
	case KindCounterStats:
		return len(b.CounterStats)
	case KindProfiles:
		return len(b.Profiles)
	}
	return 0
}

// DecodeBatch decodes one message of kind: a JSON array of records. Unknown
// fields are accepted (producers may be newer), but every record must pass
// its Validate. Executions are decoded by this package's own codec, which
// reads every document exactly as encoding/json does or rejects it. Records are normalized (nil arrays become empty ones) so
// that stored documents have the same shape whoever wrote them.
func DecodeBatch(kind Kind, data []byte) (Batch, error) {
	b := Batch{Kind: kind}
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] != '[' {
		return b, fmt.Errorf("decode %s batch: not a JSON array", kind)
	}
	var err error
	switch kind {
	case KindAnomalies, KindNormalExecs:
		b.Execs, err = decodeExecs(data)
	case KindMetadata:
		err = json.Unmarshal(data, &b.Metadata)
	case KindFuncStats:
		err = json.Unmarshal(data, &b.FuncStats)
	case KindCounterStats:
		err = json.Unmarshal(data, &b.CounterStats)
	case KindProfiles:
		err = json.Unmarshal(data, &b.Profiles)
	default:
		return b, fmt.Errorf("decode batch: unknown kind %q", kind)
	}
	if err != nil {
		return b, fmt.Errorf("decode %s batch: %w", kind, err)
	}
	if err := b.Validate(); err != nil {
		return b, err
	}
	b.Normalize()
	return b, nil
}

// Validate checks every record of b, naming the first bad one.
func (b Batch) Validate() error {
	if !ValidKind(b.Kind) {
		return fmt.Errorf("batch: unknown kind %q", b.Kind)
	}
	var err error
	check := func(i int, e error) bool {
		if e != nil {
			err = fmt.Errorf("%s record %d: %w", b.Kind, i, e)
			return false
		}
		return true
	}
	switch b.Kind {
	case KindAnomalies, KindNormalExecs:
		for i := range b.Execs {
			if !check(i, b.Execs[i].Validate()) {
				return err
			}
		}
	case KindMetadata:
		for i, m := range b.Metadata {
			if !check(i, m.Validate()) {
				return err
			}
		}
	case KindFuncStats:
		for i, f := range b.FuncStats {
			if f.Func == "" {
				check(i, errors.New("empty func"))
				return err
			}
		}
	case KindCounterStats:
		for i, c := range b.CounterStats {
			if c.Counter == "" {
				check(i, errors.New("empty counter"))
				return err
			}
		}
	}
	return nil
}

// Normalize replaces nil arrays of b's records by empty ones.
func (b *Batch) Normalize() {
	for i := range b.Execs {
		b.Execs[i].Normalize()
	}
	for i := range b.Profiles {
		p := &b.Profiles[i]
		if p.Timers == nil {
			p.Timers = []TimerProfile{}
		}
		if p.Counters == nil {
			p.Counters = []CounterProfile{}
		}
	}
}

// Validate checks what the store relies on: an event id of the form
// "<rank>:<io_step>:<idx>" and exit not before entry.
func (e *Exec) Validate() error {
	if _, _, _, err := ParseEventID(e.EventID); err != nil {
		return err
	}
	if e.Exit != 0 && e.Exit < e.Entry {
		return fmt.Errorf("event %s: exit %d before entry %d", e.EventID, e.Exit, e.Entry)
	}
	return nil
}

// Normalize replaces nil arrays by empty ones.
func (e *Exec) Normalize() {
	if e.CallStack == nil {
		e.CallStack = []CallFrame{}
	}
	if e.CounterEvents == nil {
		e.CounterEvents = []CounterEvent{}
	}
	if e.EventWindow.ExecWindow == nil {
		e.EventWindow.ExecWindow = []WindowExec{}
	}
	if e.EventWindow.CommWindow == nil {
		e.EventWindow.CommWindow = []CommRecord{}
	}
	if e.GPUParent != nil && e.GPUParent.CallStack == nil {
		e.GPUParent.CallStack = []CallFrame{}
	}
}

// Validate checks a metadata record has a description.
func (m Metadata) Validate() error {
	if m.Descr == "" {
		return errors.New("metadata with an empty descr")
	}
	return nil
}

// ParseEventID splits an event label "<rank>:<io_step>:<idx>".
func ParseEventID(id string) (rank uint32, step uint64, idx uint64, err error) {
	var parts [3]string
	n, start := 0, 0
	for i := 0; i <= len(id); i++ {
		if i == len(id) || id[i] == ':' {
			if n == 3 {
				n++
				break
			}
			parts[n] = id[start:i]
			n++
			start = i + 1
		}
	}
	if n != 3 {
		return 0, 0, 0, fmt.Errorf("event_id %q is not <rank>:<io_step>:<idx>", id)
	}
	r, err1 := strconv.ParseUint(parts[0], 10, 32)
	s, err2 := strconv.ParseUint(parts[1], 10, 64)
	x, err3 := strconv.ParseUint(parts[2], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return 0, 0, 0, fmt.Errorf("event_id %q is not <rank>:<io_step>:<idx>", id)
	}
	return uint32(r), s, x, nil
}

// ExecKey is the natural key of an execution, "<pid>/<event_id>".
func ExecKey(pid uint32, eventID string) string {
	return strconv.FormatUint(uint64(pid), 10) + "/" + eventID
}

// Key is the natural key of a metadata record, "<pid>/<rid>/<tid>/<descr>".
func (m Metadata) Key() string { return fmt.Sprintf("%d/%d/%d/%s", m.PID, m.RID, m.TID, m.Descr) }

// Key is the natural key of a function's statistics, "<pid>/<func>".
func (f GlobalFuncStats) Key() string { return fmt.Sprintf("%d/%s", f.PID, f.Func) }

// Key is the natural key of a counter's statistics, "<pid>/<counter>".
func (c GlobalCounterStats) Key() string { return fmt.Sprintf("%d/%s", c.PID, c.Counter) }

// Key is the natural key of a thread profile, "<pid>/<rank>/<tid>/<io_step>",
// followed by "/<part>" for a part of a split profile.
func (p ThreadProfile) Key() string {
	if p.Parts > 1 {
		return fmt.Sprintf("%d/%d/%d/%d/%d", p.PID, p.Rank, p.TID, p.Step, p.Part)
	}
	return fmt.Sprintf("%d/%d/%d/%d", p.PID, p.Rank, p.TID, p.Step)
}

// EachFilled is how a store's read of q (normalized) returns q.Limit
// records even where it leaves bad ones out: each reads, in q's order,
// what q selects, at most q.Limit rows, passing the good records to its fn
// and reporting every other row it reads to Skip. EachFilled runs each
// again, after the last good record passed, for as many rows more as were
// left out, until q.Limit records reached fn or each read fewer rows than
// it was asked for (the matches ran out). Without a limit (NoLimit), or
// when nothing is left out, each runs once. Errors, fn's included, are
// returned as each returns them.
func EachFilled(ctx context.Context, q Query, each func(ctx context.Context, q Query, fn func(Exec) error) error, fn func(Exec) error) error {
	if q.Limit == NoLimit {
		return each(ctx, q, fn)
	}
	outer, _ := ctx.Value(skipsKey{}).(*Skips)
	need := q.Limit
	var behind int64 // the bad rows known to follow the last good record
	for {
		var sk Skips
		var last *Exec
		good, skipsAtLast := 0, int64(0)
		r := q
		r.Limit = need + int(behind)
		err := each(WithSkips(ctx, &sk), r, func(e Exec) error {
			good++
			last = &e
			skipsAtLast = sk.Count()
			return fn(e)
		})
		if outer != nil {
			// The rows met again on the next round were reported already.
			outer.Add(sk.Count()-min(behind, sk.Count()), sk.First())
		}
		if err != nil {
			return err
		}
		read := int64(good) + sk.Count()
		if good >= need || sk.Count() == 0 || read < int64(r.Limit) {
			return nil
		}
		need -= good
		if last != nil {
			q.After = CursorAfter(q, last)
			behind = sk.Count() - skipsAtLast
		} else {
			behind = sk.Count()
		}
	}
}
