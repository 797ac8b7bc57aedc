// Package sqlitestore is the embedded provenance store: one SQLite file
// (modernc.org/sqlite, pure Go, WAL) holding each record as a JSON document
// (executions compressed, see doc.go) next to indexed columns extracted from
// it for the fields queries filter and sort on. It needs nothing installed
// and is the default of provdb and kipimo query.
package sqlitestore

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"

	"modernc.org/sqlite"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/docblock"
)

// Options tune a Store.
type Options struct {
	// Synchronous is SQLite's synchronous pragma: FULL (default) makes a
	// committed batch survive a power failure, NORMAL only a process crash.
	Synchronous string
	// ReadOnly opens the file for queries only (kipimo query).
	ReadOnly bool
}

// Store is a provenance.Store on one SQLite file. Writes go through one
// connection, one transaction per batch; queries use a separate pool of
// read connections and so run concurrently with writes (WAL). Safe for
// concurrent use; the caller who opened it calls Close once.
type Store struct {
	path string
	w    *sql.DB // one connection: all writes
	r    *sql.DB // readers
	// streams are the connections of Each, one per call while it runs: a
	// pool without a cap, so that a stream's callback can call the store.
	streams *sql.DB
	ins     map[provenance.Kind]*sql.Stmt // per kind, on w
	// insRows[kind][i] inserts rowSizes[i] executions at once, and
	// insBlock[kind] a block of their documents, per exec kind.
	insRows  map[provenance.Kind][]*sql.Stmt
	insBlock map[provenance.Kind]*sql.Stmt

	mu    sync.Mutex // held by Write: one writer, and the buffers below
	block docblock.Builder
	// zblock is the compressed block; rows its executions' columns; refs
	// the rows' doc references; args the insert's arguments.
	zblock, refs []byte
	rows         []docblock.Row
	args         []any
}

var registerOnce sync.Once

// regexpCache holds compiled patterns of the REGEXP SQL function.
var regexpCache sync.Map

func registerRegexp() {
	registerOnce.Do(func() {
		// REGEXP(pattern, text): SQLite's "text REGEXP pattern" operator.
		// Patterns are Go RE2 expressions bound as parameters, validated
		// before any query runs.
		_ = sqlite.RegisterDeterministicScalarFunction("regexp", 2, func(_ *sqlite.FunctionContext, args []driver.Value) (driver.Value, error) {
			pat, _ := args[0].(string)
			var s string
			switch x := args[1].(type) {
			case string:
				s = x
			case []byte:
				s = string(x)
			}
			var re *regexp.Regexp
			if v, ok := regexpCache.Load(pat); ok {
				re = v.(*regexp.Regexp)
			} else {
				var err error
				if re, err = regexp.Compile(pat); err != nil {
					return nil, err
				}
				regexpCache.Store(pat, re)
			}
			return re.MatchString(s), nil
		})
	})
}

const execColumns = `
	id INTEGER PRIMARY KEY,
	pid INTEGER NOT NULL, event_id TEXT NOT NULL, rid INTEGER NOT NULL, tid INTEGER NOT NULL,
	fid INTEGER NOT NULL, func TEXT NOT NULL, io_step INTEGER NOT NULL,
	entry INTEGER NOT NULL, exit INTEGER NOT NULL,
	runtime_total INTEGER NOT NULL, runtime_exclusive INTEGER NOT NULL,
	outlier_score REAL NOT NULL, is_gpu_event INTEGER NOT NULL,
	doc BLOB NOT NULL, -- a reference into <table>_docs (see doc.go)
	UNIQUE (pid, event_id)`

// execIndexes are the secondary indexes of the execution tables, one per
// access path users take: a function's executions, slowest first; a rank's
// executions over a range of steps; the highest outlier scores. Every index
// costs each insert a B-tree update, and each one added beyond these slowed
// ingest by a tenth or more; other filters and sorts scan.
var execIndexes = []string{"func, runtime_total", "rid, io_step", "outlier_score"}

// execInsertColumns is the column list of an execution insert.
const execInsertColumns = "(pid, event_id, rid, tid, fid, func, io_step, entry, exit, runtime_total, runtime_exclusive, outlier_score, is_gpu_event, doc)"

// execRowsPerInsert is the number of executions one multi-row INSERT
// carries at most, and so the most one document block holds: statement
// overhead is paid once for them.
const execRowsPerInsert = docblock.MaxDocs

// rowSizes are the row counts of the prepared multi-row INSERTs, largest
// first: a group of n executions takes one statement per bit set in n.
var rowSizes = []int{64, 32, 16, 8, 4, 2, 1}

func schema() []string {
	var s []string
	for _, t := range []string{string(provenance.KindAnomalies), string(provenance.KindNormalExecs)} {
		s = append(s, `CREATE TABLE IF NOT EXISTS `+t+` (`+execColumns+`)`,
			`CREATE TABLE IF NOT EXISTS `+t+`_docs (id INTEGER PRIMARY KEY, data BLOB NOT NULL)`)
		for _, ix := range execIndexes {
			name := t + "_" + strings.NewReplacer(", ", "_").Replace(ix)
			s = append(s, `CREATE INDEX IF NOT EXISTS `+name+` ON `+t+` (`+ix+`)`)
		}
	}
	s = append(s,
		`CREATE TABLE IF NOT EXISTS metadata (pid INTEGER NOT NULL, rid INTEGER NOT NULL, tid INTEGER NOT NULL, descr TEXT NOT NULL, doc TEXT NOT NULL, PRIMARY KEY (pid, rid, tid, descr))`,
		`CREATE TABLE IF NOT EXISTS func_stats (pid INTEGER NOT NULL, func TEXT NOT NULL, doc TEXT NOT NULL, PRIMARY KEY (pid, func))`,
		`CREATE TABLE IF NOT EXISTS counter_stats (pid INTEGER NOT NULL, counter TEXT NOT NULL, doc TEXT NOT NULL, PRIMARY KEY (pid, counter))`,
		`CREATE TABLE IF NOT EXISTS profiles (`+profileColumns+`)`,
	)
	return s
}

