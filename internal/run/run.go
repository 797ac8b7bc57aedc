package run

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/ad"
	"github.com/kipimo-hpc/kipimo/internal/adnode"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provdb"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provstream"
	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
	"github.com/kipimo-hpc/kipimo/internal/pserver"
	"github.com/kipimo-hpc/kipimo/internal/replay/publish"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

// Pipeline is a running pipeline. Start it with Start; it owns every server
// and goroutine it starts, and Close stops them all.
type Pipeline struct {
	cfg Config
	log zerolog.Logger

	ns    *natsx.Server
	nc    *nats.Conn
	js    jetstream.JetStream
	store *sqlitestore.Store
	prov  *provdb.Service
	ps    *pserver.Server
	sink  *adnode.NATSSink

	provHTTP *http.Server
	provURL  string
	wg       sync.WaitGroup

	// createdDir is the run's directory when this run created it;
	// wroteEndpoints whether its endpoints file was written; started when
	// Start began.
	createdDir     string
	createdOut     bool
	wroteEndpoints bool
	started        time.Time
	// finished is set once Execute has returned a summary; closeNote is
	// what Close did with the directory of a run that did not finish.
	finished  bool
	closeNote string

	// stop is done once Interrupt has been called, with stopSig its
	// signal; child is the pid of a live run's command while it runs, and
	// childGroup whether it leads a process group of its own.
	stop       context.Context
	stopRun    context.CancelFunc
	stopSig    os.Signal
	stopOnce   sync.Once
	child      atomic.Int64
	childGroup atomic.Bool

	// Set by Execute, for the benchmark: the ground truth, when the input
	// was published, the input's first timestamp and the step width (µs).
	truth     []workload.Truth
	paceStart time.Time
	paceT0    uint64
	stepWidth uint64
	// input is what the trace input's reader read (trace inputs only).
	input *inputStats
}

// Start brings up NATS, the provenance service, the parameter server and
// the detectors' record sink. The detectors and the input start with Execute.
func Start(ctx context.Context, cfg Config, log zerolog.Logger) (*Pipeline, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := &Pipeline{cfg: cfg, log: log, started: time.Now()}
	p.stop, p.stopRun = context.WithCancel(context.Background())
	if err := p.start(ctx); err != nil {
		p.Close(context.Background())
		return nil, err
	}
	return p, nil
}

func (p *Pipeline) start(ctx context.Context) error {
	if err := p.claimRunDir(); err != nil {
		return err
	}
	cfg := p.cfg
	url := cfg.NATSURL
	if url == "" {
		ns, err := natsx.StartServer(natsx.DefaultServerConfig(cfg.path("nats")))
		if err != nil {
			return err
		}
		p.ns = ns
		url = ns.ClientURL()
	}
	// Each rank's detector subscribes synchronously to its frames. When
	// the input is published here, flow control keeps at most MaxLag of
	// them pending, so the default queue of 64k messages per subscription
	// (512 KiB each, 2 GiB at 4,096 ranks) is not needed; a live run's
	// processes publish without it and keep the default.
	// Losing and regaining the server (an external one) is logged once
	// per change, as the daemons do.
	opts := []nats.Option{natsx.Logged(p.log)}
	if len(cfg.Live.Command) == 0 {
		opts = append(opts, nats.SyncQueueLen(max(256, 4*max(cfg.MaxLag, maxAutoLag))))
	}
	if cfg.NATSURL != "" {
		auth, err := cfg.NATSAuth.Options()
		if err != nil {
			return err
		}
		opts = append(opts, auth...)
	}
	nc, err := natsx.Connect(ctx, url, "kipimo-run", opts...)
	if err != nil {
		return err
	}
	p.nc = nc
	if p.js, err = jetstream.New(nc); err != nil {
		return fmt.Errorf("JetStream: %w", err)
	}
	if p.ns == nil {
		if err := p.claimStream(ctx); err != nil {
			return err
		}
	}
	if _, err := provstream.EnsureStream(ctx, p.js, cfg.RunID); err != nil {
		return err
	}

	store, err := sqlitestore.Open(ctx, cfg.path("provenance.db"), sqlitestore.Options{Synchronous: "NORMAL"})
	if err != nil {
		return err
	}
	p.store = store
	if err := p.startProvenance(ctx); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("provenance query API: %w", err)
	}
	p.provURL = "http://" + ln.Addr().String()
	p.provHTTP = &http.Server{
		Handler:           provdb.NewHTTPHandler(store, "", provdb.WithStats(p.prov.Stats)),
		ReadHeaderTimeout: 5 * time.Second,
	}
	p.wg.Add(1)
	go pprof.Do(ctx, pprof.Labels("component", "provdb-http"), func(context.Context) {
		defer p.wg.Done()
		if err := p.provHTTP.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			p.log.Error().Err(err).Msg("provenance query API stopped")
		}
	})

	if err := p.startPServer(ctx, cfg.HTTP); err != nil {
		return err
	}

	sink, err := adnode.NewNATSSink(p.js, cfg.RunID, 0, adnode.Block, p.log.With().Str("component", "ad-sink").Logger())
	if err != nil {
		return err
	}
	if err := sink.Start(ctx); err != nil {
		return fmt.Errorf("start record sink: %w", err)
	}
	p.sink = sink
	return p.writeEndpoints()
}

