package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// Prepared is a batch made ready to be written: for executions, their
// documents encoded and compressed into the blocks Write would make, one per
// group of execRowsPerInsert executions. Preparing is the CPU-bound part of
// a write (about half of it); Prepare does it on the caller's goroutine, so
// that several batches can be prepared at once while the store's single
// writer only inserts (WritePrepared).
type Prepared struct {
	batch  provenance.Batch
	blocks [][]byte
}

// Kind is the kind of the prepared batch's records.
func (p *Prepared) Kind() provenance.Kind { return p.batch.Kind }

// Len is the number of records of the prepared batch.
func (p *Prepared) Len() int { return p.batch.Len() }

// scratch holds one Prepare's buffers between calls.
type scratch struct {
	b blockBuilder
}

var scratches = sync.Pool{New: func() any { return new(scratch) }}

// Prepare encodes and compresses b's documents. It touches no connection
// and may be called from any number of goroutines at once; b must not be
// modified until the Prepared is written.
func (s *Store) Prepare(b provenance.Batch) (*Prepared, error) {
	if !b.Kind.Valid() {
		return nil, fmt.Errorf("prepare provenance batch: unknown kind %q", b.Kind)
	}
	p := &Prepared{batch: b}
	if !b.Kind.IsExec() {
		return p, nil
	}
	sc := scratches.Get().(*scratch)
	defer scratches.Put(sc)
	p.blocks = make([][]byte, 0, (len(b.Execs)+execRowsPerInsert-1)/execRowsPerInsert)
	for lo := 0; lo < len(b.Execs); lo += execRowsPerInsert {
		z, err := sc.b.build(nil, b.Execs[lo:min(lo+execRowsPerInsert, len(b.Execs))])
		if err != nil {
			return nil, fmt.Errorf("prepare %s batch: %w", b.Kind, err)
		}
		p.blocks = append(p.blocks, z)
	}
	return p, nil
}

// WritePrepared stores the prepared batches, in their order, in one
// transaction: all of them or, on error, none. Records already stored are
// skipped, as by Write.
func (s *Store) WritePrepared(ctx context.Context, ps []*Prepared) error {
	n := 0
	for _, p := range ps {
		n += p.Len()
	}
	if n == 0 {
		if s.w == nil {
			return errors.New("write provenance batches: store opened read-only")
		}
		return nil
	}
	tx, err := s.BeginPrepared(ctx)
	if err != nil {
		return err
	}
	if err := tx.Write(ctx, ps); err != nil {
		return err
	}
	return tx.Commit()
}

// PreparedTx is a transaction of prepared writes that stays open across
// several Write calls, so that one commit (the log pages it writes, its
// fsync) serves many batches that did not arrive together. It holds the
// store's writer from BeginPrepared until Commit or Rollback: the owner
// ends it promptly, and no other write runs meanwhile. Not safe for
// concurrent use.
type PreparedTx struct {
	s       *Store
	tx      *sql.Tx
	execs   map[provenance.Kind]*execWriter
	rows    map[provenance.Kind]*sql.Stmt
	batches int
	records int
	done    bool
}

// BeginPrepared starts a transaction of prepared writes. ctx bounds the
// whole transaction: if it ends before Commit, the transaction is rolled
// back.
func (s *Store) BeginPrepared(ctx context.Context) (*PreparedTx, error) {
	if s.w == nil {
		return nil, errors.New("write provenance batches: store opened read-only")
	}
	s.mu.Lock()
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		s.mu.Unlock()
		return nil, fmt.Errorf("write provenance batches: begin: %w", err)
	}
	return &PreparedTx{s: s, tx: tx, execs: map[provenance.Kind]*execWriter{}, rows: map[provenance.Kind]*sql.Stmt{}}, nil
}

// Write inserts the prepared batches, in their order. On error the whole
// transaction, what earlier Writes inserted included, is rolled back and
// t is done.
func (t *PreparedTx) Write(ctx context.Context, ps []*Prepared) error {
	if t.done {
		return errors.New("write provenance batches: transaction already ended")
	}
	for _, p := range ps {
		if err := t.s.writePrepared(ctx, t.tx, p, t.execs, t.rows); err != nil {
			t.end(false)
			return fmt.Errorf("write %d provenance batches: %s batch: %w", len(ps), p.Kind(), err)
		}
		t.batches++
		t.records += p.Len()
	}
	return nil
}

// Records is the number of records written in t so far (duplicates
// included).
func (t *PreparedTx) Records() int { return t.records }

// Commit commits what t's Writes inserted and ends t.
func (t *PreparedTx) Commit() error {
	if t.done {
		return errors.New("commit provenance batches: transaction already ended")
	}
	if err := t.end(true); err != nil {
		return fmt.Errorf("write %d provenance batches: commit: %w", t.batches, err)
	}
	return nil
}

// Rollback discards what t's Writes inserted and ends t; after Commit or
// a failed Write it does nothing.
func (t *PreparedTx) Rollback() error {
	if t.done {
		return nil
	}
	return t.end(false)
}

// end commits or rolls back the transaction and releases the writer.
func (t *PreparedTx) end(commit bool) error {
	t.done = true
	defer t.s.mu.Unlock()
	if commit {
		return t.tx.Commit()
	}
	return t.tx.Rollback()
}

// writePrepared inserts one prepared batch in tx, with the transaction's
// writers and statements of each kind (created when first needed).
func (s *Store) writePrepared(ctx context.Context, tx *sql.Tx, p *Prepared, execs map[provenance.Kind]*execWriter, rows map[provenance.Kind]*sql.Stmt) error {
	kind := p.Kind()
	if !kind.IsExec() {
		st := rows[kind]
		if st == nil {
			prepared, ok := s.ins[kind]
			if !ok {
				return fmt.Errorf("unknown kind %q", kind)
			}
			st = tx.StmtContext(ctx, prepared)
			rows[kind] = st
		}
		return writeRows(ctx, st, p.batch)
	}
	w := execs[kind]
	if w == nil {
		w = s.execWriter(ctx, tx, kind)
		execs[kind] = w
	}
	for i, z := range p.blocks {
		lo := i * execRowsPerInsert
		if err := w.writeGroup(ctx, p.batch.Execs[lo:min(lo+execRowsPerInsert, len(p.batch.Execs))], z); err != nil {
			return err
		}
	}
	return nil
}
