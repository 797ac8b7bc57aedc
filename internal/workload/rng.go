package workload

// splitMix is the SplitMix64 generator. It is small, fast and has a fixed,
// documented sequence, so a seed gives the same run on every Go version and
// platform (math/rand/v2 documents its own sequences as stable too, but owning
// the dozen lines keeps the generator's output a property of this package).
type splitMix struct{ s uint64 }

const golden = 0x9E3779B97F4A7C15

func (r *splitMix) next() uint64 {
	r.s += golden
	z := r.s
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// float returns a uniform value in [0, 1).
func (r *splitMix) float() float64 { return float64(r.next()>>11) * (1.0 / (1 << 53)) }

// intn returns a uniform value in [0, n); n must be > 0. The modulo bias is
// below 2^-40 for the small n used here.
func (r *splitMix) intn(n uint64) uint64 { return r.next() % n }

// mix derives an independent stream seed from a seed and a list of labels
// (rank, thread, purpose), so that each stream depends only on its own labels
// and never on how many other streams exist or the order they run in.
func mix(seed uint64, labels ...uint64) uint64 {
	r := splitMix{seed}
	h := r.next()
	for _, l := range labels {
		r.s = h ^ (l * 0xD1B54A32D192ED03)
		h = r.next()
	}
	return h
}

// threshold converts a probability into a bound for a uniform uint64 draw:
// draw < threshold(p) happens with probability p.
func threshold(p float64) uint64 {
	switch {
	case p <= 0:
		return 0
	case p >= 1:
		return ^uint64(0)
	}
	return uint64(p * (1 << 63) * 2)
}

// noise3 returns a bounded, bell-shaped variate with mean 0 and standard
// deviation 1, supported on [-3, 3]: the Irwin-Hall sum of three uniforms,
// all three taken from one 64-bit draw (21 bits each).
func noise3(x uint64) float64 {
	const m = 1<<21 - 1
	s := (x & m) + ((x >> 21) & m) + ((x >> 42) & m)
	// s/2^21 is the sum of three U(0,1): mean 1.5, sd 0.5.
	return (float64(s)*(1.0/(1<<21)) - 1.5) * 2
}