func (p *Pipeline) startProvenance(ctx context.Context) error {
	plog := p.log.With().Str("component", "provdb").Logger()
	p.prov = provdb.New(provdb.Config{Run: p.cfg.RunID, AckWait: 5 * time.Second}, p.store, p.js, plog)
	if err := p.prov.Start(ctx); err != nil {
		return fmt.Errorf("start provenance service: %w", err)
	}
	return nil
}

func (p *Pipeline) startPServer(ctx context.Context, addr string) error {
	ps, err := pserver.New(pserver.Config{Run: p.cfg.RunID, HTTPAddr: addr, ProvDBURL: p.provURL, Baseline: p.cfg.Detector.Baseline}, p.log)
	if err != nil {
		return err
	}
	if err := ps.Start(ctx, p.nc); err != nil {
		return fmt.Errorf("start parameter server: %w", err)
	}
	p.ps = ps
	return nil
}

// RunID is the run's id (given, or made from the time by Validate).
func (p *Pipeline) RunID() string { return p.cfg.RunID }

// Dir is the run's directory: Out/RunID.
func (p *Pipeline) Dir() string { return p.cfg.path("") }

// DashboardURL is the parameter server's web page.
func (p *Pipeline) DashboardURL() string { return "http://" + p.ps.HTTPAddr() + "/" }

// Truth is the ground truth the run injected, once Execute has returned
// (synthetic runs, and live runs with injected delays).
func (p *Pipeline) Truth() []workload.Truth { return p.truth }

// PacedTime is, in a run paced at Config.Pace > 0, the wall-clock time at
// which the input reached its timestamp ts (µs, the input's clock), once
// Execute has started publishing.
func (p *Pipeline) PacedTime(ts uint64) time.Time {
	return p.paceStart.Add(time.Duration(float64(ts-p.paceT0) * float64(time.Microsecond) / p.cfg.Pace))
}

// StepWidth is the synthetic workload's io_step length in the input's time
// (0 for other inputs).
func (p *Pipeline) StepWidth() time.Duration { return time.Duration(p.stepWidth) * time.Microsecond }

// ViewServer calls fn with the parameter server's state, under its lock;
// fn must not keep it.
func (p *Pipeline) ViewServer(fn func(*pserver.State)) { p.ps.View(fn) }

