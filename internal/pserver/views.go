package pserver

import (
	"math"
	"sort"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/stats"
)

// Summary is the state at a glance (GET /api/summary).
type Summary struct {
	Run        string `json:"run"`
	Shard      int    `json:"shard"`
	Shards     int    `json:"shards"`
	Totals     Totals `json:"totals"`
	IOStep     uint64 `json:"io_step"`
	Ranks      int    `json:"ranks"`
	Detectors  int    `json:"detectors"`
	Models     int    `json:"models"`
	Counters   int    `json:"counters"`
	Applied    uint64 `json:"applied"`
	Duplicates uint64 `json:"duplicates"`
	Merges     uint64 `json:"merges"`
	WALSeq     uint64 `json:"wal_seq"`
	// Invalid counts the sync requests refused by validation since this
	// process started; ReplaySkipped the invalid sync-log entries and
	// snapshot contents it found and left out.
	Invalid       uint64 `json:"invalid"`
	ReplaySkipped uint64 `json:"replay_skipped"`
	// Incarnations counts detectors that synced again under a new
	// incarnation (restarted without their checkpoint).
	Incarnations uint64 `json:"incarnations"`
	Window       int    `json:"window"`
	Late         uint64 `json:"late_summaries"`
	// Status is StatusLive while detectors may still sync, StatusFinished
	// once the run's final statistics are published, StatusStored for a
	// finished run rebuilt from its provenance store.
	Status string `json:"status"`
	// Labels says which anomalies the counts are: LabelsLive, as the
	// detectors flagged them during the run, or LabelsFinal, those that
	// stand after the end-of-run relabelling (a stored run's, as kipimo
	// query counts them; Unflagged the others).
	Labels    string `json:"labels"`
	Unflagged int64  `json:"unflagged,omitempty"`
	// StartTS is the run's start on the trace's clock (µs; 0 before any
	// step): the dashboard shows times relative to it, and as dates when
	// the clock is the epoch's.
	StartTS uint64 `json:"start_ts"`
}

// Values of Summary.Labels.
const (
	LabelsLive  = "live"
	LabelsFinal = "final"
)

// Values of Summary.Status.
const (
	StatusLive     = "live"
	StatusFinished = "finished"
	StatusStored   = "stored"
)

func (s *Server) summary(st *State) Summary {
	status := StatusLive
	if s.finished.Load() {
		status = StatusFinished
	}
	sum := summarize(s.cfg, st, status)
	sum.Invalid, sum.ReplaySkipped = s.invalid.Load(), s.skipped.Load()
	return sum
}

func summarize(cfg Config, st *State, status string) Summary {
	return Summary{
		Run: cfg.Run, Shard: cfg.Shard, Shards: cfg.Shards, Status: status,
		Totals: st.Agg.Total(), IOStep: st.Agg.MaxStep, Ranks: len(st.Agg.Ranks),
		Detectors: len(st.LastSeq), Models: len(st.Models), Counters: len(st.Counters),
		Applied: st.Applied, Duplicates: st.Duplicates, Merges: st.Merges, WALSeq: st.WALSeq, Incarnations: st.Incarnations,
		Window: st.Agg.Window, Late: st.Agg.Late, Labels: LabelsLive, StartTS: st.Agg.StartTS,
	}
}

// FuncBin is one bin of a function's runtime histogram: runtimes in
// (Lo, Hi], how many, and whether the model labels the bin's runtimes
// anomalous (beyond the natural range, or past the HBOS threshold).
type FuncBin struct {
	Lo        float64 `json:"lo"`
	Hi        float64 `json:"hi"`
	Count     uint64  `json:"count"`
	Anomalous bool    `json:"anomalous"`
}

// FuncView is one function's runtime distribution over all ranks (GET
// /api/function?func=F), drawn from the model its algorithm keeps: the
// natural-range histogram (algorithm tail, the default) with the runtimes
// below and above which it flags, or an HBOS/COPOD histogram with the HBOS
// score threshold at the default fraction and the smallest runtime above
// the mean that it labels anomalous; and its anomaly metrics over the run.
type FuncView struct {
	Func string  `json:"func"`
	Row  FuncRow `json:"stats"`
	// Source says where the histogram comes from: the merged model of a live
	// server, or the executions kept in a provenance store.
	Source string `json:"source"`
	// Model is how bins are labelled: ModelNaturalRange or ModelHBOS ("" when
	// there is no histogram).
	Model          string    `json:"model"`
	Bins           []FuncBin `json:"bins"`
	Total          uint64    `json:"total"`
	ScoreThreshold float64   `json:"score_threshold"`
	// LowThreshold and ThresholdRuntime are the runtimes below and above
	// which the model flags (natural range); with HBOS, ThresholdRuntime is
	// the first anomalous bin above the mean. 0: none.
	LowThreshold     float64        `json:"low_threshold"`
	ThresholdRuntime float64        `json:"threshold_runtime"`
	Anomalies        AnomalyMetrics `json:"anomalies"`
	Ranks            int            `json:"ranks"` // ranks with anomalies of the function
}

