package stats

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// HBOS defaults, as in Chimbuko's AD module.
const (
	// DefaultBins is the number of bins of every built or merged histogram.
	DefaultBins = 200
	// HBOSAlpha is added to a bin's probability before taking -log2, so that an
	// empty bin (or a value outside the histogram) scores -log2(HBOSAlpha) ≈ 100.
	HBOSAlpha = 78.88e-32
	// DefaultHBOSThreshold is the fraction of the bin-score range above the
	// minimum score at which values become anomalous.
	DefaultHBOSThreshold = 0.99
)

// MaxScore is the score of a value outside the histogram, or in an empty bin.
var MaxScore = -math.Log2(HBOSAlpha)

// minThreshold is the smallest threshold ever used (Chimbuko's initial global
// threshold log2(1.00001)): a histogram whose values all share one bin then
// labels that bin normal.
var minThreshold = math.Log2(1.00001)

// Histogram is an HBOS histogram over [FirstEdge, FirstEdge+BinWidth*len(Counts)].
//
// Bin i covers (FirstEdge + i*BinWidth, FirstEdge + (i+1)*BinWidth]: lower
// edges exclusive, upper edges inclusive. Min and Max are the smallest and
// largest values ever counted. The zero value is an empty histogram; merging
// into it copies the other side.
//
// Semantics follow Chimbuko's (src/core/util/Histogram.cpp):
//   - Build bins a sample into DefaultBins equal bins spanning [min, max], the
//     first edge placed 1e-6 of a bin width below min so that min falls in
//     bin 0; identical values give one bin of width 1e-12*|x| centred on them.
//   - Merge re-bins both sides over the union of their ranges with
//     DefaultBins bins, spreading each source bin's count uniformly over the
//     target bins it overlaps; counts stay integers and the total is exact.
//   - Scores: a bin with count c out of N scores -log2(c/N + HBOSAlpha).
//     Values outside the histogram (with a tolerance of 5% of a bin width at
//     each end) score MaxScore.
//   - Threshold: min + thres*(max-min) over the scores of non-empty bins (a
//     fraction of the score range, not a percentile), never below
//     log2(1.00001).
type Histogram struct {
	FirstEdge float64  `json:"first_edge"`
	BinWidth  float64  `json:"bin_width"`
	Counts    []uint64 `json:"counts"`
	Min       float64  `json:"min"`
	Max       float64  `json:"max"`
}

// Total is the number of values counted.
func (h *Histogram) Total() uint64 {
	var n uint64
	for _, c := range h.Counts {
		n += c
	}
	return n
}

// Empty reports whether h counts no value.
func (h *Histogram) Empty() bool { return len(h.Counts) == 0 || h.Total() == 0 }

// LastEdge is the upper edge of the last bin.
func (h *Histogram) LastEdge() float64 { return h.FirstEdge + h.BinWidth*float64(len(h.Counts)) }

// Validate reports whether h is well formed: finite edges, a positive bin width
// when it has bins, and Min <= Max when it counts values.
func (h *Histogram) Validate() error {
	if len(h.Counts) == 0 {
		return nil
	}
	if math.IsNaN(h.FirstEdge) || math.IsInf(h.FirstEdge, 0) {
		return fmt.Errorf("histogram first edge %v is not finite", h.FirstEdge)
	}
	if !(h.BinWidth > 0) || math.IsInf(h.BinWidth, 0) {
		return fmt.Errorf("histogram bin width %v is not a positive finite number", h.BinWidth)
	}
	if math.IsInf(h.LastEdge(), 0) {
		return fmt.Errorf("histogram last edge overflows (first edge %v, width %v, %d bins)", h.FirstEdge, h.BinWidth, len(h.Counts))
	}
	if h.Total() > 0 && (math.IsNaN(h.Min) || math.IsNaN(h.Max) || h.Min > h.Max) {
		return fmt.Errorf("histogram min %v and max %v are not ordered", h.Min, h.Max)
	}
	return nil
}

// layout returns the first edge and bin width of nbins bins spanning [lo, hi].
func layout(lo, hi float64, nbins int) (first, width float64) {
	if hi <= lo {
		w := 1e-12 * math.Abs(lo)
		if w == 0 || math.IsInf(lo+w, 0) {
			w = 1e-12
		}
		return lo - w/2, w
	}
	w0 := (hi - lo) / float64(nbins)
	first = lo - 1e-6*w0
	return first, (hi - first) / float64(nbins)
}

