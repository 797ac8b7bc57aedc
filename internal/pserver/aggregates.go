package pserver

import (
	"cmp"
	"slices"
	"sort"

	"github.com/kipimo-hpc/kipimo/internal/stats"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// Cell is one rank's counts in one io_step.
type Cell struct {
	Anomalies  uint64 `json:"anomalies"`
	Executions uint64 `json:"executions"`
}

// StepAgg is one io_step across all ranks that reported it.
type StepAgg struct {
	Step       uint64 `json:"io_step"`
	Anomalies  uint64 `json:"anomalies"`
	Executions uint64 `json:"executions"`
	Events     uint64 `json:"events"`
	BadFrames  uint64 `json:"bad_frames"`
	Missing    uint64 `json:"missing_steps"` // steps of ranks missing just before this one
	Frames     uint64 `json:"frames"`        // step summaries received
	// the event library's counts, as in Totals
	SummarisedCalls uint64              `json:"summarised_calls"`
	DroppedCalls    uint64              `json:"dropped_calls"`
	DroppedEvents   uint64              `json:"dropped_events"`
	MinTS           uint64              `json:"min_ts"`
	MaxTS           uint64              `json:"max_ts"`
	Ranks           map[DetectorID]Cell `json:"-"`
	// blocks sums the cells of Ranks per block of blockRanks consecutive
	// rank numbers: what the banded heat map reads, so that building it
	// costs the number of blocks, not of ranks. Derived (rebuilt by fill).
	blocks map[blockKey]*blockCell
}

// blockRanks is the number of consecutive rank numbers of one block, the
// unit of which the heat map's bands are made; blockShift is its log2.
const (
	blockShift = 4
	blockRanks = 1 << blockShift
)

// blockKey names a block: a program and its rank numbers
// [No*blockRanks, (No+1)*blockRanks).
type blockKey struct {
	PID uint32
	No  uint32
}

func blockOf(id DetectorID) blockKey { return blockKey{id.PID, id.Rank >> blockShift} }

// blockCell is a block's counts in one io_step: the anomalies of its ranks,
// how many of its ranks had any, and the most one of them had (a rank's
// cell only grows, so the largest is kept as cells change).
type blockCell struct {
	Anomalies uint64
	HotRanks  uint64
	Peak      uint64
}

// blockInfo is what is known of a block's ranks over the run.
type blockInfo struct {
	Ranks     int    // ranks seen
	Low, High uint32 // their lowest and highest rank numbers
}

// addCell adds a rank's cell change (from before to after) to the step's
// block sums.
func (st *StepAgg) addCell(id DetectorID, before, after Cell) {
	if st.blocks == nil {
		st.blocks = map[blockKey]*blockCell{}
	}
	k := blockOf(id)
	b := st.blocks[k]
	if b == nil {
		b = &blockCell{}
		st.blocks[k] = b
	}
	b.Anomalies += after.Anomalies - before.Anomalies
	b.Peak = max(b.Peak, after.Anomalies)
	if before.Anomalies == 0 && after.Anomalies > 0 {
		b.HotRanks++
	}
}

// Totals are counts summed over steps.
type Totals struct {
	Anomalies  uint64 `json:"anomalies"`
	Executions uint64 `json:"executions"`
	Events     uint64 `json:"events"`
	BadFrames  uint64 `json:"bad_frames"`
	// Missing are io_steps that never reached a detector (gaps in a rank's
	// sequence of frames).
	Missing uint64 `json:"missing_steps"`
	Frames  uint64 `json:"frames"`
	Steps   uint64 `json:"steps"`
	// SummarisedCalls are calls the ranks' event library summarised per
	// io_step instead of streaming them (in the profiles, never scored);
	// DroppedCalls calls it dropped whole and DroppedEvents comm and
	// counter events it dropped, its rings being full: missing from the
	// profiles and from detection.
	SummarisedCalls uint64 `json:"summarised_calls"`
	DroppedCalls    uint64 `json:"dropped_calls"`
	DroppedEvents   uint64 `json:"dropped_events"`
}

// addSource adds the event library's counts of a step summary.
func (t *Totals) addSource(s *syncproto.StepSummary) {
	t.SummarisedCalls += s.SummarisedCalls
	t.DroppedCalls += s.DroppedCalls
	t.DroppedEvents += s.DroppedEvents
}

// RankTotals is everything one rank reported, over the whole run.
type RankTotals struct {
	Totals
	FirstStep uint64        `json:"first_step"`
	LastStep  uint64        `json:"last_step"`
	PerStep   stats.Moments `json:"per_step"` // anomalies per reported step
	Scores    stats.Moments `json:"scores"`
	Severity  stats.Moments `json:"severity"`
}

// RankFunc names one function on one rank.
type RankFunc struct {
	DetectorID
	Func string `json:"func"`
}

// AnomalyMetrics are the anomaly statistics of a function on one rank (or on
// all ranks): first and last step with anomalies, per-step counts, scores and
// severities.
type AnomalyMetrics struct {
	Count     uint64        `json:"count"`
	FirstStep uint64        `json:"first_io_step"`
	LastStep  uint64        `json:"last_io_step"`
	MinTS     uint64        `json:"min_timestamp"`
	MaxTS     uint64        `json:"max_timestamp"`
	PerStep   stats.Moments `json:"anomaly_count"` // count per (rank, step) with anomalies
	Score     stats.Moments `json:"score"`
	Severity  stats.Moments `json:"severity"`
}

func (a *AnomalyMetrics) add(step uint64, f *syncproto.FuncAnomalyMetrics) {
	if f.Count == 0 {
		return
	}
	if a.Count == 0 || step < a.FirstStep {
		a.FirstStep = step
	}
	if a.Count == 0 || step > a.LastStep {
		a.LastStep = step
	}
	if f.FirstTS != 0 && (a.MinTS == 0 || f.FirstTS < a.MinTS) {
		a.MinTS = f.FirstTS
	}
	if f.LastTS > a.MaxTS {
		a.MaxTS = f.LastTS
	}
	a.Count += f.Count
	a.PerStep.Push(float64(f.Count))
	a.Score.Merge(f.Score)
	a.Severity.Merge(f.Severity)
}

// Aggregates are the run's dashboard aggregates, built from step summaries.
// The last Window steps are kept in full (per rank); older steps are folded
// into Folded and the per-rank totals, so memory is bounded by
// Window x ranks cells plus one RankTotals per rank, one AnomalyMetrics per
// (rank, function) pair that ever had an anomaly, and one per function.
type Aggregates struct {
	Window   int
	Steps    map[uint64]*StepAgg
	MaxStep  uint64
	HaveStep bool
	Folded   Totals // steps evicted from the window
	Late     uint64 // summaries older than the window when they arrived
	// StartTS is the earliest timestamp a step summary reported (µs, the
	// trace's clock): the run's start, which the dashboard shows times
	// relative to.
	StartTS  uint64
	Ranks    map[DetectorID]*RankTotals
	RankFunc map[RankFunc]*AnomalyMetrics
	Funcs    map[string]*AnomalyMetrics

	// Derived from the fields above (not saved; rebuilt by fill), kept up
	// to date by AddStep so that the views pushed on every update cost no
	// pass over the ranks:
	funcRanks map[string]int          // ranks with anomalies, per function
	blockInfo map[blockKey]*blockInfo // the ranks of each block
	// order is the ranks in (pid, rank) order and blockOrder the blocks.
	order      []DetectorID
	blockOrder []blockKey
	// top is the topN ranks by anomaly count, largest first (ties by id).
	top []DetectorID
	// peers is the culprit analysis of the summaries' peer data
	// (culprits.go): not saved, rebuilt from the summaries that follow.
	peers *culpritState
}

// topN is how many ranks AddStep keeps ordered by anomaly count: the
// top-ranks list of the dashboard's updates.
const topN = 10

// NewAggregates returns empty aggregates keeping window steps in full.
func NewAggregates(window int) *Aggregates {
	if window <= 0 {
		window = DefaultWindow
	}
	a := &Aggregates{
		Window:   window,
		Steps:    map[uint64]*StepAgg{},
		Ranks:    map[DetectorID]*RankTotals{},
		RankFunc: map[RankFunc]*AnomalyMetrics{},
		Funcs:    map[string]*AnomalyMetrics{},
	}
	a.fill()
	return a
}

// AddStep records one rank's step summary.
func (a *Aggregates) AddStep(id DetectorID, s *syncproto.StepSummary) {
	if a.blockInfo == nil {
		a.fill()
	}
	r := a.Ranks[id]
	if r == nil {
		r = &RankTotals{FirstStep: s.Step, LastStep: s.Step}
		a.Ranks[id] = r
		a.addRank(id)
	}
	defer a.bumpTop(id)
	if s.Peer != nil {
		if a.peers == nil {
			a.peers = newCulpritState()
		}
		a.peers.add(id, s)
	}
	if s.MinTS > 0 && (a.StartTS == 0 || s.MinTS < a.StartTS) {
		a.StartTS = s.MinTS
	}
	// A frame is a (rank, io_step): a second summary of the rank's latest
	// step (the detector's final flush at close) adds to it without counting
	// another frame or step.
	var frames uint64
	if r.Frames == 0 || s.Step > r.LastStep {
		frames = 1
	}
	r.Anomalies += s.Anomalies
	r.Executions += s.Executions
	r.Events += s.Events
	r.BadFrames += s.BadFrames
	r.Missing += s.MissingSteps
	r.addSource(s)
	r.Frames += frames
	r.Steps += frames
	r.FirstStep = min(r.FirstStep, s.Step)
	r.LastStep = max(r.LastStep, s.Step)
	if frames == 1 {
		r.PerStep.Push(float64(s.Anomalies))
	}
	r.Scores.Merge(s.Scores)
	r.Severity.Merge(s.Severity)

	funcs := s.Funcs
	if len(funcs) == 0 && len(s.FuncAnomalies) > 0 {
		funcs = make([]syncproto.FuncAnomalyMetrics, 0, len(s.FuncAnomalies))
		for name, n := range s.FuncAnomalies {
			funcs = append(funcs, syncproto.FuncAnomalyMetrics{Func: name, Count: n})
		}
	}
	for i := range funcs {
		f := &funcs[i]
		if f.Count == 0 {
			continue
		}
		k := RankFunc{id, f.Func}
		m := a.RankFunc[k]
		if m == nil {
			m = &AnomalyMetrics{}
			a.RankFunc[k] = m
			a.funcRanks[f.Func]++
		}
		m.add(s.Step, f)
		g := a.Funcs[f.Func]
		if g == nil {
			g = &AnomalyMetrics{}
			a.Funcs[f.Func] = g
		}
		g.add(s.Step, f)
	}

	if a.HaveStep && s.Step+uint64(a.Window) <= a.MaxStep {
		// Older than the window: count it in the folded totals only.
		a.Late++
		a.Folded.Anomalies += s.Anomalies
		a.Folded.Executions += s.Executions
		a.Folded.Events += s.Events
		a.Folded.BadFrames += s.BadFrames
		a.Folded.Missing += s.MissingSteps
		a.Folded.addSource(s)
		a.Folded.Frames += frames
		return
	}
	st := a.Steps[s.Step]
	if st == nil {
		st = &StepAgg{Step: s.Step, Ranks: map[DetectorID]Cell{}, MinTS: s.MinTS}
		a.Steps[s.Step] = st
	}
	st.Anomalies += s.Anomalies
	st.Executions += s.Executions
	st.Events += s.Events
	st.BadFrames += s.BadFrames
	st.Missing += s.MissingSteps
	st.SummarisedCalls += s.SummarisedCalls
	st.DroppedCalls += s.DroppedCalls
	st.DroppedEvents += s.DroppedEvents
	st.Frames += frames
	if s.MinTS != 0 && (st.MinTS == 0 || s.MinTS < st.MinTS) {
		st.MinTS = s.MinTS
	}
	st.MaxTS = max(st.MaxTS, s.MaxTS)
	c := st.Ranks[id]
	before := c
	c.Anomalies += s.Anomalies
	c.Executions += s.Executions
	st.Ranks[id] = c
	st.addCell(id, before, c)
	if !a.HaveStep || s.Step > a.MaxStep {
		a.MaxStep, a.HaveStep = s.Step, true
		a.evict()
	}
}

// addStep adds the event library's counts of a step of the window.
func (t *Totals) addStep(st *StepAgg) {
	t.SummarisedCalls += st.SummarisedCalls
	t.DroppedCalls += st.DroppedCalls
	t.DroppedEvents += st.DroppedEvents
}

// evict folds the steps that fell out of the window.
func (a *Aggregates) evict() {
	for step, st := range a.Steps {
		if step+uint64(a.Window) > a.MaxStep {
			continue
		}
		a.Folded.Anomalies += st.Anomalies
		a.Folded.Executions += st.Executions
		a.Folded.Events += st.Events
		a.Folded.BadFrames += st.BadFrames
		a.Folded.Missing += st.Missing
		a.Folded.Frames += st.Frames
		a.Folded.addStep(st)
		a.Folded.Steps++
		delete(a.Steps, step)
	}
}

// Total returns the counts over the whole run (window plus folded steps).
func (a *Aggregates) Total() Totals {
	t := a.Folded
	for _, st := range a.Steps {
		t.Anomalies += st.Anomalies
		t.Executions += st.Executions
		t.Events += st.Events
		t.BadFrames += st.BadFrames
		t.Missing += st.Missing
		t.Frames += st.Frames
		t.addStep(st)
		t.Steps++
	}
	return t
}

// StepList returns the steps in the window in increasing order.
func (a *Aggregates) StepList() []*StepAgg {
	out := make([]*StepAgg, 0, len(a.Steps))
	for _, st := range a.Steps {
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Step < out[j].Step })
	return out
}