// profileColumns are the profiles table's: a split profile's parts
// (provenance.ThreadProfile.Part) are rows of their own.
const profileColumns = `pid INTEGER NOT NULL, rid INTEGER NOT NULL, tid INTEGER NOT NULL, io_step INTEGER NOT NULL, part INTEGER NOT NULL DEFAULT 0, doc TEXT NOT NULL, PRIMARY KEY (pid, rid, tid, io_step, part)`

// migrateProfiles gives a profiles table of a store written before profiles
// had parts its part column, keeping its rows.
func migrateProfiles(ctx context.Context, db *sql.DB) error {
	rows, err := db.QueryContext(ctx, `SELECT name FROM pragma_table_info('profiles')`)
	if err != nil {
		return err
	}
	hasPart := false
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return err
		}
		hasPart = hasPart || name == "part"
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil || hasPart {
		return err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	for _, st := range []string{
		`ALTER TABLE profiles RENAME TO profiles_unsplit`,
		`CREATE TABLE profiles (` + profileColumns + `)`,
		`INSERT INTO profiles (pid, rid, tid, io_step, part, doc) SELECT pid, rid, tid, io_step, 0, doc FROM profiles_unsplit`,
		`DROP TABLE profiles_unsplit`,
	} {
		if _, err := tx.ExecContext(ctx, st); err != nil {
			return errors.Join(fmt.Errorf("add the part column to profiles: %w", err), tx.Rollback())
		}
	}
	return tx.Commit()
}

// execInsert is the INSERT of n executions into table.
func execInsert(table string, n int) string {
	row := "(?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
	return "INSERT OR IGNORE INTO " + table + " " + execInsertColumns + " VALUES " + strings.TrimSuffix(strings.Repeat(row+",", n), ",")
}

var insertSQL = map[provenance.Kind]string{
	provenance.KindAnomalies:    execInsert(string(provenance.KindAnomalies), 1),
	provenance.KindNormalExecs:  execInsert(string(provenance.KindNormalExecs), 1),
	provenance.KindMetadata:     `INSERT OR IGNORE INTO metadata (pid, rid, tid, descr, doc) VALUES (?,?,?,?,?)`,
	provenance.KindFuncStats:    `INSERT OR IGNORE INTO func_stats (pid, func, doc) VALUES (?,?,?)`,
	provenance.KindCounterStats: `INSERT OR IGNORE INTO counter_stats (pid, counter, doc) VALUES (?,?,?)`,
	provenance.KindProfiles:     `INSERT OR IGNORE INTO profiles (pid, rid, tid, io_step, part, doc) VALUES (?,?,?,?,?,?)`,
}

