package ad

import (
	"context"
	"slices"
	"sync"
)

// Barrier lines up the detectors of one process at every step boundary:
// they send their step's deltas one after the other in rank order (Turn,
// Next), wait for all to have sent (Wait), then read the global models back
// and wait for all to have read them (Wait) before labelling. Every detector then labels step s against the models of
// every rank's data up to step s, merged by the parameter server in the same
// order every time, so detection on files is reproducible to the bit. Live
// runs do without it: a rank must never wait for another.
//
// Detectors Join before the first of them processes a frame and Leave when
// they close. Safe for concurrent use.
type Barrier struct {
	mu      sync.Mutex
	n       int           // detectors that joined and have not left
	arrived int           // detectors waiting at the current boundary
	release chan struct{} // closed when the current boundary is passed

	order   []uint32      // ranks that joined and have not left, sorted
	turn    int           // index in order of the rank whose turn it is
	changed chan struct{} // closed when turn or order changes
}

// NewBarrier returns a barrier with no detectors.
func NewBarrier() *Barrier {
	return &Barrier{release: make(chan struct{}), changed: make(chan struct{})}
}

// Join adds the detector of rank.
func (b *Barrier) Join(rank uint32) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.n++
	i, _ := slices.BinarySearch(b.order, rank)
	b.order = slices.Insert(b.order, i, rank)
	if i < b.turn {
		b.turn++
	}
}

// Leave removes the detector of rank, releasing the others if they were
// waiting only for it.
func (b *Barrier) Leave(rank uint32) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.n--
	if i, ok := slices.BinarySearch(b.order, rank); ok {
		b.order = slices.Delete(b.order, i, i+1)
		if i < b.turn {
			b.turn--
		}
		if b.turn >= len(b.order) {
			b.turn = 0
		}
		b.notify()
	}
	if b.arrived > 0 && b.arrived >= b.n {
		b.pass()
	}
}

// Turn blocks until it is rank's turn to send, or ctx is done.
func (b *Barrier) Turn(ctx context.Context, rank uint32) error {
	for {
		b.mu.Lock()
		mine := b.turn < len(b.order) && b.order[b.turn] == rank
		ch := b.changed
		b.mu.Unlock()
		if mine {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Next ends the current rank's turn.
func (b *Barrier) Next() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.order) > 0 {
		b.turn = (b.turn + 1) % len(b.order)
	}
	b.notify()
}

// notify wakes the detectors waiting for their turn; b.mu is held.
func (b *Barrier) notify() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// Wait blocks until every detector that has not left waits too, or ctx is
// done.
func (b *Barrier) Wait(ctx context.Context) error {
	b.mu.Lock()
	b.arrived++
	ch := b.release
	if b.arrived >= b.n {
		b.pass()
		b.mu.Unlock()
		return nil
	}
	b.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// pass releases the waiting detectors; b.mu is held.
func (b *Barrier) pass() {
	close(b.release)
	b.release = make(chan struct{})
	b.arrived = 0
}
