// Package bench is the harness of kipimo bench: it measures the pipeline on
// this machine (detector throughput, the whole pipeline, end-to-end latency,
// provenance ingest, parameter-server sync latency, and each component's
// peak memory in a process of its own, started through the hidden
// `kipimo component` command) and reports each figure next to its target.
package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/ad"
	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/procstat"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
	"github.com/kipimo-hpc/kipimo/internal/pserver"
	"github.com/kipimo-hpc/kipimo/internal/run"
	"github.com/kipimo-hpc/kipimo/internal/stats"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

// Config configures the benchmark.
type Config struct {
	// Out is a scratch directory (removed content is recreated).
	Out string
	// Detectors and Funcs size the pserver sync load (default 1024 x 200).
	Detectors, Funcs int
	// Log receives progress lines ("detector...", "pserver...").
	Log io.Writer
	// Command runs one component in a child process when given the
	// component's name and flags: the program and the arguments before
	// them, e.g. the kipimo executable and ComponentCommand. With it, the
	// benchmark runs the default synthetic run once more with NATS, the
	// pserver, provdb and the detectors each in a process of its own and
	// reports each one's peak RSS; without it, only this process's.
	Command []string
}

// Figure is one measured number next to its target.
type Figure struct {
	Value  float64 `json:"value"`
	Unit   string  `json:"unit"`
	Target string  `json:"target,omitempty"`
	Met    *bool   `json:"met,omitempty"`
}

func fig(v float64, unit string) Figure { return Figure{Value: v, Unit: unit} }

func (f Figure) atLeast(t float64) Figure {
	ok := f.Value >= t
	f.Met, f.Target = &ok, fmt.Sprintf(">= %g", t)
	return f
}

func (f Figure) atMost(t float64) Figure {
	ok := f.Value <= t
	f.Met, f.Target = &ok, fmt.Sprintf("<= %g", t)
	return f
}

// Result is what `kipimo bench` reports.
type Result struct {
	Figures map[string]Figure `json:"figures"`
	Notes   []string          `json:"notes"`
}

