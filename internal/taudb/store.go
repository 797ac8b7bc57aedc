package taudb

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kipimo-hpc/kipimo/schemas"
)

// SchemaSQL is the TAUdb schema (version 2) this package writes,
// schemas/taudb.sql at the top of the repository.
var SchemaSQL = schemas.TAUdbSQL

// SchemaVersion is the schema_version this package reads and writes.
const SchemaVersion = 2

// Store is a TAUdb in PostgreSQL. It is safe for concurrent use; Close it
// when done.
type Store struct {
	pool *pgxpool.Pool

	// ForeignKeyChecks keeps PostgreSQL's per-row foreign-key checks on
	// while SaveTrial copies rows. By default a superuser connection skips
	// them for the save's transaction (see SaveTrial); set this before
	// the first save to keep them.
	ForeignKeyChecks bool
}

// Open connects to the PostgreSQL database at dsn (a postgres:// URL or a
// key=value string). It does not check the schema; see Configure and
// Version.
func Open(ctx context.Context, dsn string) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("taudb: parse DSN: %w", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("taudb: connect: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("taudb: connect to %s:%d: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	return &Store{pool: pool}, nil
}

// Close releases the store's connections.
func (s *Store) Close() { s.pool.Close() }

// Version returns the database's schema_version, and false when the database
// has no TAUdb schema.
func (s *Store) Version(ctx context.Context) (int, bool, error) {
	var present bool
	if err := s.pool.QueryRow(ctx, `SELECT to_regclass('schema_version') IS NOT NULL`).Scan(&present); err != nil {
		return 0, false, fmt.Errorf("taudb: look for schema_version: %w", err)
	}
	if !present {
		return 0, false, nil
	}
	var v int
	if err := s.pool.QueryRow(ctx, `SELECT max(version) FROM schema_version`).Scan(&v); err != nil {
		return 0, true, fmt.Errorf("taudb: read schema_version: %w", err)
	}
	return v, true, nil
}

// Configure creates the TAUdb schema when the database has none, in one
// transaction, and returns the schema version found or created and whether
// it was created. A database with another version is an error.
func (s *Store) Configure(ctx context.Context) (version int, created bool, err error) {
	v, ok, err := s.Version(ctx)
	if err != nil {
		return 0, false, err
	}
	if ok {
		if v != SchemaVersion {
			return v, false, fmt.Errorf("taudb: database has TAUdb schema version %d, this program writes version %d", v, SchemaVersion)
		}
		return v, false, nil
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, SchemaSQL)
		return err
	})
	if err != nil {
		return 0, false, fmt.Errorf("taudb: create schema: %w", err)
	}
	return SchemaVersion, true, nil
}

// checkDouble is TAU's checkDoubleValue on the COPY path: values below
// 1e-307 (negative ones included) are stored as 0, above 1e308 as 9e307.
func checkDouble(v float64) float64 {
	switch {
	case math.IsNaN(v):
		return 0
	case v < 1e-307:
		return 0
	case v > 1e308:
		return 9e307
	}
	return v
}

// javaInt is Java's (int) cast of a double.
func javaInt(v float64) int32 {
	switch {
	case math.IsNaN(v):
		return 0
	case v >= math.MaxInt32:
		return math.MaxInt32
	case v <= math.MinInt32:
		return math.MinInt32
	}
	return int32(v)
}

// rowSource feeds COPY from a callback that fills a reused row.
type rowSource struct {
	n, i int
	row  []any
	fill func(i int, row []any)
}

func (r *rowSource) Next() bool { r.i++; return r.i <= r.n }
func (r *rowSource) Values() ([]any, error) {
	r.fill(r.i-1, r.row)
	return r.row, nil
}
func (r *rowSource) Err() error { return nil }

func copyRows(ctx context.Context, tx pgx.Tx, table string, cols []string, n int, fill func(i int, row []any)) (int64, error) {
	if n == 0 {
		return 0, nil
	}
	c, err := tx.CopyFrom(ctx, pgx.Identifier{table}, cols, &rowSource{n: n, row: make([]any, len(cols)), fill: fill})
	if err != nil {
		return c, fmt.Errorf("copy %s: %w", table, err)
	}
	return c, nil
}

// binaryRows is an io.Reader producing PostgreSQL binary COPY data on
// demand (header, one tuple per row, trailer), so the large numeric tables
// go to the server without per-value encoding on either side. Rows are
// built about 64 KiB at a time into one reused buffer.
type binaryRows struct {
	n, i int
	done bool
	buf  []byte // rows built and not yet read are buf[off:]
	off  int
	row  func(i int, b []byte) []byte
}

var copyHeader = []byte("PGCOPY\n\xff\r\n\x00\x00\x00\x00\x00\x00\x00\x00\x00")

func (r *binaryRows) Read(p []byte) (int, error) {
	for r.off == len(r.buf) {
		if r.done {
			return 0, io.EOF
		}
		r.buf, r.off = r.buf[:0], 0
		if r.i == 0 {
			r.buf = append(r.buf, copyHeader...)
		}
		for r.i < r.n && len(r.buf) < 64<<10 {
			r.buf = r.row(r.i, r.buf)
			r.i++
		}
		if r.i >= r.n {
			r.buf = append(r.buf, 0xff, 0xff) // trailer: field count -1
			r.done = true
		}
	}
	k := copy(p, r.buf[r.off:])
	r.off += k
	return k, nil
}