// RankIDs returns every rank seen, ordered by (pid, rank). The slice may
// be shared: callers must not modify it.
func (a *Aggregates) RankIDs() []DetectorID {
	if a.derived() {
		return a.order
	}
	out := make([]DetectorID, 0, len(a.Ranks))
	for id := range a.Ranks {
		out = append(out, id)
	}
	slices.SortFunc(out, cmpID)
	return out
}

// derived reports whether the derived fields account for every rank: not
// when a rank was put in Ranks other than by AddStep (a stored run's ranks
// without anomalies), until fill is called.
func (a *Aggregates) derived() bool { return len(a.order) == len(a.Ranks) }

// blocks returns every block with ranks, in (pid, block) order, and what
// is known of each. The results may be shared: callers must not modify
// them.
func (a *Aggregates) blocks() ([]blockKey, map[blockKey]*blockInfo) {
	if a.derived() {
		return a.blockOrder, a.blockInfo
	}
	b := &Aggregates{blockInfo: map[blockKey]*blockInfo{}}
	for _, id := range a.RankIDs() {
		b.addRank(id)
	}
	return b.blockOrder, b.blockInfo
}

// addRank records a rank seen for the first time: in the rank order, and
// in its block. Ranks mostly come in increasing order, appended; one out
// of order is inserted. (AddStep runs under the state's write lock, so
// readers, which may run together, find these ready.)
func (a *Aggregates) addRank(id DetectorID) {
	a.order = insertSorted(a.order, id, cmpID)
	k := blockOf(id)
	b := a.blockInfo[k]
	if b == nil {
		b = &blockInfo{Low: id.Rank, High: id.Rank}
		a.blockInfo[k] = b
		a.blockOrder = insertSorted(a.blockOrder, k, func(x, y blockKey) int {
			return cmp.Or(cmp.Compare(x.PID, y.PID), cmp.Compare(x.No, y.No))
		})
	}
	b.Ranks++
	b.Low, b.High = min(b.Low, id.Rank), max(b.High, id.Rank)
}

