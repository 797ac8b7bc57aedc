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
	if s.w == nil {
		return errors.New("write provenance batches: store opened read-only")
	}
	n := 0
	for _, p := range ps {
		n += p.Len()
	}
	if n == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("write %d provenance batches: begin: %w", len(ps), err)
	}
	execs := map[provenance.Kind]*execWriter{}
	rows := map[provenance.Kind]*sql.Stmt{}
	for _, p := range ps {
		if err = s.writePrepared(ctx, tx, p, execs, rows); err != nil {
			tx.Rollback()
			return fmt.Errorf("write %d provenance batches: %s batch: %w", len(ps), p.Kind(), err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("write %d provenance batches: commit: %w", len(ps), err)
	}
	return nil
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
