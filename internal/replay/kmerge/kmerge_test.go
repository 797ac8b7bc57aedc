package kmerge

import (
	"math/rand/v2"
	"slices"
	"testing"
)

type cur struct {
	vals []int
	pos  int
	id   int
}

func TestMergeOrdersEveryInput(t *testing.T) {
	for _, tc := range []struct {
		name   string
		inputs int
		each   int
	}{
		{"one input", 1, 50},
		{"two", 2, 40},
		{"many short", 33, 3},
		{"empty ones among", 9, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, uint64(tc.inputs)))
			var cs []*cur
			var want []int
			for i := 0; i < tc.inputs; i++ {
				n := tc.each
				if tc.each == 0 {
					n = r.IntN(5) // some inputs are empty
				}
				c := &cur{id: i}
				for j := 0; j < n; j++ {
					c.vals = append(c.vals, r.IntN(20))
				}
				slices.Sort(c.vals)
				want = append(want, c.vals...)
				if len(c.vals) > 0 {
					cs = append(cs, c)
				}
			}
			slices.Sort(want)
			h := New(cs, func(a, b *cur) bool {
				if a.vals[a.pos] != b.vals[b.pos] {
					return a.vals[a.pos] < b.vals[b.pos]
				}
				return a.id < b.id
			})
			var got []int
			lastID := map[int]int{}
			for h.Len() > 0 {
				c := h.Top()
				v := c.vals[c.pos]
				if len(got) > 0 && v == got[len(got)-1] && c.id < lastID[v] {
					t.Fatalf("tie on %d read input %d after input %d", v, c.id, lastID[v])
				}
				lastID[v] = c.id
				got = append(got, v)
				c.pos++
				if c.pos == len(c.vals) {
					h.Pop()
				} else {
					h.Fix()
				}
			}
			if !slices.Equal(got, want) {
				t.Fatalf("merged %v, want %v", got, want)
			}
		})
	}
}