// Interrupt ends a running Execute early, as Ctrl-C does in kipimo run: a
// synthetic or trace input stops being published, a live run's command is
// sent sig (its process group, when it leads one: as a terminal sends it),
// and the run then ends as if its input had ended, every detector's
// records drained into the store, the summary (which says it was
// interrupted) and the profiles written. Only the first call counts; it
// may come before Execute, which then ends at once.
func (p *Pipeline) Interrupt(sig os.Signal) {
	p.stopOnce.Do(func() {
		p.stopSig = sig
		p.stopRun()
	})
}

// Kill kills a live run's command (its process group, when it leads one)
// at once: for a second Ctrl-C, when the caller exits without waiting.
func (p *Pipeline) Kill() {
	p.signalChild(syscall.SIGKILL, true)
}

// signalChild sends sig to a live run's command: to its process group when
// it leads one. In a process group shared with kipimo, the group (the
// terminal's) already had a SIGINT from the terminal: it is sent again only
// when always is set.
func (p *Pipeline) signalChild(sig os.Signal, always bool) {
	pid := int(p.child.Load())
	s, ok := sig.(syscall.Signal)
	if pid <= 0 || !ok {
		return
	}
	if p.childGroup.Load() {
		pid = -pid
	} else if s == syscall.SIGINT && !always {
		return
	}
	if err := syscall.Kill(pid, s); err != nil && !errors.Is(err, syscall.ESRCH) {
		p.log.Warn().Err(err).Int("pid", pid).Msg("could not signal the command")
	}
}

// interrupted is the signal Interrupt was given, or nil.
func (p *Pipeline) interrupted() os.Signal {
	if p.stop.Err() == nil {
		return nil
	}
	return p.stopSig
}

// Close stops everything Start started, in reverse order.
func (p *Pipeline) Close(ctx context.Context) {
	p.stopRun()
	if p.sink != nil {
		_ = p.sink.Shutdown(ctx)
	}
	if p.ps != nil {
		_ = p.ps.Shutdown(ctx)
	}
	if p.provHTTP != nil {
		_ = p.provHTTP.Shutdown(ctx)
	}
	if p.prov != nil {
		_ = p.prov.Shutdown(ctx)
	}
	p.wg.Wait()
	emptyStore := false
	if p.store != nil {
		emptyStore = !p.finished && p.storeEmpty(ctx)
		_ = p.store.Close()
		p.store = nil
	}
	if p.nc != nil {
		p.nc.Close()
	}
	if p.ns != nil {
		p.ns.Shutdown()
		p.ns = nil
		if !p.cfg.KeepNATS {
			// Everything the run keeps is in the store by now.
			if err := os.RemoveAll(p.cfg.path("nats")); err != nil {
				p.log.Warn().Err(err).Msg("could not delete the run's NATS data")
			}
		}
	}
	if p.wroteEndpoints {
		// The servers are gone: nobody is to look for them there.
		_ = os.Remove(p.cfg.path(EndpointsFile))
		p.wroteEndpoints = false
	}
	if !p.finished && p.createdDir != "" {
		p.closeNote = p.removeFailed(emptyStore)
	}
}

// CloseNote says, after Close, what became of the directory of a run that
// did not finish (it failed, or Execute was never called): removed, when
// the run stored nothing, or kept with what it stored. It is empty for a
// run that finished and for one whose directory was there before.
func (p *Pipeline) CloseNote() string { return p.closeNote }

// removeFailed deletes the directory of a run that did not finish, when
// its store is empty, and says what it did.
func (p *Pipeline) removeFailed(emptyStore bool) string {
	dir := p.createdDir
	p.createdDir = ""
	if !emptyStore {
		return fmt.Sprintf("kept %s: its store holds what the run stored before it stopped", dir)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Sprintf("could not delete %s, which the run created: %v", dir, err)
	}
	if p.createdOut {
		_ = os.Remove(p.cfg.Out) // only when empty
	}
	return fmt.Sprintf("removed %s: the run created it and stored nothing", dir)
}

// storeEmpty reports whether the provenance store holds no record.
func (p *Pipeline) storeEmpty(ctx context.Context) bool {
	for _, kind := range provenance.Kinds {
		if n, err := p.store.Count(ctx, provenance.Query{Kind: kind}); err != nil || n > 0 {
			return false
		}
	}
	return true
}

