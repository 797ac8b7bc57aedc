package stats

import (
	"fmt"
	"math"
)

// TailBinsPerOctave is the resolution of a TailHist: bin edges are
// 2^(i/TailBinsPerOctave) - 1 µs, so each bin is about 9% wide and the first
// bins hold one timer tick each (0, 1, 2, 3 µs...).
const TailBinsPerOctave = 8

// tailMaxBin bounds bin indices (2^64 µs is far beyond any runtime).
const tailMaxBin = 64 * TailBinsPerOctave

// tailEdges[k] is 2^(k/TailBinsPerOctave): the sub-bin edges of an octave.
var tailEdges = func() (e [TailBinsPerOctave]float64) {
	for k := range e {
		e[k] = math.Exp2(float64(k) / TailBinsPerOctave)
	}
	return e
}()

// tailSub maps the top 6 bits of a mantissa m in [1, 2) to the largest k
// with tailEdges[k] at or below the smallest m of that bit pattern; the
// answer is that k or the next one.
var tailSub = func() (t [64]uint8) {
	for i := range t {
		m := 1 + float64(i)/64
		k := TailBinsPerOctave - 1
		for k > 0 && m < tailEdges[k] {
			k--
		}
		t[i] = uint8(k)
	}
	return t
}()

// TailBin returns the bin of runtime x (µs), floor(8·log2(1+x)), computed
// from the float's bits and a table (it is on the detector's hot path).
// Negative values and NaN count as 0.
func TailBin(x float64) int {
	if !(x > 0) {
		return 0
	}
	if x >= 1<<62 {
		return tailMaxBin
	}
	bits := math.Float64bits(1 + x)
	e := int(bits>>52&0x7ff) - 1023
	k := int(tailSub[bits>>46&63])
	if k < TailBinsPerOctave-1 {
		if m := math.Float64frombits(bits&(1<<52-1) | 1023<<52); m >= tailEdges[k+1] {
			k++
		}
	}
	return e*TailBinsPerOctave + k
}

// TailHist is a histogram of runtimes on fixed logarithmic bins that also
// keeps the smallest and largest value of every bin. Its bins never move, so
// merging two of them is exact and independent of order (counts add, bounds
// take min and max): the detectors of every rank and the parameter server
// hold the same model whatever the order their deltas arrive in. It is what
// the natural range of a function (NaturalMax) is read from.
//
// Bin i covers [2^(i/8) - 1, 2^((i+1)/8) - 1) µs; Lo is the index of
// Counts[0]. Counts, Mins and Maxs have the same length; an empty bin has
// count 0 and bounds 0. The zero value is an empty histogram.
type TailHist struct {
	Lo     int       `json:"lo"`
	Counts []uint64  `json:"counts"`
	Mins   []float64 `json:"mins"`
	Maxs   []float64 `json:"maxs"`
}

// N is the number of values counted.
func (h *TailHist) N() uint64 {
	var n uint64
	for _, c := range h.Counts {
		n += c
	}
	return n
}

// Empty reports whether h counts nothing.
func (h *TailHist) Empty() bool { return len(h.Counts) == 0 }

// Reset empties h, keeping its storage.
func (h *TailHist) Reset() {
	h.Lo = 0
	h.Counts, h.Mins, h.Maxs = h.Counts[:0], h.Mins[:0], h.Maxs[:0]
}

// grow makes bins lo..hi (inclusive) addressable.
func (h *TailHist) grow(lo, hi int) {
	if len(h.Counts) == 0 {
		h.Lo = lo
		n := hi - lo + 1
		h.Counts = append(h.Counts[:0], make([]uint64, n)...)
		h.Mins = append(h.Mins[:0], make([]float64, n)...)
		h.Maxs = append(h.Maxs[:0], make([]float64, n)...)
		return
	}
	if lo < h.Lo {
		k := h.Lo - lo
		h.Counts = append(make([]uint64, k, k+len(h.Counts)), h.Counts...)
		h.Mins = append(make([]float64, k, k+len(h.Mins)), h.Mins...)
		h.Maxs = append(make([]float64, k, k+len(h.Maxs)), h.Maxs...)
		h.Lo = lo
	}
	if top := h.Lo + len(h.Counts) - 1; hi > top {
		k := hi - top
		h.Counts = append(h.Counts, make([]uint64, k)...)
		h.Mins = append(h.Mins, make([]float64, k)...)
		h.Maxs = append(h.Maxs, make([]float64, k)...)
	}
}

