package run

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/adnode"
	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/replay"
	"github.com/kipimo-hpc/kipimo/internal/replay/publish"
	"github.com/kipimo-hpc/kipimo/internal/replay/steps"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

// workloadSource yields a synthetic run step by step, every rank's frame of
// step s before any frame of step s+1, and keeps the ground truth.
type workloadSource struct {
	w     *workload.Workload
	cfg   workload.Config
	mu    sync.Mutex
	truth []workload.Truth
}

func (s *workloadSource) Frames(ctx context.Context, emit func(*frame.Frame) error) (replay.Stats, error) {
	var st replay.Stats
	gens := make([]*workload.RankGen, s.cfg.Ranks)
	for r := range gens {
		gens[r] = s.w.Rank(uint32(r))
	}
	var f frame.Frame
	for step := 0; ; step++ {
		live := 0
		for _, g := range gens {
			if g == nil {
				continue
			}
			truth, err := g.Next(&f)
			if errors.Is(err, io.EOF) {
				continue
			}
			if err != nil {
				return st, err
			}
			live++
			st.Frames++
			st.Events += f.NumEvents()
			if err := emit(&f); err != nil {
				return st, err
			}
			// The truth of published frames only: an interrupted run is
			// scored on what it saw.
			s.mu.Lock()
			s.truth = append(s.truth, truth...)
			s.mu.Unlock()
			if err := ctx.Err(); err != nil {
				return st, err
			}
		}
		if live == 0 {
			return st, nil
		}
	}
}

func (s *workloadSource) Truth() []workload.Truth {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.truth
}

// source opens the run's input and lists the ranks it has.
func (p *Pipeline) source(ctx context.Context) (replay.Source, func() []workload.Truth, []uint32, error) {
	cfg := p.cfg
	if len(cfg.Inputs) == 0 {
		var w *workload.Workload
		var err error
		if len(cfg.From.Apps) > 0 {
			w, err = workload.FromTraces(ctx, cfg.From)
		} else {
			w, err = workload.New(cfg.Workload)
		}
		if err != nil {
			return nil, nil, nil, err
		}
		ranks := make([]uint32, w.Config().Ranks)
		for i := range ranks {
			ranks[i] = uint32(i)
		}
		src := &workloadSource{w: w, cfg: w.Config()}
		p.stepWidth = w.StepWidth()
		return src, src.Truth, ranks, nil
	}
	// A trace is read once to learn its ranks, then again to publish it.
	stepCfg := steps.Config{Step: cfg.Step, Marker: cfg.StepMarker}
	probe, err := replay.Open(cfg.InputFormat, cfg.Inputs, stepCfg)
	if err != nil {
		return nil, nil, nil, err
	}
	seen := map[uint32]bool{}
	st, err := probe.Frames(context.Background(), func(f *frame.Frame) error {
		seen[f.Rank] = true
		return nil
	})
	if err != nil {
		if len(st.Losses) > 0 {
			return nil, nil, nil, fmt.Errorf("read input: %w; not in the frames:\n  %s", err, strings.Join(st.Losses.Lines(), "\n  "))
		}
		return nil, nil, nil, fmt.Errorf("read input: %w", err)
	}
	p.input = &st
	if len(seen) == 0 {
		return nil, nil, nil, errors.New("the input holds no frames")
	}
	ranks := make([]uint32, 0, len(seen))
	for r := range seen {
		ranks = append(ranks, r)
	}
	sort.Slice(ranks, func(i, j int) bool { return ranks[i] < ranks[j] })
	src, err := replay.Open(cfg.InputFormat, cfg.Inputs, stepCfg)
	if err != nil {
		return nil, nil, nil, err
	}
	truth, err := inputTruth(cfg.InputFormat, cfg.Inputs)
	if err != nil {
		return nil, nil, nil, err
	}
	return src, truth, ranks, nil
}

// inputTruth returns the ground truth of frame files written by kipimo
// gen: the truth.jsonl of each input directory, when every one has it, so
// that a run on them is scored as the run that generated them would be.
// It returns nil for other inputs.
func inputTruth(format string, inputs []string) (func() []workload.Truth, error) {
	if format != replay.FormatFrames {
		return nil, nil
	}
	var all []workload.Truth
	for _, in := range inputs {
		if st, err := os.Stat(in); err != nil || !st.IsDir() {
			return nil, nil
		}
		f, err := os.Open(filepath.Join(in, "truth.jsonl"))
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("ground truth of %s: %w", in, err)
		}
		t, err := workload.ReadTruth(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("ground truth of %s: %w", in, err)
		}
		all = append(all, t...)
	}
	return func() []workload.Truth { return all }, nil
}