// Run measures the pipeline: detector throughput on one core, provenance
// ingest, pserver sync latency under many detectors, end-to-end latency from a
// function's exit to its anomaly in the pserver, bytes per stored anomaly, the
// reduction factor, and peak memory: of each component in a process of its
// own when cfg.Command is set, and of this process.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if cfg.Out == "" {
		return nil, errors.New("bench: no scratch directory")
	}
	if cfg.Detectors <= 0 {
		cfg.Detectors = 1024
	}
	if cfg.Funcs <= 0 {
		cfg.Funcs = 200
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	if err := os.RemoveAll(cfg.Out); err != nil {
		return nil, err
	}
	res := &Result{Figures: map[string]Figure{}}

	fmt.Fprintln(cfg.Log, "detector: one rank of the synthetic workload, decode + stacks + statistics + SSTD, one core")
	eps, bpe, err := benchDetector(ctx)
	if err != nil {
		return nil, err
	}
	res.Figures["detector_events_per_s"] = fig(eps, "events/s").atLeast(10e6)
	res.Figures["frame_bytes_per_event"] = fig(bpe, "B/event").atMost(6)

	fmt.Fprintln(cfg.Log, "pipeline: the default synthetic run, as fast as it goes")
	sum, _, err := benchPipeline(ctx, filepath.Join(cfg.Out, "pipeline"), workload.DefaultConfig(), 0)
	if err != nil {
		return nil, err
	}
	res.Figures["pipeline_events_per_s"] = fig(sum.EventsPerSecond, "events/s")
	wl := workload.DefaultConfig()
	wl.Ranks = 4
	fmt.Fprintf(cfg.Log, "latency: %d ranks in real time, from each injected anomaly's exit to the pserver\n", wl.Ranks)
	_, lat, err := benchPipeline(ctx, filepath.Join(cfg.Out, "latency"), wl, 1)
	if err != nil {
		return nil, err
	}
	res.Figures["e2e_p50_ms"] = fig(lat.p50, "ms")
	res.Figures["e2e_p95_ms"] = fig(lat.p95, "ms").atMost(lat.stepMs + 100)
	res.Figures["io_step_ms"] = fig(lat.stepMs, "ms")
	if sum.Score != nil {
		res.Figures["precision"] = fig(sum.Score.Precision, "").atLeast(0.9)
		res.Figures["recall"] = fig(sum.Score.Recall, "").atLeast(0.9)
	}
	res.Figures["reduction_factor"] = fig(sum.Reduction, "x").atLeast(100)
	res.Figures["reduction_factor_vs_tau_adios2"] = fig(sum.ReductionVsTAU, "x")

	fmt.Fprintln(cfg.Log, "provenance: SQLite ingest of the run's anomaly records")
	ing, err := benchIngest(ctx, filepath.Join(cfg.Out, "pipeline", "bench", "provenance.db"), filepath.Join(cfg.Out, "ingest.db"))
	if err != nil {
		return nil, err
	}
	res.Figures["provenance_records_per_s"] = fig(ing.perSec, "records/s").atLeast(50000)
	res.Figures["provenance_records_per_cpu_s"] = fig(ing.perCPUSec, "records/cpu-s")
	res.Figures["stored_bytes_per_anomaly"] = fig(ing.storedPerRecord, "B/record").atMost(1024)
	res.Figures["anomaly_json_median_bytes"] = fig(ing.jsonMedian, "B").atMost(1024)

	fmt.Fprintf(cfg.Log, "pserver: %d detectors syncing %d functions each, one step\n", cfg.Detectors, cfg.Funcs)
	p50, p99, mps, err := benchSync(ctx, filepath.Join(cfg.Out, "sync"), cfg.Detectors, cfg.Funcs)
	if err != nil {
		return nil, err
	}
	res.Figures["sync_p50_ms"] = fig(p50, "ms")
	res.Figures["sync_p99_ms"] = fig(p99, "ms").atMost(20)
	res.Figures["sync_merges_per_s"] = fig(mps, "merges/s")

	if len(cfg.Command) > 0 {
		fmt.Fprintf(cfg.Log, "components: the default synthetic run with NATS, pserver, provdb and the detectors (one ad for %d ranks) in processes of their own\n", workload.DefaultConfig().Ranks)
		cr, err := benchComponents(ctx, cfg.Command, filepath.Join(cfg.Out, "components"), workload.DefaultConfig())
		if err != nil {
			return nil, fmt.Errorf("bench components: %w", err)
		}
		for _, c := range []struct{ component, figure string }{
			{ComponentAD, "peak_rss_detector_mib"},
			{ComponentPServer, "peak_rss_pserver_mib"},
			{ComponentProvDB, "peak_rss_provdb_mib"},
			{ComponentNATS, "peak_rss_nats_mib"},
		} {
			if mib, ok := cr.PeakRSS[c.component]; ok {
				res.Figures[c.figure] = fig(mib, "MiB")
			} else {
				res.Notes = append(res.Notes, fmt.Sprintf("%s: this system reports no peak RSS of child processes", c.figure))
			}
		}
		res.Figures["separate_processes_events_per_s"] = fig(cr.EventsPerSecond, "events/s")
		res.Notes = append(res.Notes, fmt.Sprintf(
			"peak_rss_{detector,pserver,provdb,nats}_mib: the default synthetic run (%d ranks x %d steps x %d events) with each component in a process of its own on 127.0.0.1, as each process reported it (VmHWM on Linux) when it exited cleanly; one ad process serves all %d ranks; the input waits while a rank's detector is 16 frames behind",
			workload.DefaultConfig().Ranks, workload.DefaultConfig().Steps, workload.DefaultConfig().EventsPerStep, workload.DefaultConfig().Ranks))
		if cr.Stored != int64(cr.Flagged) {
			res.Notes = append(res.Notes, fmt.Sprintf("separate processes: the detectors flagged %d anomalies but provdb stored %d", cr.Flagged, cr.Stored))
		}
	} else {
		res.Notes = append(res.Notes, "peak RSS per component not measured: no command to start components in child processes with (kipimo bench gives its own executable)")
	}
	if kib, ok := peakRSSSelfKiB(); ok {
		res.Figures["peak_rss_bench_process_mib"] = fig(float64(kib)/1024, "MiB")
	}
	res.Notes = append(res.Notes,
		"peak_rss_bench_process_mib is this process, which ran the other measurements with every component in it (as kipimo run does): the NATS server, pserver, provdb and all detectors, and the frames held for the detector and sync measurements",
		"reduction_factor is raw binary frames over the provenance store; reduction_factor_vs_tau_adios2 counts 48 bytes per event as TAU's ADIOS2 stream spends",
		fmt.Sprintf("the sync benchmark runs %d detectors over loopback NATS on this machine's %d cores, together with the pserver", cfg.Detectors, runtime.NumCPU()),
	)
	return res, nil
}

