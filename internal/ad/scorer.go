package ad

import (
	"math"

	"github.com/kipimo-hpc/kipimo/internal/stats"
)

// scorer is one outlier algorithm's configuration; newState makes the state
// one model keeps for it. histogram says whether the algorithm needs the
// merged HBOS histogram.
type scorer interface {
	histogram() bool
	newState() scoreState
}

// scoreState is one model's state of the algorithm, its own and no other
// algorithm's. reset builds it from the model's merged statistics (m.det,
// the natural range, and h, the merged histogram, when the scorer's
// histogram says it needs one); judge scores a runtime against it and says
// whether the algorithm flags it; score is judge's score alone, as cheaply
// as the algorithm allows (for runtimes inside the natural range, which no
// algorithm may flag); exact recomputes a score judge took a shortcut for.
type scoreState interface {
	reset(m *model, h stats.Histogram)
	judge(m *model, x float64) (score float64, flagged bool)
	score(m *model, x float64) float64
	exact(m *model, x, score float64) float64
}

// newScorer returns the scorer of cfg.Algorithm (validated).
func newScorer(cfg *Config) scorer {
	switch cfg.Algorithm {
	case Tail:
		return &tailScorer{resolution: cfg.Resolution, slowOnly: cfg.SlowOnly}
	case SSTD:
		return &sstdScorer{sigma: cfg.Sigma, slowOnly: cfg.SlowOnly}
	case HBOS:
		return &hbosScorer{threshold: cfg.Threshold, isolation: cfg.Isolation, maxMass: cfg.MaxMass, slowOnly: cfg.SlowOnly}
	default:
		return &copodScorer{threshold: cfg.Threshold, isolation: cfg.Isolation, maxMass: cfg.MaxMass, slowOnly: cfg.SlowOnly, massOnly: !cfg.Chimbuko}
	}
}

// tailScorer flags runtimes outside the natural range; its score is the
// ratio to the natural maximum (or of the natural minimum to the runtime,
// below the range). It keeps no state of its own: the natural range is
// every algorithm's.
type tailScorer struct {
	resolution float64
	slowOnly   bool
}

func (s *tailScorer) histogram() bool      { return false }
func (s *tailScorer) newState() scoreState { return s }

func (*tailScorer) reset(*model, stats.Histogram) {}
func (s *tailScorer) judge(m *model, x float64) (float64, bool) {
	if x < m.natLowThr && !s.slowOnly {
		return m.natMin / max(x, s.resolution), true
	}
	return x / max(m.natMax, s.resolution), x > m.natThr
}
func (s *tailScorer) score(m *model, x float64) float64      { v, _ := s.judge(m, x); return v }
func (*tailScorer) exact(_ *model, _, score float64) float64 { return score }

// sstdScorer is Chimbuko's SSTD: |x - mean| / σ, flagged beyond sigma σ.
type sstdScorer struct {
	sigma    float64
	slowOnly bool
}

func (s *sstdScorer) histogram() bool      { return false }
func (s *sstdScorer) newState() scoreState { return &sstdState{cfg: s} }

// sstdState is a model's SSTD state: σ of its merged moments and the bounds
// beyond which it flags.
type sstdState struct {
	cfg    *sstdScorer
	std    float64
	lo, hi float64
}

func (s *sstdState) reset(m *model, _ stats.Histogram) {
	s.std = m.det.Stddev()
	s.lo = m.det.Mean - s.cfg.sigma*s.std
	s.hi = m.det.Mean + s.cfg.sigma*s.std
}
func (s *sstdState) judge(m *model, x float64) (float64, bool) {
	std := s.std
	if std == 0 {
		std = 1e-10
	}
	return math.Abs(x-m.det.Mean) / std, x > s.hi || (!s.cfg.slowOnly && x < s.lo)
}
func (s *sstdState) score(m *model, x float64) float64      { v, _ := s.judge(m, x); return v }
func (*sstdState) exact(_ *model, _, score float64) float64 { return score }

// hbosScorer is Chimbuko's HBOS: -log2 of the value's bin probability,
// flagged beyond a fraction of the score range; with isolation, -log2 of
// the mass within isolation bins of the value, flagged below maxMass.
type hbosScorer struct {
	threshold, maxMass float64
	isolation          int
	slowOnly           bool
}

func (s *hbosScorer) histogram() bool      { return true }
func (s *hbosScorer) newState() scoreState { return &hbosState{cfg: s} }

// hbosState is a model's HBOS state: its merged histogram's scores.
type hbosState struct {
	cfg *hbosScorer
	s   stats.HBOSScorer
}

func (s *hbosState) reset(_ *model, h stats.Histogram) {
	s.s.Reset(h, s.cfg.threshold)
}
func (s *hbosState) judge(m *model, x float64) (float64, bool) {
	slow := !s.cfg.slowOnly || x > m.det.Mean
	if s.cfg.isolation > 0 {
		mass := s.s.WindowMass(x, s.cfg.isolation)
		return -math.Log2(mass + stats.HBOSAlpha), mass < s.cfg.maxMass && slow
	}
	score := s.s.Score(x)
	return score, score >= s.s.Threshold && slow
}
func (s *hbosState) score(m *model, x float64) float64 {
	if s.cfg.isolation > 0 {
		// the window's mass is at least the value's bin's: the bin's score
		// ranks runtimes inside the range as well, at a bin lookup
		return s.s.Score(x)
	}
	v, _ := s.judge(m, x)
	return v
}
func (*hbosState) exact(_ *model, _, score float64) float64 { return score }

// copodScorer is Chimbuko's COPOD tail score, flagged beyond a fraction of
// the score range; with isolation, also only below maxMass in the window
// (massOnly, outside Chimbuko's rules: by that window alone).
type copodScorer struct {
	threshold, maxMass float64
	isolation          int
	slowOnly, massOnly bool
}

func (s *copodScorer) histogram() bool      { return true }
func (s *copodScorer) newState() scoreState { return &copodState{cfg: s} }

// copodState is a model's COPOD state: its merged histogram's tail
// probabilities.
type copodState struct {
	cfg *copodScorer
	s   stats.COPODScorer
}

func (s *copodState) reset(m *model, h stats.Histogram) {
	s.s.Reset(h, m.det.Skewness(), s.cfg.threshold)
}
func (s *copodState) judge(m *model, x float64) (float64, bool) {
	c := s.cfg
	score, _ := s.s.ScoreFast(x)
	if c.massOnly && c.isolation > 0 {
		return score, s.s.WindowMass(x, c.isolation) < c.maxMass && (!c.slowOnly || x > m.det.Mean)
	}
	anom := score >= s.s.Threshold && (!c.slowOnly || x > m.det.Mean)
	if anom && c.isolation > 0 {
		anom = s.s.WindowMass(x, c.isolation) < c.maxMass
	}
	return score, anom
}
func (s *copodState) score(_ *model, x float64) float64 {
	v, _ := s.s.ScoreFast(x)
	return v
}
func (s *copodState) exact(_ *model, x, score float64) float64 {
	if s.cfg.isolation == 0 {
		return s.s.Score(x)
	}
	return score
}