// BuildHistogram returns the histogram of values with nbins bins (DefaultBins
// when nbins <= 0) spanning [min, max]. Values that are NaN or infinite are
// skipped. An empty or all-skipped input gives an empty histogram.
func BuildHistogram(values []float64, nbins int) Histogram {
	var h Histogram
	h.Rebuild(values, nbins)
	return h
}

// Rebuild makes h the histogram of values, reusing h's Counts capacity.
func (h *Histogram) Rebuild(values []float64, nbins int) {
	if nbins <= 0 {
		nbins = DefaultBins
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, v := range values {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			continue
		}
		lo = math.Min(lo, v)
		hi = math.Max(hi, v)
	}
	h.Counts = h.Counts[:0]
	if lo > hi {
		*h = Histogram{Counts: h.Counts}
		return
	}
	n := nbins
	if hi == lo {
		n = 1
	}
	h.FirstEdge, h.BinWidth = layout(lo, hi, nbins)
	h.Counts = slices.Grow(h.Counts, n)[:n]
	clear(h.Counts)
	h.Min, h.Max = lo, hi
	for _, v := range values {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			continue
		}
		h.Counts[h.binClamped(v)]++
	}
}

// bin returns the bin of v, or -1 when v lies outside the histogram by more
// than 5% of a bin width.
func (h *Histogram) bin(v float64) int {
	if len(h.Counts) == 0 {
		return -1
	}
	tol := 0.05 * h.BinWidth
	if v <= h.FirstEdge-tol || v > h.LastEdge()+tol {
		return -1
	}
	return h.binClamped(v)
}

func (h *Histogram) binClamped(v float64) int {
	i := int(math.Ceil((v-h.FirstEdge)/h.BinWidth)) - 1
	if i < 0 || math.IsNaN(float64(i)) {
		return 0
	}
	if i >= len(h.Counts) {
		return len(h.Counts) - 1
	}
	return i
}

// Merge adds the values counted by o to h, preserving the total count exactly.
//
// The result has DefaultBins bins over [min(h.Min, o.Min), max(h.Max, o.Max)]
// (one bin when that range is a single value). Each source bin's count is
// spread over the target bins it overlaps in proportion to the overlap
// (uniform density within a bin, as Chimbuko's merge_histograms_uniform_int),
// with cumulative rounding so that every source bin hands out exactly its
// count. Merging an empty histogram is a no-op; merging into an empty one
// copies o. The parameter server merges detectors' deltas with it.
func (h *Histogram) Merge(o Histogram) error {
	if err := o.Validate(); err != nil {
		return fmt.Errorf("merge histogram: %w", err)
	}
	if o.Empty() {
		return nil
	}
	if h.Empty() {
		h.FirstEdge, h.BinWidth, h.Min, h.Max = o.FirstEdge, o.BinWidth, o.Min, o.Max
		h.Counts = append(h.Counts[:0], o.Counts...)
		return nil
	}
	if err := h.Validate(); err != nil {
		return fmt.Errorf("merge into histogram: %w", err)
	}
	lo, hi := math.Min(h.Min, o.Min), math.Max(h.Max, o.Max)
	// The sources may extend beyond [lo, hi] by their edge offsets; cover them.
	nb := DefaultBins
	if hi == lo {
		nb = 1
	}
	first, width := layout(lo, hi, nb)
	first = math.Min(first, math.Min(h.FirstEdge, o.FirstEdge))
	last := math.Max(first+width*float64(nb), math.Max(h.LastEdge(), o.LastEdge()))
	width = (last - first) / float64(nb)
	if !(width > 0) || math.IsInf(width, 0) {
		return errors.New("merge histogram: merged range has no width")
	}
	out := make([]uint64, nb)
	spread(out, first, width, h)
	spread(out, first, width, &o)
	h.FirstEdge, h.BinWidth, h.Counts = first, width, out
	h.Min, h.Max = lo, hi
	return nil
}

