package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/docblock"
)

// Prepared is a batch made ready to be written: for executions, their
// indexed columns and their documents compressed into blocks of up to
// execRowsPerInsert, the blocks Write would make (Prepare) or those a
// producer sent (PrepareBlocks). Preparing is the CPU-bound part of a
// write; it runs on the caller's goroutine, so that several batches can be
// prepared at once while the store's single writer only inserts
// (WritePrepared).
type Prepared struct {
	kind   provenance.Kind
	batch  provenance.Batch // the records of a kind other than executions
	rows   []docblock.Row   // the executions' columns
	blocks []docblock.Block // their documents, in rows' order
}

// Kind is the kind of the prepared batch's records.
func (p *Prepared) Kind() provenance.Kind { return p.kind }

// Len is the number of records of the prepared batch.
func (p *Prepared) Len() int {
	if p.kind.IsExec() {
		return len(p.rows)
	}
	return p.batch.Len()
}

// scratch holds one Prepare's buffers between calls.
type scratch struct {
	b docblock.Builder
}

var scratches = sync.Pool{New: func() any { return new(scratch) }}

// Prepare encodes and compresses b's documents. It touches no connection
// and may be called from any number of goroutines at once; b must not be
// modified until the Prepared is written.
func (s *Store) Prepare(b provenance.Batch) (*Prepared, error) {
	if !b.Kind.Valid() {
		return nil, fmt.Errorf("prepare provenance batch: unknown kind %q", b.Kind)
	}
	p := &Prepared{kind: b.Kind}
	if !b.Kind.IsExec() {
		p.batch = b
		return p, nil
	}
	sc := scratches.Get().(*scratch)
	defer scratches.Put(sc)
	p.rows = make([]docblock.Row, len(b.Execs))
	for i := range b.Execs {
		p.rows[i] = docblock.RowOf(&b.Execs[i])
	}
	p.blocks = make([]docblock.Block, 0, (len(b.Execs)+execRowsPerInsert-1)/execRowsPerInsert)
	for lo := 0; lo < len(b.Execs); lo += execRowsPerInsert {
		group := b.Execs[lo:min(lo+execRowsPerInsert, len(b.Execs))]
		z, err := sc.b.Build(nil, group)
		if err != nil {
			return nil, fmt.Errorf("prepare %s batch: %w", b.Kind, err)
		}
		p.blocks = append(p.blocks, docblock.Block{N: len(group), Data: z})
	}
	return p, nil
}

// PrepareBlocks prepares the executions of kind a producer sent in the
// block encoding, m, whose blocks Check passed: they are stored as they
// came. It touches no connection; m must not be modified until the
// Prepared is written.
func (s *Store) PrepareBlocks(kind provenance.Kind, m *docblock.Message) (*Prepared, error) {
	if !kind.IsExec() {
		return nil, fmt.Errorf("prepare provenance blocks: %q is not a kind of executions", kind)
	}
	if !m.Checked() {
		return nil, fmt.Errorf("prepare %s blocks: blocks not checked", kind)
	}
	n := 0
	for _, b := range m.Blocks {
		if b.N < 1 || b.N > execRowsPerInsert {
			return nil, fmt.Errorf("prepare %s blocks: a block of %d documents", kind, b.N)
		}
		n += b.N
	}
	if n != len(m.Rows) {
		return nil, fmt.Errorf("prepare %s blocks: %d documents for %d executions", kind, n, len(m.Rows))
	}
	return &Prepared{kind: kind, rows: m.Rows, blocks: m.Blocks}, nil
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
	lo := 0
	for _, b := range p.blocks {
		if err := w.writeGroup(ctx, p.rows[lo:lo+b.N], b.Data); err != nil {
			return err
		}
		lo += b.N
	}
	return nil
}