// copyNumeric streams n rows of numbers (no text values) into table with
// COPY ... FROM STDIN (FORMAT binary); row appends zero or more tuples.
func copyNumeric(ctx context.Context, tx pgx.Tx, table string, cols []string, n int, row func(i int, b []byte) []byte) (int64, error) {
	if n == 0 {
		return 0, nil
	}
	quoted := make([]string, len(cols))
	for i, c := range cols {
		quoted[i] = pgx.Identifier{c}.Sanitize()
	}
	sql := "COPY " + pgx.Identifier{table}.Sanitize() + " (" + strings.Join(quoted, ", ") + ") FROM STDIN WITH (FORMAT binary)"
	tag, err := tx.Conn().PgConn().CopyFrom(ctx, &binaryRows{n: n, buf: make([]byte, 0, 80<<10), row: row}, sql)
	if err != nil {
		return 0, fmt.Errorf("copy %s: %w", table, err)
	}
	return tag.RowsAffected(), nil
}

func appendTuple(b []byte, fields int) []byte {
	return binary.BigEndian.AppendUint16(b, uint16(fields))
}

func appendI4(b []byte, v int32) []byte {
	b = binary.BigEndian.AppendUint32(b, 4)
	return binary.BigEndian.AppendUint32(b, uint32(v))
}

func appendF8(b []byte, v float64) []byte {
	b = binary.BigEndian.AppendUint32(b, 8)
	return binary.BigEndian.AppendUint64(b, math.Float64bits(v))
}

func appendNull(b []byte) []byte { return binary.BigEndian.AppendUint32(b, 0xffffffff) }

// reserveIDs takes n consecutive values from a table's id sequence and
// returns the first (0 when n is 0). It locks the table against other
// writers (until the transaction ends) so that no row can take a value from
// the sequence between the two calls; tables are always locked in the same
// order, so concurrent saves queue rather than deadlock.
func reserveIDs(ctx context.Context, tx pgx.Tx, table string, n int) (int, error) {
	if n == 0 {
		return 0, nil
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{table}.Sanitize()+" IN SHARE ROW EXCLUSIVE MODE"); err != nil {
		return 0, fmt.Errorf("lock %s: %w", table, err)
	}
	var first int64
	err := tx.QueryRow(ctx, `WITH s AS (SELECT pg_get_serial_sequence($1, 'id') AS seq), f AS (SELECT nextval(seq) AS v FROM s)
		SELECT f.v FROM f, s WHERE setval(s.seq, f.v + $2 - 1) > 0`, table, n).Scan(&first)
	if err != nil {
		return 0, fmt.Errorf("reserve %d %s ids: %w", n, table, err)
	}
	if first+int64(n)-1 > math.MaxInt32 {
		return 0, fmt.Errorf("reserve %d %s ids: the INT id column would overflow", n, table)
	}
	return int(first), nil
}

