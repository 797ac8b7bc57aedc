package stats

// Histogram is an HBOS histogram over [FirstEdge, FirstEdge+BinWidth*len(Counts)].
// Its semantics (binning, merging, scoring) follow docs in hbos.go.
type Histogram struct {
	FirstEdge float64  `json:"first_edge"`
	BinWidth  float64  `json:"bin_width"`
	Counts    []uint64 `json:"counts"`
	Min       float64  `json:"min"`
	Max       float64  `json:"max"`
}