// Add counts value x.
func (h *TailHist) Add(x float64) {
	if !(x > 0) {
		x = 0
	}
	b := TailBin(x)
	i := b - h.Lo
	if uint(i) >= uint(len(h.Counts)) {
		h.grow(b, b)
		i = b - h.Lo
	}
	switch {
	case h.Counts[i] == 0:
		h.Mins[i], h.Maxs[i] = x, x
	case x < h.Mins[i]:
		h.Mins[i] = x
	case x > h.Maxs[i]:
		h.Maxs[i] = x
	}
	h.Counts[i]++
}

// Validate reports whether h is well formed: slices of one length, bins in
// range, and every counted bin's bounds inside the bin.
func (h *TailHist) Validate() error {
	if len(h.Mins) != len(h.Counts) || len(h.Maxs) != len(h.Counts) {
		return fmt.Errorf("tail histogram: %d counts, %d mins, %d maxs", len(h.Counts), len(h.Mins), len(h.Maxs))
	}
	if len(h.Counts) == 0 {
		return nil
	}
	if h.Lo < 0 || h.Lo+len(h.Counts)-1 > tailMaxBin {
		return fmt.Errorf("tail histogram: bins %d..%d out of [0, %d]", h.Lo, h.Lo+len(h.Counts)-1, tailMaxBin)
	}
	for i, c := range h.Counts {
		if c == 0 {
			continue
		}
		b := h.Lo + i
		if TailBin(h.Mins[i]) != b || TailBin(h.Maxs[i]) != b || h.Mins[i] > h.Maxs[i] {
			return fmt.Errorf("tail histogram: bin %d has bounds [%v, %v] outside it", b, h.Mins[i], h.Maxs[i])
		}
	}
	return nil
}

// Merge adds o's counts into h. It fails, leaving h unchanged, when o is
// malformed (see Validate).
func (h *TailHist) Merge(o TailHist) error {
	if err := o.Validate(); err != nil {
		return err
	}
	if len(o.Counts) == 0 {
		return nil
	}
	h.grow(o.Lo, o.Lo+len(o.Counts)-1)
	for j, c := range o.Counts {
		if c == 0 {
			continue
		}
		i := o.Lo + j - h.Lo
		if h.Counts[i] == 0 {
			h.Mins[i], h.Maxs[i] = o.Mins[j], o.Maxs[j]
		} else {
			h.Mins[i] = min(h.Mins[i], o.Mins[j])
			h.Maxs[i] = max(h.Maxs[i], o.Maxs[j])
		}
		h.Counts[i] += c
	}
	return nil
}

// Clone returns a deep copy of h.
func (h TailHist) Clone() TailHist {
	return TailHist{Lo: h.Lo, Counts: append([]uint64(nil), h.Counts...),
		Mins: append([]float64(nil), h.Mins...), Maxs: append([]float64(nil), h.Maxs...)}
}

// TailRule says how the natural range of a histogram is read.
type TailRule struct {
	// Ratio is how far beyond a value the next one may lie and still belong
	// to the same body of values; it is also how far beyond the natural
	// maximum a value must lie to be outside the natural range.
	Ratio float64 `json:"ratio"`
	// Recur is how many values per bin it occupies a mode beyond a gap
	// needs to belong to the natural range whatever the gap below it (a
	// mode WideRatio wide or more: at most twice Recur all together): a runtime
	// that keeps coming back is the function's behaviour, however far it
	// sits from the rest.
	Recur uint64 `json:"recur"`
	// RecurFrac is the fraction of the values counted a mode must also
	// hold, its bins taken together, or DenseShare of it (FarDenseShare
	// for a mode FarRatio beyond) within Ratio of each other: at scale, a
	// mode must hold a share of the runtimes, not a fixed count, to be
	// behaviour rather than a cluster of rare anomalies.
	RecurFrac float64 `json:"recur_frac"`
	// Resolution is the timer resolution in µs: a value must exceed the
	// natural maximum by more than this.
	Resolution float64 `json:"resolution"`
	// Alpha is the false-alarm rate: once the histogram holds at least
	// 1/Alpha values, the natural range never ends below its (1-Alpha)
	// quantile, except across a clear gap (see NaturalRange). 0 reads the
	// range without it.
	Alpha float64 `json:"alpha,omitempty"`
}

// DenseShare is the share of RecurFrac that the values of a mode within
// Ratio of each other need to make it natural: a mode concentrated on a few
// runtimes is behaviour at a smaller share of the calls than one spread
// thin, which is what a cluster of rare anomalies looks like.
const DenseShare = 0.3

// FarRatio and FarDenseShare: a mode that starts FarRatio or more beyond
// the top of the range below it sits where stalls sit, and its values within
// Ratio of each other need FarDenseShare of RecurFrac instead: a rare stall
// also holds its partners on other ranks as long, in the same function.
const (
	FarRatio      = 4
	FarDenseShare = 0.5
)