// Progress is the running state of a run, reported while it executes.
type Progress struct {
	// Step is the io_steps every detector has processed, of Steps (0 when
	// unknown).
	Step, Steps int
	// Frames and Events are what the input published so far.
	Frames    int
	Events    int64
	Anomalies uint64
	Elapsed   time.Duration
	// BehindRank is the rank whose detector the input is waiting for or,
	// when it is not waiting, the one furthest behind; Behind is how many
	// steps published to that rank its detector has not taken yet (at most
	// Config.MaxLag). Stalled is how long the input has been waiting for
	// it (0 when not waiting), Held the time the input waited in all.
	BehindRank uint32
	Behind     int
	Stalled    time.Duration
	Held       time.Duration
}

// Execute runs the detectors and publishes the input, then finishes the run:
// final statistics, provenance drained into the store, the summary written.
// progress, when set, is called about four times a second.
func (p *Pipeline) Execute(ctx context.Context, progress func(Progress)) (*Summary, error) {
	var (
		sum *Summary
		err error
	)
	if len(p.cfg.Live.Command) > 0 {
		sum, err = p.executeLive(ctx, progress)
	} else {
		sum, err = p.executeInput(ctx, progress)
	}
	p.finished = err == nil
	return sum, err
}

// executeInput is Execute for a synthetic run, a replay or trace files:
// the input is published here.
func (p *Pipeline) executeInput(ctx context.Context, progress func(Progress)) (*Summary, error) {
	cfg := p.cfg
	start := time.Now()
	src, truth, ranks, err := p.source(ctx)
	if err != nil {
		return nil, err
	}
	dc := cfg.Detector
	dc.Sink = p.sink
	if h := cfg.hooks; h != nil && h.wrapSink != nil {
		dc.Sink = h.wrapSink(p.sink)
	}

	sctx, cancelServe := context.WithCancel(ctx)
	defer cancelServe()
	node, err := p.startDetectors(sctx, adnode.ServeConfig{PID: p.pid(), Ranks: ranks, Detector: dc, Lockstep: true, CloseTimeout: closeTimeout(len(ranks))})
	if err != nil {
		return nil, err
	}
	collector := node.Collector()

	if h := cfg.hooks; h != nil && h.afterReady != nil {
		h.afterReady()
	}
	flow := newFlowControl(collectorCounts{collector}, cfg.lag(len(ranks)), p.log.With().Str("component", "input").Logger())
	// Progress is reported on the publishing goroutine: after frames are
	// published, and while the input waits for a detector that fell behind.
	var (
		last       publish.Counts
		lastReport time.Time
	)
	report := func() {
		lastReport = time.Now()
		l := flow.lag()
		var total ad.Stats
		step := uint64(math.MaxUint64)
		for _, s := range collector.Stats() {
			total.Add(s)
			step = min(step, s.Frames)
		}
		if step == math.MaxUint64 {
			step = 0
		}
		progress(Progress{
			Step: int(step), Steps: p.steps(), Frames: last.Frames, Events: int64(last.Events),
			Anomalies: total.Anomalies, Elapsed: time.Since(start),
			Behind: l.Behind, BehindRank: l.Rank, Stalled: l.Stalled, Held: l.Held,
		})
	}
	const progressEvery = 250 * time.Millisecond
	pace := publish.Pace{Speed: cfg.Pace, ProgressEvery: progressEvery}
	if progress != nil {
		pace.Progress = func(c publish.Counts) {
			last = c
			report()
		}
		flow.onStall = func() {
			if time.Since(lastReport) >= progressEvery {
				report()
			}
		}
	}
	p.paceStart = time.Now()
	// Interrupt stops the input where it is; the run then ends as if the
	// input had ended there.
	pubCtx, stopInput := context.WithCancel(ctx)
	defer stopInput()
	defer context.AfterFunc(p.stop, stopInput)()
	counts, inStats, err := publish.Frames(pubCtx, p.nc, natsx.Subjects{Run: cfg.RunID}, flow.wrap(src, &p.paceT0), pace)
	if err != nil && p.interrupted() != nil && ctx.Err() == nil {
		err = nil
	}
	if err != nil {
		cancelServe()
		<-node.Done()
		return nil, fmt.Errorf("publish input: %w", err)
	}
	for _, r := range ranks {
		if err := p.endOfStream(r); err != nil {
			return nil, err
		}
	}
	stats, err := detectorsEnded(node)
	if err != nil {
		return nil, fmt.Errorf("detectors: %w", err)
	}
	detectTime := time.Since(start)
	drainStart := time.Now()
	if err := p.finishDetection(ctx); err != nil {
		return nil, err
	}
	drainTime := time.Since(drainStart)
	if truth != nil {
		p.truth = truth()
	}
	sum, err := p.summarize(ctx, stats, truth, counts, inStats.Executions, detectTime, time.Since(start))
	if err != nil {
		return nil, err
	}
	sum.Backpressure = flow.report()
	sum.DrainSeconds = drainTime.Seconds()
	sum.setInterrupted(p.interrupted())
	return sum, nil
}

