package pserver

import (
	"cmp"
	"fmt"
	"slices"
)

// The heat map shows one row per rank up to maxHeatRanks ranks. Beyond, its
// rows are bands of consecutive ranks (of one program), at most maxBands of
// them: each band is 2^k blocks of blockRanks rank numbers, k the smallest
// that fits, so a band's cell is the sum of its ranks' cells. A band is
// opened (drilled into) by asking for the map of its ranks alone.
const (
	maxHeatRanks = 128
	maxBands     = 64
)

// HeatMap is the anomaly counts per rank, or per band of ranks, and io_step
// of the recent steps, sparse: Cells holds [row index, step index,
// anomalies] for the non-zero cells, by step then row. Its rows are Ranks,
// or Bands when Banded.
type HeatMap struct {
	Banded bool         `json:"banded"`
	Ranks  []DetectorID `json:"ranks"`
	Bands  []Band       `json:"bands,omitempty"`
	// Band is the band whose ranks alone this map shows (a drill-down).
	Band  *Band       `json:"band,omitempty"`
	Steps []uint64    `json:"steps"`
	Cells [][3]uint64 `json:"cells"`
	// HotRanks holds, when Banded, how many of the band's ranks had
	// anomalies in each cell, in the order of Cells.
	HotRanks []uint64 `json:"hot_ranks,omitempty"`
	// Peaks holds, when Banded, the most anomalies one rank of the band
	// had in each cell, in the order of Cells: what a band's cell is
	// coloured by, so that one slow rank stands out of its band however
	// many ranks the band sums.
	Peaks []uint64 `json:"peaks,omitempty"`
	Max   uint64   `json:"max"`
	// Scale is the colour scale of the cells.
	Scale HeatScale `json:"scale"`
	// RankCount is the number of ranks that reported, over all rows.
	RankCount int `json:"rank_count"`
}

// HeatScale is the heat map's colour scale. A cell is coloured by one
// rank's anomalies in one io_step (a band's cell by its busiest rank's),
// in one of HeatClasses classes measured against Typical, the median of
// every cell of the map (empty cells included; at least 1): class 0 holds
// values up to Typical, class 1 up to Edges[1] = 2×Typical, class 2 up to
// Edges[2] = 4×Typical, class 3 everything beyond. Ranks that are as noisy
// as the rest stay in the pale classes whatever the noise's level or the
// number of ranks, and one rank far beyond them takes the top class, at 8
// ranks or 4,096; the maximum of noisy counts never sets the colours.
type HeatScale struct {
	Typical uint64   `json:"typical"`
	Edges   []uint64 `json:"edges"` // upper bounds of classes 0..HeatClasses-2
}

// HeatClasses is the number of colour classes of a HeatScale.
const HeatClasses = 4

// newHeatScale builds the scale of a map of cells cells whose non-zero
// values are vals (reordered).
func newHeatScale(vals []uint64, cells int) HeatScale {
	slices.Sort(vals)
	typical := uint64(0)
	if zeros := cells - len(vals); cells > 0 {
		if mid := cells / 2; mid >= zeros {
			typical = vals[mid-zeros]
		}
	}
	typical = max(typical, 1)
	return HeatScale{Typical: typical, Edges: []uint64{typical, 2 * typical, 4 * typical}}
}

// Class is the colour class (0..HeatClasses-1) of a cell of value v > 0.
func (s HeatScale) Class(v uint64) int {
	for i, e := range s.Edges {
		if v <= e {
			return i
		}
	}
	return len(s.Edges)
}

// Band is a row of a banded heat map: the ranks First..Last of program PID
// (Ranks of them reported). ID is its name for a drill-down
// (/api/heatmap?band=ID).
type Band struct {
	ID    string `json:"id"`
	PID   uint32 `json:"pid"`
	First uint32 `json:"first"`
	Last  uint32 `json:"last"`
	Ranks int    `json:"ranks"`
}

// bandShift returns the k of the bands of blocks (2^k blocks a band) that
// gives at most maxBands of them.
func bandShift(blocks []blockKey) uint {
	for k := uint(0); ; k++ {
		n := 0
		for i, b := range blocks {
			if i == 0 || b.PID != blocks[i-1].PID || b.No>>k != blocks[i-1].No>>k {
				n++
			}
		}
		if n <= maxBands || k >= 32 {
			return k
		}
	}
}

// bands returns the bands of the aggregates' ranks, and the index of each
// block's band.
func bands(a *Aggregates) ([]Band, map[blockKey]int) {
	blocks, infos := a.blocks()
	k := bandShift(blocks)
	var out []Band
	idx := make(map[blockKey]int, len(blocks))
	for i, b := range blocks {
		info := infos[b]
		if i == 0 || b.PID != blocks[i-1].PID || b.No>>k != blocks[i-1].No>>k {
			out = append(out, Band{PID: b.PID, First: info.Low, Last: info.High})
		}
		band := &out[len(out)-1]
		band.First, band.Last = min(band.First, info.Low), max(band.Last, info.High)
		band.Ranks += info.Ranks
		idx[b] = len(out) - 1
	}
	for i := range out {
		out[i].ID = fmt.Sprintf("%d:%d-%d", out[i].PID, out[i].First, out[i].Last)
	}
	return out, idx
}

