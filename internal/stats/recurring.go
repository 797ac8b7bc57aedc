package stats

// DefaultRecurringShare is the share of a function's total runtime a slow
// mode must hold to be reported as recurring (SlowMode): 5%. Lower than
// what a reader would call the function's behaviour, on purpose: a mode
// the natural range takes in is not flagged, so the report is the only
// place a stall of 0.5% of the calls at 5-10x (2-5% of the time and more)
// shows.
const DefaultRecurringShare = 0.05

// SlowMode is a slow mode of a histogram: natural runtimes (inside the
// natural range) that lie beyond a gap above the body of runtimes around
// the median.
type SlowMode struct {
	// Calls is how many values the mode holds, CallsFraction their share
	// of all values.
	Calls         uint64
	CallsFraction float64
	// Lo and Hi are the mode's smallest and largest values; LoBin and HiBin
	// the bins (TailBin) that hold them.
	Lo, Hi       float64
	LoBin, HiBin int
	// Typical is the mode's median (the middle of the bin that holds it).
	Typical float64
	// TimeShare is the mode's share of the total runtime (every bin's
	// values taken at the middle of the bin).
	TimeShare float64
}

// SlowMode returns h's slow mode when it holds at least minShare of the
// total runtime: the values inside the natural range read with r that lie
// beyond the Threshold of the body's largest value, the body being the
// values continuous with the median's bin. A mode beyond a gap is inside the
// natural range only when it recurs (TailRule.Recur, RecurFrac), so rare
// stalls, which are flagged, are never a slow mode. It reads every bin a
// few times.
func (h *TailHist) SlowMode(r TailRule, minShare float64) (SlowMode, bool) {
	n := h.N()
	if n == 0 {
		return SlowMode{}, false
	}
	start := h.medianBin(n)
	body := h.Maxs[start]
	first := len(h.Counts)
	for i := start + 1; i < len(h.Counts); i++ {
		if h.Counts[i] == 0 {
			continue
		}
		if h.Mins[i] > r.Threshold(body) {
			first = i
			break
		}
		body = h.Maxs[i]
	}
	hi := h.NaturalMax(r)
	var m SlowMode
	var total, slow float64
	for i, c := range h.Counts {
		if c == 0 {
			continue
		}
		t := float64(c) * (h.Mins[i] + h.Maxs[i]) / 2
		total += t
		if i < first || h.Maxs[i] > hi {
			continue
		}
		if m.Calls == 0 {
			m.Lo, m.LoBin = h.Mins[i], h.Lo+i
		}
		m.Hi, m.HiBin = h.Maxs[i], h.Lo+i
		m.Calls += c
		slow += t
	}
	if m.Calls == 0 || !(total > 0) || slow/total < minShare {
		return SlowMode{}, false
	}
	m.CallsFraction = float64(m.Calls) / float64(n)
	m.TimeShare = slow / total
	var cum uint64
	for i := m.LoBin - h.Lo; i <= m.HiBin-h.Lo; i++ {
		cum += h.Counts[i]
		if 2*cum >= m.Calls {
			m.Typical = (h.Mins[i] + h.Maxs[i]) / 2
			break
		}
	}
	return m, true
}
