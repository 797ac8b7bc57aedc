package pserver

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"sort"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provdb"
	"github.com/kipimo-hpc/kipimo/internal/stats"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// StoreOptions configures a StoreDashboard.
type StoreOptions struct {
	Run    string // shown in the page title
	Window int    // io_steps shown in the heat map; default DefaultWindow
	Token  string // optional bearer token, as Config.Token
	// FuncStats are the run's func_stats records. The provenance.Store
	// interface cannot list them, so the caller reads them (kipimo serve
	// reads the SQLite file's func_stats table).
	FuncStats []provenance.GlobalFuncStats
	// Culprits is the run's culprit analysis as it ended (kipimo run's
	// culprits.json), served at /api/culprits and /api/outliers; without
	// it they answer an empty analysis, since a store keeps no step
	// summaries to analyse.
	Culprits *Culprits
}

// StoreDashboard serves the dashboard of a finished run from its provenance
// store alone: the aggregates (per-rank and per-step anomaly counts, the top
// lists, per-function anomaly metrics) are rebuilt once from the stored
// anomaly records, the function table from the func_stats records, function
// histograms from the stored executions on demand, and the anomaly list, call
// stacks and event windows are the store's query API under /provdb/.
type StoreDashboard struct {
	st    *State
	cfg   Config
	store provenance.Store
	execs float64 // executions over the run, from func_stats
	// ranges are the final models' natural ranges by key (empty with
	// Chimbuko's rules): anomalies inside them are unflagged and left out.
	ranges    map[string]provenance.Range
	culprits  *Culprits // the run's analysis, or nil
	Unflagged int64     // stored anomalies the final relabelling unflagged
	Truncated int64     // anomaly records not read because one io_step held more than provenance.MaxLimit
}

// NewStoreDashboard reads store's anomaly records and builds the dashboard's
// state. store stays owned by the caller and must outlive the dashboard.
func NewStoreDashboard(ctx context.Context, store provenance.Store, opt StoreOptions) (*StoreDashboard, error) {
	cfg := Config{Run: opt.Run, Window: opt.Window, Token: opt.Token, ProvDBURL: "store"}
	if cfg.Run == "" {
		cfg.Run = "stored"
	}
	if cfg.Window <= 0 {
		cfg.Window = DefaultWindow
	}
	cfg.Shards = 1
	cfg.ProvDBList = "/api/v1/records"
	cfg.ProvDBRecord = "/api/v1/records/anomalies/{pid}/{event_id}"
	d := &StoreDashboard{st: NewState(cfg.Window), cfg: cfg, store: store, ranges: provenance.FinalRanges(opt.FuncStats), culprits: opt.Culprits}
	for _, f := range opt.FuncStats {
		m := &Model{Key: f.Func, PID: f.PID, Summary: stats.Summary{Moments: momentsOf(f.Stats), Anomalies: f.Anomalies}}
		if len(d.ranges) > 0 {
			m.Anomalies = 0 // flagged live; the final ones are counted from the records
		}
		d.st.Models[f.Func] = m
		d.execs += f.Stats.Count
	}
	if err := d.load(ctx); err != nil {
		return nil, err
	}
	return d, nil
}

// momentsOf inverts provenance.FuncStatsOf.
func momentsOf(f provenance.FuncStats) stats.Moments {
	m := stats.Moments{N: f.Count, Mean: f.Mean, Min: f.Minimum, Max: f.Maximum}
	if f.Count >= 2 {
		m.M2 = f.Stddev * f.Stddev * (f.Count - 1)
		m.M3 = f.Skewness * math.Pow(m.M2, 1.5) / math.Sqrt(f.Count)
		m.M4 = (f.Kurtosis + 3) * m.M2 * m.M2 / f.Count
	}
	return m
}