func (p *Pipeline) pid() uint32 {
	if len(p.cfg.From.Apps) > 0 {
		return p.cfg.From.PID
	}
	if len(p.cfg.Inputs) == 0 {
		return p.cfg.Workload.PID
	}
	return 0
}

func (p *Pipeline) steps() int {
	if len(p.cfg.From.Apps) > 0 {
		return p.cfg.From.Steps
	}
	if len(p.cfg.Inputs) == 0 {
		return p.cfg.Workload.Steps
	}
	return 0
}

// DetectorProgress tells the input's flow control how far each rank's
// detector has got.
type DetectorProgress interface {
	// Taken is how many frames rank's detector has taken off its subject
	// (processed or rejected).
	Taken(ctx context.Context, rank uint32) uint64
	// TakenAll is Taken for every rank known so far.
	TakenAll() map[uint32]uint64
}

// PublishWorkload publishes synthetic workload wl on run's frame subjects
// through nc as kipimo run publishes it: every rank's frame of an io_step
// before any frame of the next, a rank's input held while its detector,
// as progress tells, has maxLag frames published and not taken; then it ends
// every rank's stream. It returns what it published. Detectors in other
// processes are measured this way (kipimo bench).
func PublishWorkload(ctx context.Context, nc *nats.Conn, run string, wl workload.Config, progress DetectorProgress, maxLag int) (publish.Counts, error) {
	w, err := workload.New(wl)
	if err != nil {
		return publish.Counts{}, err
	}
	flow := newFlowControl(progress, maxLag, zerolog.Nop())
	var t0 uint64
	counts, _, err := publish.Frames(ctx, nc, natsx.Subjects{Run: run}, flow.wrap(&workloadSource{w: w, cfg: w.Config()}, &t0), publish.Pace{EndOfStream: true})
	if err != nil {
		return counts, fmt.Errorf("publish input: %w", err)
	}
	return counts, nil
}

// collectorCounts reads the counts of in-process detectors.
type collectorCounts struct{ c *adnode.Collector }

func (cc collectorCounts) Taken(_ context.Context, rank uint32) uint64 {
	n, _ := cc.c.Taken(rank)
	return n
}

func (cc collectorCounts) TakenAll() map[uint32]uint64 {
	out := map[uint32]uint64{}
	cc.c.EachTaken(func(rank uint32, taken uint64) { out[rank] += taken })
	return out
}

// stallLogAfter is how long the input waits for one detector before a
// warning says so; the next warning of the same wait comes after twice as
// long, and so on.
const stallLogAfter = 5 * time.Second

// flowControl holds a rank's input back while its detector is maxLag frames
// behind: back-pressure from the detectors to the input. At most maxLag
// frames of a rank are ever published and not yet taken by its detector,
// which bounds what a slow detector makes the pipeline buffer. It also keeps
// what users need to see of it: which rank is behind and by how much, and
// how long the input waited.
type flowControl struct {
	counts DetectorProgress
	maxLag int
	log    zerolog.Logger
	// onStall, when set, is called on the waiting goroutine while the input
	// waits (the run's progress line uses it to keep reporting).
	onStall func()

	mu        sync.Mutex
	sent      map[uint32]uint64        // frames released to each rank
	taken     map[uint32]uint64        // frames each rank's detector had taken when last asked (a lower bound)
	heldBy    map[uint32]time.Duration // time the input waited for each rank
	waiting   bool
	waitRank  uint32
	waitStart time.Time
	held      time.Duration // total time the input waited
	heldCount int           // frames that had to wait
	maxBehind uint64        // most frames a rank had published and not taken
	maxRank   uint32        // the first rank that had maxBehind
}

func newFlowControl(counts DetectorProgress, maxLag int, log zerolog.Logger) *flowControl {
	return &flowControl{counts: counts, maxLag: maxLag, log: log, sent: map[uint32]uint64{}, taken: map[uint32]uint64{}, heldBy: map[uint32]time.Duration{}}
}

// wrap applies flow control to src and stores the first frame's start time
// in t0.
func (fc *flowControl) wrap(src replay.Source, t0 *uint64) replay.Source {
	return sourceFunc(func(ctx context.Context, emit func(*frame.Frame) error) (replay.Stats, error) {
		first := true
		return src.Frames(ctx, func(f *frame.Frame) error {
			if first {
				*t0, first = f.TStart, false
			}
			if err := fc.wait(ctx, f.Rank); err != nil {
				return err
			}
			return emit(f)
		})
	})
}