// spread distributes the counts of src over the bins of dst (first edge
// first, width width), uniformly within each source bin.
func spread(dst []uint64, first, width float64, src *Histogram) {
	nb := len(dst)
	for i, c := range src.Counts {
		if c == 0 {
			continue
		}
		a := src.FirstEdge + float64(i)*src.BinWidth
		b := a + src.BinWidth
		ja := int((a - first) / width)
		jb := int(math.Ceil((b-first)/width)) - 1
		ja = min(max(ja, 0), nb-1)
		jb = min(max(jb, ja), nb-1)
		if ja == jb {
			dst[ja] += c
			continue
		}
		var given uint64
		for j := ja; j <= jb; j++ {
			upper := first + float64(j+1)*width
			var want uint64
			if j == jb || upper >= b {
				want = c
			} else {
				frac := (upper - a) / src.BinWidth
				want = uint64(math.Round(frac * float64(c)))
				if want > c {
					want = c
				}
			}
			if want > given {
				dst[j] += want - given
				given = want
			}
			if given == c {
				break
			}
		}
	}
}

// HBOSScorer labels values against one histogram. Build it once per model
// update with NewHBOSScorer; Score is then a bin lookup. It is read-only after
// construction and safe for concurrent use.
type HBOSScorer struct {
	h         Histogram
	cum       []float64 // cum[i] = count of bins < i
	scores    []float64
	Threshold float64 // values scoring >= Threshold are anomalous
}

// NewHBOSScorer precomputes the bin scores of h and its threshold at fraction
// thres of the score range of non-empty bins (DefaultHBOSThreshold when thres
// is not in (0, 1]).
func NewHBOSScorer(h Histogram, thres float64) *HBOSScorer {
	s := &HBOSScorer{}
	s.Reset(h, thres)
	return s
}

// Reset rebuilds s for histogram h, reusing its memory. h's counts are copied.
func (s *HBOSScorer) Reset(h Histogram, thres float64) {
	if !(thres > 0 && thres <= 1) {
		thres = DefaultHBOSThreshold
	}
	s.h = h
	s.h.Counts = append(s.h.Counts[:0], h.Counts...)
	s.scores = slices.Grow(s.scores[:0], len(h.Counts))[:len(h.Counts)]
	s.cum = prefix(s.cum, h.Counts)
	total := float64(h.Total())
	lo, hi := math.Inf(1), math.Inf(-1)
	for i, c := range h.Counts {
		if c == 0 {
			s.scores[i] = MaxScore
			continue
		}
		sc := -math.Log2(float64(c)/total + HBOSAlpha)
		s.scores[i] = sc
		lo = math.Min(lo, sc)
		hi = math.Max(hi, sc)
	}
	if lo > hi {
		s.Threshold = MaxScore
		return
	}
	s.Threshold = math.Max(lo+thres*(hi-lo), minThreshold)
}

// Histogram returns the histogram s was last Reset with; its counts are
// s's own (read them, do not modify them). Resetting a scorer with it
// rebuilds s exactly (a detector's checkpoint keeps only this).
func (s *HBOSScorer) Histogram() Histogram { return s.h }

// Histogram returns the histogram s was last Reset with; its counts are
// s's own (read them, do not modify them). Resetting a scorer with it and
// the same skewness and threshold rebuilds s exactly.
func (s *COPODScorer) Histogram() Histogram { return s.h }

// WindowMass is the fraction of the histogram's values within w bins of v's
// bin (0 outside the histogram).
func (s *HBOSScorer) WindowMass(v float64, w int) float64 { return windowMass(&s.h, s.cum, v, w) }

// WindowMass is the fraction of the histogram's values within w bins of v's
// bin (0 outside the histogram).
func (s *COPODScorer) WindowMass(v float64, w int) float64 { return windowMass(&s.h, s.cum, v, w) }

func windowMass(h *Histogram, cum []float64, v float64, w int) float64 {
	i := h.bin(v)
	total := cum[len(cum)-1]
	if i < 0 || total == 0 {
		return 0
	}
	lo, hi := max(i-w, 0), min(i+w+1, len(h.Counts))
	return (cum[hi] - cum[lo]) / total
}

func prefix(dst []float64, counts []uint64) []float64 {
	dst = slices.Grow(dst[:0], len(counts)+1)[:len(counts)+1]
	var acc float64
	for i, c := range counts {
		dst[i] = acc
		acc += float64(c)
	}
	dst[len(counts)] = acc
	return dst
}

// Score is the HBOS score of v: its bin's score, or MaxScore outside the
// histogram.
func (s *HBOSScorer) Score(v float64) float64 {
	i := s.h.bin(v)
	if i < 0 {
		return MaxScore
	}
	return s.scores[i]
}