// load folds every stored anomaly into per-(rank, io_step) summaries, reading
// the steps in chunks of at most provenance.MaxLimit records.
func (d *StoreDashboard) load(ctx context.Context) error {
	groups, err := d.store.Aggregate(ctx, provenance.Query{Kind: provenance.KindAnomalies, Limit: provenance.MaxLimit}, provenance.ByStep)
	if err != nil {
		return fmt.Errorf("count anomalies per io_step: %w", err)
	}
	sort.Slice(groups, func(i, j int) bool { return *groups[i].Step < *groups[j].Step })
	for i := 0; i < len(groups); {
		lo, n := *groups[i].Step, int64(0)
		j := i
		for j < len(groups) && (j == i || n+groups[j].Count <= provenance.MaxLimit) {
			n += groups[j].Count
			j++
		}
		hi := *groups[j-1].Step
		execs, err := d.store.Query(ctx, provenance.Query{
			Kind: provenance.KindAnomalies, StepMin: &lo, StepMax: &hi, Limit: provenance.MaxLimit,
		})
		if err != nil {
			return fmt.Errorf("read anomalies of io_steps %d..%d: %w", lo, hi, err)
		}
		d.Truncated += max(0, n-int64(len(execs)))
		d.add(d.final(execs))
		i = j
	}
	// Ranks without anomalies are known from their stored normal executions
	// (groups carry no program id: such ranks are shown as program 0).
	ranks, err := d.store.Aggregate(ctx, provenance.Query{Kind: provenance.KindNormalExecs, Limit: provenance.MaxLimit}, provenance.ByRank)
	if err != nil {
		return fmt.Errorf("count normal executions per rank: %w", err)
	}
	seen := map[uint32]bool{}
	for id := range d.st.Agg.Ranks {
		seen[id.Rank] = true
	}
	for _, g := range ranks {
		if g.Rank != nil && !seen[*g.Rank] {
			id := DetectorID{Rank: *g.Rank}
			d.st.Agg.Ranks[id] = &RankTotals{}
			d.st.LastSeq[id] = 1
		}
	}
	return nil
}

type rankStep struct {
	id   DetectorID
	step uint64
}

func (d *StoreDashboard) add(execs []provenance.Exec) {
	sums := map[rankStep]*syncproto.StepSummary{}
	funcs := map[rankStep]map[string]*syncproto.FuncAnomalyMetrics{}
	for i := range execs {
		e := &execs[i]
		k := rankStep{DetectorID{e.PID, e.RID}, e.IOStep}
		s := sums[k]
		if s == nil {
			s = &syncproto.StepSummary{Step: e.IOStep, MinTS: e.Entry}
			sums[k] = s
			funcs[k] = map[string]*syncproto.FuncAnomalyMetrics{}
		}
		s.Anomalies++
		s.Executions++
		s.MinTS = min(s.MinTS, e.Entry)
		s.MaxTS = max(s.MaxTS, e.Exit)
		s.Scores.Push(e.OutlierScore)
		s.Severity.Push(e.OutlierSeverity)
		f := funcs[k][e.Func]
		if f == nil {
			f = &syncproto.FuncAnomalyMetrics{Func: e.Func, FirstTS: e.Entry}
			funcs[k][e.Func] = f
		}
		f.Count++
		f.Score.Push(e.OutlierScore)
		f.Severity.Push(e.OutlierSeverity)
		f.FirstTS = min(f.FirstTS, e.Entry)
		f.LastTS = max(f.LastTS, e.Exit)
	}
	keys := make([]rankStep, 0, len(sums))
	for k := range sums {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].step != keys[j].step {
			return keys[i].step < keys[j].step
		}
		return lessID(keys[i].id, keys[j].id)
	})
	for _, k := range keys {
		s := sums[k]
		names := make([]string, 0, len(funcs[k]))
		for n := range funcs[k] {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			s.Funcs = append(s.Funcs, *funcs[k][n])
		}
		d.st.Agg.AddStep(k.id, s)
		d.st.LastSeq[k.id] = 1
	}
}