// Open opens (creating if needed) the SQLite store at path. A new store's
// file, and its log and shared-memory files, are readable and writable by
// their owner only (0600).
func Open(ctx context.Context, path string, opt Options) (*Store, error) {
	registerRegexp()
	if path == "" {
		return nil, errors.New("open SQLite provenance store: empty path")
	}
	sync := strings.ToUpper(opt.Synchronous)
	switch sync {
	case "":
		sync = "FULL"
	case "FULL", "NORMAL", "OFF":
	default:
		return nil, fmt.Errorf("open SQLite provenance store: synchronous %q is not FULL, NORMAL or OFF", opt.Synchronous)
	}
	// dsn names the file with the pragmas run on every connection.
	dsn := func(extra ...string) string {
		u := url.URL{Scheme: "file", Opaque: path}
		q := url.Values{}
		q.Add("_pragma", "busy_timeout(10000)")
		q.Add("_pragma", "journal_mode(WAL)")
		q.Add("_pragma", "synchronous("+sync+")")
		for _, p := range extra {
			q.Add("_pragma", p)
		}
		u.RawQuery = q.Encode()
		return u.String()
	}
	s := &Store{path: path, ins: map[provenance.Kind]*sql.Stmt{}, insRows: map[provenance.Kind][]*sql.Stmt{}, insBlock: map[provenance.Kind]*sql.Stmt{}}
	var err error
	if !opt.ReadOnly {
		if err := createPrivate(path); err != nil {
			return nil, fmt.Errorf("open SQLite provenance store %s: %w", path, err)
		}
		// A 64 MiB page cache keeps the indexes' pages in memory while
		// writing, and the log is copied into the file every
		// walCheckpointPages pages rather than every 1,000, so that an
		// index page changed by several writes is copied once.
		if s.w, err = sql.Open("sqlite", dsn("cache_size(-65536)", fmt.Sprintf("wal_autocheckpoint(%d)", walCheckpointPages))); err != nil {
			return nil, fmt.Errorf("open SQLite provenance store %s: %w", path, err)
		}
		s.w.SetMaxOpenConns(1)
		if err := newFilePages(ctx, s.w); err != nil {
			s.w.Close()
			return nil, fmt.Errorf("open SQLite provenance store %s: %w", path, err)
		}
		for _, st := range schema() {
			if _, err := s.w.ExecContext(ctx, st); err != nil {
				s.w.Close()
				return nil, fmt.Errorf("open SQLite provenance store %s: create schema: %w", path, err)
			}
		}
		if err := migrateProfiles(ctx, s.w); err != nil {
			s.w.Close()
			return nil, fmt.Errorf("open SQLite provenance store %s: %w", path, err)
		}
		for kind, q := range insertSQL {
			st, err := s.w.PrepareContext(ctx, q)
			if err != nil {
				s.w.Close()
				return nil, fmt.Errorf("open SQLite provenance store %s: prepare %s insert: %w", path, kind, err)
			}
			s.ins[kind] = st
			if provenance.IsExecKind(kind) {
				for _, n := range rowSizes {
					var st *sql.Stmt
					if st, err = s.w.PrepareContext(ctx, execInsert(string(kind), n)); err != nil {
						break
					}
					s.insRows[kind] = append(s.insRows[kind], st)
				}
				if err == nil {
					s.insBlock[kind], err = s.w.PrepareContext(ctx, "INSERT INTO "+string(kind)+"_docs (data) VALUES (?)")
				}
				if err != nil {
					s.w.Close()
					return nil, fmt.Errorf("open SQLite provenance store %s: prepare %s insert: %w", path, kind, err)
				}
			}
		}
	}
	if s.r, err = sql.Open("sqlite", dsn("query_only(1)")); err != nil {
		s.closeW()
		return nil, fmt.Errorf("open SQLite provenance store %s: %w", path, err)
	}
	s.r.SetMaxOpenConns(4)
	if s.streams, err = sql.Open("sqlite", dsn("query_only(1)")); err != nil {
		s.r.Close()
		s.closeW()
		return nil, fmt.Errorf("open SQLite provenance store %s: %w", path, err)
	}
	s.streams.SetMaxIdleConns(1)
	var n int
	if err := s.r.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE name = 'anomalies'`).Scan(&n); err != nil || n == 0 {
		s.Close()
		if err == nil {
			err = errors.New("no anomalies table: not a provenance store")
		}
		return nil, fmt.Errorf("open SQLite provenance store %s: %w", path, err)
	}
	return s, nil
}

// createPrivate creates path, empty, readable and writable by its owner
// only (0600), unless it exists: SQLite then opens it as a new database,
// and makes its log and shared-memory files with the same mode. A store
// that exists keeps the mode it has.
func createPrivate(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return f.Close()
}

// walCheckpointPages is how many pages the write-ahead log grows to before
// the writer copies it into the file: 8,000 (125 MiB of 16 KiB pages).
// Every commit writes each index page it changed to the log, and with
// records inserted at random places in the indexes a commit changes most of
// their pages; a copy writes each page once, its newest version, however
// many commits changed it. So the fewer copies, the fewer bytes: at 2,000
// pages (a copy after every commit or two of provdb's) ingest wrote about a
// third more bytes per record (BenchmarkProvdbIngest's written-B/record).
// The log takes up to that much disk besides the file (it is reused, not
// shrunk, after a copy), and opening a store after a crash reads it whole.
const walCheckpointPages = 8000

// pageSize is the page size of a new store: an execution's index entries
// then share fewer, shallower pages, and a document block fits in two.
// With 16 KiB pages and the log copied every 2,000 pages (when measured),
// the writer's CPU per record was about a tenth lower than with SQLite's
// defaults.
const pageSize = 16384

// newFilePages gives a new, empty file (no table yet) pageSize pages. The
// connection pragmas have already put it in WAL mode, in which the page
// size is fixed, so it leaves WAL mode to set it, rewrites the empty file
// and goes back.
func newFilePages(ctx context.Context, db *sql.DB) error {
	var tables, size int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM sqlite_master").Scan(&tables); err != nil {
		return fmt.Errorf("read schema: %w", err)
	}
	if err := db.QueryRowContext(ctx, "PRAGMA page_size").Scan(&size); err != nil {
		return fmt.Errorf("read page size: %w", err)
	}
	if tables > 0 || size == pageSize {
		return nil
	}
	for _, st := range []string{"PRAGMA journal_mode=DELETE", fmt.Sprintf("PRAGMA page_size=%d", pageSize), "VACUUM", "PRAGMA journal_mode=WAL"} {
		if _, err := db.ExecContext(ctx, st); err != nil {
			return fmt.Errorf("set page size: %s: %w", st, err)
		}
	}
	return nil
}

func (s *Store) closeW() {
	if s.w != nil {
		s.w.Close()
	}
}

// Close closes the store's connections.
func (s *Store) Close() error {
	var errs []error
	for _, st := range s.ins {
		errs = append(errs, st.Close())
	}
	for _, sts := range s.insRows {
		for _, st := range sts {
			errs = append(errs, st.Close())
		}
	}
	for _, st := range s.insBlock {
		errs = append(errs, st.Close())
	}
	if s.w != nil {
		errs = append(errs, s.w.Close())
	}
	errs = append(errs, s.r.Close())
	if s.streams != nil {
		errs = append(errs, s.streams.Close())
	}
	return errors.Join(errs...)
}

// Write stores b in one transaction; records already stored are skipped.
func (s *Store) Write(ctx context.Context, b provenance.Batch) error {
	if s.w == nil {
		return errors.New("write provenance batch: store opened read-only")
	}
	st, ok := s.ins[b.Kind]
	if !ok {
		return fmt.Errorf("write provenance batch: unknown kind %q", b.Kind)
	}
	if b.Len() == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("write %s batch: begin: %w", b.Kind, err)
	}
	if provenance.IsExecKind(b.Kind) {
		err = s.writeExecs(ctx, tx, b.Kind, b.Execs)
	} else {
		err = writeRows(ctx, tx.StmtContext(ctx, st), b)
	}
	if err != nil {
		tx.Rollback()
		return fmt.Errorf("write %s batch: %w", b.Kind, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("write %s batch: commit: %w", b.Kind, err)
	}
	return nil
}

// writeExecs inserts execs, execRowsPerInsert at a time, each group's
// documents as one block. Called with s.mu held.
func (s *Store) writeExecs(ctx context.Context, tx *sql.Tx, kind provenance.Kind, execs []provenance.Exec) error {
	w := s.execWriter(ctx, tx, kind)
	for len(execs) > 0 {
		group := execs[:min(len(execs), execRowsPerInsert)]
		execs = execs[len(group):]
		var err error
		if s.zblock, err = s.block.Build(s.zblock[:0], group); err != nil {
			return err
		}
		s.rows = s.rows[:0]
		for i := range group {
			s.rows = append(s.rows, docblock.RowOf(&group[i]))
		}
		if err := w.writeGroup(ctx, s.rows, s.zblock); err != nil {
			return err
		}
	}
	return nil
}

// execWriter returns the writer of executions of kind in tx.
func (s *Store) execWriter(ctx context.Context, tx *sql.Tx, kind provenance.Kind) *execWriter {
	return &execWriter{s: s, tx: tx, kind: kind, insBlock: tx.StmtContext(ctx, s.insBlock[kind]), rows: make([]*sql.Stmt, len(rowSizes))}
}

// execWriter writes executions of one kind in one transaction.
type execWriter struct {
	s        *Store
	tx       *sql.Tx
	kind     provenance.Kind
	insBlock *sql.Stmt
	rows     []*sql.Stmt // the transaction's row inserts by rowSizes index, when first needed
	exists   *sql.Stmt
}

// writeGroup stores group (at most execRowsPerInsert executions) with
// zblock, the compressed block of their documents, in their order.
//
// A group whose rows are not all new (a batch delivered again, or a record
// given twice) is taken back and written again with only the records not
// stored yet, their documents taken out of zblock into a new block, so that
// no block holds a document that no row refers to. (A savepoint per group
// would do the same, at a quarter of the write's speed: SQLite then
// journals every page a group changes.)
func (w *execWriter) writeGroup(ctx context.Context, group []docblock.Row, zblock []byte) error {
	id, n, err := w.insert(ctx, group, zblock)
	if err != nil || n == int64(len(group)) {
		return err
	}
	if err := w.takeBack(ctx, group, id); err != nil {
		return err
	}
	fresh, err := w.unstored(ctx, group)
	if err != nil || len(fresh) == 0 {
		return err
	}
	docs, err := docblock.Decode(zblock)
	if err != nil {
		return fmt.Errorf("rebuild a document block: %w", err)
	}
	if len(docs) != len(group) {
		return fmt.Errorf("rebuild a document block: %d documents for %d executions", len(docs), len(group))
	}
	var b docblock.Builder
	rows := make([]docblock.Row, len(fresh))
	for i, k := range fresh {
		b.Add(docs[k])
		rows[i] = group[k]
	}
	_, _, err = w.insert(ctx, rows, b.AppendCompressed(nil))
	return err
}

// insert stores group (at most execRowsPerInsert executions) and zblock,
// their documents' block, and returns the block's id and the number of rows
// inserted.
func (w *execWriter) insert(ctx context.Context, group []docblock.Row, zblock []byte) (id, inserted int64, err error) {
	s := w.s
	res, err := w.insBlock.ExecContext(ctx, zblock)
	if err != nil {
		return 0, 0, fmt.Errorf("insert document block: %w", err)
	}
	if id, err = res.LastInsertId(); err != nil {
		return 0, 0, fmt.Errorf("insert document block: %w", err)
	}
	s.refs = s.refs[:0]
	lo := 0
	for si, n := range rowSizes {
		for len(group)-lo >= n {
			if w.rows[si] == nil {
				w.rows[si] = w.tx.StmtContext(ctx, s.insRows[w.kind][si])
			}
			s.args = s.args[:0]
			for i := lo; i < lo+n; i++ {
				e := &group[i]
				start := len(s.refs)
				s.refs = appendRef(s.refs, id, i)
				s.args = append(s.args, int64(e.PID), e.EventID, int64(e.RID), int64(e.TID), int64(e.FID), e.Func,
					int64(e.IOStep), int64(e.Entry), int64(e.Exit), int64(e.RuntimeTotal), int64(e.RuntimeExclusive),
					e.OutlierScore, e.IsGPUEvent, s.refs[start:len(s.refs):len(s.refs)])
			}
			res, err := w.rows[si].ExecContext(ctx, s.args...)
			if err != nil {
				return 0, 0, err
			}
			k, err := res.RowsAffected()
			if err != nil {
				return 0, 0, err
			}
			inserted += k
			lo += n
		}
	}
	return id, inserted, nil
}

// takeBack deletes what insert stored for group as block id: the rows that
// refer to the block, and the block.
func (w *execWriter) takeBack(ctx context.Context, group []docblock.Row, id int64) error {
	for i := range group {
		e := &group[i]
		if _, err := w.tx.ExecContext(ctx, "DELETE FROM "+string(w.kind)+" WHERE pid = ? AND event_id = ? AND doc = ?",
			int64(e.PID), e.EventID, appendRef(nil, id, i)); err != nil {
			return fmt.Errorf("take back a group: %w", err)
		}
	}
	if _, err := w.tx.ExecContext(ctx, "DELETE FROM "+string(w.kind)+"_docs WHERE id = ?", id); err != nil {
		return fmt.Errorf("take back a group: %w", err)
	}
	return nil
}

// unstored returns the indexes in group of the executions not stored yet,
// each once (its first place).
func (w *execWriter) unstored(ctx context.Context, group []docblock.Row) ([]int, error) {
	if w.exists == nil {
		var err error
		if w.exists, err = w.tx.PrepareContext(ctx, "SELECT count(*) FROM "+string(w.kind)+" WHERE pid = ? AND event_id = ?"); err != nil {
			return nil, err
		}
	}
	seen := map[string]bool{}
	var fresh []int
	for i, e := range group {
		key := provenance.ExecKey(e.PID, e.EventID)
		if seen[key] {
			continue
		}
		seen[key] = true
		var n int
		if err := w.exists.QueryRowContext(ctx, e.PID, e.EventID).Scan(&n); err != nil {
			return nil, err
		}
		if n == 0 {
			fresh = append(fresh, i)
		}
	}
	return fresh, nil
}

// writeRows inserts the records of a batch of a kind other than executions
// (see writeExecs) with st, the kind's insert.
func writeRows(ctx context.Context, st *sql.Stmt, b provenance.Batch) error {
	var buf []byte
	enc := func(v any) (string, error) {
		var err error
		buf, err = json.Marshal(v)
		return string(buf), err
	}
	exec := func(args ...any) error {
		_, err := st.ExecContext(ctx, args...)
		return err
	}
	switch b.Kind {
	case provenance.KindMetadata:
		for _, m := range b.Metadata {
			doc, err := enc(m)
			if err != nil {
				return err
			}
			if err := exec(m.PID, m.RID, m.TID, m.Descr, doc); err != nil {
				return err
			}
		}
	case provenance.KindFuncStats:
		for _, f := range b.FuncStats {
			doc, err := enc(f)
			if err != nil {
				return err
			}
			if err := exec(f.PID, f.Func, doc); err != nil {
				return err
			}
		}
	case provenance.KindCounterStats:
		for _, c := range b.CounterStats {
			doc, err := enc(c)
			if err != nil {
				return err
			}
			if err := exec(c.PID, c.Counter, doc); err != nil {
				return err
			}
		}
	case provenance.KindProfiles:
		for _, p := range b.Profiles {
			doc, err := enc(p)
			if err != nil {
				return err
			}
			if err := exec(p.PID, p.Rank, p.TID, int64(p.Step), p.Part, doc); err != nil {
				return err
			}
		}
	}
	return nil
}

// where builds the WHERE clause of q from whitelisted column names and
// parameters only; user strings are never part of the SQL text.
func where(q provenance.Query) (string, []any) {
	var c []string
	var args []any
	add := func(cond string, v any) {
		c = append(c, cond)
		args = append(args, v)
	}
	rankCol := "rid"
	if q.PID != nil {
		add("pid = ?", *q.PID)
	}
	if q.Rank != nil {
		add(rankCol+" = ?", *q.Rank)
	}
	if q.TID != nil {
		add("tid = ?", *q.TID)
	}
	if provenance.IsExecKind(q.Kind) {
		if q.Func != "" {
			add("func = ?", q.Func)
		}
		if q.FuncRegexp != "" {
			add("regexp(?, func)", q.FuncRegexp)
		}
		if q.StepMin != nil {
			add("io_step >= ?", int64(*q.StepMin))
		}
		if q.StepMax != nil {
			add("io_step <= ?", int64(*q.StepMax))
		}
		if q.From != nil {
			add("entry >= ?", int64(*q.From))
		}
		if q.To != nil {
			add("exit <= ?", int64(*q.To))
		}
		if q.MinRuntime > 0 {
			add("runtime_total >= ?", int64(q.MinRuntime))
		}
		if q.MinScore != nil {
			add("outlier_score >= ?", *q.MinScore)
		}
		if q.GPUOnly {
			c = append(c, "is_gpu_event = 1")
		}
		if a := q.After; a != nil {
			// After the cursor in the query's order: a later sort value,
			// or the same one and a greater key. q.Sort is a column name.
			op := " > ?"
			if q.Desc {
				op = " < ?"
			}
			c = append(c, "("+q.Sort+op+" OR ("+q.Sort+" = ? AND (pid > ? OR (pid = ? AND event_id > ?))))")
			args = append(args, a.SortArg(), a.SortArg(), int64(a.PID), int64(a.PID), a.EventID)
		}
	}
	if len(c) == 0 {
		return "", nil
	}
	return " WHERE " + strings.Join(c, " AND "), args
}

// table maps a validated kind to its table name.
func table(kind provenance.Kind) (string, error) {
	if !provenance.ValidKind(kind) {
		return "", fmt.Errorf("unknown kind %q", kind)
	}
	return string(kind), nil
}

// Query returns the matching executions.
func (s *Store) Query(ctx context.Context, q provenance.Query) ([]provenance.Exec, error) {
	if err := q.Normalize(); err != nil {
		return nil, fmt.Errorf("query: %w", err)
	}
	if err := q.CheckBounded(); err != nil {
		return nil, fmt.Errorf("query: %w", err)
	}
	if !provenance.IsExecKind(q.Kind) {
		return nil, fmt.Errorf("query: kind %s does not hold executions", q.Kind)
	}
	var out []provenance.Exec
	err := provenance.EachFilled(ctx, q, func(ctx context.Context, q provenance.Query, fn func(provenance.Exec) error) error {
		recs, err := s.query(ctx, q)
		for _, e := range recs {
			if err := fn(e); err != nil {
				return err
			}
		}
		return err
	}, func(e provenance.Exec) error {
		out = append(out, e)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if out == nil {
		out = []provenance.Exec{}
	}
	return out, nil
}

// query reads the executions q (normalized, bounded) selects, leaving out
// those whose documents are bad (reported to provenance.Skip).
func (s *Store) query(ctx context.Context, q provenance.Query) ([]provenance.Exec, error) {
	sqlText, args, err := selectDocs(ctx, s.r, q)
	if err != nil {
		return nil, fmt.Errorf("query %s: %w", q.Kind, err)
	}
	rows, err := s.r.QueryContext(ctx, sqlText, args...)
	if err != nil {
		return nil, fmt.Errorf("query %s: %w", q.Kind, err)
	}
	defer rows.Close()
	var docs [][]byte
	var cols []docblock.Row
	for rows.Next() {
		var doc []byte
		var w docblock.Row
		if err := scanExecRow(rows, &doc, &w); err != nil {
			provenance.Skip(ctx, 1, fmt.Errorf("query %s: %w", q.Kind, err))
			continue
		}
		docs = append(docs, doc)
		cols = append(cols, w)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("query %s: %w", q.Kind, err)
	}
	rows.Close()
	out := make([]provenance.Exec, 0, len(docs))
	blocks := map[int64][][]byte{}
	for i, doc := range docs {
		var e provenance.Exec
		err := s.readExec(ctx, q.Kind, doc, blocks, &e)
		if err == nil {
			err = checkRow(&e, &cols[i])
		}
		if errors.Is(err, provenance.ErrBadDocument) {
			provenance.Skip(ctx, 1, fmt.Errorf("query %s: %w", q.Kind, err))
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("query %s: %w", q.Kind, err)
		}
		out = append(out, e)
	}
	return out, nil
}

// execRowColumns are the indexed columns of an execution table, in the
// order of docblock.Row, as scanExecRow reads them after the doc column.
const execRowColumns = "pid, event_id, rid, tid, fid, func, io_step, entry, exit, runtime_total, runtime_exclusive, outlier_score, is_gpu_event"

// scanExecRow reads a row selected as "doc, "+execRowColumns. An error
// means the row's columns do not hold what an execution's do (it wraps
// provenance.ErrBadDocument).
func scanExecRow(rows *sql.Rows, doc *[]byte, w *docblock.Row) error {
	var pid, rid, tid, fid, step, entry, exit, rt, rx int64
	if err := rows.Scan(doc, &pid, &w.EventID, &rid, &tid, &fid, &w.Func, &step, &entry, &exit, &rt, &rx, &w.OutlierScore, &w.IsGPUEvent); err != nil {
		return fmt.Errorf("%w: its columns: %w", provenance.ErrBadDocument, err)
	}
	w.PID, w.RID, w.TID, w.FID = uint32(pid), uint32(rid), uint32(tid), uint32(fid)
	w.IOStep, w.Entry, w.Exit, w.RuntimeTotal, w.RuntimeExclusive = uint64(step), uint64(entry), uint64(exit), uint64(rt), uint64(rx)
	if int64(w.PID) != pid || int64(w.RID) != rid || int64(w.TID) != tid || int64(w.FID) != fid {
		return fmt.Errorf("%w: a 32-bit column out of range", provenance.ErrBadDocument)
	}
	return nil
}

// checkRow checks that e, read from a stored document, agrees with w, the
// columns it is indexed by.
func checkRow(e *provenance.Exec, w *docblock.Row) error {
	if f := docblock.RowDiff(docblock.RowOf(e), *w); f != "" {
		return fmt.Errorf("%w: execution %s: its document disagrees with its %s column", provenance.ErrBadDocument, provenance.ExecKey(w.PID, w.EventID), f)
	}
	return nil
}

// rowQueryer is what selectDocs asks: a pool or one connection.
type rowQueryer interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// selectDocs returns the SELECT of the doc column and the indexed columns
// (execRowColumns) of the executions q (normalized, of an execution kind)
// selects, in its order.
func selectDocs(ctx context.Context, db rowQueryer, q provenance.Query) (string, []any, error) {
	w, args := where(q)
	dir, cmp := " ASC", " <= ?"
	if q.Desc {
		dir, cmp = " DESC", " >= ?"
	}
	// q.Sort is one of provenance.SortFields (checked by Normalize), which
	// are column names. Ties are broken by (pid, event_id), which no index
	// holds, so SQLite would sort every matching row to return the first
	// ones. Where an index gives the sort column's order, the value at the
	// limit is found first through it; only rows up to that value (the
	// result and its ties) are then sorted.
	if q.Limit > 0 && sortIndexed(q) {
		var edge any
		err := db.QueryRowContext(ctx, "SELECT "+q.Sort+" FROM "+string(q.Kind)+w+" ORDER BY "+q.Sort+dir+" LIMIT 1 OFFSET ?",
			append(slices.Clone(args), q.Limit-1)...).Scan(&edge)
		switch {
		case err == nil:
			if w == "" {
				w = " WHERE "
			} else {
				w += " AND "
			}
			w += q.Sort + cmp
			args = append(args, edge)
		case !errors.Is(err, sql.ErrNoRows):
			return "", nil, err
		}
	}
	// A negative LIMIT is no limit in SQLite: NoLimit needs no other text.
	sqlText := "SELECT doc, " + execRowColumns + " FROM " + string(q.Kind) + w + " ORDER BY " + q.Sort + dir + ", pid ASC, event_id ASC LIMIT ?"
	return sqlText, append(args, q.Limit), nil
}

// Stream sizes of Each: the rows whose documents are read together, and
// the decompressed bytes of document blocks kept for the next rows.
const (
	eachChunk      = 4096
	eachCacheBytes = 8 << 20
)

// Each streams the matching executions to fn. It reads them through one
// connection of its own (from a pool without a cap, apart from the
// readers Query uses, so that fn may call any method), eachChunk rows at a
// time: each document block the chunk's rows refer to is read and
// decompressed once for them all, their documents copied out of it, and at
// most eachCacheBytes of blocks kept for the next chunks. In write order
// (entry, mostly) blocks are met one after the other; in an order
// unrelated to it (outlier_score) a chunk needs most blocks, and a result
// of n records decompresses about n/eachChunk times the blocks it spans.
func (s *Store) Each(ctx context.Context, q provenance.Query, fn func(provenance.Exec) error) error {
	if err := q.Normalize(); err != nil {
		return fmt.Errorf("list: %w", err)
	}
	if !provenance.IsExecKind(q.Kind) {
		return fmt.Errorf("list: kind %s does not hold executions", q.Kind)
	}
	return provenance.EachFilled(ctx, q, s.each, fn)
}

// each is Each on q, normalized, leaving out the executions whose
// documents are bad (reported to provenance.Skip).
func (s *Store) each(ctx context.Context, q provenance.Query, fn func(provenance.Exec) error) error {
	conn, err := s.streams.Conn(ctx)
	if err != nil {
		return fmt.Errorf("list %s: %w", q.Kind, err)
	}
	defer conn.Close()
	sqlText, args, err := selectDocs(ctx, conn, q)
	if err != nil {
		return fmt.Errorf("list %s: %w", q.Kind, err)
	}
	blockStmt, err := conn.PrepareContext(ctx, "SELECT data FROM "+string(q.Kind)+"_docs WHERE id = ?")
	if err != nil {
		return fmt.Errorf("list %s: %w", q.Kind, err)
	}
	defer blockStmt.Close()
	rows, err := conn.QueryContext(ctx, sqlText, args...)
	if err != nil {
		return fmt.Errorf("list %s: %w", q.Kind, err)
	}
	defer rows.Close()
	st := streamer{blockStmt: blockStmt, cache: map[int64]*cachedBlock{}}
	var refs [][]byte
	var cols []docblock.Row
	skip := func(err error) { provenance.Skip(ctx, 1, fmt.Errorf("list %s: %w", q.Kind, err)) }
	flush := func() error {
		if err := st.resolve(ctx, refs); err != nil {
			return fmt.Errorf("list %s: %w", q.Kind, err)
		}
		for i, js := range st.docs {
			if err := st.bad[i]; err != nil {
				skip(err)
				continue
			}
			var e provenance.Exec
			if err := provenance.DecodeExec(js, &e); err != nil {
				skip(fmt.Errorf("%w: execution %s: %w", provenance.ErrBadDocument, provenance.ExecKey(cols[i].PID, cols[i].EventID), err))
				continue
			}
			e.Normalize()
			st.docs[i] = nil
			if err := checkRow(&e, &cols[i]); err != nil {
				skip(err)
				continue
			}
			if err := fn(e); err != nil {
				return err
			}
		}
		refs, cols = refs[:0], cols[:0]
		return nil
	}
	for rows.Next() {
		var doc []byte
		var w docblock.Row
		if err := scanExecRow(rows, &doc, &w); err != nil {
			skip(err)
			continue
		}
		refs = append(refs, doc)
		cols = append(cols, w)
		if len(refs) == eachChunk {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("list %s: %w", q.Kind, err)
	}
	return flush()
}

// streamer reads the documents of the rows of one Each, a chunk at a time.
type streamer struct {
	blockStmt *sql.Stmt
	docs      [][]byte // of the chunk's rows, in order
	bad       []error  // why a row of the chunk has no document
	// cache holds decompressed blocks, at most eachCacheBytes of them;
	// tick orders their last uses, to drop the least recent first.
	cache      map[int64]*cachedBlock
	cacheBytes int
	tick       int64
	slots      []blockSlot
}

// blockSlot is a row of a chunk that refers to a block.
type blockSlot struct {
	id        int64
	slot, row int
}

type cachedBlock struct {
	docs    [][]byte
	size    int
	lastUse int64
}

// resolve sets s.docs to the JSON documents of the rows whose doc columns
// are refs, reading each block they refer to once, and s.bad to why a row
// has none (a reference or block that is bad, wrapping
// provenance.ErrBadDocument). The documents are copied out of their
// blocks, which the cache may then drop. An error is one of reading.
func (s *streamer) resolve(ctx context.Context, refs [][]byte) error {
	s.docs = slices.Grow(s.docs[:0], len(refs))[:len(refs)]
	s.bad = slices.Grow(s.bad[:0], len(refs))[:len(refs)]
	clear(s.bad)
	s.slots = s.slots[:0]
	for i, doc := range refs {
		if len(doc) > 0 && doc[0] == '{' {
			s.docs[i] = doc
			continue
		}
		s.docs[i] = nil
		id, slot, err := parseRef(doc)
		if err != nil {
			s.bad[i] = fmt.Errorf("%w: %w", provenance.ErrBadDocument, err)
			continue
		}
		s.slots = append(s.slots, blockSlot{id: id, slot: slot, row: i})
	}
	slices.SortFunc(s.slots, func(a, b blockSlot) int { return cmp.Compare(a.id, b.id) })
	var b *cachedBlock
	var berr error
	for i, sl := range s.slots {
		if i == 0 || sl.id != s.slots[i-1].id {
			b, berr = s.block(ctx, sl.id)
			if berr != nil && !errors.Is(berr, provenance.ErrBadDocument) {
				return berr
			}
		}
		switch {
		case berr != nil:
			s.bad[sl.row] = berr
		case sl.slot >= len(b.docs):
			s.bad[sl.row] = fmt.Errorf("%w: document block %d has no slot %d", provenance.ErrBadDocument, sl.id, sl.slot)
		default:
			s.docs[sl.row] = slices.Clone(b.docs[sl.slot])
		}
	}
	return nil
}

// block returns document block id, from the cache or read and decoded.
func (s *streamer) block(ctx context.Context, id int64) (*cachedBlock, error) {
	s.tick++
	if b, ok := s.cache[id]; ok {
		b.lastUse = s.tick
		return b, nil
	}
	var data []byte
	if err := s.blockStmt.QueryRowContext(ctx, id).Scan(&data); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			err = provenance.ErrBadDocument
		}
		return nil, fmt.Errorf("read document block %d: %w", id, err)
	}
	docs, err := docblock.Decode(data)
	if err != nil {
		return nil, fmt.Errorf("%w: document block %d: %w", provenance.ErrBadDocument, id, err)
	}
	b := &cachedBlock{docs: docs, lastUse: s.tick}
	for _, d := range docs {
		b.size += len(d)
	}
	for s.cacheBytes+b.size > eachCacheBytes && len(s.cache) > 0 {
		var oldest int64
		first := true
		for k, c := range s.cache {
			if first || c.lastUse < s.cache[oldest].lastUse {
				oldest, first = k, false
			}
		}
		s.cacheBytes -= s.cache[oldest].size
		delete(s.cache, oldest)
	}
	s.cache[id] = b
	s.cacheBytes += b.size
	return b, nil
}

// sortIndexed reports whether one of execIndexes gives the order of q's
// sort column among the rows q selects.
func sortIndexed(q provenance.Query) bool {
	switch q.Sort {
	case "outlier_score":
		return true
	case "runtime_total":
		return q.Func != ""
	}
	return false
}

// Profiles streams the profiles table in key order.
func (s *Store) Profiles(ctx context.Context, fn func(provenance.ThreadProfile) error) error {
	return eachDoc(ctx, s, "SELECT doc FROM profiles ORDER BY pid, rid, tid, io_step, part", provenance.KindProfiles, func(doc []byte) error {
		var p provenance.ThreadProfile
		if err := json.Unmarshal(doc, &p); err != nil {
			provenance.Skip(ctx, 1, fmt.Errorf("list profiles: %w: %w", provenance.ErrBadDocument, err))
			return nil
		}
		return fn(p)
	})
}

// Metadata streams the metadata table in key order.
func (s *Store) Metadata(ctx context.Context, fn func(provenance.Metadata) error) error {
	return eachDoc(ctx, s, "SELECT doc FROM metadata ORDER BY pid, rid, tid, descr", provenance.KindMetadata, func(doc []byte) error {
		var m provenance.Metadata
		if err := json.Unmarshal(doc, &m); err != nil {
			provenance.Skip(ctx, 1, fmt.Errorf("list metadata: %w: %w", provenance.ErrBadDocument, err))
			return nil
		}
		return fn(m)
	})
}

// FuncStats streams the func_stats records in (pid, func) order.
func (s *Store) FuncStats(ctx context.Context, fn func(provenance.GlobalFuncStats) error) error {
	return eachDoc(ctx, s, "SELECT doc FROM func_stats ORDER BY pid, func", provenance.KindFuncStats, func(doc []byte) error {
		var f provenance.GlobalFuncStats
		if err := json.Unmarshal(doc, &f); err != nil {
			provenance.Skip(ctx, 1, fmt.Errorf("list func_stats: %w: %w", provenance.ErrBadDocument, err))
			return nil
		}
		return fn(f)
	})
}

// eachDoc runs query, which selects one doc column, on a stream connection
// of its own (fn may call the store) and passes each row's document to fn.
// fn's errors are returned unwrapped.
func eachDoc(ctx context.Context, s *Store, query string, kind provenance.Kind, fn func([]byte) error) error {
	conn, err := s.streams.Conn(ctx)
	if err != nil {
		return fmt.Errorf("list %s: %w", kind, err)
	}
	defer conn.Close()
	rows, err := conn.QueryContext(ctx, query)
	if err != nil {
		return fmt.Errorf("list %s: %w", kind, err)
	}
	defer rows.Close()
	var doc []byte
	for rows.Next() {
		if err := rows.Scan(&doc); err != nil {
			return fmt.Errorf("list %s: %w", kind, err)
		}
		if err := fn(doc); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("list %s: %w", kind, err)
	}
	return nil
}

// Get returns one execution whole.
func (s *Store) Get(ctx context.Context, kind provenance.Kind, pid uint32, eventID string) (provenance.Exec, error) {
	var e provenance.Exec
	if !provenance.IsExecKind(kind) {
		return e, fmt.Errorf("get: kind %q does not hold executions", kind)
	}
	key := provenance.ExecKey(pid, eventID)
	rows, err := s.r.QueryContext(ctx, "SELECT doc, "+execRowColumns+" FROM "+string(kind)+" WHERE pid = ? AND event_id = ?", pid, eventID)
	if err != nil {
		return e, fmt.Errorf("get %s %s: %w", kind, key, err)
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return e, fmt.Errorf("get %s %s: %w", kind, key, err)
		}
		return e, fmt.Errorf("get %s %s: %w", kind, key, provenance.ErrNotFound)
	}
	var doc []byte
	var w docblock.Row
	err = scanExecRow(rows, &doc, &w)
	rows.Close()
	if err == nil {
		err = s.readExec(ctx, kind, doc, nil, &e)
	}
	if err == nil {
		err = checkRow(&e, &w)
	}
	if err != nil {
		return provenance.Exec{}, fmt.Errorf("get %s %s: %w", kind, key, err)
	}
	return e, nil
}

// readExec decodes the execution whose doc column is doc into e, reading
// its document block if doc refers to one. blocks, if not nil, keeps the
// blocks read for the next calls.
func (s *Store) readExec(ctx context.Context, kind provenance.Kind, doc []byte, blocks map[int64][][]byte, e *provenance.Exec) error {
	js := doc
	if len(doc) == 0 || doc[0] != '{' {
		id, slot, err := parseRef(doc)
		if err != nil {
			return fmt.Errorf("%w: %w", provenance.ErrBadDocument, err)
		}
		docs, ok := blocks[id]
		if !ok {
			var data []byte
			if err := s.r.QueryRowContext(ctx, "SELECT data FROM "+string(kind)+"_docs WHERE id = ?", id).Scan(&data); err != nil {
				if errors.Is(err, sql.ErrNoRows) {
					err = provenance.ErrBadDocument
				}
				return fmt.Errorf("read document block %d: %w", id, err)
			}
			if docs, err = docblock.Decode(data); err != nil {
				return fmt.Errorf("%w: document block %d: %w", provenance.ErrBadDocument, id, err)
			}
			if blocks != nil {
				blocks[id] = docs
			}
		}
		if slot >= len(docs) {
			return fmt.Errorf("%w: document block %d has no slot %d", provenance.ErrBadDocument, id, slot)
		}
		js = docs[slot]
	}
	if err := provenance.DecodeExec(js, e); err != nil {
		return fmt.Errorf("%w: %w", provenance.ErrBadDocument, err)
	}
	e.Normalize()
	return nil
}

// Count counts the matching records.
func (s *Store) Count(ctx context.Context, q provenance.Query) (int64, error) {
	if err := q.Normalize(); err != nil {
		return 0, fmt.Errorf("count: %w", err)
	}
	t, err := table(q.Kind)
	if err != nil {
		return 0, fmt.Errorf("count: %w", err)
	}
	if q.Kind == provenance.KindFuncStats || q.Kind == provenance.KindCounterStats {
		q.Rank, q.TID = nil, nil // these records have no rank or thread
	}
	w, args := where(q)
	var n int64
	if err := s.r.QueryRowContext(ctx, "SELECT count(*) FROM "+t+w, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("count %s: %w", q.Kind, err)
	}
	return n, nil
}

// Aggregate counts the matching executions per group.
func (s *Store) Aggregate(ctx context.Context, q provenance.Query, by provenance.GroupBy) ([]provenance.Group, error) {
	if err := q.Normalize(); err != nil {
		return nil, fmt.Errorf("aggregate: %w", err)
	}
	if !provenance.IsExecKind(q.Kind) {
		return nil, fmt.Errorf("aggregate: kind %s does not hold executions", q.Kind)
	}
	var cols, order string
	switch by {
	case provenance.ByRank:
		cols, order = "rid, '', 0", "rid"
	case provenance.ByFunc:
		cols, order = "0, func, 0", "func"
	case provenance.ByStep:
		cols, order = "0, '', io_step", "io_step"
	case provenance.ByRankFunc:
		cols, order = "rid, func, 0", "rid, func"
	default:
		return nil, fmt.Errorf("aggregate: cannot group by %q", by)
	}
	w, args := where(q)
	sqlText := "SELECT " + cols + ", count(*) AS n FROM " + string(q.Kind) + w + " GROUP BY " + order +
		" ORDER BY n DESC, " + order + " LIMIT ?"
	args = append(args, q.Limit)
	rows, err := s.r.QueryContext(ctx, sqlText, args...)
	if err != nil {
		return nil, fmt.Errorf("aggregate %s by %s: %w", q.Kind, by, err)
	}
	defer rows.Close()
	var out []provenance.Group
	for rows.Next() {
		var rank uint32
		var fn string
		var step int64
		var n int64
		if err := rows.Scan(&rank, &fn, &step, &n); err != nil {
			return nil, fmt.Errorf("aggregate %s by %s: %w", q.Kind, by, err)
		}
		out = append(out, provenance.MakeGroup(by, rank, fn, uint64(step), n))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("aggregate %s by %s: %w", q.Kind, by, err)
	}
	return out, nil
}

// DiskUsage checkpoints the write-ahead log into the database file and
// truncates it (so the figure does not count log pages already copied), and
// returns the bytes the store takes on disk: the file and what remains of
// its log. A store opened read-only only measures.
func (s *Store) DiskUsage(ctx context.Context) (int64, error) {
	if s.w != nil {
		s.mu.Lock()
		_, err := s.w.ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)")
		s.mu.Unlock()
		if err != nil {
			return 0, fmt.Errorf("disk usage of %s: checkpoint: %w", s.path, err)
		}
	}
	var total int64
	for _, p := range []string{s.path, s.path + "-wal"} {
		fi, err := os.Stat(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("disk usage of %s: %w", s.path, err)
		}
		total += fi.Size()
	}
	return total, nil
}

// Path is the store's file.
func (s *Store) Path() string { return s.path }

var _ provenance.Store = (*Store)(nil)
