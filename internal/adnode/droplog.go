package adnode

import (
	"sync"
	"time"
)

// dropLogEvery is the least time between two log lines of one dropLog.
const dropLogEvery = 10 * time.Second

// dropLog rate-limits the log lines about frames dropped by the ranks of a
// Serve: drops are added as they are found, and a line is due at the
// first drop and then at most once every interval, carrying the drops
// since the previous line. Safe for concurrent use.
type dropLog struct {
	every time.Duration

	mu     sync.Mutex
	last   time.Time
	logged bool
	held   uint64 // drops added since the last line
	total  uint64
}

// add counts n drops found at now and reports whether a line is due, with
// the drops since the previous line and the total so far.
func (l *dropLog) add(now time.Time, n uint64) (due bool, since, total uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.held += n
	l.total += n
	if l.held == 0 || l.logged && now.Sub(l.last) < l.every {
		return false, 0, l.total
	}
	since = l.held
	l.logged, l.last, l.held = true, now, 0
	return true, since, l.total
}

// rest returns the drops added since the last line (for a final line) and
// the total, and forgets them.
func (l *dropLog) rest() (since, total uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	since = l.held
	l.held = 0
	return since, l.total
}
