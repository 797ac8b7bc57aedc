// Package kmerge is the k-way merge the trace readers share: a binary
// min-heap of input cursors, ordered by a function the reader gives, whose
// top is the cursor to read next.
//
// A Heap is not safe for concurrent use; it keeps the slice it is given.
package kmerge

// Heap is a binary min-heap of cursors under less.
type Heap[T any] struct {
	items []T
	less  func(a, b T) bool
}

// New returns a heap of items (which it keeps and reorders) under less.
func New[T any](items []T, less func(a, b T) bool) *Heap[T] {
	h := &Heap[T]{items: items, less: less}
	for i := len(items)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
	return h
}

// Len returns the number of cursors left.
func (h *Heap[T]) Len() int { return len(h.items) }

// Top returns the least cursor. The heap must not be empty.
func (h *Heap[T]) Top() T { return h.items[0] }

// Fix restores the order after the top cursor advanced (its key grew).
func (h *Heap[T]) Fix() { h.down(0) }

// Pop removes the top cursor (its input ended).
func (h *Heap[T]) Pop() {
	n := len(h.items) - 1
	h.items[0] = h.items[n]
	var zero T
	h.items[n] = zero
	h.items = h.items[:n]
	h.down(0)
}

// Items returns the cursors left, in heap order.
func (h *Heap[T]) Items() []T { return h.items }

func (h *Heap[T]) down(i int) {
	items := h.items
	for {
		l := 2*i + 1
		if l >= len(items) {
			return
		}
		m := l
		if r := l + 1; r < len(items) && h.less(items[r], items[l]) {
			m = r
		}
		if !h.less(items[m], items[i]) {
			return
		}
		items[i], items[m] = items[m], items[i]
		i = m
	}
}
