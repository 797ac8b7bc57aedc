package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/replay"
	"github.com/kipimo-hpc/kipimo/internal/run"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

// DefaultScaleRanks are the sizes `kipimo bench --scale` runs unless told
// otherwise.
var DefaultScaleRanks = []int{256, 1024, 4096}

// ScaleConfig configures the scale benchmark: the whole pipeline of
// `kipimo run`, in this process, on a synthetic workload of each size (or
// on frame files Prepare writes).
type ScaleConfig struct {
	// Out is a scratch directory; each size runs under Out/<ranks>.
	Out string
	// Ranks are the sizes to run, in order (default DefaultScaleRanks).
	Ranks []int
	// Steps, EventsPerStep and ThreadsPerRank shape each rank's workload
	// (defaults 5, 1000 and 1: few events per rank).
	Steps, EventsPerStep, ThreadsPerRank int
	// Prepare, when set, writes the input of each size as frame files and
	// their truth.jsonl into dir (what kipimo gen writes, e.g. a replay of
	// real traces across the ranks), untimed; the size then runs on them
	// as kipimo run --format frames dir does, instead of on the synthetic
	// workload.
	Prepare func(ctx context.Context, ranks int, dir string) error
	// Log receives a line per size as it starts and ends.
	Log io.Writer
}

// ScalePoint is what one size measured.
type ScalePoint struct {
	Ranks int `json:"ranks"`
	Steps int `json:"steps"`
	// Events is what the input published.
	Events int64 `json:"events"`
	// WallSeconds is the whole run, start to summary; the phases below
	// split it: detection (input, detectors, syncs), draining provenance
	// (records flushed, final statistics, the store caught up) and writing
	// the TAU profiles. The rest of the summary (counts, scoring) is
	// OtherSeconds.
	WallSeconds    float64 `json:"wall_seconds"`
	DetectSeconds  float64 `json:"detect_seconds"`
	DrainSeconds   float64 `json:"drain_seconds"`
	ProfileSeconds float64 `json:"profile_seconds"`
	OtherSeconds   float64 `json:"other_seconds"`
	// MicrosPerRankStep is WallSeconds per rank per io_step, in µs.
	MicrosPerRankStep float64 `json:"us_per_rank_step"`
	// EventsPerRankStep is Events per rank per io_step.
	EventsPerRankStep float64 `json:"events_per_rank_step"`
	EventsPerSecond   float64 `json:"events_per_s"`
	// PeakRSSMiB is this process's peak resident memory so far: every
	// component runs in it, and sizes run in increasing order, so it is
	// the peak of the largest size run yet.
	PeakRSSMiB float64 `json:"peak_rss_process_mib"`
	// SyncP50Ms and SyncP99Ms are the pserver's sync latency quantiles,
	// read from its kipimo_ps_sync_latency_seconds histogram (bucket upper
	// bounds); Syncs the requests it served.
	SyncP50Ms float64 `json:"ps_sync_p50_ms"`
	SyncP99Ms float64 `json:"ps_sync_p99_ms"`
	Syncs     float64 `json:"ps_syncs"`
	// SyncsPerStep is Syncs per io_step, and RanksPerSync the ranks'
	// requests each applied request carried (kipimo run is one node: its
	// detectors send one merged write and, in lockstep, one read per shard
	// per step).
	SyncsPerStep float64 `json:"ps_syncs_per_step"`
	RanksPerSync float64 `json:"ps_ranks_per_sync"`
	// ProvLagSeconds is how long provdb took, after the detectors ended,
	// to have stored everything they sent: the drain phase.
	ProvLagSeconds float64 `json:"provdb_lag_seconds"`
	Anomalies      uint64  `json:"anomalies"`
	Precision      float64 `json:"precision"`
	Recall         float64 `json:"recall"`
}