// insertSorted inserts v into the sorted slice s (which does not hold it).
func insertSorted[T any](s []T, v T, cmp func(T, T) int) []T {
	if len(s) == 0 || cmp(s[len(s)-1], v) < 0 {
		return append(s, v)
	}
	i, _ := slices.BinarySearchFunc(s, v, cmp)
	return slices.Insert(s, i, v)
}

// beforeTop reports whether rank x comes before rank y in the top-ranks
// order: more anomalies first, then by id.
func (a *Aggregates) beforeTop(x, y DetectorID) bool {
	nx, ny := a.Ranks[x].Anomalies, a.Ranks[y].Anomalies
	if nx != ny {
		return nx > ny
	}
	return lessID(x, y)
}

// bumpTop keeps a.top the topN ranks after id's totals grew. Counts only
// grow, so a rank outside the list can enter it only through its own
// update, which this sees.
func (a *Aggregates) bumpTop(id DetectorID) {
	i := slices.Index(a.top, id)
	switch {
	case i >= 0:
	case len(a.top) < topN:
		a.top = append(a.top, id)
		i = len(a.top) - 1
	case a.beforeTop(id, a.top[len(a.top)-1]):
		i = len(a.top) - 1
		a.top[i] = id
	default:
		return
	}
	for ; i > 0 && a.beforeTop(a.top[i], a.top[i-1]); i-- {
		a.top[i], a.top[i-1] = a.top[i-1], a.top[i]
	}
}