// WideRatio is how many times its smallest value a mode's largest value
// must be for the mode to be wide. A mode narrower than that needs Recur
// values per bin it occupies (a cluster of a few runtimes is where rare
// anomalies and a young model's first values sit); a wide one, spread over
// an octave or more, cannot hold that many per bin short of hundreds of
// values and is judged by its mass: RecurFrac of all values and twice
// Recur (a wait on another rank or a scheduler's delays spread over
// milliseconds in 1-15% of a small function's calls).
const WideRatio = 2

// ClearGapRatio is how far beyond the top of a natural range a value must
// lie for the gap below it to be clear: the quantile floor of the
// false-alarm rate does not cross it (TailRule.ClearGap).
const ClearGapRatio = 1.5

// NaturalMax returns the largest value of h's natural range (see
// NaturalRange).
func (h *TailHist) NaturalMax(r TailRule) float64 {
	_, hi := h.NaturalRange(r)
	return hi
}

// medianBin returns the index in h.Counts of the bin that holds the median
// of the n values counted (n > 0).
func (h *TailHist) medianBin(n uint64) int {
	half := (n + 1) / 2
	var cum uint64
	for i, c := range h.Counts {
		cum += c
		if cum >= half {
			return i
		}
	}
	return len(h.Counts) - 1
}

// recurFracs are how many values a mode beyond a gap needs, all its bins
// together (total) or within Ratio of each other (dense, and far for a mode
// FarRatio beyond), as a share of all the n values.
func (r TailRule) recurFracs(n uint64) (total, dense, far uint64) {
	share := func(f float64) uint64 { return uint64(math.Ceil(f * r.RecurFrac * float64(n))) }
	return share(1), share(DenseShare), share(FarDenseShare)
}

// ClearGap is the smallest value beyond a clear gap above m, the largest
// value taken so far: ClearGapRatio × m, and never below Threshold(m).
func (r TailRule) ClearGap(m float64) float64 {
	return max(ClearGapRatio*m, r.Threshold(m))
}

// recurs reports whether the mode made of the nonempty bins among i..j-1
// (each within the Threshold of the one before) holds enough values to be
// natural: at least total of all values and, all together, Recur per
// nonempty bin, or at most twice Recur for a wide mode (see WideRatio); or at least
// dense and twice Recur per nonempty bin within the Threshold of the
// smallest value of one of its bins (a window gathers a few bins' values: a
// handful of anomalies in a young model must not pass).
func (h *TailHist) recurs(r TailRule, i, j int, total, dense uint64) bool {
	var all, win uint64
	var allBins, winBins uint64
	lowest, highest := -1.0, 0.0
	b := i
	for a := i; a < j; a++ {
		c := h.Counts[a]
		if c == 0 {
			continue
		}
		all += c
		allBins++
		if lowest < 0 {
			lowest = h.Mins[a]
		}
		highest = h.Maxs[a]
		// the window of bins from a whose values lie within Threshold(Mins[a])
		if b <= a {
			b, win, winBins = a, 0, 0
		}
		for ; b < j && h.Maxs[b] <= r.Threshold(h.Mins[a]); b++ {
			if h.Counts[b] > 0 {
				win += h.Counts[b]
				winBins++
			}
		}
		if win >= max(dense, 2*r.Recur*winBins) {
			return true
		}
		win -= c
		winBins--
	}
	need := r.Recur * allBins
	if highest >= WideRatio*lowest {
		need = min(need, 2*r.Recur)
	}
	return all >= max(total, need)
}

