package adnode

import (
	"testing"
	"time"
)

// A dropLog lets the first drop through, then one line per interval with
// the drops since the previous line; rest hands over what no line carried.
func TestDropLog(t *testing.T) {
	l := &dropLog{every: 10 * time.Second}
	t0 := time.Unix(1000, 0)
	type step struct {
		at              time.Duration
		n               uint64
		due             bool
		since, totalNow uint64
	}
	for i, s := range []step{
		{0, 3, true, 3, 3},
		{time.Second, 5, false, 0, 8},
		{9 * time.Second, 1, false, 0, 9},
		{10 * time.Second, 2, true, 8, 11},
		{15 * time.Second, 4, false, 0, 15},
		{15 * time.Second, 0, false, 0, 15},
		{21 * time.Second, 0, true, 4, 15},
		{40 * time.Second, 7, true, 7, 22},
		{41 * time.Second, 6, false, 0, 28},
	} {
		due, since, total := l.add(t0.Add(s.at), s.n)
		if due != s.due || since != s.since || total != s.totalNow {
			t.Errorf("step %d: due %v since %d total %d, want %v %d %d", i, due, since, total, s.due, s.since, s.totalNow)
		}
	}
	if since, total := l.rest(); since != 6 || total != 28 {
		t.Errorf("rest %d of %d, want 6 of 28", since, total)
	}
	if since, _ := l.rest(); since != 0 {
		t.Errorf("rest twice: %d", since)
	}
}
