package stats

import (
	"encoding/binary"
	"math"

	"github.com/kipimo-hpc/kipimo/internal/binio"
)

// The binary forms of the statistics types, used by the detector's
// checkpoints (internal/ad). Integers are unsigned varints (encoding/binary's
// Uvarint, Varint for Lo), floats 8 bytes little endian (their IEEE bits, so
// every value, NaN payloads included, comes back to the bit):
//
//	Moments:   0 (all fields 0) | 1, N, Mean, M2, M3, M4, Min, Max
//	Histogram: 0 (zero value, nil Counts) | 1, FirstEdge, BinWidth, Min, Max,
//	           0 (nil Counts) or len(Counts)+1, Counts...
//	TailHist:  Lo (signed varint), len(Counts), then per bin its count and
//	           0 (bounds 0) or 1, Min, Max
//	Summary:   Moments, Histogram, TailHist, Anomalies
//
// A decoder refuses (with an error, leaving its receiver zero) a form that is
// truncated, has a tag other than those or more bins than maxHistBins, or
// holds a histogram that Validate refuses.

// maxHistBins bounds the bins of a decoded Histogram, maxTailLo the first
// bin of a decoded TailHist (Validate bounds those of one that counts).
const (
	maxHistBins = 1 << 16
	maxTailLo   = 1 << 20
)

// AppendBinary appends the binary form of m to b. It never fails (the error
// is encoding.BinaryAppender's).
func (m *Moments) AppendBinary(b []byte) ([]byte, error) {
	if math.Float64bits(m.N)|math.Float64bits(m.Mean)|math.Float64bits(m.M2)|math.Float64bits(m.M3)|
		math.Float64bits(m.M4)|math.Float64bits(m.Min)|math.Float64bits(m.Max) == 0 {
		return append(b, 0), nil
	}
	b = append(b, 1)
	for _, v := range [...]float64{m.N, m.Mean, m.M2, m.M3, m.M4, m.Min, m.Max} {
		b = appendF64(b, v)
	}
	return b, nil
}

// DecodeBinary sets m from the binary form at the front of b and returns
// the number of bytes it took.
func (m *Moments) DecodeBinary(b []byte) (int, error) {
	d := decoder{binio.Reader{B: b}}
	d.moments(m)
	return d.done(func() { *m = Moments{} })
}

// AppendBinary appends the binary form of h to b. It never fails.
func (h *Histogram) AppendBinary(b []byte) ([]byte, error) {
	if h.Counts == nil && math.Float64bits(h.FirstEdge)|math.Float64bits(h.BinWidth)|math.Float64bits(h.Min)|math.Float64bits(h.Max) == 0 {
		return append(b, 0), nil
	}
	b = append(b, 1)
	for _, v := range [...]float64{h.FirstEdge, h.BinWidth, h.Min, h.Max} {
		b = appendF64(b, v)
	}
	if h.Counts == nil {
		b = binary.AppendUvarint(b, 0)
	} else {
		b = binary.AppendUvarint(b, uint64(len(h.Counts))+1)
	}
	for _, c := range h.Counts {
		b = binary.AppendUvarint(b, c)
	}
	return b, nil
}

// DecodeBinary sets h from the binary form at the front of b and returns
// the number of bytes it took.
func (h *Histogram) DecodeBinary(b []byte) (int, error) {
	d := decoder{binio.Reader{B: b}}
	d.histogram(h)
	return d.done(func() { *h = Histogram{} })
}

// AppendBinary appends the binary form of h to b. It never fails.
func (h *TailHist) AppendBinary(b []byte) ([]byte, error) {
	b = binary.AppendVarint(b, int64(h.Lo))
	b = binary.AppendUvarint(b, uint64(len(h.Counts)))
	for i, c := range h.Counts {
		b = binary.AppendUvarint(b, c)
		if c != 0 || math.Float64bits(h.Mins[i])|math.Float64bits(h.Maxs[i]) != 0 {
			b = append(b, 1)
			b = appendF64(b, h.Mins[i])
			b = appendF64(b, h.Maxs[i])
		} else {
			b = append(b, 0)
		}
	}
	return b, nil
}

// DecodeBinary sets h from the binary form at the front of b and returns
// the number of bytes it took.
func (h *TailHist) DecodeBinary(b []byte) (int, error) {
	d := decoder{binio.Reader{B: b}}
	d.tail(h)
	return d.done(func() { *h = TailHist{} })
}