// NaturalRange returns the smallest and largest values of h's natural range.
// Starting from the median's bin, going up, a bin is taken when its smallest
// value is not beyond the Threshold of the largest value taken so far (the
// body of values is continuous). Beyond a gap, the bins that follow each
// other each within the Threshold of the one below form a mode, and the mode
// is taken, all of it, when it recurs: when its bins together hold at least
// RecurFrac of all values (a mode spread over many bins is
// judged by its total mass, not bin by bin), or when its values within the
// Threshold of each other hold at least DenseShare × RecurFrac of all
// (FarDenseShare × RecurFrac for a mode that starts FarRatio beyond) and
// twice Recur values per bin they occupy; all together, at least Recur
// per bin, or at most twice Recur for a mode WideRatio wide or more. A mode that
// does not stays outside and the scan goes on past it, so a
// recurring mode beyond isolated values is still found. Going down is the
// same with LowThreshold.
//
// Then, with a false-alarm rate Alpha and at least 1/Alpha values, the top
// of the range is raised towards the (1-Alpha) quantile (the smallest bin
// above which at most Alpha of the values lie), bin by bin, until a bin
// starts at or beyond the ClearGap of the largest value taken: a sparse
// tail is natural up to the quantile, but rare values beyond a clear gap (a
// stall at 10x the body in 0.1% of the calls) stay outside whatever Alpha.
//
// It reads every bin a few times and returns 0, 0 for an empty histogram.
func (h *TailHist) NaturalRange(r TailRule) (lo, hi float64) {
	n := h.N()
	if n == 0 {
		return 0, 0
	}
	start := h.medianBin(n)
	total, dense, far := r.recurFracs(n)
	lo, hi = h.Mins[start], h.Maxs[start]
	for i := start + 1; i < len(h.Counts); {
		if h.Counts[i] == 0 {
			i++
			continue
		}
		if h.Mins[i] <= r.Threshold(hi) {
			hi = max(hi, h.Maxs[i])
			i++
			continue
		}
		// a mode beyond a gap: bins i..j-1
		top := h.Maxs[i]
		j := i + 1
		for ; j < len(h.Counts); j++ {
			if h.Counts[j] > 0 {
				if h.Mins[j] > r.Threshold(top) {
					break
				}
				top = h.Maxs[j]
			}
		}
		d := dense
		if h.Mins[i] >= FarRatio*hi {
			d = far
		}
		if h.recurs(r, i, j, total, d) {
			hi = top
		}
		i = j
	}
	for i := start - 1; i >= 0; {
		if h.Counts[i] == 0 {
			i--
			continue
		}
		if h.Maxs[i] >= r.LowThreshold(lo) {
			lo = min(lo, h.Mins[i])
			i--
			continue
		}
		// a mode below a gap: bins j+1..i
		bottom := h.Mins[i]
		j := i - 1
		for ; j >= 0; j-- {
			if h.Counts[j] > 0 {
				if h.Maxs[j] < r.LowThreshold(bottom) {
					break
				}
				bottom = h.Mins[j]
			}
		}
		if h.recurs(r, j+1, i+1, total, dense) {
			lo = bottom
		}
		i = j
	}
	return lo, h.alphaFloor(r, n, start, hi)
}

// alphaFloor raises hi, the top of a natural range read from the median's
// bin start, towards the (1-Alpha) quantile of h's n values, stopping at a
// clear gap (see NaturalRange).
func (h *TailHist) alphaFloor(r TailRule, n uint64, start int, hi float64) float64 {
	a := r.Alpha
	if !(a > 0 && a < 1) || a*float64(n) < 1 {
		return hi
	}
	allow := uint64(a * float64(n)) // values the range may leave above it
	var above uint64
	k := len(h.Counts) - 1
	for ; k > start; k-- {
		if above+h.Counts[k] > allow {
			break
		}
		above += h.Counts[k]
	}
	for i := start + 1; i <= k; i++ {
		if h.Counts[i] == 0 || h.Maxs[i] <= hi {
			continue
		}
		if h.Mins[i] >= r.ClearGap(hi) {
			break
		}
		hi = h.Maxs[i]
	}
	return hi
}

// LowThreshold is the smallest value inside the natural range whose minimum
// is m: m / Ratio², and at least ten Resolutions below m. Values below it are
// outside (unusually fast). The lower side is stricter than the upper: a
// call a few ticks faster than usual is not worth a record.
func (r TailRule) LowThreshold(m float64) float64 {
	return min(m/(r.Ratio*r.Ratio), m-10*r.Resolution)
}

// Threshold is the largest value inside the natural range whose maximum is
// m: Ratio × m, and at least one Resolution above m, so that the next timer
// tick is never out of range (a function whose runtimes are 0, 1 or 2 µs has
// all three as natural levels, however rare the last). Values beyond it are
// outside.
func (r TailRule) Threshold(m float64) float64 {
	return max(r.Ratio*m, m+r.Resolution)
}

// Quantile returns an estimate of the q-quantile (0 ≤ q ≤ 1) of the counted
// values: the largest value of the bin where the cumulative count reaches q.
func (h *TailHist) Quantile(q float64) float64 {
	n := h.N()
	if n == 0 {
		return 0
	}
	want := uint64(math.Ceil(q * float64(n)))
	want = max(want, 1)
	var cum uint64
	for i, c := range h.Counts {
		cum += c
		if cum >= want {
			return h.Maxs[i]
		}
	}
	return h.Maxs[len(h.Maxs)-1]
}

// LogMoments returns the mean and standard deviation of ln(1+x) over the
// counted values, each bin taken at the log of its midpoint value.
func (h *TailHist) LogMoments() (mean, std float64) {
	var m Moments
	for i, c := range h.Counts {
		if c == 0 {
			continue
		}
		v := math.Log1p((h.Mins[i] + h.Maxs[i]) / 2)
		m.Merge(Moments{N: float64(c), Mean: v, Min: v, Max: v})
	}
	return m.Mean, m.Stddev()
}