// Values of FuncView.Model.
const (
	ModelNaturalRange = "natural range"
	ModelHBOS         = "hbos"
)

// funcModel is what a function's view is drawn from: the natural-range
// histogram of its model (tail), or a runtime histogram (an HBOS or COPOD
// model's, or one of a store's normal executions), and the natural range's
// thresholds when known.
type funcModel struct {
	tail   *stats.TailHist
	hist   *stats.Histogram
	rng    *provenance.Range
	source string
}

// liveFuncModel is fn's model on a live server: its natural-range
// histogram when detectors send one, else its merged histogram (copies).
func liveFuncModel(st *State, fn string) funcModel {
	m := st.Models[fn]
	if m == nil {
		return funcModel{}
	}
	if !m.Tail.Empty() {
		t := m.Tail.Clone()
		fm := funcModel{tail: &t, source: "natural-range histogram of the merged model of all ranks"}
		if r := st.TailRule; r != nil {
			lo, hi := t.NaturalRange(*r)
			fm.rng = &provenance.Range{Low: r.LowThreshold(lo), High: r.Threshold(hi)}
		}
		return fm
	}
	if !m.Histogram.Empty() {
		c := m.Histogram
		c.Counts = append([]uint64(nil), m.Histogram.Counts...)
		return funcModel{hist: &c, source: "merged model histogram of all ranks"}
	}
	return funcModel{}
}

// funcView builds fn's view from its row of the function table and its
// model fm; found is false for an unknown fn.
func funcView(st *State, fn string, fm funcModel) (v FuncView, found bool) {
	for _, r := range funcTable(st) {
		if r.Func == fn {
			v.Row, found = r, true
			break
		}
	}
	if !found {
		return v, false
	}
	v.Func, v.Bins = fn, []FuncBin{}
	if a := st.Agg.Funcs[fn]; a != nil {
		v.Anomalies = *a
	}
	v.Ranks = st.Agg.funcRanks[fn]
	if t := fm.tail; t != nil && !t.Empty() {
		tailBins(&v, t, fm.rng)
		v.Source = fm.source
		return v, true
	}
	h := fm.hist
	if h == nil || h.Empty() {
		return v, true
	}
	v.Source = fm.source
	if r := fm.rng; r != nil {
		// Labelled by the final model's natural range.
		v.Model, v.LowThreshold, v.ThresholdRuntime = ModelNaturalRange, r.Low, r.High
		for i, c := range h.Counts {
			lo := h.FirstEdge + float64(i)*h.BinWidth
			v.Total += c
			if c > 0 {
				b := FuncBin{Lo: lo, Hi: lo + h.BinWidth, Count: c}
				b.Anomalous = b.Hi < r.Low || b.Lo > r.High
				v.Bins = append(v.Bins, b)
			}
		}
		return v, true
	}
	v.Model = ModelHBOS
	sc := stats.NewHBOSScorer(*h, 0)
	v.ScoreThreshold = sc.Threshold
	mean := v.Row.Mean
	if !v.Row.HasModel {
		mean = (h.Min + h.Max) / 2
	}
	for i, c := range h.Counts {
		lo := h.FirstEdge + float64(i)*h.BinWidth
		b := FuncBin{Lo: lo, Hi: lo + h.BinWidth, Count: c}
		v.Total += c
		if c == 0 {
			continue
		}
		b.Anomalous = sc.Score(b.Hi) >= sc.Threshold
		if b.Anomalous && b.Lo >= mean && v.ThresholdRuntime == 0 {
			v.ThresholdRuntime = b.Lo
		}
		v.Bins = append(v.Bins, b)
	}
	return v, true
}

// StepPoint is one io_step of the series (GET /api/steps).
type StepPoint struct {
	Step       uint64 `json:"io_step"`
	Anomalies  uint64 `json:"anomalies"`
	Executions uint64 `json:"executions"`
	Events     uint64 `json:"events"`
	BadFrames  uint64 `json:"bad_frames"`
	Ranks      int    `json:"ranks"`
}

