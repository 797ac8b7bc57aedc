package run

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/ad"
	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/replay"
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
			s.mu.Lock()
			s.truth = append(s.truth, truth...)
			s.mu.Unlock()
			st.Frames++
			st.Events += f.NumEvents()
			if err := emit(&f); err != nil {
				return st, err
			}
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
func (p *Pipeline) source() (replay.Source, func() []workload.Truth, []uint32, error) {
	cfg := p.cfg
	if len(cfg.Inputs) == 0 {
		w, err := workload.New(cfg.Workload)
		if err != nil {
			return nil, nil, nil, err
		}
		ranks := make([]uint32, cfg.Workload.Ranks)
		for i := range ranks {
			ranks[i] = uint32(i)
		}
		src := &workloadSource{w: w, cfg: cfg.Workload}
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
	if _, err := probe.Frames(context.Background(), func(f *frame.Frame) error {
		seen[f.Rank] = true
		return nil
	}); err != nil {
		return nil, nil, nil, fmt.Errorf("read input: %w", err)
	}
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
	return src, nil, ranks, nil
}

func (p *Pipeline) pid() uint32 {
	if len(p.cfg.Inputs) == 0 {
		return p.cfg.Workload.PID
	}
	return 0
}

func (p *Pipeline) steps() int {
	if len(p.cfg.Inputs) == 0 {
		return p.cfg.Workload.Steps
	}
	return 0
}

// flowControl holds a rank's input back while its detector is more than
// maxLag frames behind: back-pressure from the detectors to the input.
type flowControl struct {
	c       *ad.Collector
	maxLag  int
	mu      sync.Mutex
	emitted map[uint32]uint64
}

func newFlowControl(c *ad.Collector, maxLag int) *flowControl {
	return &flowControl{c: c, maxLag: maxLag, emitted: map[uint32]uint64{}}
}

// minStep is the lowest number of frames any detector has processed.
func (fc *flowControl) minStep() int {
	st := fc.c.Stats()
	if len(st) == 0 {
		return 0
	}
	low := st[0].Frames
	for _, s := range st[1:] {
		low = min(low, s.Frames)
	}
	return int(low)
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

func (fc *flowControl) wait(ctx context.Context, rank uint32) error {
	fc.mu.Lock()
	sent := fc.emitted[rank]
	fc.emitted[rank] = sent + 1
	fc.mu.Unlock()
	delay := 200 * time.Microsecond
	for {
		done := fc.processed(rank)
		if sent < done+uint64(fc.maxLag) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, 20*time.Millisecond)
	}
}

func (fc *flowControl) processed(rank uint32) uint64 {
	for _, s := range fc.c.Stats() {
		if s.Rank == rank {
			return s.Frames + s.BadFrames
		}
	}
	return 0
}

type sourceFunc func(ctx context.Context, emit func(*frame.Frame) error) (replay.Stats, error)

func (f sourceFunc) Frames(ctx context.Context, emit func(*frame.Frame) error) (replay.Stats, error) {
	return f(ctx, emit)
}