func cmpID(x, y DetectorID) int {
	return cmp.Or(cmp.Compare(x.PID, y.PID), cmp.Compare(x.Rank, y.Rank))
}

func lessID(a, b DetectorID) bool {
	if a.PID != b.PID {
		return a.PID < b.PID
	}
	return a.Rank < b.Rank
}

// fill makes the maps of decoded aggregates usable (gob leaves empty maps
// nil) and builds what is derived from them.
func (a *Aggregates) fill() {
	if a.Steps == nil {
		a.Steps = map[uint64]*StepAgg{}
	}
	for _, st := range a.Steps {
		if st.Ranks == nil {
			st.Ranks = map[DetectorID]Cell{}
		}
	}
	if a.Ranks == nil {
		a.Ranks = map[DetectorID]*RankTotals{}
	}
	if a.RankFunc == nil {
		a.RankFunc = map[RankFunc]*AnomalyMetrics{}
	}
	if a.Funcs == nil {
		a.Funcs = map[string]*AnomalyMetrics{}
	}
	a.funcRanks = map[string]int{}
	for k := range a.RankFunc {
		a.funcRanks[k.Func]++
	}
	a.blockInfo = map[blockKey]*blockInfo{}
	a.order, a.blockOrder, a.top = nil, nil, nil
	for id := range a.Ranks {
		a.addRank(id)
	}
	for _, id := range a.order {
		a.bumpTop(id)
	}
	for _, st := range a.Steps {
		st.blocks = nil
		for id, c := range st.Ranks {
			st.addCell(id, Cell{}, c)
		}
	}
}
