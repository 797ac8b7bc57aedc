package pserver

import (
	"cmp"
	"maps"
	"slices"
	"sync"

	"github.com/kipimo-hpc/kipimo/internal/culprit"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// Bounds of what the culprit analysis keeps.
const (
	// maxBursts is how many of the latest bursts are kept.
	maxBursts = 512
	// burstCulprits and burstOutliers bound each burst's lists.
	burstCulprits = 8
	burstOutliers = 16
	// maxRowSteps bounds the io_steps listed per culprit or outlier row
	// (the latest; the count covers all).
	maxRowSteps = 64
	// maxRows bounds the culprit rows and the outlier rows of a run: a row
	// beyond it is counted in Culprits.DroppedRows only.
	maxRows = 1 << 16
	// analyseAfter is how many io_steps after a step its analysis waits
	// for ranks that have not reported it.
	analyseAfter = 2
	// maxVictims bounds the victims a burst's culprit lists (all count
	// in its victim_count).
	maxVictims = 32
)

// Burst is one io_step's findings across the ranks of one program: its
// anomalies, outlier ranks and ranked culprits.
type Burst struct {
	PID    uint32 `json:"pid"`
	IOStep uint64 `json:"io_step"`
	// Ranks is how many ranks' reports the step was analysed with.
	Ranks int `json:"ranks"`
	// Anomalies are the step's anomalies over those ranks; AnomalousRanks
	// how many ranks had any.
	Anomalies      uint64 `json:"anomalies"`
	AnomalousRanks int    `json:"anomalous_ranks"`
	// WaitUs is the step's excess waits, all traced to culprits.
	WaitUs float64 `json:"wait_us"`
	// StartTS and EndTS are the step's time bucket (µs, the trace's clock)
	// or, for ranks that report no step times, the span of the step's
	// labelled executions.
	StartTS uint64 `json:"start_ts"`
	EndTS   uint64 `json:"end_ts"`
	// Culprits are the largest by time lost, first the top culprit.
	Culprits []culprit.Culprit `json:"culprits"`
	Outliers []culprit.Outlier `json:"outliers"`
}

// CulpritRow is a (rank, function) named as a culprit over the run.
type CulpritRow struct {
	PID        uint32  `json:"pid"`
	Rank       uint32  `json:"rank"`
	Func       string  `json:"func"`
	TimeLostUs float64 `json:"time_lost_us"`
	OwnUs      float64 `json:"own_us"`
	CausedUs   float64 `json:"caused_us"`
	// Bursts counts the bursts it was a culprit of; Top those it was the
	// top culprit of.
	Bursts int `json:"bursts"`
	Top    int `json:"top"`
	// IOSteps are the latest bursts' io_steps (at most 64).
	IOSteps []uint64 `json:"io_steps"`
}

// OutlierRow is a (rank, function) that stood out from its peers.
type OutlierRow struct {
	PID  uint32 `json:"pid"`
	Rank uint32 `json:"rank"`
	Func string `json:"func"`
	// Steps counts the io_steps it stood out in; IOSteps are the latest
	// (at most 64).
	Steps   int      `json:"steps"`
	IOSteps []uint64 `json:"io_steps"`
	// ExcessUs is its time beyond its peers' median, summed over those
	// steps; TimeLostUs adds the waits it caused on other ranks.
	ExcessUs   float64 `json:"excess_us"`
	TimeLostUs float64 `json:"time_lost_us"`
	// Standing is set when it stood out in at least 2 io_steps and 10% of
	// the steps analysed: a lasting difference, not a passing one.
	Standing bool `json:"standing"`
}

// Culprits is the run's culprit analysis (GET /api/culprits).
type Culprits struct {
	// Steps is how many io_steps were analysed; Pending how many wait for
	// ranks' reports.
	Steps   int `json:"steps_analysed"`
	Pending int `json:"steps_pending"`
	// Late counts reports that came after their step's analysis.
	Late        uint64 `json:"late_reports"`
	DroppedRows uint64 `json:"dropped_rows,omitempty"`
	// Culprits are ordered by time lost, largest first.
	Culprits []CulpritRow `json:"culprits"`
	// Outliers are ordered by time lost, largest first.
	Outliers []OutlierRow `json:"outlier_ranks"`
	// Bursts are the latest bursts, in io_step order.
	Bursts []Burst `json:"bursts"`
}

type rowKey struct {
	pid, rank uint32
	fn        string
}

// culpritState runs the culprit analysis on the step summaries' peer data
// (internal/culprit), per program, once a step has every rank's report or
// analyseAfter steps later. Its own lock lets a reader under the state's
// read lock finish the pending steps (the end-of-run report).
type culpritState struct {
	mu       sync.Mutex
	progs    map[uint32]*progCulprits
	bursts   []Burst // ring of the latest maxBursts
	head     int
	culprits map[rowKey]*CulpritRow
	outliers map[rowKey]*OutlierRow
	steps    int
	late     uint64
	dropped  uint64
}

// progCulprits is one program's analysis.
//
// Ranks cut their io_steps on their own clocks, so a rank's step n need
// not cover the same time as another's: the steps are put in time buckets
// of one period (the median length of the first alignReports steps
// reported, from the earliest start among them), each rank's step in the
// bucket of its midpoint, and a bucket is what is analysed as one io_step
// (a rank's two steps in one bucket are added up). Steps that report no
// times are analysed by their numbers.
type progCulprits struct {
	an      *culprit.Analyzer
	ranks   map[uint32]uint64 // each rank's latest bucket
	pending map[uint64]*pendingStep
	// done: buckets below are analysed; analysed: one has been
	done     uint64
	analysed bool
	maxSeen  uint64
	maxRank  uint32
	// alignment, fixed once alignReports reports came (early holds them)
	aligned, timed bool
	period, origin uint64
	early          []earlyReport
}

// alignReports is how many reports the time buckets are fixed from.
const alignReports = 8

type earlyReport struct {
	rank uint32
	sum  syncproto.StepSummary
}

type pendingStep struct {
	reports      map[uint32]*syncproto.PeerStep
	anomalies    uint64
	anomalous    int
	minTS, maxTS uint64
	passed       int // ranks whose latest bucket is beyond this one
}

func newCulpritState() *culpritState {
	return &culpritState{progs: map[uint32]*progCulprits{}, culprits: map[rowKey]*CulpritRow{}, outliers: map[rowKey]*OutlierRow{}}
}

// add takes one rank's step summary; buckets it completes are analysed.
func (c *culpritState) add(id DetectorID, s *syncproto.StepSummary) {
	if s.Peer == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.progs[id.PID]
	if p == nil {
		p = &progCulprits{an: culprit.New(culprit.Config{}), ranks: map[uint32]uint64{}, pending: map[uint64]*pendingStep{}}
		c.progs[id.PID] = p
	}
	if !p.aligned {
		p.early = append(p.early, earlyReport{id.Rank, *s})
		if len(p.early) < alignReports {
			return
		}
		p.align()
		for _, e := range p.early {
			c.place(id.PID, p, e.rank, &e.sum)
		}
		p.early = nil
		return
	}
	c.place(id.PID, p, id.Rank, s)
}

// align fixes p's time buckets from its early reports: one period long (the
// median length of their steps, to two significant digits: the period the
// ranks were given, whatever the jitter of their cuts), on the clock's grid
// of that period (so which steps share a bucket does not depend on which
// reports came first), numbered from the bucket of the earliest start.
func (p *progCulprits) align() {
	p.aligned = true
	var lens []uint64
	first := uint64(0)
	for _, e := range p.early {
		if pe := e.sum.Peer; pe.End > pe.Start {
			lens = append(lens, pe.End-pe.Start)
			if first == 0 || pe.Start < first {
				first = pe.Start
			}
		}
	}
	if 2*len(lens) < len(p.early) {
		return
	}
	slices.Sort(lens)
	p.timed, p.period = true, roundSig2(lens[len(lens)/2])
	p.origin = first / p.period * p.period
}

// roundSig2 rounds x (> 0) to two significant digits.
func roundSig2(x uint64) uint64 {
	unit := uint64(1)
	for x/unit >= 100 {
		unit *= 10
	}
	return max(1, (x+unit/2)/unit*unit)
}

// bucket is the analysis step of a rank's step s.
func (p *progCulprits) bucket(s *syncproto.StepSummary) uint64 {
	if !p.timed || s.Peer.End <= s.Peer.Start {
		return s.Step
	}
	mid := s.Peer.Start + (s.Peer.End-s.Peer.Start)/2
	if mid < p.origin {
		return 0
	}
	return (mid - p.origin) / p.period
}

// place puts one report in its bucket and analyses the buckets ready.
func (c *culpritState) place(pid uint32, p *progCulprits, rank uint32, s *syncproto.StepSummary) {
	b := p.bucket(s)
	last, known := p.ranks[rank]
	if b < p.done {
		c.late++
		if !known || b > last {
			p.ranks[rank] = b
		}
		return
	}
	ps := p.pending[b]
	if ps == nil {
		ps = &pendingStep{reports: map[uint32]*syncproto.PeerStep{}}
		for r, l := range p.ranks {
			if l > b && r != rank {
				ps.passed++
			}
		}
		p.pending[b] = ps
	}
	if !known || b > last {
		// the rank has moved past the buckets before b
		for pb, pp := range p.pending {
			if pb < b && (!known || pb >= last) {
				pp.passed++
			}
		}
		p.ranks[rank] = b
	}
	if old := ps.reports[rank]; old != nil {
		// the rank's final flush of its latest step, or two of its steps
		// in one bucket
		ps.reports[rank] = mergePeer(old, s.Peer)
	} else {
		ps.reports[rank] = s.Peer
		if s.Anomalies > 0 {
			ps.anomalous++
		}
	}
	ps.anomalies += s.Anomalies
	if s.MinTS != 0 && (ps.minTS == 0 || s.MinTS < ps.minTS) {
		ps.minTS = s.MinTS
	}
	ps.maxTS = max(ps.maxTS, s.MaxTS)
	p.maxSeen = max(p.maxSeen, b)
	p.maxRank = max(p.maxRank, rank)
	// the latest bucket every rank (0 to the largest seen, once a bucket
	// has been analysed: the first wait for the ranks to show up) has
	// moved past, or the one analyseAfter buckets behind the latest
	var ready uint64
	ok := false
	if p.analysed && len(p.ranks) > int(p.maxRank) {
		for pb, pp := range p.pending {
			if pp.passed >= len(p.ranks) && (!ok || pb > ready) {
				ready, ok = pb, true
			}
		}
	}
	if p.maxSeen >= analyseAfter && p.maxSeen-analyseAfter >= p.done && (!ok || p.maxSeen-analyseAfter > ready) {
		ready, ok = p.maxSeen-analyseAfter, true
	}
	if ok {
		c.analyse(pid, p, ready)
	}
}

// analyse analyses p's pending steps up to last, in order.
func (c *culpritState) analyse(pid uint32, p *progCulprits, last uint64) {
	steps := make([]uint64, 0, len(p.pending))
	for st := range p.pending {
		if st <= last {
			steps = append(steps, st)
		}
	}
	slices.Sort(steps)
	for _, st := range steps {
		ps := p.pending[st]
		delete(p.pending, st)
		reports := make([]culprit.RankStep, 0, len(ps.reports))
		for r, peer := range ps.reports {
			reports = append(reports, culprit.RankStep{Rank: r, Peer: *peer})
		}
		res := p.an.Step(st, reports)
		c.steps++
		if p.timed {
			ps.minTS, ps.maxTS = p.origin+st*p.period, p.origin+(st+1)*p.period
		}
		c.record(pid, ps, res)
	}
	if len(steps) > 0 {
		p.done = max(p.done, steps[len(steps)-1]+1)
		p.analysed = true
	}
}

// record adds one step's result to the run's rows and bursts.
func (c *culpritState) record(pid uint32, ps *pendingStep, res culprit.Result) {
	caused := map[rowKey]float64{}
	for i, cu := range res.Culprits {
		k := rowKey{pid, cu.Rank, cu.Func}
		row := c.culprits[k]
		if row == nil {
			if len(c.culprits) >= maxRows {
				c.dropped++
				continue
			}
			row = &CulpritRow{PID: pid, Rank: cu.Rank, Func: cu.Func}
			c.culprits[k] = row
		}
		row.TimeLostUs += cu.TimeLostUs
		row.OwnUs += cu.OwnUs
		row.CausedUs += cu.CausedUs
		if n := len(row.IOSteps); n == 0 || row.IOSteps[n-1] != res.IOStep {
			row.Bursts++
			row.IOSteps = appendBounded(row.IOSteps, res.IOStep)
		}
		if i == 0 {
			row.Top++
		}
		if cu.IOStep == res.IOStep {
			caused[k] += cu.CausedUs
		}
	}
	for _, o := range res.Outliers {
		k := rowKey{pid, o.Rank, o.Func}
		row := c.outliers[k]
		if row == nil {
			if len(c.outliers) >= maxRows {
				c.dropped++
				continue
			}
			row = &OutlierRow{PID: pid, Rank: o.Rank, Func: o.Func}
			c.outliers[k] = row
		}
		row.Steps++
		row.IOSteps = appendBounded(row.IOSteps, res.IOStep)
		row.ExcessUs += o.ExcessUs
		row.TimeLostUs += o.ExcessUs + caused[k]
	}
	if ps.anomalies == 0 && len(res.Culprits) == 0 && len(res.Outliers) == 0 {
		return
	}
	for i := range res.Culprits {
		cu := &res.Culprits[i]
		cu.Victims = cu.Victims[:min(len(cu.Victims), maxVictims)]
	}
	b := Burst{PID: pid, IOStep: res.IOStep, Ranks: res.Ranks, Anomalies: ps.anomalies, AnomalousRanks: ps.anomalous, WaitUs: res.WaitUs, StartTS: ps.minTS, EndTS: ps.maxTS,
		Culprits: res.Culprits[:min(len(res.Culprits), burstCulprits)], Outliers: res.Outliers[:min(len(res.Outliers), burstOutliers)]}
	if b.Culprits == nil {
		b.Culprits = []culprit.Culprit{}
	}
	if b.Outliers == nil {
		b.Outliers = []culprit.Outlier{}
	}
	if len(c.bursts) < maxBursts {
		c.bursts = append(c.bursts, b)
		return
	}
	c.bursts[c.head] = b
	c.head = (c.head + 1) % maxBursts
}

func appendBounded(s []uint64, x uint64) []uint64 {
	if len(s) == maxRowSteps {
		copy(s, s[1:])
		s = s[:len(s)-1]
	}
	return append(s, x)
}

// mergePeer adds b's functions and waits to a's (the same rank's step).
func mergePeer(a, b *syncproto.PeerStep) *syncproto.PeerStep {
	out := &syncproto.PeerStep{Funcs: slices.Clone(a.Funcs), Waits: slices.Clone(a.Waits)}
	for _, f := range b.Funcs {
		if i := slices.IndexFunc(out.Funcs, func(x syncproto.PeerFunc) bool { return x.Func == f.Func }); i >= 0 {
			out.Funcs[i].Us += f.Us
			out.Funcs[i].Calls += f.Calls
			out.Funcs[i].MaxUs = max(out.Funcs[i].MaxUs, f.MaxUs)
		} else {
			out.Funcs = append(out.Funcs, f)
		}
	}
	for _, w := range b.Waits {
		if i := slices.IndexFunc(out.Waits, func(x syncproto.PeerWait) bool { return x.Partner == w.Partner }); i >= 0 {
			out.Waits[i].Us += w.Us
		} else {
			out.Waits = append(out.Waits, w)
		}
	}
	return out
}

// report returns the analysis so far; with finish, every pending step is
// analysed first (the run has ended: no report is coming).
func (c *culpritState) report(finish bool) Culprits {
	c.mu.Lock()
	defer c.mu.Unlock()
	if finish {
		for _, pid := range slices.Sorted(maps.Keys(c.progs)) {
			p := c.progs[pid]
			if !p.aligned {
				p.align()
				for _, e := range p.early {
					c.place(pid, p, e.rank, &e.sum)
				}
				p.early = nil
			}
			if len(p.pending) > 0 {
				c.analyse(pid, p, p.maxSeen)
			}
		}
	}
	out := Culprits{Steps: c.steps, Late: c.late, DroppedRows: c.dropped, Culprits: []CulpritRow{}, Outliers: []OutlierRow{}, Bursts: []Burst{}}
	for _, p := range c.progs {
		out.Pending += len(p.pending)
	}
	for _, r := range c.culprits {
		row := *r
		row.IOSteps = slices.Clone(r.IOSteps)
		out.Culprits = append(out.Culprits, row)
	}
	slices.SortFunc(out.Culprits, func(a, b CulpritRow) int {
		if x := cmp.Compare(b.TimeLostUs, a.TimeLostUs); x != 0 {
			return x
		}
		return cmpRow(a.PID, a.Rank, a.Func, b.PID, b.Rank, b.Func)
	})
	for _, r := range c.outliers {
		row := *r
		row.IOSteps = slices.Clone(r.IOSteps)
		row.Standing = row.Steps >= 2 && 10*row.Steps >= c.steps
		out.Outliers = append(out.Outliers, row)
	}
	slices.SortFunc(out.Outliers, func(a, b OutlierRow) int {
		if x := cmp.Compare(b.TimeLostUs, a.TimeLostUs); x != 0 {
			return x
		}
		return cmpRow(a.PID, a.Rank, a.Func, b.PID, b.Rank, b.Func)
	})
	out.Bursts = append(out.Bursts, c.bursts[c.head:]...)
	out.Bursts = append(out.Bursts, c.bursts[:c.head]...)
	slices.SortStableFunc(out.Bursts, func(a, b Burst) int {
		if x := cmp.Compare(a.IOStep, b.IOStep); x != 0 {
			return x
		}
		return cmp.Compare(a.PID, b.PID)
	})
	return out
}

func cmpRow(ap, ar uint32, af string, bp, br uint32, bf string) int {
	if x := cmp.Compare(ap, bp); x != 0 {
		return x
	}
	if x := cmp.Compare(ar, br); x != 0 {
		return x
	}
	return cmp.Compare(af, bf)
}

// Culprits returns the run's culprit analysis: culprits and outlier ranks
// by time lost, and the latest bursts. With finish, the steps still
// waiting for ranks' reports are analysed with those they have (call it
// once the run has ended). Safe under the state's read lock.
func (s *State) Culprits(finish bool) Culprits {
	if s.Agg == nil || s.Agg.peers == nil {
		return Culprits{Culprits: []CulpritRow{}, Outliers: []OutlierRow{}, Bursts: []Burst{}}
	}
	return s.Agg.peers.report(finish)
}
