package ad

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestBarrier(t *testing.T) {
	for _, tc := range []struct {
		name    string
		n       int
		rounds  []int // rounds each detector waits before leaving
		wantMax int   // most boundaries passed
	}{
		{"equal streams", 4, []int{5, 5, 5, 5}, 5},
		{"a stream that ends early releases the others", 3, []int{5, 2, 5}, 5},
		{"one detector", 1, []int{3}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := NewBarrier()
			for d := range tc.n {
				b.Join(uint32(d))
			}
			var inRound [16]atomic.Int32
			var wg sync.WaitGroup
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for d := range tc.n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer b.Leave(uint32(d))
					for r := range tc.rounds[d] {
						inRound[r].Add(1)
						if err := b.Wait(ctx); err != nil {
							t.Errorf("detector %d round %d: %v", d, r, err)
							return
						}
						// nobody passes round r before everyone still in
						// the run has reached it
						want := 0
						for _, n := range tc.rounds {
							if n > r {
								want++
							}
						}
						if got := int(inRound[r].Load()); got != want {
							t.Errorf("detector %d passed round %d with %d of %d arrived", d, r, got, want)
						}
					}
				}()
			}
			wg.Wait()
		})
	}
}

func TestBarrierWaitHonoursContext(t *testing.T) {
	b := NewBarrier()
	b.Join(0)
	b.Join(1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.Wait(ctx); err == nil {
		t.Fatal("Wait returned nil with another detector missing and ctx done")
	}
	if err := b.Turn(ctx, 1); err == nil {
		t.Fatal("Turn returned nil for rank 1 before rank 0's turn ended, with ctx done")
	}
}

// Turns go in rank order, every round, whatever order the detectors ask in;
// a rank that leaves gives up its turns.
func TestBarrierTurnsInRankOrder(t *testing.T) {
	b := NewBarrier()
	ranks := []uint32{7, 2, 5, 0}
	for _, r := range ranks {
		b.Join(r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var mu sync.Mutex
	var got []uint32
	var wg sync.WaitGroup
	for _, r := range ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer b.Leave(r)
			rounds := 3
			if r == 5 {
				rounds = 1
			}
			for range rounds {
				if err := b.Turn(ctx, r); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				got = append(got, r)
				mu.Unlock()
				b.Next()
				if err := b.Wait(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	want := []uint32{0, 2, 5, 7, 0, 2, 7, 0, 2, 7}
	if !slices.Equal(got, want) {
		t.Errorf("turns %v, want %v", got, want)
	}
}