// trustIDs turns off the foreign-key triggers for the rest of the
// transaction when the role may (a superuser, as pg_restore
// --disable-triggers does): SaveTrial writes ids it has just reserved and
// rows that refer only to rows written before them, so the per-row checks,
// which cost more than the COPY itself, cannot fail. Other roles keep the
// checks.
func trustIDs(ctx context.Context, tx pgx.Tx) (bool, error) {
	var super bool
	if err := tx.QueryRow(ctx, `SELECT rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&super); err != nil {
		return false, fmt.Errorf("check role: %w", err)
	}
	if !super {
		return false, nil
	}
	if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
		return false, fmt.Errorf("disable foreign-key triggers: %w", err)
	}
	return true, nil
}

// SaveStats counts the rows one SaveTrial wrote.
type SaveStats struct {
	Threads, Timers, Callpaths, CallData, TimerValues, CounterValues, Metadata int64
	// CallDataCopy and TimerValueCopy are how long the COPY of
	// timer_call_data and of timer_value took.
	CallDataCopy, TimerValueCopy time.Duration
}

// Rows is the total number of rows written.
func (s SaveStats) Rows() int64 {
	return s.Threads + s.Timers + s.Callpaths + s.CallData + s.TimerValues + s.CounterValues + s.Metadata
}

// SaveTrial stores tr as a new trial in one transaction, the value tables
// with COPY, the way TAU's loader lays it out: flat timers with their groups
// and parameters, one root call-graph row per timer and a child row per call
// path, call data and values for real threads with calls > 0 and for the
// derived threads, counter values for real threads, primary and secondary
// metadata. It sets the ids of tr's rows and returns the row counts.
//
// Ids are reserved from the tables' sequences up front (the tables are
// locked against other writers until the save commits). When the role is a
// superuser and ForeignKeyChecks is false, the transaction runs with
// session_replication_role = replica, which skips the foreign-key triggers
// for rows whose references are consistent by construction.
func (s *Store) SaveTrial(ctx context.Context, tr *Trial) (SaveStats, error) {
	var st SaveStats
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		st, err = saveTrial(ctx, tx, tr, s.ForeignKeyChecks)
		return err
	})
	if err != nil {
		return st, fmt.Errorf("taudb: save trial %q: %w", tr.Name, err)
	}
	return st, nil
}

// validate checks that every reference in tr points at a row of tr, which
// SaveTrial relies on when it skips the foreign-key triggers. It returns
// the call data SaveTrial stores, in order: the real threads' with
// calls > 0 and all of the derived threads' (their rows exist where the
// untruncated statistic was > 0, so a truncated 0 is stored too).
func (tr *Trial) validate() ([]*TimerCallData, error) {
	metrics := map[*Metric]bool{}
	for _, m := range tr.Metrics {
		metrics[m] = true
	}
	timers := map[*Timer]bool{}
	for _, t := range tr.Timers {
		timers[t] = true
	}
	callpaths := map[*TimerCallpath]bool{}
	for _, c := range tr.Callpaths {
		if !timers[c.Timer] {
			return nil, fmt.Errorf("call path %q names a timer that is not in the trial", c.Name)
		}
		if c.Parent != nil && !callpaths[c.Parent] {
			return nil, fmt.Errorf("call path %q comes before its parent or has one outside the trial", c.Name)
		}
		callpaths[c] = true
	}
	threads := map[*Thread]bool{}
	for _, th := range tr.Threads {
		threads[th] = true
	}
	ranges := map[*TimeRange]bool{}
	for _, r := range tr.TimeRanges {
		ranges[r] = true
	}
	counters := map[*Counter]bool{}
	for _, c := range tr.Counters {
		counters[c] = true
	}
	var data []*TimerCallData
	for _, th := range tr.Threads {
		for _, d := range th.CallData {
			if d.Calls > 0 || th.IsDerived() {
				data = append(data, d)
			}
			if d.Thread != th || !callpaths[d.Callpath] || (d.TimeRange != nil && !ranges[d.TimeRange]) {
				return nil, fmt.Errorf("thread %s: data of %q refers outside the trial", th, d.Callpath.Name)
			}
			for _, v := range d.Values {
				if v != nil && !metrics[v.Metric] {
					return nil, fmt.Errorf("thread %s: a value of %q has a metric outside the trial", th, d.Callpath.Name)
				}
			}
		}
		for _, v := range th.CounterValues {
			if v.Thread != th || !counters[v.Counter] || (v.Callpath != nil && !callpaths[v.Callpath]) {
				return nil, fmt.Errorf("thread %s: a counter value refers outside the trial", th)
			}
		}
	}
	seen := map[*SecondaryMetadata]bool{}
	for _, m := range tr.SecondaryMetadata {
		if (m.Thread != nil && !threads[m.Thread]) || (m.Callpath != nil && !callpaths[m.Callpath]) ||
			(m.TimeRange != nil && !ranges[m.TimeRange]) || (m.Parent != nil && !seen[m.Parent]) {
			return nil, fmt.Errorf("secondary metadata %q refers outside the trial (or before its parent)", m.Name)
		}
		seen[m] = true
	}
	return data, nil
}

func saveTrial(ctx context.Context, tx pgx.Tx, tr *Trial, checks bool) (SaveStats, error) {
	var st SaveStats
	data, err := tr.validate()
	if err != nil {
		return st, err
	}
	if !checks {
		if _, err := trustIDs(ctx, tx); err != nil {
			return st, err
		}
	}
	err = tx.QueryRow(ctx, `INSERT INTO trial (name, data_source, node_count, contexts_per_node, threads_per_context, total_threads)
		VALUES ($1, $2, $3, $4, $5, $6) RETURNING id`,
		tr.Name, tr.DataSource, tr.NodeCount, tr.ContextsPerNode, tr.ThreadsPerContext, tr.TotalThreads).Scan(&tr.ID)
	if err != nil {
		return st, fmt.Errorf("insert trial: %w", err)
	}
	for _, m := range tr.Metrics {
		if err := tx.QueryRow(ctx, `INSERT INTO metric (name, trial, derived) VALUES ($1, $2, $3) RETURNING id`, m.Name, tr.ID, m.Derived).Scan(&m.ID); err != nil {
			return st, fmt.Errorf("insert metric: %w", err)
		}
	}

	// Timers, groups, parameters.
	first, err := reserveIDs(ctx, tx, "timer", len(tr.Timers))
	if err != nil {
		return st, err
	}
	for i, t := range tr.Timers {
		t.ID = first + i
	}
	st.Timers, err = copyRows(ctx, tx, "timer", []string{"id", "trial", "name", "short_name", "source_file", "line_number", "line_number_end", "column_number", "column_number_end"}, len(tr.Timers), func(i int, r []any) {
		t := tr.Timers[i]
		var src any
		if t.SourceFile != "" {
			src = t.SourceFile
		}
		r[0], r[1], r[2], r[3], r[4] = int32(t.ID), int32(tr.ID), t.Name, t.ShortName, src
		r[5], r[6], r[7], r[8] = int32(t.LineNumber), int32(t.LineNumberEnd), int32(t.ColumnNumber), int32(t.ColumnNumberEnd)
	})
	if err != nil {
		return st, err
	}
	type pair struct {
		timer int32
		a, b  string
	}
	var groups, params []pair
	for _, t := range tr.Timers {
		for _, g := range t.Groups {
			groups = append(groups, pair{int32(t.ID), g, ""})
		}
		for _, p := range t.Parameters {
			params = append(params, pair{int32(t.ID), p.Name, p.Value})
		}
	}
	if _, err = copyRows(ctx, tx, "timer_group", []string{"timer", "group_name"}, len(groups), func(i int, r []any) {
		r[0], r[1] = groups[i].timer, groups[i].a
	}); err != nil {
		return st, err
	}
	if _, err = copyRows(ctx, tx, "timer_parameter", []string{"timer", "parameter_name", "parameter_value"}, len(params), func(i int, r []any) {
		r[0], r[1], r[2] = params[i].timer, params[i].a, params[i].b
	}); err != nil {
		return st, err
	}

	// Call graph (parents are always listed before their children).
	if first, err = reserveIDs(ctx, tx, "timer_callpath", len(tr.Callpaths)); err != nil {
		return st, err
	}
	for i, c := range tr.Callpaths {
		c.ID = first + i
	}
	st.Callpaths, err = copyRows(ctx, tx, "timer_callpath", []string{"id", "timer", "parent"}, len(tr.Callpaths), func(i int, r []any) {
		c := tr.Callpaths[i]
		r[0], r[1], r[2] = int32(c.ID), int32(c.Timer.ID), nil
		if c.Parent != nil {
			r[2] = int32(c.Parent.ID)
		}
	})
	if err != nil {
		return st, err
	}

	// Time ranges.
	if first, err = reserveIDs(ctx, tx, "time_range", len(tr.TimeRanges)); err != nil {
		return st, err
	}
	for i, t := range tr.TimeRanges {
		t.ID = first + i
	}
	if _, err = copyRows(ctx, tx, "time_range", []string{"id", "iteration_start", "iteration_end", "time_start", "time_end"}, len(tr.TimeRanges), func(i int, r []any) {
		t := tr.TimeRanges[i]
		r[0], r[1], r[2], r[3], r[4] = int32(t.ID), int32(t.IterationStart), nil, t.TimeStart, nil
		if t.IterationEnd != nil {
			r[2] = int32(*t.IterationEnd)
		}
		if t.TimeEnd != nil {
			r[4] = *t.TimeEnd
		}
	}); err != nil {
		return st, err
	}

	// Threads: real ones by index, then the derived ones in TAU's order.
	if first, err = reserveIDs(ctx, tx, "thread", len(tr.Threads)); err != nil {
		return st, err
	}
	for i, th := range tr.Threads {
		th.ID = first + i
	}
	st.Threads, err = copyRows(ctx, tx, "thread", []string{"id", "trial", "node_rank", "context_rank", "thread_rank", "thread_index"}, len(tr.Threads), func(i int, r []any) {
		th := tr.Threads[i]
		r[0], r[1], r[2], r[3], r[4], r[5] = int32(th.ID), int32(tr.ID), int32(th.NodeRank), int32(th.ContextRank), int32(th.ThreadRank), int32(th.Index)
	})
	if err != nil {
		return st, err
	}

	// Call data and values, in thread order (each thread's in call data
	// order) with ascending ids, so that the id and thread indexes of
	// timer_call_data grow only at their right end; call-path order was
	// measured to cost more server time, the thread index then taking the
	// scattered inserts. Ids are set as the rows are encoded.
	if first, err = reserveIDs(ctx, tx, "timer_call_data", len(data)); err != nil {
		return st, err
	}
	start := time.Now()
	st.CallData, err = copyNumeric(ctx, tx, "timer_call_data", []string{"id", "timer_callpath", "thread", "calls", "subroutines", "time_range"}, len(data), func(i int, b []byte) []byte {
		d := data[i]
		d.ID = first + i
		b = appendTuple(b, 6)
		b = appendI4(b, int32(d.ID))
		b = appendI4(b, int32(d.Callpath.ID))
		b = appendI4(b, int32(d.Thread.ID))
		b = appendI4(b, javaInt(d.Calls))
		b = appendI4(b, javaInt(d.Subroutines))
		if d.TimeRange != nil {
			return appendI4(b, int32(d.TimeRange.ID))
		}
		return appendNull(b)
	})
	if err != nil {
		return st, err
	}
	st.CallDataCopy = time.Since(start)
	start = time.Now()
	st.TimerValues, err = copyNumeric(ctx, tx, "timer_value", []string{"timer_call_data", "metric", "inclusive_value", "exclusive_value", "inclusive_percent", "exclusive_percent", "sum_exclusive_squared"}, len(data), func(i int, b []byte) []byte {
		d := data[i]
		for _, v := range d.Values {
			if v == nil {
				continue
			}
			b = appendTuple(b, 7)
			b = appendI4(b, int32(d.ID))
			b = appendI4(b, int32(v.Metric.ID))
			b = appendF8(b, checkDouble(v.Inclusive))
			b = appendF8(b, checkDouble(v.Exclusive))
			b = appendF8(b, checkDouble(v.InclusivePercent))
			b = appendF8(b, checkDouble(v.ExclusivePercent))
			if v.SumExclusiveSquared != nil {
				b = appendF8(b, checkDouble(*v.SumExclusiveSquared))
			} else {
				b = appendNull(b)
			}
		}
		return b
	})
	st.TimerValueCopy = time.Since(start)
	if err != nil {
		return st, err
	}

	// Counters and their values on the real threads.
	if first, err = reserveIDs(ctx, tx, "counter", len(tr.Counters)); err != nil {
		return st, err
	}
	for i, c := range tr.Counters {
		c.ID = first + i
	}
	if _, err = copyRows(ctx, tx, "counter", []string{"id", "trial", "name"}, len(tr.Counters), func(i int, r []any) {
		r[0], r[1], r[2] = int32(tr.Counters[i].ID), int32(tr.ID), tr.Counters[i].Name
	}); err != nil {
		return st, err
	}
	var cvals []*CounterValue
	for _, th := range tr.Threads {
		if !th.IsDerived() {
			cvals = append(cvals, th.CounterValues...)
		}
	}
	st.CounterValues, err = copyNumeric(ctx, tx, "counter_value", []string{"counter", "timer_callpath", "thread", "sample_count", "maximum_value", "minimum_value", "mean_value", "standard_deviation"}, len(cvals), func(i int, b []byte) []byte {
		v := cvals[i]
		b = appendTuple(b, 8)
		b = appendI4(b, int32(v.Counter.ID))
		if v.Callpath != nil {
			b = appendI4(b, int32(v.Callpath.ID))
		} else {
			b = appendNull(b)
		}
		b = appendI4(b, int32(v.Thread.ID))
		b = appendI4(b, javaInt(v.SampleCount))
		b = appendF8(b, checkDouble(v.Maximum))
		b = appendF8(b, checkDouble(v.Minimum))
		b = appendF8(b, checkDouble(v.Mean))
		return appendF8(b, checkDouble(v.SumSquares))
	})
	if err != nil {
		return st, err
	}

	// Metadata. Every save is a new trial, so its rows get new ids.
	for _, m := range tr.SecondaryMetadata {
		m.ID = NewUUID()
	}
	n1, err := copyRows(ctx, tx, "primary_metadata", []string{"trial", "name", "value"}, len(tr.PrimaryMetadata), func(i int, r []any) {
		r[0], r[1], r[2] = int32(tr.ID), tr.PrimaryMetadata[i].Name, tr.PrimaryMetadata[i].Value
	})
	if err != nil {
		return st, err
	}
	n2, err := copyRows(ctx, tx, "secondary_metadata", []string{"id", "trial", "thread", "timer_callpath", "time_range", "parent", "name", "value", "is_array"}, len(tr.SecondaryMetadata), func(i int, r []any) {
		m := tr.SecondaryMetadata[i]
		r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8] = m.ID, int32(tr.ID), nil, nil, nil, nil, m.Name, m.Value, m.IsArray
		if m.Thread != nil {
			r[2] = int32(m.Thread.ID)
		}
		if m.Callpath != nil {
			r[3] = int32(m.Callpath.ID)
		}
		if m.TimeRange != nil {
			r[4] = int32(m.TimeRange.ID)
		}
		if m.Parent != nil {
			r[5] = m.Parent.ID
		}
	})
	if err != nil {
		return st, err
	}
	st.Metadata = n1 + n2
	return st, nil
}

// AddViews adds the taudb_view rows TAU's loader creates for an application
// and experiment name (-a/-x): "Application-<app>" under the root, selecting
// primary_metadata Application = app, and "Experiment-<exp>" under it,
// selecting Application and Experiment. Existing views are kept.
func (s *Store) AddViews(ctx context.Context, app, exp string) error {
	if app == "" {
		return nil
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		view := func(parent *int, name string, params [][2]string) (int, error) {
			var id int
			err := tx.QueryRow(ctx, `SELECT id FROM taudb_view WHERE name = $1 AND parent IS NOT DISTINCT FROM $2`, name, parent).Scan(&id)
			if err == nil {
				return id, nil
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				return 0, err
			}
			if err := tx.QueryRow(ctx, `INSERT INTO taudb_view (parent, name, conjoin) VALUES ($1, $2, 'and') RETURNING id`, parent, name).Scan(&id); err != nil {
				return 0, err
			}
			for _, p := range params {
				if _, err := tx.Exec(ctx, `INSERT INTO taudb_view_parameter (taudb_view, table_name, column_name, operator, value) VALUES ($1, 'primary_metadata', $2, '=', $3)`, id, p[0], p[1]); err != nil {
					return 0, err
				}
			}
			return id, nil
		}
		appID, err := view(nil, "Application-"+app, [][2]string{{"Application", app}})
		if err != nil || exp == "" {
			return err
		}
		_, err = view(&appID, "Experiment-"+exp, [][2]string{{"Application", app}, {"Experiment", exp}})
		return err
	})
	if err != nil {
		return fmt.Errorf("taudb: add views: %w", err)
	}
	return nil
}

// TrialInfo is one row of the trial table.
type TrialInfo struct {
	ID                int    `json:"id"`
	Name              string `json:"name"`
	DataSource        int    `json:"data_source"`
	NodeCount         int    `json:"node_count"`
	ContextsPerNode   int    `json:"contexts_per_node"`
	ThreadsPerContext int    `json:"threads_per_context"`
	TotalThreads      int    `json:"total_threads"`
}

// Filter selects trials; zero fields match everything. Metadata matches
// trials whose primary metadata has every given name with that value.
type Filter struct {
	ID       int
	Name     string
	Metadata map[string]string
}

// Trials lists the trials matching f, by id.
func (s *Store) Trials(ctx context.Context, f Filter) ([]TrialInfo, error) {
	var where []string
	var args []any
	arg := func(v any) string { args = append(args, v); return fmt.Sprintf("$%d", len(args)) }
	if f.ID != 0 {
		where = append(where, "t.id = "+arg(f.ID))
	}
	if f.Name != "" {
		where = append(where, "t.name = "+arg(f.Name))
	}
	keys := make([]string, 0, len(f.Metadata))
	for k := range f.Metadata {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		where = append(where, fmt.Sprintf("EXISTS (SELECT 1 FROM primary_metadata pm WHERE pm.trial = t.id AND pm.name = %s AND pm.value = %s)", arg(k), arg(f.Metadata[k])))
	}
	q := `SELECT t.id, coalesce(t.name, ''), coalesce(t.data_source, 0), coalesce(t.node_count, 0), coalesce(t.contexts_per_node, 0),
		coalesce(t.threads_per_context, 0), coalesce(t.total_threads, 0) FROM trial t`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	rows, err := s.pool.Query(ctx, q+" ORDER BY t.id", args...)
	if err != nil {
		return nil, fmt.Errorf("taudb: list trials: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (TrialInfo, error) {
		var t TrialInfo
		err := r.Scan(&t.ID, &t.Name, &t.DataSource, &t.NodeCount, &t.ContextsPerNode, &t.ThreadsPerContext, &t.TotalThreads)
		return t, err
	})
	if err != nil {
		return nil, fmt.Errorf("taudb: list trials: %w", err)
	}
	return out, nil
}

// ErrNoTrial is returned by LoadTrial for an id that is not in the database.
var ErrNoTrial = errors.New("no such trial")

// LoadTrial reads trial id back whole. The derived threads' counter values,
// which TAU does not store, are recomputed; each thread's Metadata is rebuilt
// from the primary rows and its own secondary rows, sorted by name as TAU
// writes them.
func (s *Store) LoadTrial(ctx context.Context, id int) (*Trial, error) {
	tr, err := s.loadTrial(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("taudb: load trial %d: %w", id, err)
	}
	return tr, nil
}

func (s *Store) loadTrial(ctx context.Context, id int) (*Trial, error) {
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly, IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	tr := &Trial{}
	err = tx.QueryRow(ctx, `SELECT id, coalesce(name, ''), coalesce(data_source, 0), coalesce(node_count, 0), coalesce(contexts_per_node, 0),
		coalesce(threads_per_context, 0), coalesce(total_threads, 0) FROM trial WHERE id = $1`, id).
		Scan(&tr.ID, &tr.Name, &tr.DataSource, &tr.NodeCount, &tr.ContextsPerNode, &tr.ThreadsPerContext, &tr.TotalThreads)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNoTrial
	}
	if err != nil {
		return nil, err
	}
	each := func(q string, scan func(pgx.Rows) error) error {
		rows, err := tx.Query(ctx, q, id)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			if err := scan(rows); err != nil {
				return err
			}
		}
		return rows.Err()
	}
	metrics := map[int]*Metric{}
	if err := each(`SELECT id, name, derived FROM metric WHERE trial = $1 ORDER BY id`, func(r pgx.Rows) error {
		var mid int
		var name string
		var derived bool
		if err := r.Scan(&mid, &name, &derived); err != nil {
			return err
		}
		m := tr.AddMetric(name)
		m.ID, m.Derived = mid, derived
		metrics[mid] = m
		return nil
	}); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	threads := map[int]*Thread{}
	if err := each(`SELECT id, node_rank, context_rank, thread_rank, thread_index FROM thread WHERE trial = $1 ORDER BY id`, func(r pgx.Rows) error {
		var tid, n, c, t, idx int
		if err := r.Scan(&tid, &n, &c, &t, &idx); err != nil {
			return err
		}
		th := tr.AddThread(n, c, t, idx)
		th.ID = tid
		threads[tid] = th
		return nil
	}); err != nil {
		return nil, fmt.Errorf("threads: %w", err)
	}
	timers := map[int]*Timer{}
	if err := each(`SELECT id, name, short_name, source_file, line_number, line_number_end, column_number, column_number_end
		FROM timer WHERE trial = $1 ORDER BY id`, func(r pgx.Rows) error {
		var tid int
		var name, short string
		var src *string
		var l1, l2, c1, c2 *int
		if err := r.Scan(&tid, &name, &short, &src, &l1, &l2, &c1, &c2); err != nil {
			return err
		}
		t := tr.AddTimer(name)
		t.ID, t.ShortName, t.Groups, t.Parameters = tid, short, nil, nil
		t.SourceFile = deref(src)
		t.LineNumber, t.LineNumberEnd, t.ColumnNumber, t.ColumnNumberEnd = deref(l1), deref(l2), deref(c1), deref(c2)
		timers[tid] = t
		return nil
	}); err != nil {
		return nil, fmt.Errorf("timers: %w", err)
	}
	if err := each(`SELECT g.timer, g.group_name FROM timer_group g JOIN timer t ON t.id = g.timer WHERE t.trial = $1 ORDER BY g.timer, g.ctid`, func(r pgx.Rows) error {
		var tid int
		var g string
		if err := r.Scan(&tid, &g); err != nil {
			return err
		}
		timers[tid].Groups = append(timers[tid].Groups, g)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("timer groups: %w", err)
	}
	if err := each(`SELECT p.timer, p.parameter_name, p.parameter_value FROM timer_parameter p JOIN timer t ON t.id = p.timer WHERE t.trial = $1 ORDER BY p.timer, p.ctid`, func(r pgx.Rows) error {
		var tid int
		var p Parameter
		if err := r.Scan(&tid, &p.Name, &p.Value); err != nil {
			return err
		}
		timers[tid].Parameters = append(timers[tid].Parameters, p)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("timer parameters: %w", err)
	}
	callpaths := map[int]*TimerCallpath{}
	type cpRow struct{ id, timer, parent int }
	var pending []cpRow
	if err := each(`SELECT c.id, c.timer, coalesce(c.parent, 0) FROM timer_callpath c JOIN timer t ON t.id = c.timer WHERE t.trial = $1 ORDER BY c.id`, func(r pgx.Rows) error {
		var c cpRow
		if err := r.Scan(&c.id, &c.timer, &c.parent); err != nil {
			return err
		}
		pending = append(pending, c)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("call paths: %w", err)
	}
	for len(pending) > 0 {
		var later []cpRow
		for _, c := range pending {
			t := timers[c.timer]
			if t == nil {
				return nil, fmt.Errorf("call path %d names timer %d of another trial", c.id, c.timer)
			}
			if c.parent == 0 {
				t.root.ID = c.id
				callpaths[c.id] = t.root
				continue
			}
			p := callpaths[c.parent]
			if p == nil {
				later = append(later, c)
				continue
			}
			cp := tr.addCallpath(t, p)
			cp.ID = c.id
			callpaths[c.id] = cp
		}
		if len(later) == len(pending) {
			return nil, fmt.Errorf("call path %d has a parent outside the trial", later[0].id)
		}
		pending = later
	}
	ranges := map[int]*TimeRange{}
	if err := each(`SELECT r.id, r.iteration_start, r.iteration_end, r.time_start, r.time_end FROM time_range r
		WHERE r.id IN (SELECT d.time_range FROM timer_call_data d JOIN thread h ON h.id = d.thread WHERE h.trial = $1
		               UNION SELECT s.time_range FROM secondary_metadata s WHERE s.trial = $1) ORDER BY r.id`, func(r pgx.Rows) error {
		t := &TimeRange{}
		if err := r.Scan(&t.ID, &t.IterationStart, &t.IterationEnd, &t.TimeStart, &t.TimeEnd); err != nil {
			return err
		}
		tr.TimeRanges = append(tr.TimeRanges, t)
		ranges[t.ID] = t
		return nil
	}); err != nil {
		return nil, fmt.Errorf("time ranges: %w", err)
	}
	data := map[int]*TimerCallData{}
	if err := each(`SELECT d.id, d.timer_callpath, d.thread, coalesce(d.calls, 0), coalesce(d.subroutines, 0), coalesce(d.time_range, 0)
		FROM timer_call_data d JOIN thread h ON h.id = d.thread WHERE h.trial = $1 ORDER BY d.id`, func(r pgx.Rows) error {
		var did, cid, tid, calls, subrs, rid int
		if err := r.Scan(&did, &cid, &tid, &calls, &subrs, &rid); err != nil {
			return err
		}
		c, th := callpaths[cid], threads[tid]
		if c == nil || th == nil {
			return fmt.Errorf("timer_call_data %d refers outside the trial", did)
		}
		d := tr.AddCallData(th, c)
		d.ID, d.Calls, d.Subroutines, d.TimeRange = did, float64(calls), float64(subrs), ranges[rid]
		data[did] = d
		return nil
	}); err != nil {
		return nil, fmt.Errorf("timer call data: %w", err)
	}
	if err := each(`SELECT v.timer_call_data, v.metric, coalesce(v.inclusive_value, 0), coalesce(v.exclusive_value, 0),
		coalesce(v.inclusive_percent, 0), coalesce(v.exclusive_percent, 0), v.sum_exclusive_squared
		FROM timer_value v JOIN timer_call_data d ON d.id = v.timer_call_data JOIN thread h ON h.id = d.thread
		WHERE h.trial = $1`, func(r pgx.Rows) error {
		var did, mid int
		var incl, excl, ip, ep float64
		var sq *float64
		if err := r.Scan(&did, &mid, &incl, &excl, &ip, &ep, &sq); err != nil {
			return err
		}
		d, m := data[did], metrics[mid]
		if d == nil || m == nil {
			return fmt.Errorf("timer_value of call data %d refers outside the trial", did)
		}
		v := d.SetValue(m, incl, excl)
		v.InclusivePercent, v.ExclusivePercent, v.SumExclusiveSquared = ip, ep, sq
		return nil
	}); err != nil {
		return nil, fmt.Errorf("timer values: %w", err)
	}
	counters := map[int]*Counter{}
	if err := each(`SELECT id, name FROM counter WHERE trial = $1 ORDER BY id`, func(r pgx.Rows) error {
		var cid int
		var name string
		if err := r.Scan(&cid, &name); err != nil {
			return err
		}
		c := tr.AddCounter(name)
		c.ID = cid
		counters[cid] = c
		return nil
	}); err != nil {
		return nil, fmt.Errorf("counters: %w", err)
	}
	if err := each(`SELECT v.counter, coalesce(v.timer_callpath, 0), v.thread, coalesce(v.sample_count, 0), coalesce(v.maximum_value, 0),
		coalesce(v.minimum_value, 0), coalesce(v.mean_value, 0), coalesce(v.standard_deviation, 0)
		FROM counter_value v JOIN thread h ON h.id = v.thread WHERE h.trial = $1 ORDER BY v.ctid`, func(r pgx.Rows) error {
		var cid, cpid, tid, n int
		var mx, mn, mean, sq float64
		if err := r.Scan(&cid, &cpid, &tid, &n, &mx, &mn, &mean, &sq); err != nil {
			return err
		}
		c, th := counters[cid], threads[tid]
		if c == nil || th == nil {
			return fmt.Errorf("counter_value of counter %d refers outside the trial", cid)
		}
		v := tr.AddCounterValue(th, c)
		v.Callpath = callpaths[cpid]
		v.SampleCount, v.Maximum, v.Minimum, v.Mean, v.SumSquares = float64(n), mx, mn, mean, sq
		return nil
	}); err != nil {
		return nil, fmt.Errorf("counter values: %w", err)
	}
	if err := each(`SELECT name, coalesce(value, '') FROM primary_metadata WHERE trial = $1 ORDER BY ctid`, func(r pgx.Rows) error {
		var a Attribute
		if err := r.Scan(&a.Name, &a.Value); err != nil {
			return err
		}
		tr.PrimaryMetadata = append(tr.PrimaryMetadata, a)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("primary metadata: %w", err)
	}
	secondary := map[string]*SecondaryMetadata{}
	parents := map[*SecondaryMetadata]string{}
	if err := each(`SELECT id, coalesce(thread, 0), coalesce(timer_callpath, 0), coalesce(time_range, 0), coalesce(parent, ''), name,
		coalesce(value, ''), coalesce(is_array, false) FROM secondary_metadata WHERE trial = $1 ORDER BY ctid`, func(r pgx.Rows) error {
		m := &SecondaryMetadata{}
		var tid, cid, rid int
		var parent string
		if err := r.Scan(&m.ID, &tid, &cid, &rid, &parent, &m.Name, &m.Value, &m.IsArray); err != nil {
			return err
		}
		m.Thread, m.Callpath, m.TimeRange = threads[tid], callpaths[cid], ranges[rid]
		tr.SecondaryMetadata = append(tr.SecondaryMetadata, m)
		secondary[m.ID] = m
		if parent != "" {
			parents[m] = parent
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("secondary metadata: %w", err)
	}
	for m, p := range parents {
		m.Parent = secondary[p]
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, err
	}
	tr.rebuildThreadMetadata()
	real := tr.RealThreads()
	derived := map[int]*Thread{}
	for _, idx := range DerivedIndexes {
		if th := tr.Thread(idx); th != nil {
			derived[idx] = th
		}
	}
	if len(derived) == len(DerivedIndexes) {
		tr.computeCounterStats(real, derived)
	}
	return tr, nil
}

// rebuildThreadMetadata sets each real thread's Metadata from the primary
// rows (without the ones the loader adds) and the thread's own top-level
// secondary rows, sorted by name.
func (tr *Trial) rebuildThreadMetadata() {
	skip := map[string]bool{"File Type Index": true, "File Type Name": true}
	for _, th := range tr.RealThreads() {
		var md []Attribute
		for _, a := range tr.PrimaryMetadata {
			if !skip[a.Name] {
				md = append(md, a)
			}
		}
		for _, s := range tr.SecondaryMetadata {
			if s.Thread == th && s.Parent == nil && s.Callpath == nil {
				md = append(md, Attribute{Name: s.Name, Value: s.Value})
			}
		}
		sort.SliceStable(md, func(i, j int) bool { return md[i].Name < md[j].Name })
		th.Metadata = md
	}
}

func deref[T any](p *T) T {
	var z T
	if p == nil {
		return z
	}
	return *p
}