// Handler is the dashboard and its API, as a live server serves them, with
// status "stored" and the store's query API under /provdb/.
func (d *StoreDashboard) Handler() http.Handler {
	view := func(f func(st *State)) { f(d.st) } // read-only after NewStoreDashboard
	dash := &dashboard{
		cfg: d.cfg, view: view, hasProv: true,
		summary: func(st *State) Summary {
			s := summarize(d.cfg, st, StatusStored)
			if len(d.ranges) > 0 {
				s.Labels, s.Unflagged = LabelsFinal, d.Unflagged
			}
			if d.execs > 0 {
				s.Totals.Executions = uint64(d.execs)
			}
			return s
		},
		provdb: withoutToken(http.StripPrefix("/provdb", provdb.NewHTTPHandler(d.store, ""))),
	}
	dash.hist = d.histogram
	if d.culprits != nil {
		dash.culprits = func(*State) Culprits { return *d.culprits }
	}
	dash.events = func(w http.ResponseWriter, r *http.Request) {
		// One update, then nothing changes: the run is over.
		var u Update
		view(func(st *State) {
			u = Update{Summary: dash.summary(st), Heat: heatMap(st, updateSteps), Steps: stepSeries(st, updateSteps),
				TopRanks: topRanks(st, 10, "count"), TopFuncs: topFuncs(st, 10, "count")}
		})
		data, _ := json.Marshal(u)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		fmt.Fprintf(w, "retry: %d\nevent: update\ndata: %s\n\n", time.Hour.Milliseconds(), data)
		if fl, ok := w.(http.Flusher); ok {
			fl.Flush()
		}
		<-r.Context().Done()
	}
	return dash.handler()
}

// histogram is what fn's view is drawn from in a store, which keeps a
// model's statistics and natural range but not its histogram: the
// exclusive runtimes of fn's stored normal executions (at most
// provenance.MaxLimit), labelled by the final model's natural range. The
// anomalies are not counted in: they are the executions the view marks,
// and in a sample that is mostly anomalies a rebuilt model would call the
// normal runtimes the outliers.
func (d *StoreDashboard) histogram(r *http.Request, fn string) (funcModel, error) {
	execs, err := d.store.Query(r.Context(), provenance.Query{Kind: provenance.KindNormalExecs, Func: fn, Limit: provenance.MaxLimit})
	if err != nil {
		return funcModel{}, fmt.Errorf("read the normal executions of %s: %w", fn, err)
	}
	if len(execs) == 0 {
		return funcModel{}, nil
	}
	vals := make([]float64, len(execs))
	for i := range execs {
		vals[i] = float64(execs[i].RuntimeExclusive)
	}
	h := stats.BuildHistogram(vals, stats.DefaultBins)
	fm := funcModel{hist: &h, source: fmt.Sprintf("%d stored normal executions", len(execs))}
	if rng, ok := d.ranges[fn]; ok {
		fm.rng = &rng
		fm.source += ", labelled by the final model's natural range"
	}
	return fm, nil
}

// withoutToken drops a ?token= the page sends when the dashboard has no
// token (with one, daemon.Bearer drops it) before the query API, which
// rejects parameters it does not know.
func withoutToken(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if q := r.URL.Query(); q.Has("token") {
			q.Del("token")
			r2 := r.Clone(r.Context())
			r2.URL.RawQuery = q.Encode()
			r = r2
		}
		next.ServeHTTP(w, r)
	})
}

// final keeps the anomalies of execs that stand after the end-of-run
// relabelling (all of them without final natural ranges), as kipimo query
// counts them, and counts the others in Unflagged.
func (d *StoreDashboard) final(execs []provenance.Exec) []provenance.Exec {
	if len(d.ranges) == 0 {
		return execs
	}
	kept := execs[:0]
	for i := range execs {
		if provenance.FinalAnomaly(&execs[i], d.ranges) {
			kept = append(kept, execs[i])
		} else {
			d.Unflagged++
		}
	}
	return kept
}