// AppendBinary appends the binary form of s to b. It never fails.
func (s *Summary) AppendBinary(b []byte) ([]byte, error) {
	b, _ = s.Moments.AppendBinary(b)
	b, _ = s.Histogram.AppendBinary(b)
	b, _ = s.Tail.AppendBinary(b)
	return binary.AppendUvarint(b, s.Anomalies), nil
}

// DecodeBinary sets s from the binary form at the front of b and returns
// the number of bytes it took.
func (s *Summary) DecodeBinary(b []byte) (int, error) {
	d := decoder{binio.Reader{B: b}}
	d.moments(&s.Moments)
	d.histogram(&s.Histogram)
	d.tail(&s.Tail)
	s.Anomalies = d.Uvarint()
	return d.done(func() { *s = Summary{} })
}

// DecodeOptionalBinary sets s from the form a sync model had in the
// pserver's snapshots of format kpss-v1 and the detector's checkpoints of
// versions 2 to 6, before Summary had its own: Moments, then 0 (no
// histogram) or 1 and a Histogram, 0 (no natural-range histogram) or 1 and
// a TailHist, then Anomalies. It returns the number of bytes it took; an
// absent histogram is left zero. Nothing writes that form any more.
func (s *Summary) DecodeOptionalBinary(b []byte) (int, error) {
	d := decoder{binio.Reader{B: b}}
	*s = Summary{}
	d.moments(&s.Moments)
	if d.Bool() {
		d.histogram(&s.Histogram)
	}
	if d.Bool() {
		d.tail(&s.Tail)
	}
	s.Anomalies = d.Uvarint()
	return d.done(func() { *s = Summary{} })
}

func appendF64(b []byte, v float64) []byte {
	return binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
}

// decoder reads binary forms (binio's values); the first error sticks,
// and every later read returns zero values.
type decoder struct{ binio.Reader }

// done returns the bytes read and the error, calling zero first on error.
func (d *decoder) done(zero func()) (int, error) {
	if d.Err != nil {
		zero()
		return 0, d.Err
	}
	return d.Off, nil
}

func (d *decoder) moments(m *Moments) {
	switch v := d.Byte1(); {
	case d.Err != nil:
	case v == 0:
		*m = Moments{}
	case v == 1:
		*m = Moments{N: d.F64(), Mean: d.F64(), M2: d.F64(), M3: d.F64(), M4: d.F64(), Min: d.F64(), Max: d.F64()}
	default:
		d.Fail("moments tag %d", v)
	}
}

func (d *decoder) histogram(h *Histogram) {
	switch v := d.Byte1(); {
	case d.Err != nil:
		return
	case v == 0:
		*h = Histogram{}
		return
	case v != 1:
		d.Fail("histogram tag %d", v)
		return
	}
	*h = Histogram{FirstEdge: d.F64(), BinWidth: d.F64(), Min: d.F64(), Max: d.F64()}
	n := d.Uvarint()
	if d.Err != nil || n == 0 {
		return // nil Counts
	}
	if n-1 > maxHistBins {
		d.Fail("histogram of %d bins, more than %d", n-1, maxHistBins)
		return
	}
	h.Counts = make([]uint64, d.CountOf(n-1, 1))
	for i := range h.Counts {
		h.Counts[i] = d.Uvarint()
	}
	if d.Err == nil {
		if err := h.Validate(); err != nil {
			d.Fail("%v", err)
		}
	}
}

func (d *decoder) tail(h *TailHist) {
	lo := d.Varint()
	n := d.Uvarint()
	if d.Err == nil && (lo < 0 || lo > maxTailLo) {
		d.Fail("tail histogram starts at bin %d", lo)
	}
	k := d.CountOf(n, 2)
	if d.Err != nil {
		return
	}
	*h = TailHist{Lo: int(lo)}
	if k > 0 {
		h.Counts, h.Mins, h.Maxs = make([]uint64, k), make([]float64, k), make([]float64, k)
	}
	for i := range k {
		h.Counts[i] = d.Uvarint()
		switch v := d.Byte1(); {
		case d.Err != nil:
		case v == 1:
			h.Mins[i], h.Maxs[i] = d.F64(), d.F64()
		case v != 0:
			d.Fail("tail bin bounds tag %d", v)
		}
	}
	if d.Err == nil {
		if err := h.Validate(); err != nil {
			d.Fail("%v", err)
		}
	}
}