func stepSeries(st *State, last int) []StepPoint {
	steps := st.Agg.StepList()
	if last > 0 && len(steps) > last {
		steps = steps[len(steps)-last:]
	}
	out := make([]StepPoint, 0, len(steps))
	for _, sa := range steps {
		out = append(out, StepPoint{sa.Step, sa.Anomalies, sa.Executions, sa.Events, sa.BadFrames, len(sa.Ranks)})
	}
	return out
}

// RankRow is one rank of the top-ranks list.
type RankRow struct {
	PID         uint32  `json:"pid"`
	Rank        uint32  `json:"rank"`
	Anomalies   uint64  `json:"anomalies"`
	Executions  uint64  `json:"executions"`
	Steps       uint64  `json:"steps"`
	LastStep    uint64  `json:"last_step"`
	SeveritySum float64 `json:"severity_sum"`
	SeverityMax float64 `json:"severity_max"`
	ScoreMean   float64 `json:"score_mean"`
	// the event library's counts on the rank, as in Totals
	SummarisedCalls uint64 `json:"summarised_calls,omitempty"`
	DroppedCalls    uint64 `json:"dropped_calls,omitempty"`
	DroppedEvents   uint64 `json:"dropped_events,omitempty"`
}

func topRanks(st *State, n int, by string) []RankRow {
	row := func(id DetectorID, r *RankTotals) RankRow {
		return RankRow{
			PID: id.PID, Rank: id.Rank, Anomalies: r.Anomalies, Executions: r.Executions,
			Steps: r.Steps, LastStep: r.LastStep, SeveritySum: sum(r.Severity), SeverityMax: maxOf(r.Severity),
			ScoreMean:       r.Scores.Mean,
			SummarisedCalls: r.SummarisedCalls, DroppedCalls: r.DroppedCalls, DroppedEvents: r.DroppedEvents,
		}
	}
	if by != "severity" && n > 0 && n <= len(st.Agg.top) && st.Agg.derived() {
		// The aggregates keep the first ranks by count as they change.
		out := make([]RankRow, n)
		for i, id := range st.Agg.top[:n] {
			out[i] = row(id, st.Agg.Ranks[id])
		}
		return out
	}
	out := make([]RankRow, 0, len(st.Agg.Ranks))
	for id, r := range st.Agg.Ranks {
		out = append(out, row(id, r))
	}
	key := func(r RankRow) float64 { return float64(r.Anomalies) }
	if by == "severity" {
		key = func(r RankRow) float64 { return r.SeveritySum }
	}
	sort.Slice(out, func(i, j int) bool {
		if ki, kj := key(out[i]), key(out[j]); ki != kj {
			return ki > kj
		}
		return lessID(DetectorID{out[i].PID, out[i].Rank}, DetectorID{out[j].PID, out[j].Rank})
	})
	if n > 0 && len(out) > n {
		out = out[:n]
	}
	return out
}

// FuncAnomRow is one function of the top-functions list.
type FuncAnomRow struct {
	Func        string  `json:"func"`
	Anomalies   uint64  `json:"anomalies"`
	FirstStep   uint64  `json:"first_io_step"`
	LastStep    uint64  `json:"last_io_step"`
	SeveritySum float64 `json:"severity_sum"`
	SeverityMax float64 `json:"severity_max"`
	ScoreMean   float64 `json:"score_mean"`
	Ranks       int     `json:"ranks"`
}

func topFuncs(st *State, n int, by string) []FuncAnomRow {
	ranks := st.Agg.funcRanks
	out := make([]FuncAnomRow, 0, len(st.Agg.Funcs))
	for name, m := range st.Agg.Funcs {
		out = append(out, FuncAnomRow{
			Func: name, Anomalies: m.Count, FirstStep: m.FirstStep, LastStep: m.LastStep,
			SeveritySum: sum(m.Severity), SeverityMax: maxOf(m.Severity), ScoreMean: m.Score.Mean, Ranks: ranks[name],
		})
	}
	key := func(r FuncAnomRow) float64 { return float64(r.Anomalies) }
	if by == "severity" {
		key = func(r FuncAnomRow) float64 { return r.SeveritySum }
	}
	sort.Slice(out, func(i, j int) bool {
		if ki, kj := key(out[i]), key(out[j]); ki != kj {
			return ki > kj
		}
		return out[i].Func < out[j].Func
	})
	if n > 0 && len(out) > n {
		out = out[:n]
	}
	return out
}