// wait returns once rank's detector is less than maxLag frames behind, and
// counts the frame as released to it.
func (fc *flowControl) wait(ctx context.Context, rank uint32) error {
	fc.mu.Lock()
	sent, known := fc.sent[rank], fc.taken[rank]
	fc.mu.Unlock()
	// Detectors only ever take more frames, so a count read earlier is
	// a lower bound: while it leaves room, the frame goes without asking.
	// Otherwise every rank's count is read at once (asking one rank at a
	// time costs as much as asking all of them in-process, which made
	// flow control quadratic in ranks).
	if sent < known+uint64(fc.maxLag) {
		fc.release(rank, sent, known)
		return nil
	}
	done := fc.refresh(ctx, rank)
	if sent < done+uint64(fc.maxLag) {
		fc.release(rank, sent, done)
		return nil
	}
	start := time.Now()
	fc.mu.Lock()
	fc.waiting, fc.waitRank, fc.waitStart = true, rank, start
	fc.heldCount++
	fc.mu.Unlock()
	defer func() {
		el := time.Since(start)
		fc.mu.Lock()
		fc.waiting = false
		fc.held += el
		fc.heldBy[rank] += el
		fc.mu.Unlock()
	}()
	delay := 200 * time.Microsecond
	nextLog := stallLogAfter
	for {
		if fc.onStall != nil {
			fc.onStall()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, 20*time.Millisecond)
		done = fc.counts.Taken(ctx, rank)
		fc.mu.Lock()
		fc.taken[rank] = max(fc.taken[rank], done)
		fc.mu.Unlock()
		if sent < done+uint64(fc.maxLag) {
			fc.release(rank, sent, done)
			return nil
		}
		if w := time.Since(start); w >= nextLog {
			fc.log.Warn().Uint32("rank", rank).Uint64("behind_steps", sent-done).Dur("waited", w).
				Msg("a detector has fallen behind: its input waits for it")
			nextLog *= 2
		}
	}
}

// refresh reads every rank's count of frames taken and returns rank's.
func (fc *flowControl) refresh(ctx context.Context, rank uint32) uint64 {
	all := fc.counts.TakenAll()
	done, ok := all[rank]
	if !ok {
		done = fc.counts.Taken(ctx, rank)
	}
	fc.mu.Lock()
	defer fc.mu.Unlock()
	for r, n := range all {
		fc.taken[r] = max(fc.taken[r], n)
	}
	fc.taken[rank] = max(fc.taken[rank], done)
	return fc.taken[rank]
}

// release counts the frame sent to rank (its index, sent) as published, its
// detector having taken done frames.
func (fc *flowControl) release(rank uint32, sent, done uint64) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	fc.sent[rank] = sent + 1
	if sent+1 > done && sent+1-done > fc.maxBehind {
		fc.maxBehind, fc.maxRank = sent+1-done, rank
	}
}

// lagReport is how far the detectors are behind their input.
type lagReport struct {
	// Rank is the detector the input waits for, or else the one furthest
	// behind; Behind how many of the frames published to it it has not
	// taken yet; Stalled how long the input has been waiting for it (0
	// when not waiting).
	Rank    uint32
	Behind  int
	Stalled time.Duration
	// Held is the time the input waited so far.
	Held time.Duration
}

// lag reports the detectors' lag now.
func (fc *flowControl) lag() lagReport {
	all := fc.counts.TakenAll()
	fc.mu.Lock()
	defer fc.mu.Unlock()
	l := lagReport{Held: fc.held}
	behind := func(r uint32) int {
		if s, d := fc.sent[r], all[r]; s > d {
			return int(s - d)
		}
		return 0
	}
	if fc.waiting {
		l.Rank, l.Behind, l.Stalled = fc.waitRank, behind(fc.waitRank), time.Since(fc.waitStart)
		l.Held += l.Stalled
		return l
	}
	first := true
	for r := range fc.sent {
		if b := behind(r); first || b > l.Behind || (b == l.Behind && r < l.Rank) {
			l.Rank, l.Behind, first = r, b, false
		}
	}
	return l
}

// report is what the summary says about back-pressure.
func (fc *flowControl) report() *Backpressure {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	b := &Backpressure{
		Bound: fc.maxLag, HeldSeconds: fc.held.Seconds(), HeldFrames: fc.heldCount,
		MaxBehind: int(fc.maxBehind), MaxBehindRank: fc.maxRank,
	}
	first := true
	for r, d := range fc.heldBy {
		if first || d > fc.heldBy[b.SlowestRank] || (d == fc.heldBy[b.SlowestRank] && r < b.SlowestRank) {
			b.SlowestRank, first = r, false
		}
	}
	b.SlowestRankHeldSeconds = fc.heldBy[b.SlowestRank].Seconds()
	return b
}

type sourceFunc func(ctx context.Context, emit func(*frame.Frame) error) (replay.Stats, error)

func (f sourceFunc) Frames(ctx context.Context, emit func(*frame.Frame) error) (replay.Stats, error) {
	return f(ctx, emit)
}

// inputStats is what a trace input's reader read: its events, executions
// and what the frames do not carry of it (replay.Losses).
type inputStats = replay.Stats