// Scale runs the whole pipeline at each size of cfg.Ranks and reports each.
func Scale(ctx context.Context, cfg ScaleConfig) ([]ScalePoint, error) {
	if cfg.Out == "" {
		return nil, errors.New("bench: no scratch directory")
	}
	if len(cfg.Ranks) == 0 {
		cfg.Ranks = DefaultScaleRanks
	}
	if cfg.Steps <= 0 {
		cfg.Steps = 5
	}
	if cfg.EventsPerStep <= 0 {
		cfg.EventsPerStep = 1000
	}
	if cfg.ThreadsPerRank <= 0 {
		cfg.ThreadsPerRank = 1
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	var out []ScalePoint
	for _, r := range cfg.Ranks {
		if r <= 0 {
			return nil, fmt.Errorf("bench: %d ranks", r)
		}
		fmt.Fprintf(cfg.Log, "scale: %d ranks x %d steps x %d events per rank-step ...\n", r, cfg.Steps, cfg.EventsPerStep)
		dir := filepath.Join(cfg.Out, strconv.Itoa(r))
		var pt ScalePoint
		var err error
		if cfg.Prepare != nil {
			in := filepath.Join(dir, "input")
			if err := cfg.Prepare(ctx, r, in); err != nil {
				return out, fmt.Errorf("bench: input of %d ranks: %w", r, err)
			}
			pt, err = measure(ctx, run.Config{Out: dir, RunID: "scale", Inputs: []string{in}, InputFormat: replay.FormatFrames}, r, cfg.Steps)
		} else {
			pt, err = ScaleOne(ctx, dir, r, cfg.Steps, cfg.EventsPerStep, cfg.ThreadsPerRank)
		}
		if err != nil {
			return out, fmt.Errorf("bench: scale at %d ranks: %w", r, err)
		}
		fmt.Fprintf(cfg.Log, "scale: %d ranks: %.1f s, %.0f µs per rank-step, peak RSS %.0f MiB\n", r, pt.WallSeconds, pt.MicrosPerRankStep, pt.PeakRSSMiB)
		out = append(out, pt)
	}
	return out, nil
}

// ScaleOne runs the pipeline once on a synthetic workload of ranks ranks.
func ScaleOne(ctx context.Context, dir string, ranks, steps, eventsPerStep, threads int) (ScalePoint, error) {
	wl := workload.DefaultConfig()
	wl.Ranks, wl.Steps, wl.EventsPerStep, wl.ThreadsPerRank = ranks, steps, eventsPerStep, threads
	return measure(ctx, run.Config{Out: dir, RunID: "scale", Workload: wl}, ranks, steps)
}

// measure runs the pipeline once as rc says, on ranks ranks of steps
// io_steps, and reads what it measured.
func measure(ctx context.Context, rc run.Config, ranks, steps int) (ScalePoint, error) {
	rc.Replace = true // the directory is scratch: a second measurement replaces the first
	p, err := run.Start(ctx, rc, zerolog.Nop())
	if err != nil {
		return ScalePoint{}, err
	}
	defer p.Close(context.WithoutCancel(ctx))
	start := time.Now()
	sum, err := p.Execute(ctx, nil)
	if err != nil {
		return ScalePoint{}, err
	}
	wall := time.Since(start).Seconds()
	pt := ScalePoint{
		Ranks: ranks, Steps: steps, Events: sum.Events,
		WallSeconds: wall, DetectSeconds: sum.DetectSeconds,
		DrainSeconds: sum.DrainSeconds, ProfileSeconds: sum.ProfileSeconds,
		EventsPerSecond: sum.EventsPerSecond, ProvLagSeconds: sum.DrainSeconds,
		Anomalies: sum.Anomalies,
	}
	pt.OtherSeconds = max(0, pt.WallSeconds-pt.DetectSeconds-pt.DrainSeconds-pt.ProfileSeconds)
	pt.MicrosPerRankStep = wall * 1e6 / float64(ranks*steps)
	pt.EventsPerRankStep = float64(sum.Events) / float64(ranks*steps)
	if sum.Score != nil {
		pt.Precision, pt.Recall = sum.Score.Precision, sum.Score.Recall
	}
	if kib, ok := peakRSSSelfKiB(); ok {
		pt.PeakRSSMiB = float64(kib) / 1024
	}
	h, err := scrapeHistogram(ctx, p.DashboardURL()+"metrics", "kipimo_ps_sync_latency_seconds")
	if err != nil {
		return pt, err
	}
	pt.Syncs = h.count
	pt.SyncP50Ms = h.quantile(0.5) * 1e3
	pt.SyncP99Ms = h.quantile(0.99) * 1e3
	pt.SyncsPerStep = h.count / float64(steps)
	parts, err := scrapeCounter(ctx, p.DashboardURL()+"metrics", "kipimo_ps_rank_syncs_total")
	if err != nil {
		return pt, err
	}
	applied, err := scrapeCounter(ctx, p.DashboardURL()+"metrics", `kipimo_ps_sync_requests_total{result="applied"}`)
	if err != nil {
		return pt, err
	}
	if applied > 0 {
		pt.RanksPerSync = parts / applied
	}
	return pt, nil
}

// histogram is a Prometheus histogram read from the text exposition:
// cumulative counts per upper bound.
type histogram struct {
	bounds []float64
	counts []float64
	count  float64
}

// quantile is the upper bound of the bucket holding quantile q (NaN with
// no observations; +Inf when it lies beyond the last finite bound).
func (h histogram) quantile(q float64) float64 {
	if h.count == 0 {
		return math.NaN()
	}
	want := q * h.count
	for i, c := range h.counts {
		if c >= want {
			return h.bounds[i]
		}
	}
	return math.Inf(1)
}

func scrapeHistogram(ctx context.Context, url, name string) (histogram, error) {
	body, err := fetchMetrics(ctx, url)
	if err != nil {
		return histogram{}, err
	}
	return parseHistogram(bytes.NewReader(body), name)
}

// scrapeCounter reads the value of one series (name with its labels, as
// exposed) from the metrics at url; a series not exposed reads 0.
func scrapeCounter(ctx context.Context, url, series string) (float64, error) {
	body, err := fetchMetrics(ctx, url)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return 0, fmt.Errorf("metrics %s: %s: %w", url, series, err)
			}
			return f, nil
		}
	}
	return 0, nil
}

