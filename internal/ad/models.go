package ad

import (
	"github.com/kipimo-hpc/kipimo/internal/stats"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// modelSet is the detector's second stage: it keys every completed
// execution to its model (its function, or its call path), adds its runtime
// to the step's statistics, and at the end of a step builds each model's
// detection state from the global model and the local deltas; judge then
// scores a runtime with the configured algorithm (each model's scoreState,
// made by the scorer) and the natural range. Not safe for concurrent use:
// the detector's goroutine owns it.
type modelSet struct {
	cfg    *Config
	stats  *counters
	stacks *callStacks // the names keys are made of
	scorer scorer
	hist   bool // scorer.histogram(), read on the hot path
	gated  bool // cfg.gated(), read on the hot path
	rule   stats.TailRule
	tmp    stats.TailHist // scratch for prepare

	ignored   map[string]bool
	list      []*model
	keyByName map[string]int32
	fidKey    []int32
	pathKey   []int32
}

func newModelSet(cfg *Config, st *counters, stacks *callStacks) *modelSet {
	ms := &modelSet{cfg: cfg, stats: st, stacks: stacks, scorer: newScorer(cfg), gated: cfg.gated(), rule: cfg.TailRule(),
		ignored: map[string]bool{}, keyByName: map[string]int32{}}
	ms.hist = ms.scorer.histogram()
	for _, n := range cfg.Ignore {
		ms.ignored[n] = true
	}
	return ms
}

// observe adds completed execution e of thread t to its model's step
// statistics.
func (ms *modelSet) observe(t *thread, e *execRec) {
	m := ms.list[ms.keyOf(t, e)]
	x := ms.value(e)
	m.step.Push(x)
	if ms.hist {
		m.values = append(m.values, x)
	}
	if ms.gated {
		m.accum.Tail.Add(x)
	}
	m.touched = true
}

// model is one key's statistics and detection state.
type model struct {
	name    string
	shard   int
	ignored bool

	step   stats.Moments // this step's values
	values []float64     // this step's values (histogram algorithms)

	// accum holds the deltas not sent yet, inflight those of the request in
	// flight (while inFlight), global the last global model (the pserver's,
	// or, without a Syncer, every delta merged). The anomaly count of
	// global is unused: the pserver does not send it back.
	accum, inflight, global stats.Summary
	inFlight                bool
	// heldAnoms, with ExactSync, are the anomalies labelled since the last
	// ReleaseOutputs (checkpoint); they join accum then.
	heldAnoms uint64

	// the natural range (every algorithm but with Chimbuko's rules)
	natMin, natMax       float64 // the natural range
	natLowThr, natThr    float64 // flagged below and above these
	p99, logMean, logStd float64 // for explanations

	det       stats.Moments // global, inflight and accum merged: the detection model
	detReady  bool
	state     scoreState // the algorithm's state, built from det
	touched   bool
	stepAnoms uint64
	best      bestNormal
}

type bestNormal struct {
	t     *thread
	seq   uint64
	score float64
	ok    bool
}

// keyOf returns the model key of a completed execution of thread t,
// creating it. It is first asked when the execution completes, while its
// callers are still open.
func (ms *modelSet) keyOf(t *thread, e *execRec) int32 {
	if e.key != 0 {
		return e.key - 1
	}
	if !ms.cfg.ByCallPath && int(e.fid) < len(ms.fidKey) {
		if k := ms.fidKey[e.fid]; k >= 0 {
			e.key = k + 1
			return k
		}
	}
	k := ms.newKey(t, e)
	e.key = k + 1
	return k
}

func (ms *modelSet) newKey(t *thread, e *execRec) int32 {
	if ms.cfg.ByCallPath {
		// The key is the execution's last ModelPathDepth frames. A call-path
		// node that holds at least as many frames as that names them once
		// for all its executions.
		cached := e.path != pathOverflow && ms.cfg.CallPathDepth >= ms.cfg.ModelPathDepth
		if cached && int(e.path) < len(ms.pathKey) && ms.pathKey[e.path] >= 0 {
			return ms.pathKey[e.path]
		}
		k := ms.modelFor(ms.stacks.modelPathName(t, e), e.fid)
		if cached {
			for len(ms.pathKey) <= int(e.path) {
				ms.pathKey = append(ms.pathKey, -1)
			}
			ms.pathKey[e.path] = k
		}
		return k
	}
	if int(e.fid) < len(ms.fidKey) && ms.fidKey[e.fid] >= 0 {
		return ms.fidKey[e.fid]
	}
	k := ms.modelFor(ms.stacks.funcName(e.fid), e.fid)
	for len(ms.fidKey) <= int(e.fid) {
		ms.fidKey = append(ms.fidKey, -1)
	}
	ms.fidKey[e.fid] = k
	return k
}

func (ms *modelSet) modelFor(name string, fid uint32) int32 {
	if k, ok := ms.keyByName[name]; ok {
		return k
	}
	k := int32(len(ms.list))
	ms.list = append(ms.list, &model{
		name:    name,
		shard:   syncproto.Shard(name, ms.cfg.Shards),
		ignored: ms.ignored[ms.stacks.funcName(fid)],
		state:   ms.scorer.newState(),
	})
	ms.keyByName[name] = k
	return k
}

func (ms *modelSet) value(e *execRec) float64 {
	if ms.cfg.Statistic == Inclusive {
		return float64(e.incl())
	}
	return float64(e.excl())
}

// prepare builds m's detection model: the last global model merged with
// every local delta it does not include yet.
func (ms *modelSet) prepare(m *model) {
	m.det = m.global.Moments
	m.det.Merge(m.inflight.Moments)
	m.det.Merge(m.accum.Moments)
	m.detReady = m.det.N >= ms.cfg.MinCount
	if ms.gated {
		ms.tmp.Reset()
		for _, src := range []*stats.Summary{&m.global, &m.inflight, &m.accum} {
			if err := ms.tmp.Merge(src.Tail); err != nil {
				ms.stats.modelErrors.Add(1)
			}
		}
		m.natMin, m.natMax = ms.tmp.NaturalRange(ms.rule)
		m.natLowThr, m.natThr = ms.rule.LowThreshold(m.natMin), ms.rule.Threshold(m.natMax)
		m.p99 = ms.tmp.Quantile(0.99)
		m.logMean, m.logStd = ms.tmp.LogMoments()
	}
	var h stats.Histogram
	if ms.hist {
		for _, src := range []*stats.Summary{&m.global, &m.inflight, &m.accum} {
			if err := h.Merge(src.Histogram); err != nil {
				ms.stats.modelErrors.Add(1)
			}
		}
	}
	m.state.reset(m, h)
}

// judge scores value x against model m with the algorithm and says whether
// it is an anomaly: with the natural range (every algorithm but under
// Chimbuko's rules), only outside it.
func (ms *modelSet) judge(m *model, x float64) (score float64, anom bool) {
	// the default algorithm's state is called directly, not through the
	// interface
	tail, isTail := m.state.(*tailScorer)
	if ms.gated && x <= m.natThr && (x >= m.natLowThr || ms.cfg.SlowOnly) {
		// inside the natural range: normal whatever the algorithm says
		if isTail {
			return tail.score(m, x), false
		}
		return m.state.score(m, x), false
	}
	if isTail {
		return tail.judge(m, x)
	}
	return m.state.judge(m, x)
}

// exactScore is e's outlier score (recomputed where labelling used a
// shortcut).
func (ms *modelSet) exactScore(m *model, e *execRec) float64 {
	if m.detReady {
		return m.state.exact(m, ms.value(e), float64(e.score))
	}
	return float64(e.score)
}

// ModelKeys returns the keys of the detector's models (function names, or
// call paths with Config.ByCallPath) in the order they were first met. Call
// it from the detector's goroutine, or once it is closed.
func (d *Detector) ModelKeys() []string {
	out := make([]string, len(d.models.list))
	for i, m := range d.models.list {
		out[i] = m.name
	}
	return out
}
