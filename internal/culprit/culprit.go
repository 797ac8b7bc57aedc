// Package culprit compares the ranks of an io_step with their peers and
// traces their waits to the rank and function where the time was spent.
//
// Each rank reports, per io_step, the exclusive time of its costliest
// functions, the time of its MPI point-to-point waits by partner and its
// time in each collective (syncproto.PeerStep). An Analyzer takes one step's
// reports from every rank and decides:
//
//   - Outlier ranks: per work function, a rank whose time per call exceeds
//     the median of its peers' by more than the bound the function's
//     rank-to-rank spread allows: Config.K times the larger of the step's
//     robust spread (1.4826 times the median absolute deviation) and the
//     function's learnt spread (the median of its robust spreads over the
//     last Config.History steps), and at least Config.Rel of the median;
//     its excess (beyond the median, times its calls) at least the step's
//     floor (Config.MinUs, or Config.MinFrac of the step's length). Times
//     per call, because ranks cut their steps at their own times: one
//     holds a call more than another. The ranks' longest calls are
//     compared the same way: one stalled call among many stands out there;
//     the larger excess counts.
//   - Waits, clock-free: at a collective, every rank waits for the one that
//     spent the least time in it (it arrived last). A rank's point-to-point
//     waits beyond those of the ranks that waited least (the lower
//     quartile) are a wait on the partner it waited on that was latest (by
//     its own excess work, or its own explained waits in turn, spread round
//     by round along the waits), for as long as that partner was late; else
//     on a partner late in the previous step; else, beyond K learnt spreads
//     of the ranks' waits, the rank's own. A collective's waits count for
//     as long as its last arrival was late, or, when it was not, beyond K
//     learnt spreads of the collective.
//   - Culprits: each wait is followed along these links to the rank whose
//     extra time was spent in its own work, in the step or the one before.
//     The culprit is that rank and its costliest excess function; its time
//     lost is its own excess plus the waits traced to it on other ranks.
//
// Results do not depend on the order in which the ranks' reports arrive:
// they are sorted by rank first, and every tie is broken by rank.
package culprit