// parseBand reads a band's ID.
func parseBand(id string) (Band, error) {
	var b Band
	_, err := fmt.Sscanf(id, "%d:%d-%d", &b.PID, &b.First, &b.Last)
	if err != nil || b.First > b.Last || fmt.Sprintf("%d:%d-%d", b.PID, b.First, b.Last) != id {
		return b, fmt.Errorf("band %q is not pid:first-last", id)
	}
	b.ID = id
	return b, nil
}

// recentSteps returns the last steps of the window (all when last <= 0).
func recentSteps(st *State, last int) []*StepAgg {
	steps := st.Agg.StepList()
	if last > 0 && len(steps) > last {
		steps = steps[len(steps)-last:]
	}
	return steps
}

// heatMap returns the heat map of the last steps: per rank, or banded when
// more than maxHeatRanks ranks reported. Its cost is the number of steps
// times the number of ranks (at most maxHeatRanks) or of blocks, whichever
// the rows are made of.
func heatMap(st *State, last int) HeatMap {
	a := st.Agg
	ids := a.RankIDs()
	if len(ids) <= maxHeatRanks {
		return rankHeatMap(st, last, ids, nil)
	}
	h := HeatMap{Banded: true, Ranks: []DetectorID{}, Cells: [][3]uint64{}, Steps: []uint64{}, HotRanks: []uint64{}, Peaks: []uint64{}, RankCount: len(ids)}
	var idx map[blockKey]int
	h.Bands, idx = bands(a)
	sums := make([]blockCell, len(h.Bands))
	for si, sa := range recentSteps(st, last) {
		h.Steps = append(h.Steps, sa.Step)
		clear(sums)
		for k, c := range sa.blocks {
			s := &sums[idx[k]]
			s.Anomalies += c.Anomalies
			s.HotRanks += c.HotRanks
			s.Peak = max(s.Peak, c.Peak)
		}
		for bi, s := range sums {
			if s.Anomalies == 0 {
				continue
			}
			h.Cells = append(h.Cells, [3]uint64{uint64(bi), uint64(si), s.Anomalies})
			h.HotRanks = append(h.HotRanks, s.HotRanks)
			h.Peaks = append(h.Peaks, s.Peak)
			h.Max = max(h.Max, s.Anomalies)
		}
	}
	h.Scale = newHeatScale(slices.Clone(h.Peaks), len(h.Bands)*len(h.Steps))
	return h
}

// bandHeatMap returns the per-rank heat map of the last steps of the ranks
// of band id alone.
func bandHeatMap(st *State, last int, id string) (HeatMap, error) {
	b, err := parseBand(id)
	if err != nil {
		return HeatMap{}, err
	}
	ids := st.Agg.RankIDs()
	lo, _ := slices.BinarySearchFunc(ids, DetectorID{b.PID, b.First}, cmpID)
	hi, _ := slices.BinarySearchFunc(ids, DetectorID{b.PID, b.Last}, func(x, y DetectorID) int {
		return cmp.Or(cmpID(x, y), -1) // the first id after y
	})
	b.Ranks = hi - lo
	return rankHeatMap(st, last, ids[lo:hi], &b), nil
}

// rankHeatMap returns the heat map of the last steps with one row per rank
// of ids (in order).
func rankHeatMap(st *State, last int, ids []DetectorID, band *Band) HeatMap {
	h := HeatMap{Ranks: ids, Band: band, Cells: [][3]uint64{}, Steps: []uint64{}, RankCount: len(st.Agg.Ranks)}
	for si, sa := range recentSteps(st, last) {
		h.Steps = append(h.Steps, sa.Step)
		for ri, id := range ids {
			if c := sa.Ranks[id]; c.Anomalies > 0 {
				h.Cells = append(h.Cells, [3]uint64{uint64(ri), uint64(si), c.Anomalies})
				h.Max = max(h.Max, c.Anomalies)
			}
		}
	}
	vals := make([]uint64, len(h.Cells))
	for i, c := range h.Cells {
		vals[i] = c[2]
	}
	h.Scale = newHeatScale(vals, len(ids)*len(h.Steps))
	return h
}

// heatMapView is GET /api/heatmap: the map of the last steps, or with band
// the map of that band's ranks.
func heatMapView(st *State, last int, band string) (HeatMap, error) {
	if band != "" {
		return bandHeatMap(st, last, band)
	}
	return heatMap(st, last), nil
}