// benchDetector runs one rank's frames through a detector on the calling
// goroutine and returns events/s and binary bytes per event.
func benchDetector(ctx context.Context) (float64, float64, error) {
	wc := workload.DefaultConfig()
	wc.Ranks, wc.Steps, wc.EventsPerStep = 1, 20, 100_000
	w, err := workload.New(wc)
	if err != nil {
		return 0, 0, err
	}
	g := w.Rank(0)
	var frames [][]byte
	var f frame.Frame
	events, size := 0, 0
	for {
		_, err := g.Next(&f)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, 0, err
		}
		b := frame.AppendBinary(nil, &f)
		frames = append(frames, b)
		events += f.NumEvents()
		size += len(b)
	}
	best := 0.0
	for range 3 {
		d, err := ad.New(ad.Config{Algorithm: ad.SSTD, Logger: zerolog.Nop()})
		if err != nil {
			return 0, 0, err
		}
		runtime.GC()
		start := time.Now()
		for _, b := range frames {
			if _, err := frame.DecodeBinary(b, &f); err != nil {
				return 0, 0, err
			}
			if err := d.Process(ctx, &f); err != nil {
				return 0, 0, err
			}
		}
		el := time.Since(start)
		if err := d.Close(ctx); err != nil {
			return 0, 0, err
		}
		best = max(best, float64(events)/el.Seconds())
	}
	return best, float64(size) / float64(events), nil
}

type latencies struct{ p50, p95, stepMs float64 }

// benchPipeline runs a workload, paced at speed times real time (0: as fast
// as possible), and measures, for every injected anomaly, the time from its
// exit (in paced wall time) to the moment the pserver's aggregates show an
// anomaly of its rank and step.
func benchPipeline(ctx context.Context, out string, wl workload.Config, speed float64) (*run.Summary, latencies, error) {
	cfg := run.Config{Out: out, RunID: "bench", Pace: speed, Workload: wl}
	p, err := run.Start(ctx, cfg, zerolog.Nop())
	if err != nil {
		return nil, latencies{}, err
	}
	defer p.Close(context.WithoutCancel(ctx))
	type cell struct {
		rank uint32
		step uint64
	}
	seen := map[cell]time.Time{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	if speed > 0 { // only a paced run has exit times to measure from
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(2 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				now := time.Now()
				p.ViewServer(func(st *pserver.State) {
					for step, sa := range st.Agg.Steps {
						for id, c := range sa.Ranks {
							k := cell{id.Rank, step}
							if _, ok := seen[k]; !ok && c.Anomalies > 0 {
								seen[k] = now
							}
						}
					}
				})
			}
		}()
	}
	sum, err := p.Execute(ctx, nil)
	close(stop)
	wg.Wait()
	if err != nil {
		return nil, latencies{}, err
	}
	truth := p.Truth()
	if speed == 0 {
		return sum, latencies{}, nil
	}
	if len(truth) == 0 {
		return sum, latencies{}, errors.New("bench: the run injected no anomalies")
	}
	var lats []float64
	for _, t := range truth {
		vis, ok := seen[cell{t.Rank, t.Step}]
		if !ok {
			continue
		}
		exitAt := p.PacedTime(t.Exit)
		lats = append(lats, float64(vis.Sub(exitAt))/float64(time.Millisecond))
	}
	slices.Sort(lats)
	stepMs := float64(p.StepWidth()) / float64(time.Millisecond) / speed
	return sum, latencies{p50: quantile(lats, 0.5), p95: quantile(lats, 0.95), stepMs: stepMs}, nil
}

// ingestFigures are what benchIngest measures.
type ingestFigures struct {
	perSec, perCPUSec float64 // records ingested per second, per CPU-second
	storedPerRecord   float64 // bytes on disk per record, indexes included
	jsonMedian        float64 // median JSON size of a record
}

