package ad

import (
	"math"

	"github.com/kipimo-hpc/kipimo/internal/stats"
)

// scorer is one outlier algorithm. reset builds a model's detection state
// from its merged statistics (m.det, the natural range, and h, the merged
// histogram, when histogram says the algorithm needs one); judge scores a
// runtime against that state and says whether the algorithm flags it; score
// is judge's score alone, as cheaply as the algorithm allows (for runtimes
// inside the natural range, which no algorithm may flag); exact recomputes a
// score judge took a shortcut for. A scorer holds only its configuration:
// the state is the model's.
type scorer interface {
	histogram() bool
	reset(m *model, h stats.Histogram)
	judge(m *model, x float64) (score float64, flagged bool)
	score(m *model, x float64) float64
	exact(m *model, x, score float64) float64
}

// newScorer returns the scorer of cfg.Algorithm (validated).
func newScorer(cfg *Config) scorer {
	switch cfg.Algorithm {
	case Tail:
		return tailScorer{resolution: cfg.Resolution, slowOnly: cfg.SlowOnly}
	case SSTD:
		return sstdScorer{sigma: cfg.Sigma, slowOnly: cfg.SlowOnly}
	case HBOS:
		return hbosScorer{threshold: cfg.Threshold, isolation: cfg.Isolation, maxMass: cfg.MaxMass, slowOnly: cfg.SlowOnly}
	default:
		return copodScorer{threshold: cfg.Threshold, isolation: cfg.Isolation, maxMass: cfg.MaxMass, slowOnly: cfg.SlowOnly, massOnly: !cfg.Chimbuko}
	}
}

// tailScorer flags runtimes outside the natural range; its score is the
// ratio to the natural maximum (or of the natural minimum to the runtime,
// below the range).
type tailScorer struct {
	resolution float64
	slowOnly   bool
}

func (tailScorer) histogram() bool               { return false }
func (tailScorer) reset(*model, stats.Histogram) {}
func (s tailScorer) judge(m *model, x float64) (float64, bool) {
	if x < m.natLowThr && !s.slowOnly {
		return m.natMin / max(x, s.resolution), true
	}
	return x / max(m.natMax, s.resolution), x > m.natThr
}
func (s tailScorer) score(m *model, x float64) float64      { v, _ := s.judge(m, x); return v }
func (tailScorer) exact(_ *model, _, score float64) float64 { return score }

// sstdScorer is Chimbuko's SSTD: |x - mean| / σ, flagged beyond sigma σ.
type sstdScorer struct {
	sigma    float64
	slowOnly bool
}

func (sstdScorer) histogram() bool { return false }
func (s sstdScorer) reset(m *model, _ stats.Histogram) {
	m.lo = m.det.Mean - s.sigma*m.std
	m.hi = m.det.Mean + s.sigma*m.std
}
func (s sstdScorer) judge(m *model, x float64) (float64, bool) {
	std := m.std
	if std == 0 {
		std = 1e-10
	}
	return math.Abs(x-m.det.Mean) / std, x > m.hi || (!s.slowOnly && x < m.lo)
}
func (s sstdScorer) score(m *model, x float64) float64      { v, _ := s.judge(m, x); return v }
func (sstdScorer) exact(_ *model, _, score float64) float64 { return score }

// hbosScorer is Chimbuko's HBOS: -log2 of the value's bin probability,
// flagged beyond a fraction of the score range; with isolation, -log2 of
// the mass within isolation bins of the value, flagged below maxMass.
type hbosScorer struct {
	threshold, maxMass float64
	isolation          int
	slowOnly           bool
}

func (hbosScorer) histogram() bool { return true }
func (s hbosScorer) reset(m *model, h stats.Histogram) {
	m.hbos.Reset(h, s.threshold)
}
func (s hbosScorer) judge(m *model, x float64) (float64, bool) {
	slow := !s.slowOnly || x > m.det.Mean
	if s.isolation > 0 {
		mass := m.hbos.WindowMass(x, s.isolation)
		return -math.Log2(mass + stats.HBOSAlpha), mass < s.maxMass && slow
	}
	score := m.hbos.Score(x)
	return score, score >= m.hbos.Threshold && slow
}
func (s hbosScorer) score(m *model, x float64) float64 {
	if s.isolation > 0 {
		// the window's mass is at least the value's bin's: the bin's score
		// ranks runtimes inside the range as well, at a bin lookup
		return m.hbos.Score(x)
	}
	v, _ := s.judge(m, x)
	return v
}
func (hbosScorer) exact(_ *model, _, score float64) float64 { return score }

// copodScorer is Chimbuko's COPOD tail score, flagged beyond a fraction of
// the score range; with isolation, also only below maxMass in the window
// (massOnly, outside Chimbuko's rules: by that window alone).
type copodScorer struct {
	threshold, maxMass float64
	isolation          int
	slowOnly, massOnly bool
}

func (copodScorer) histogram() bool { return true }
func (s copodScorer) reset(m *model, h stats.Histogram) {
	m.copod.Reset(h, m.det.Skewness(), s.threshold)
}
func (s copodScorer) judge(m *model, x float64) (float64, bool) {
	score, _ := m.copod.ScoreFast(x)
	if s.massOnly && s.isolation > 0 {
		return score, m.copod.WindowMass(x, s.isolation) < s.maxMass && (!s.slowOnly || x > m.det.Mean)
	}
	anom := score >= m.copod.Threshold && (!s.slowOnly || x > m.det.Mean)
	if anom && s.isolation > 0 {
		anom = m.copod.WindowMass(x, s.isolation) < s.maxMass
	}
	return score, anom
}
func (copodScorer) score(m *model, x float64) float64 {
	v, _ := m.copod.ScoreFast(x)
	return v
}
func (s copodScorer) exact(m *model, x, score float64) float64 {
	if s.isolation == 0 {
		return m.copod.Score(x)
	}
	return score
}