// closeTimeout bounds the detectors' final flush. Every rank's last
// records and profile go through the one sink at the same moment, so the
// bound grows with the ranks: 10 s, and 5 ms more per rank.
func closeTimeout(ranks int) time.Duration {
	return 10*time.Second + time.Duration(ranks)*5*time.Millisecond
}

// startDetectors starts the run's ad node serving sc (its run and queue
// bound filled in here; it syncs through the run's pserver) and returns
// once the detectors listen. Cancelling ctx stops it.
func (p *Pipeline) startDetectors(ctx context.Context, sc adnode.ServeConfig) (*adnode.Node, error) {
	sc.Run = p.cfg.RunID
	sc.PendingFrames = max(p.cfg.MaxLag, maxAutoLag) * 4
	n, err := adnode.New(adnode.Config{Serve: sc}, p.nc, p.log.With().Str("component", "ad").Logger(), nil)
	if err != nil {
		return nil, fmt.Errorf("start detectors: %w", err)
	}
	if err := n.Start(ctx); err != nil {
		return nil, err
	}
	return n, nil
}

// detectorsEnded waits until the node has stopped and returns its
// detectors' final counts and what ended it, if that was an error.
func detectorsEnded(n *adnode.Node) ([]ad.Stats, error) {
	<-n.Done()
	err := n.Shutdown(context.Background()) // stopped: returns at once
	return n.Stats(), err
}

// finishDetection ends a run's detection once the detectors have stopped:
// their records flushed, the pserver's final statistics published, and
// everything in the provenance store.
func (p *Pipeline) finishDetection(ctx context.Context) error {
	if err := p.sink.Flush(ctx); err != nil {
		return fmt.Errorf("flush provenance records: %w", err)
	}
	if err := p.ps.Finish(ctx); err != nil {
		return fmt.Errorf("final statistics: %w", err)
	}
	return p.drain(ctx)
}

// endOfStream tells rank r's detector its input has ended.
func (p *Pipeline) endOfStream(r uint32) error {
	m := nats.NewMsg(natsx.Subjects{Run: p.cfg.RunID}.Frames(p.pid(), r))
	m.Header.Set(adnode.EndOfStreamHeader, "1")
	if err := p.nc.PublishMsg(m); err != nil {
		return fmt.Errorf("end the stream of rank %d: %w", r, err)
	}
	return p.nc.Flush()
}

// drain waits until the provenance service has written everything in the
// stream.
func (p *Pipeline) drain(ctx context.Context) error {
	return provstream.WaitConsumed(ctx, p.js, p.cfg.RunID, "provdb")
}

var _ io.Closer = (*sqlitestore.Store)(nil)
