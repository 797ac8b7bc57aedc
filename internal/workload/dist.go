package workload

import (
	"math"
	"slices"
)

// empirical resamples the exclusive runtimes a trace recorded for one
// function: every draw is one of the recorded values, uniformly, so the
// replay keeps the trace's quantiles, tails and microsecond quantisation.
type empirical struct {
	v    []uint64 // sorted
	mean float64
}

func newEmpirical(values []uint64) *empirical {
	v := slices.Clone(values)
	slices.Sort(v)
	var s float64
	for _, x := range v {
		s += float64(x)
	}
	return &empirical{v: v, mean: s / float64(max(1, len(v)))}
}

func (e *empirical) draw(r *splitMix, _ uint32, _ uint64) uint64 {
	return e.v[r.intn(uint64(len(e.v)))]
}
func (e *empirical) max() uint64        { return e.v[len(e.v)-1] }
func (e *empirical) min() uint64        { return e.v[0] }
func (e *empirical) meanValue() float64 { return e.mean }

// Shapes of the realistic profile's distributions.
const (
	shapeLogNormal = iota // median a, log-sd b, truncated at ±3.5 log-sd
	shapeBimodal          // weight w of mode (a ± 3c), else mode (b ± 3d), bounded bells
	shapePareto           // scale a, tail index b, capped at c (rejection)
	shapeLevels           // whole µs 0, 1, 2, ... with weights levels
)

// synth is a distribution of the realistic profile: a bounded base shape,
// scaled by the rank's imbalance factor and by a slow drift over the run's
// steps, rounded to whole microseconds.
type synth struct {
	shape      int
	a, b, c, d float64
	w          float64
	levels     []float64 // cumulative weights of 0, 1, 2, ... µs
	// imb: rank r's values are (1 + imb*rankFrac[r]) times the base.
	imb      float64
	rankFrac []float64
	// drift: values in step s are (1 + drift*s/(steps-1)) times the base.
	drift float64
	steps uint64
}

// normal returns a standard normal variate (Box-Muller).
func normal(r *splitMix) float64 {
	u := 1 - r.float() // (0, 1]
	v := r.float()
	return math.Sqrt(-2*math.Log(u)) * math.Cos(2*math.Pi*v)
}

const logTrunc = 3.5

func (s *synth) base(r *splitMix) float64 {
	switch s.shape {
	case shapeLogNormal:
		for {
			z := normal(r)
			if math.Abs(z) <= logTrunc {
				return s.a * math.Exp(s.b*z)
			}
		}
	case shapeBimodal:
		if r.float() < s.w {
			return s.a + s.c*noise3(r.next())
		}
		return s.b + s.d*noise3(r.next())
	case shapePareto:
		for {
			x := s.a * math.Pow(1-r.float(), -1/s.b)
			if x <= s.c {
				return x
			}
		}
	default: // shapeLevels
		u := r.float()
		for i, c := range s.levels {
			if u < c {
				return float64(i)
			}
		}
		return float64(len(s.levels) - 1)
	}
}

func (s *synth) baseRange() (lo, hi float64) {
	switch s.shape {
	case shapeLogNormal:
		return s.a * math.Exp(-logTrunc*s.b), s.a * math.Exp(logTrunc*s.b)
	case shapeBimodal:
		return min(s.a-3*s.c, s.b-3*s.d), max(s.a+3*s.c, s.b+3*s.d)
	case shapePareto:
		return s.a, s.c
	default:
		return 0, float64(len(s.levels) - 1)
	}
}

func (s *synth) factor(rank uint32, step uint64) float64 {
	f := 1.0
	if s.imb != 0 {
		f *= 1 + s.imb*s.rankFrac[rank]
	}
	if s.drift != 0 && s.steps > 1 {
		f *= 1 + s.drift*float64(min(step, s.steps-1))/float64(s.steps-1)
	}
	return f
}

func (s *synth) draw(r *splitMix, rank uint32, step uint64) uint64 {
	return uint64(s.base(r)*s.factor(rank, step) + 0.5)
}

// factorRange is the smallest and largest factor over all ranks and steps.
func (s *synth) factorRange() (lo, hi float64) {
	lo, hi = 1, 1
	if s.imb != 0 {
		flo, fhi := 1.0, 0.0
		for _, x := range s.rankFrac {
			flo, fhi = min(flo, x), max(fhi, x)
		}
		lo, hi = 1+s.imb*flo, 1+s.imb*fhi
	}
	if s.drift != 0 && s.steps > 1 {
		hi *= 1 + s.drift
	}
	return lo, hi
}

func (s *synth) max() uint64 {
	_, bh := s.baseRange()
	_, fh := s.factorRange()
	return uint64(bh*fh + 0.5)
}

func (s *synth) min() uint64 {
	bl, _ := s.baseRange()
	fl, _ := s.factorRange()
	return uint64(bl*fl + 0.5)
}

func (s *synth) meanValue() float64 {
	var m float64
	switch s.shape {
	case shapeLogNormal:
		m = s.a * math.Exp(s.b*s.b/2)
	case shapeBimodal:
		m = s.w*s.a + (1-s.w)*s.b
	case shapePareto:
		// Mean of the Pareto law truncated at c.
		a, b, c := s.a, s.b, s.c
		if b == 1 {
			m = a * math.Log(c/a) / (1 - a/c)
		} else {
			m = b * math.Pow(a, b) / (1 - b) * (math.Pow(c, 1-b) - math.Pow(a, 1-b)) / (1 - math.Pow(a/c, b))
		}
	default:
		prev := 0.0
		for i, c := range s.levels {
			m += float64(i) * (c - prev)
			prev = c
		}
	}
	lo, hi := s.factorRange()
	return m * (lo + hi) / 2
}