// benchIngest does what provdb does with the anomalies of a finished run,
// repeated with fresh event ids up to 50,000 records: decode each message
// (a JSON batch of 250 records, as detectors publish them) and write it to
// a new SQLite store in one transaction (synchronous FULL). Encoding the
// messages is not timed.
func benchIngest(ctx context.Context, from, to string) (ingestFigures, error) {
	var f ingestFigures
	src, err := sqlitestore.Open(ctx, from, sqlitestore.Options{ReadOnly: true})
	if err != nil {
		return f, err
	}
	recs, err := src.Query(ctx, provenance.Query{Kind: provenance.KindAnomalies, Limit: provenance.MaxLimit})
	src.Close()
	if err != nil {
		return f, err
	}
	if len(recs) == 0 {
		return f, errors.New("bench: no anomaly records to ingest")
	}
	var sizes []float64
	for i := range recs {
		b, err := provenance.AppendExecJSON(nil, &recs[i])
		if err != nil {
			return f, err
		}
		sizes = append(sizes, float64(len(b)))
	}
	slices.Sort(sizes)
	f.jsonMedian = quantile(sizes, 0.5)
	const total, batch = 50_000, 250
	var msgs [][]byte
	for lo := 0; lo < total; lo += batch {
		part := make([]provenance.Exec, 0, batch)
		for i := lo; i < lo+batch; i++ {
			r := recs[i%len(recs)]
			r.EventID = fmt.Sprintf("%d:%d:%d", r.RID, r.IOStep, 1_000_000_000+i)
			part = append(part, r)
		}
		data, err := json.Marshal(part)
		if err != nil {
			return f, err
		}
		msgs = append(msgs, data)
	}
	dst, err := sqlitestore.Open(ctx, to, sqlitestore.Options{})
	if err != nil {
		return f, err
	}
	defer dst.Close()
	start, cpu0 := time.Now(), procstat.CPUTime()
	for _, m := range msgs {
		b, err := provenance.DecodeBatch(provenance.KindAnomalies, m)
		if err != nil {
			return f, err
		}
		if err := dst.Write(ctx, b); err != nil {
			return f, err
		}
	}
	el, cpu := time.Since(start), procstat.CPUTime()-cpu0
	size, err := dst.DiskUsage(ctx)
	if err != nil {
		return f, err
	}
	f.perSec = total / el.Seconds()
	if cpu > 0 {
		f.perCPUSec = total / cpu.Seconds()
	}
	f.storedPerRecord = float64(size) / total
	return f, nil
}

// benchSync starts a pserver on an embedded NATS server and has n detectors
// sync one step of funcs model deltas each, spread over one second, measuring
// each request's round trip.
func benchSync(ctx context.Context, dir string, n, funcs int) (p50, p99, mergesPerSec float64, err error) {
	ns, err := natsx.StartServer(natsx.DefaultServerConfig(dir))
	if err != nil {
		return 0, 0, 0, err
	}
	defer ns.Shutdown()
	nc, err := natsx.Connect(ctx, ns.ClientURL(), "bench-pserver")
	if err != nil {
		return 0, 0, 0, err
	}
	defer nc.Close()
	ps, err := pserver.New(pserver.Config{Run: "bench", HTTPAddr: "", Durability: pserver.DurabilityNone}, zerolog.Nop())
	if err != nil {
		return 0, 0, 0, err
	}
	if err := ps.Start(ctx, nc); err != nil {
		return 0, 0, 0, err
	}
	defer ps.Shutdown(context.WithoutCancel(ctx))
	// Pre-encode every detector's request so that the measurement is the
	// pserver's, not the load generator's.
	reqs := make([][]byte, n)
	for d := range n {
		req := syncproto.SyncRequest{Rank: uint32(d), Seq: 1, Step: 0, Algorithm: ad.SSTD}
		for f := range funcs {
			var m stats.Moments
			for k := range 8 {
				m.Push(float64(100 + f + (d*7+k*13)%50))
			}
			req.Models = append(req.Models, syncproto.ModelDelta{Key: fmt.Sprintf("func_%d", f), Moments: m})
		}
		req.Steps = []syncproto.StepSummary{{Step: 0, Executions: uint64(8 * funcs)}}
		if reqs[d], err = syncproto.MarshalRequest(&req); err != nil {
			return 0, 0, 0, err
		}
	}
	const clients = 16
	conns := make([]*nats.Conn, clients)
	for i := range conns {
		if conns[i], err = natsx.Connect(ctx, ns.ClientURL(), "bench-detectors"); err != nil {
			return 0, 0, 0, err
		}
		defer conns[i].Close()
	}
	subject := natsx.Subjects{Run: "bench"}.Sync(0)
	// Detectors finish their steps at different moments: spread the syncs
	// evenly over one io_step of a second.
	const step = time.Second
	lat := make([]float64, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for d := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Until(start.Add(step * time.Duration(d) / time.Duration(n))))
			t := time.Now()
			_, errs[d] = conns[d%clients].Request(subject, reqs[d], 30*time.Second)
			lat[d] = float64(time.Since(t)) / float64(time.Millisecond)
		}()
	}
	wg.Wait()
	el := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return 0, 0, 0, fmt.Errorf("bench sync: %w", err)
	}
	slices.Sort(lat)
	return quantile(lat, 0.5), quantile(lat, 0.99), float64(n*funcs) / el.Seconds(), nil
}

// quantile of sorted values (nearest rank).
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