// fetchMetrics reads the Prometheus text exposition at url.
func fetchMetrics(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("metrics %s: %w", url, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("metrics %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("metrics %s: %s", url, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("metrics %s: %w", url, err)
	}
	return body, nil
}

// parseHistogram reads histogram name (without labels) from Prometheus's
// text format.
func parseHistogram(r io.Reader, name string) (histogram, error) {
	type bucket struct{ le, n float64 }
	var (
		bs    []bucket
		h     histogram
		found bool
	)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, name+"_bucket{"):
			i := strings.Index(line, `le="`)
			if i < 0 {
				return h, fmt.Errorf("metrics: %s bucket without le: %q", name, line)
			}
			rest := line[i+4:]
			j := strings.IndexByte(rest, '"')
			if j < 0 {
				return h, fmt.Errorf("metrics: %s bucket: %q", name, line)
			}
			le, err := strconv.ParseFloat(rest[:j], 64)
			if err != nil {
				return h, fmt.Errorf("metrics: %s bucket bound %q: %w", name, rest[:j], err)
			}
			f := strings.Fields(rest[j:])
			if len(f) < 2 {
				return h, fmt.Errorf("metrics: %s bucket without a count: %q", name, line)
			}
			n, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				return h, fmt.Errorf("metrics: %s bucket count %q: %w", name, f[1], err)
			}
			bs = append(bs, bucket{le, n})
			found = true
		case strings.HasPrefix(line, name+"_count"):
			f := strings.Fields(line)
			n, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				return h, fmt.Errorf("metrics: %s count %q: %w", name, line, err)
			}
			h.count = n
		}
	}
	if err := sc.Err(); err != nil {
		return h, fmt.Errorf("metrics: %w", err)
	}
	if !found {
		return h, fmt.Errorf("metrics: no histogram %s", name)
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
	for _, b := range bs {
		h.bounds = append(h.bounds, b.le)
		h.counts = append(h.counts, b.n)
	}
	return h, nil
}