// COPODScorer scores values by their empirical tail probabilities under a
// histogram, as Chimbuko's COPOD (after pyOD): with left and right ECDFs pL,
// pR interpolated uniformly within bins and shifted by 1/N, sL = -log2(pL+α),
// sR = -log2(pR+α); the skewness sign of the data picks the tail (right for
// positive skew, left for negative, both for none) and the score is
// max((sL+sR)/2, tail score). The threshold is a fraction of the range of the
// scores of the bin midpoints; values outside the histogram score MaxScore.
// It is read-only after construction and safe for concurrent use.
type COPODScorer struct {
	h         Histogram
	cum       []float64 // cum[i] = count of bins < i
	edgeMax   []float64 // largest score within bin i (at one of its edges)
	mid       []float64 // score at the middle of bin i
	total     float64
	skewSign  int
	Threshold float64
}

// NewCOPODScorer builds a scorer for h; skew is the skewness of the data the
// histogram counts; thres as for HBOS.
func NewCOPODScorer(h Histogram, skew, thres float64) *COPODScorer {
	s := &COPODScorer{}
	s.Reset(h, skew, thres)
	return s
}

// Reset rebuilds s for histogram h, reusing its memory.
func (s *COPODScorer) Reset(h Histogram, skew, thres float64) {
	if !(thres > 0 && thres <= 1) {
		thres = DefaultHBOSThreshold
	}
	s.h = h
	s.h.Counts = append(s.h.Counts[:0], h.Counts...)
	s.cum = prefix(s.cum, h.Counts)
	acc := s.cum[len(h.Counts)]
	s.total = acc
	switch {
	case skew > 0:
		s.skewSign = 1
	case skew < 0:
		s.skewSign = -1
	default:
		s.skewSign = 0
	}
	if acc == 0 {
		s.Threshold = MaxScore
		return
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for i, c := range h.Counts {
		if c == 0 {
			continue
		}
		sc := s.score(i, 0.5)
		lo = math.Min(lo, sc)
		hi = math.Max(hi, sc)
	}
	if hi < 0 {
		s.Threshold = lo - thres*(hi-lo)
	} else {
		s.Threshold = lo + thres*(hi-lo)
	}
	s.Threshold = math.Max(s.Threshold, minThreshold)
	// Within a bin the score is a maximum of convex functions of the position
	// (-log2 of affine ECDFs), so its largest value is at an edge.
	n := len(h.Counts)
	s.edgeMax = slices.Grow(s.edgeMax[:0], n)[:n]
	s.mid = slices.Grow(s.mid[:0], n)[:n]
	for i := range h.Counts {
		s.edgeMax[i] = math.Max(s.score(i, 0), s.score(i, 1))
		s.mid[i] = s.score(i, 0.5)
	}
}

// ScoreFast is Score, skipping the exact computation where it cannot matter:
// when every value of v's bin scores below the threshold it returns the
// bin's middle score and exact false (v is certainly normal).
func (s *COPODScorer) ScoreFast(v float64) (score float64, exact bool) {
	if s.total == 0 {
		return MaxScore, true
	}
	i := s.h.bin(v)
	if i < 0 {
		return MaxScore, true
	}
	if s.edgeMax[i] < s.Threshold {
		return s.mid[i], false
	}
	return s.Score(v), true
}

// score of a value at fraction f in (0,1] of bin i.
func (s *COPODScorer) score(i int, f float64) float64 {
	c := float64(s.h.Counts[i])
	below := s.cum[i] + f*c
	pL := below/s.total + 1/s.total
	pR := (s.total-below)/s.total + 1/s.total
	sL := -math.Log2(math.Min(pL, 1) + HBOSAlpha)
	sR := -math.Log2(math.Min(pR, 1) + HBOSAlpha)
	var tail float64
	switch s.skewSign {
	case 1:
		tail = sR
	case -1:
		tail = sL
	default:
		tail = sL + sR
	}
	return math.Max((sL+sR)/2, tail)
}

// Score is the COPOD score of v.
func (s *COPODScorer) Score(v float64) float64 {
	if s.total == 0 {
		return MaxScore
	}
	i := s.h.bin(v)
	if i < 0 {
		return MaxScore
	}
	lo := s.h.FirstEdge + float64(i)*s.h.BinWidth
	f := (v - lo) / s.h.BinWidth
	f = math.Min(math.Max(f, 0), 1)
	return s.score(i, f)
}
