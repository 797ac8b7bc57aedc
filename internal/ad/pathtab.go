package ad

// pathTable maps (parent node, fid) to a call-path node: an open-addressing
// hash table with linear probing, faster than a Go map on the builder's hot
// path. Keys are parent<<32|fid; values are node+1 (0 marks an empty slot).
type pathTable struct {
	keys []uint64
	vals []uint32
	n    int
}

func (p *pathTable) slot(k uint64) uint64 {
	return (k * 0x9E3779B97F4A7C15) >> 40
}

// get returns the node of k.
func (p *pathTable) get(k uint64) (uint32, bool) {
	if len(p.keys) == 0 {
		return 0, false
	}
	mask := uint64(len(p.keys) - 1)
	for i := p.slot(k) & mask; ; i = (i + 1) & mask {
		v := p.vals[i]
		if v == 0 {
			return 0, false
		}
		if p.keys[i] == k {
			return v - 1, true
		}
	}
}

// put adds k -> node; k must not be present.
func (p *pathTable) put(k uint64, node uint32) {
	if 2*(p.n+1) > len(p.keys) {
		p.grow()
	}
	mask := uint64(len(p.keys) - 1)
	i := p.slot(k) & mask
	for p.vals[i] != 0 {
		i = (i + 1) & mask
	}
	p.keys[i], p.vals[i] = k, node+1
	p.n++
}

// minPathSlots is the table's first size: a rank's code often has a few
// dozen call paths, and a table per rank of thousands of ranks is kept for
// the whole run.
const minPathSlots = 64

func (p *pathTable) grow() {
	old, oldv := p.keys, p.vals
	size := max(minPathSlots, 2*len(old))
	p.keys, p.vals, p.n = make([]uint64, size), make([]uint32, size), 0
	for i, v := range oldv {
		if v != 0 {
			p.put(old[i], v-1)
		}
	}
}