// FuncRow is one function of the function table (GET /api/functions): the
// global runtime statistics of its model (when this shard holds it) and its
// anomaly total.
type FuncRow struct {
	Func      string  `json:"func"`
	Count     float64 `json:"count"`
	Mean      float64 `json:"mean"`
	Stddev    float64 `json:"stddev"`
	Min       float64 `json:"min"`
	Max       float64 `json:"max"`
	Skewness  float64 `json:"skewness"`
	Kurtosis  float64 `json:"kurtosis"`
	Anomalies uint64  `json:"anomalies"`
	HasModel  bool    `json:"has_model"`
	// HasHistogram is whether the model carries a runtime histogram (HBOS
	// and COPOD models do, SSTD ones only moments).
	HasHistogram bool `json:"has_histogram"`
}

func funcTable(st *State) []FuncRow {
	rows := map[string]*FuncRow{}
	for k, m := range st.Models {
		rows[k] = &FuncRow{
			Func: k, Count: m.Moments.N, Mean: m.Moments.Mean, Stddev: finiteOr0(m.Moments.Stddev()),
			Min: m.Moments.Min, Max: m.Moments.Max, Skewness: finiteOr0(m.Moments.Skewness()), Kurtosis: finiteOr0(m.Moments.Kurtosis()),
			Anomalies: m.Anomalies, HasModel: true, HasHistogram: !m.Histogram.Empty(),
		}
	}
	for k, a := range st.Agg.Funcs {
		r := rows[k]
		if r == nil {
			r = &FuncRow{Func: k}
			rows[k] = r
		}
		r.Anomalies = max(r.Anomalies, a.Count)
	}
	out := make([]FuncRow, 0, len(rows))
	for _, r := range rows {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Anomalies != out[j].Anomalies {
			return out[i].Anomalies > out[j].Anomalies
		}
		return out[i].Func < out[j].Func
	})
	return out
}

// RankFuncRow is the anomaly metrics of one function on one rank.
type RankFuncRow struct {
	PID  uint32 `json:"pid"`
	Rank uint32 `json:"rank"`
	Func string `json:"func"`
	AnomalyMetrics
}

func rankFuncs(st *State, rank *uint32, fn string, n int) []RankFuncRow {
	var out []RankFuncRow
	for k, m := range st.Agg.RankFunc {
		if (rank != nil && k.Rank != *rank) || (fn != "" && k.Func != fn) {
			continue
		}
		out = append(out, RankFuncRow{k.PID, k.Rank, k.Func, *m})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		if out[i].Func != out[j].Func {
			return out[i].Func < out[j].Func
		}
		return lessID(DetectorID{out[i].PID, out[i].Rank}, DetectorID{out[j].PID, out[j].Rank})
	})
	if n > 0 && len(out) > n {
		out = out[:n]
	}
	if out == nil {
		out = []RankFuncRow{}
	}
	return out
}

// CounterRow is one counter's global statistics.
type CounterRow struct {
	Counter string  `json:"counter"`
	Count   float64 `json:"count"`
	Mean    float64 `json:"mean"`
	Stddev  float64 `json:"stddev"`
	Min     float64 `json:"min"`
	Max     float64 `json:"max"`
}

func counterTable(st *State) []CounterRow {
	out := make([]CounterRow, 0, len(st.Counters))
	for k, m := range st.Counters {
		out = append(out, CounterRow{k, m.N, m.Mean, finiteOr0(m.Stddev()), m.Min, m.Max})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Counter < out[j].Counter })
	return out
}

func sum(m stats.Moments) float64 { return m.N * m.Mean }

func maxOf(m stats.Moments) float64 {
	if m.N == 0 {
		return 0
	}
	if math.IsInf(m.Max, 0) || math.IsNaN(m.Max) {
		return 0
	}
	return m.Max
}

// tailBins fills v's bins from the natural-range histogram t: bin i covers
// [2^(i/8) - 1, 2^((i+1)/8) - 1) µs; a bin is anomalous when every runtime
// it counted lies outside rng (nil: none is).
func tailBins(v *FuncView, t *stats.TailHist, rng *provenance.Range) {
	v.Model = ModelNaturalRange
	if rng != nil {
		v.LowThreshold, v.ThresholdRuntime = rng.Low, rng.High
	}
	edge := func(i int) float64 { return math.Exp2(float64(i)/stats.TailBinsPerOctave) - 1 }
	for j, c := range t.Counts {
		v.Total += c
		if c == 0 {
			continue
		}
		b := FuncBin{Lo: edge(t.Lo + j), Hi: edge(t.Lo + j + 1), Count: c}
		b.Anomalous = rng != nil && (t.Maxs[j] < rng.Low || t.Mins[j] > rng.High)
		v.Bins = append(v.Bins, b)
	}
}