import (
	"cmp"
	"math"
	"slices"

	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// Config sets the bounds of the peer comparison.
type Config struct {
	// K is how many robust spreads beyond the peers' median a rank's time
	// must lie (default 6).
	K float64
	// Rel is the least excess as a fraction of the peers' median (default
	// 0.1).
	Rel float64
	// MinUs is the least excess, in µs (default 1000).
	MinUs float64
	// MinFrac is the least excess as a fraction of the ranks' median step
	// length, when more than MinUs (default 0.02: 20 ms of a 1 s io_step;
	// a rank descheduled for a few time slices is not a culprit).
	MinFrac float64
	// MinRanks is the fewest ranks a function is compared over (default 3).
	MinRanks int
	// History is how many steps' spreads a function's learnt spread is
	// the median of (default 16).
	History int
	// MaxFuncs bounds the functions whose spreads are learnt (default
	// 4096): further functions are compared on each step's spread alone.
	MaxFuncs int
}

func (c Config) withDefaults() Config {
	if c.K <= 0 {
		c.K = 6
	}
	if c.Rel <= 0 {
		c.Rel = 0.1
	}
	if c.MinUs <= 0 {
		c.MinUs = 1000
	}
	if c.MinFrac <= 0 {
		c.MinFrac = 0.02
	}
	if c.MinRanks < 2 {
		c.MinRanks = 3
	}
	if c.History <= 0 {
		c.History = 16
	}
	if c.MaxFuncs <= 0 {
		c.MaxFuncs = 4096
	}
	return c
}

// RankStep is one rank's report of one io_step.
type RankStep struct {
	Rank uint32
	Peer syncproto.PeerStep
}

// Outlier is a rank whose time in a function stood out from its peers'.
type Outlier struct {
	Rank uint32  `json:"rank"`
	Func string  `json:"func"`
	Us   float64 `json:"us"`
	// MedianUs is the peers' median time per call, times the rank's calls.
	MedianUs float64 `json:"median_us"`
	// ExcessUs is Us beyond the peers' median.
	ExcessUs float64 `json:"excess_us"`
	// BoundUs is the excess the function's spread allowed.
	BoundUs float64 `json:"bound_us"`
}

// Culprit is a rank where waits of a step began, with what it cost.
type Culprit struct {
	Rank uint32 `json:"rank"`
	// Func is the rank's costliest excess function ("" when its extra time
	// is not in any function it reported).
	Func string `json:"func"`
	// IOStep is where the extra time was spent: the step analysed or the
	// one before it.
	IOStep uint64 `json:"io_step"`
	// OwnUs is the rank's own excess time in its work functions; CausedUs
	// the waits on other ranks traced to it; TimeLostUs their sum.
	OwnUs      float64 `json:"own_us"`
	CausedUs   float64 `json:"caused_us"`
	TimeLostUs float64 `json:"time_lost_us"`
	// Victims are the ranks whose waits were traced to it, in rank order;
	// VictimCount how many.
	Victims     []uint32 `json:"victims,omitempty"`
	VictimCount int      `json:"victim_count"`
}

// Result is the analysis of one io_step.
type Result struct {
	IOStep uint64 `json:"io_step"`
	Ranks  int    `json:"ranks"`
	// Outliers are the outlier ranks by function, largest excess first.
	Outliers []Outlier `json:"outliers,omitempty"`
	// Culprits are ordered by time lost, largest first.
	Culprits []Culprit `json:"culprits,omitempty"`
	// WaitUs is the step's excess waits in all (those traced to a culprit).
	WaitUs float64 `json:"wait_us"`
}

// Analyzer analyses io_steps one after the other, learning each function's
// rank-to-rank spread, and keeping the previous step to follow waits back
// into it. Not safe for concurrent use.
type Analyzer struct {
	cfg    Config
	spread map[string]*history
	prev   *stepView
}

// history is a function's robust spreads over the last steps, a ring.
type history struct {
	xs   []float64
	next int
}

func (h *history) add(x float64, n int) {
	if len(h.xs) < n {
		h.xs = append(h.xs, x)
		return
	}
	h.xs[h.next] = x
	h.next = (h.next + 1) % n
}

func (h *history) median() float64 {
	s := slices.Clone(h.xs)
	slices.Sort(s)
	return medianSorted(s)
}

// New returns an Analyzer with cfg (zero fields take their defaults).
func New(cfg Config) *Analyzer {
	return &Analyzer{cfg: cfg.withDefaults(), spread: map[string]*history{}}
}

// p2pKey is the spread key of a rank's point-to-point waits in all;
// maxKey suffixes a function's key for the spread of its longest calls.
const (
	p2pKey = "\x00p2p"
	maxKey = "\x00max"
)

// rankView is one rank's step as the analysis reads it.
type rankView struct {
	rank    uint32
	work    map[string]float64 // exclusive time
	calls   map[string]float64 // and calls, of each work function
	maxUs   map[string]float64 // and its longest call
	coll    map[string]float64
	p2p     float64 // time in point-to-point waits
	p2pFunc string  // its costliest point-to-point wait function
	waits   []syncproto.PeerWait
	// found by the analysis
	own       float64 // excess work
	ownFunc   string  // costliest excess work function
	ownFuncEx float64
	topFunc   string // work function furthest beyond its median, excess or not
	topEx     float64
	p2pRaw    float64 // point-to-point waits beyond the lower quartile's
	p2pEx     float64 // of which explained, or beyond the bound
	waitOn    int     // index of the rank waited on (-1: none, or its own)
	late      float64 // own excess and excess waits
}

type stepView struct {
	step  uint64
	ranks []rankView // by rank
	// minUs is the least excess that counts in the step: Config.MinUs,
	// or Config.MinFrac of the ranks' median step length if more
	minUs float64
}

func (v *stepView) rank(r uint32) *rankView {
	i, ok := slices.BinarySearchFunc(v.ranks, r, func(x rankView, r uint32) int { return cmp.Compare(x.rank, r) })
	if !ok {
		return nil
	}
	return &v.ranks[i]
}

// view sorts and indexes the reports.
func (a *Analyzer) view(step uint64, reports []RankStep) *stepView {
	rs := slices.Clone(reports)
	slices.SortStableFunc(rs, func(x, y RankStep) int { return cmp.Compare(x.Rank, y.Rank) })
	v := &stepView{step: step, ranks: make([]rankView, 0, len(rs))}
	for i := range rs {
		if i > 0 && rs[i].Rank == rs[i-1].Rank {
			continue
		}
		r := rankView{rank: rs[i].Rank, work: map[string]float64{}, calls: map[string]float64{}, maxUs: map[string]float64{}, coll: map[string]float64{}, waits: slices.Clone(rs[i].Peer.Waits)}
		slices.SortFunc(r.waits, func(x, y syncproto.PeerWait) int {
			if c := cmp.Compare(y.Us, x.Us); c != 0 {
				return c
			}
			return cmp.Compare(x.Partner, y.Partner)
		})
		p2pMax := -1.0
		for _, f := range rs[i].Peer.Funcs {
			x := float64(f.Us)
			switch f.Kind {
			case syncproto.PeerP2P:
				r.p2p += x
				if x > p2pMax || (x == p2pMax && f.Func < r.p2pFunc) {
					p2pMax, r.p2pFunc = x, f.Func
				}
			case syncproto.PeerCollective:
				r.coll[f.Func] += x
			default:
				r.work[f.Func] += x
				r.calls[f.Func] += float64(f.Calls)
				r.maxUs[f.Func] = max(r.maxUs[f.Func], float64(f.MaxUs))
			}
		}
		v.ranks = append(v.ranks, r)
	}
	var lens []float64
	for i := range rs {
		if p := &rs[i].Peer; p.End > p.Start {
			lens = append(lens, float64(p.End-p.Start))
		}
	}
	slices.Sort(lens)
	v.minUs = max(a.cfg.MinUs, a.cfg.MinFrac*medianSorted(lens))
	return v
}

// learnt is f's learnt spread (0 before any step).
func (a *Analyzer) learnt(f string) float64 {
	if h := a.spread[f]; h != nil {
		return h.median()
	}
	return 0
}

// learn adds one step's spread of f.
func (a *Analyzer) learn(f string, sigma float64) {
	h := a.spread[f]
	if h == nil {
		if len(a.spread) >= a.cfg.MaxFuncs {
			return
		}
		h = &history{}
		a.spread[f] = h
	}
	h.add(sigma, a.cfg.History)
}

// waitBound is the least excess wait in f that counts: K learnt spreads
// (of the earlier steps: a step where many ranks wait has a wide spread of
// its own) and MinUs.
func (a *Analyzer) waitBound(f string, minUs float64) float64 {
	return max(a.cfg.K*a.learnt(f), minUs)
}

// Step analyses one io_step from every rank's report (in any order; of a
// rank reported twice, the first report counts). The Analyzer then keeps
// it as the previous step and its spreads in the learnt ones: steps must
// come in increasing order.
func (a *Analyzer) Step(step uint64, reports []RankStep) Result {
	v := a.view(step, reports)
	res := Result{IOStep: step, Ranks: len(v.ranks)}

	// 1. work: outlier ranks and each rank's own excess, on the time per
	// call (ranks cut their steps at their own times, so their steps hold
	// a call more or less: a sum would differ by one call's time)
	for _, f := range keys(v.ranks, func(r *rankView) map[string]float64 { return r.work }) {
		xs, who := gather(v.ranks, func(r *rankView) (float64, bool) {
			n := r.calls[f]
			if n <= 0 {
				return 0, false
			}
			return r.work[f] / n, true
		})
		if len(xs) < a.cfg.MinRanks {
			continue
		}
		med, sigma := robust(xs)
		bound := max(a.cfg.K*max(sigma, a.learnt(f)), a.cfg.Rel*med)
		a.learn(f, sigma)
		// the longest calls, when the ranks report them
		ms := make([]float64, len(xs))
		for i := range xs {
			ms[i] = v.ranks[who[i]].maxUs[f]
		}
		hasMax := slices.ContainsFunc(ms, func(x float64) bool { return x > 0 })
		var mmed, mbound float64
		if hasMax {
			var msigma float64
			mmed, msigma = robust(ms)
			mbound = max(a.cfg.K*max(msigma, a.learnt(f+maxKey)), a.cfg.Rel*mmed)
			a.learn(f+maxKey, msigma)
		}
		for i, x := range xs {
			r := &v.ranks[who[i]]
			n := r.calls[f]
			exMean, exMax := (x-med)*n, ms[i]-mmed
			if e := max(exMean, exMax); e > r.topEx {
				r.topEx, r.topFunc = e, f
			}
			ex, b := 0.0, 0.0
			if x-med > bound && exMean > v.minUs {
				ex, b = exMean, max(bound*n, v.minUs)
			}
			if hasMax && exMax > mbound && exMax > v.minUs && exMax > ex {
				ex, b = exMax, max(mbound, v.minUs)
			}
			if ex == 0 {
				continue
			}
			res.Outliers = append(res.Outliers, Outlier{Rank: r.rank, Func: f, Us: r.work[f], MedianUs: med * n, ExcessUs: ex, BoundUs: b})
			r.own += ex
			if ex > r.ownFuncEx {
				r.ownFunc, r.ownFuncEx = f, ex
			}
		}
	}

	// 2. point-to-point waits beyond the lower quartile's, explained by a
	// late partner (below the partner's lateness) or, beyond the bound,
	// the rank's own
	if len(v.ranks) >= a.cfg.MinRanks && slices.ContainsFunc(v.ranks, func(r rankView) bool { return r.p2p > 0 }) {
		xs, _ := gather(v.ranks, func(r *rankView) (float64, bool) { return r.p2p, true })
		_, sigma := robust(xs)
		bound := a.waitBound(p2pKey, v.minUs)
		a.learn(p2pKey, sigma)
		s := slices.Clone(xs)
		slices.Sort(s)
		q := s[(len(s)-1)/4]
		for i := range v.ranks {
			v.ranks[i].p2pRaw = v.ranks[i].p2p - q
		}
		a.explainWaits(v, bound)
	}

	// 3. collectives: every rank waited for the last to arrive
	type wait struct {
		victim uint32
		us     float64
		target uint32 // the rank waited for
		coll   bool
	}
	var waits []wait
	for _, f := range keys(v.ranks, func(r *rankView) map[string]float64 { return r.coll }) {
		xs, who := gather(v.ranks, func(r *rankView) (float64, bool) {
			x, ok := r.coll[f]
			return x, ok
		})
		if len(xs) < a.cfg.MinRanks {
			continue
		}
		_, sigma := robust(xs)
		bound := a.waitBound(f, v.minUs)
		a.learn(f, sigma)
		last := 0
		for i, x := range xs {
			if x < xs[last] {
				last = i
			}
		}
		l := &v.ranks[who[last]]
		late := l.late
		if late == 0 && a.prev != nil && a.prev.step < v.step {
			if pl := a.prev.rank(l.rank); pl != nil {
				late = pl.own
			}
		}
		for i, x := range xs {
			w := x - xs[last]
			if i == last || w <= v.minUs {
				continue
			}
			switch {
			case late > 0:
				// as long as the last arrival was late, at most
				w = min(w, late)
			case w <= bound:
				continue
			}
			waits = append(waits, wait{victim: v.ranks[who[i]].rank, us: w, target: l.rank, coll: true})
		}
	}
	for i := range v.ranks {
		if r := &v.ranks[i]; r.p2pEx > 0 {
			waits = append(waits, wait{victim: r.rank, us: r.p2pEx, target: r.rank})
		}
	}

	// 4. trace each wait to its origin
	type ckey struct {
		rank uint32
		step uint64
		fn   string
	}
	found := map[ckey]*Culprit{}
	get := func(r uint32, step uint64, fn string) *Culprit {
		k := ckey{r, step, fn}
		c := found[k]
		if c == nil {
			c = &Culprit{Rank: r, Func: fn, IOStep: step}
			found[k] = c
		}
		return c
	}
	for i := range v.ranks {
		if r := &v.ranks[i]; r.own > 0 {
			get(r.rank, step, r.ownFunc).OwnUs += r.own
		}
	}
	for _, w := range waits {
		x := v.rank(w.target)
		if !w.coll {
			if x.waitOn < 0 {
				// its own wait: no partner was late
				c := get(x.rank, step, x.p2pFunc)
				c.CausedUs += w.us
				res.WaitUs += w.us
				continue
			}
			x = &v.ranks[x.waitOn]
		}
		r, st, fn := a.origin(v, x)
		c := get(r, st, fn)
		c.CausedUs += w.us
		res.WaitUs += w.us
		if r != w.victim && !slices.Contains(c.Victims, w.victim) {
			c.Victims = append(c.Victims, w.victim)
		}
	}
	for _, c := range found {
		c.TimeLostUs = c.OwnUs + c.CausedUs
		slices.Sort(c.Victims)
		c.VictimCount = len(c.Victims)
		res.Culprits = append(res.Culprits, *c)
	}
	slices.SortFunc(res.Culprits, func(x, y Culprit) int {
		if c := cmp.Compare(y.TimeLostUs, x.TimeLostUs); c != 0 {
			return c
		}
		if c := cmp.Compare(x.Rank, y.Rank); c != 0 {
			return c
		}
		if c := cmp.Compare(x.IOStep, y.IOStep); c != 0 {
			return c
		}
		return cmp.Compare(x.Func, y.Func)
	})
	slices.SortFunc(res.Outliers, func(x, y Outlier) int {
		if c := cmp.Compare(y.ExcessUs, x.ExcessUs); c != 0 {
			return c
		}
		if c := cmp.Compare(x.Rank, y.Rank); c != 0 {
			return c
		}
		return cmp.Compare(x.Func, y.Func)
	})
	a.prev = v
	return res
}

// maxChain bounds the iterations that spread lateness along the waits: a
// chain of waits longer than this is traced no further.
const maxChain = 16

// explainWaits decides each rank's excess point-to-point waits and whom
// they were on. A rank's lateness is its own excess work plus its explained
// waits; a rank's raw excess wait (p2pRaw, beyond MinUs) is explained by the
// partner it waited on with the largest lateness, up to that lateness.
// Lateness spreads along the waits in rounds, each computed from the
// previous round's (so the result does not depend on the ranks' order), a
// partner whose own longest wait was on the rank not counting. A wait that
// no partner in this step explains is explained by a partner's excess work
// in the previous step; else, beyond bound, it is the rank's own.
func (a *Analyzer) explainWaits(v *stepView, bound float64) {
	n := len(v.ranks)
	late := make([]float64, n)
	next := make([]float64, n)
	on := make([]int, n)
	idx := func(r uint32) int {
		i, ok := slices.BinarySearchFunc(v.ranks, r, func(x rankView, r uint32) int { return cmp.Compare(x.rank, r) })
		if !ok {
			return -1
		}
		return i
	}
	for i := range v.ranks {
		late[i] = v.ranks[i].own
	}
	for range maxChain {
		changed := false
		for i := range v.ranks {
			r := &v.ranks[i]
			next[i], on[i] = r.own, -1
			if r.p2pRaw <= v.minUs {
				continue
			}
			best, bestLate, bestWait := -1, 0.0, uint64(0)
			for _, w := range r.waits {
				j := idx(w.Partner)
				if j < 0 || j == i {
					continue
				}
				if p := &v.ranks[j]; len(p.waits) > 0 && p.waits[0].Partner == r.rank && p.own == 0 {
					continue // it waited on r
				}
				if l := late[j]; l > bestLate || (l == bestLate && l > 0 && (w.Us > bestWait || (w.Us == bestWait && j < best))) {
					best, bestLate, bestWait = j, l, w.Us
				}
			}
			if best >= 0 {
				next[i] += min(r.p2pRaw, bestLate)
				on[i] = best
			}
		}
		for i := range late {
			if next[i] != late[i] {
				changed = true
			}
			late[i] = next[i]
		}
		if !changed {
			break
		}
	}
	prev := a.prev
	if prev != nil && prev.step >= v.step {
		prev = nil
	}
	for i := range v.ranks {
		r := &v.ranks[i]
		r.late, r.waitOn = late[i], on[i]
		if on[i] >= 0 {
			r.p2pEx = late[i] - r.own
			continue
		}
		if r.p2pRaw <= v.minUs {
			continue
		}
		// the previous step's late partner
		best, bestLate := -1, 0.0
		if prev != nil {
			for _, w := range r.waits {
				j := idx(w.Partner)
				pj := prev.rank(w.Partner)
				if j < 0 || j == i || pj == nil {
					continue
				}
				if pj.own > bestLate || (pj.own == bestLate && pj.own > 0 && j < best) {
					best, bestLate = j, pj.own
				}
			}
		}
		switch {
		case best >= 0:
			r.waitOn, r.p2pEx = best, min(r.p2pRaw, bestLate)
			r.late += r.p2pEx
		case r.p2pRaw > bound:
			r.p2pEx = r.p2pRaw
			r.late += r.p2pEx
		}
	}
}

// origin follows rank x of step v, one that others waited for, to where
// its lateness began: x itself when its own excess work is at least its
// excess waits; else the partner it waited on, and so on; else x's excess
// work in the previous step; else x itself, with the work function
// furthest beyond its peers.
func (a *Analyzer) origin(v *stepView, x *rankView) (uint32, uint64, string) {
	for range maxChain {
		switch {
		case x.own > 0 && x.own >= x.p2pEx:
			return x.rank, v.step, x.ownFunc
		case x.p2pEx > 0 && x.waitOn >= 0:
			x = &v.ranks[x.waitOn]
			continue
		case x.p2pEx > 0:
			return x.rank, v.step, x.p2pFunc
		}
		break
	}
	if a.prev != nil && a.prev.step < v.step {
		if px := a.prev.rank(x.rank); px != nil && px.own > 0 {
			return px.rank, a.prev.step, px.ownFunc
		}
	}
	return x.rank, v.step, x.topFunc
}

// keys returns the names of one map of the ranks, sorted.
func keys(rs []rankView, m func(*rankView) map[string]float64) []string {
	seen := map[string]bool{}
	var out []string
	for i := range rs {
		for k := range m(&rs[i]) {
			if !seen[k] {
				seen[k] = true
				out = append(out, k)
			}
		}
	}
	slices.Sort(out)
	return out
}

// gather returns the ranks' values that count (in rank order) and the
// indices of their ranks.
func gather(rs []rankView, val func(*rankView) (float64, bool)) ([]float64, []int) {
	xs := make([]float64, 0, len(rs))
	who := make([]int, 0, len(rs))
	for i := range rs {
		if x, ok := val(&rs[i]); ok {
			xs = append(xs, x)
			who = append(who, i)
		}
	}
	return xs, who
}

// robust returns the median of xs and 1.4826 times their median absolute
// deviation (the standard deviation of normal data, robust to a minority
// of outliers).
func robust(xs []float64) (med, sigma float64) {
	s := slices.Clone(xs)
	slices.Sort(s)
	med = medianSorted(s)
	for i, x := range s {
		s[i] = math.Abs(x - med)
	}
	slices.Sort(s)
	return med, 1.4826 * medianSorted(s)
}

func medianSorted(s []float64) float64 {
	n := len(s)
	switch {
	case n == 0:
		return 0
	case n%2 == 1:
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
