package run

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/kipimo-hpc/kipimo/internal/ad"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
)

// gatedSink stops one rank's detector, at the first batch of records of a
// step at or after from, until open is closed: a detector that has fallen
// behind. The other ranks' batches pass straight through.
type gatedSink struct {
	ad.Sink
	rank uint32
	from uint64

	once    sync.Once
	open    chan struct{}
	mu      sync.Mutex
	heldAt  uint64 // the step the detector is held in
	holding bool
}

func (g *gatedSink) Publish(ctx context.Context, b *ad.Batch) error {
	if b.Rank == g.rank && b.Step >= g.from {
		g.once.Do(func() {
			g.mu.Lock()
			g.heldAt, g.holding = b.Step, true
			g.mu.Unlock()
			select {
			case <-g.open:
			case <-ctx.Done():
			}
			g.mu.Lock()
			g.holding = false
			g.mu.Unlock()
		})
	}
	return g.Sink.Publish(ctx, b)
}

// held reports whether the detector is held now, and in which step.
func (g *gatedSink) held() (uint64, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.heldAt, g.holding
}

// TestSlowDetectorAppliesBackPressure holds one rank's detector still in the
// middle of a run. The input must stop, for every rank, once that rank has
// MaxLag frames published and not taken (its detector's subscription never
// buffers more, and NATS drops nothing); the progress reports must say which
// rank the input waits for and how far behind it is; once the detector goes
// on, the run must end complete: every frame processed, the same input,
// executions and findings as a run without the slow detector.
func TestSlowDetectorAppliesBackPressure(t *testing.T) {
	base := smallRun(t)
	base.Workload.Steps = 32
	base.Workload.EventsPerStep = 4000
	_, clean := execute(t, base, nil, nil)
	ranks := base.Workload.Ranks

	cases := []struct {
		name   string
		rank   uint32
		from   uint64 // the detector stops at its first batch of this step or later
		maxLag int
	}{
		{"rank 3 from step 4, bound 16", 3, 4, 16},
		{"rank 0 from step 10, bound 4", 0, 10, 4},
		{"rank 2 from step 1, bound 1", 2, 1, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			cfg.Out = t.TempDir()
			cfg.MaxLag = tc.maxLag
			gate := &gatedSink{rank: tc.rank, from: tc.from, open: make(chan struct{})}
			var rankSub, allSub *nats.Subscription
			var (
				observed bool
				seen     Progress
			)
			release := func() {
				if !observed {
					observed = true
					close(gate.open)
				}
			}
			t.Cleanup(release) // never leave the detector held
			p, sum := execute(t, cfg, func(p *Pipeline, h *testHooks) {
				h.wrapSink = func(s ad.Sink) ad.Sink { gate.Sink = s; return gate }
				// Independent counts of what the input published: every
				// frame, and the slow rank's frames.
				subj := natsx.Subjects{Run: cfg.RunID}
				var err error
				if rankSub, err = p.nc.SubscribeSync(subj.Frames(cfg.Workload.PID, tc.rank)); err != nil {
					t.Fatal(err)
				}
				if allSub, err = p.nc.SubscribeSync(subj.AllFrames()); err != nil {
					t.Fatal(err)
				}
				for _, s := range []*nats.Subscription{rankSub, allSub} {
					if err := s.SetPendingLimits(-1, -1); err != nil {
						t.Fatal(err)
					}
				}
			}, func(p *Pipeline, pr Progress) {
				// Runs on the publishing goroutine: while it runs, the input
				// publishes nothing.
				step, holding := gate.held()
				if observed || !holding || pr.Stalled == 0 || pr.BehindRank != tc.rank {
					return
				}
				seen = pr
				defer release()
				if err := p.nc.Flush(); err != nil {
					t.Error(err)
					return
				}
				toRank, _, _ := rankSub.Pending()
				all, _, _ := allSub.Pending()
				// The detector took steps 0..step-1 and holds step: exactly
				// maxLag more frames of its rank were published ...
				if want := int(step) + tc.maxLag; toRank != want {
					t.Errorf("held in step %d: %d frames of rank %d published, want %d (bound %d)", step, toRank, tc.rank, want, tc.maxLag)
				}
				// ... and the input stopped for every rank, at the slow
				// rank's next frame (frames go out step by step, rank by
				// rank).
				if want := (int(step)+tc.maxLag)*ranks + int(tc.rank); all != want {
					t.Errorf("held in step %d: %d frames published in all, want %d", step, all, want)
				}
				if pr.Behind != tc.maxLag {
					t.Errorf("progress says rank %d is %d steps behind, want %d", pr.BehindRank, pr.Behind, tc.maxLag)
				}
				if pr.Held < pr.Stalled {
					t.Errorf("progress: held %v in all, less than the current stall %v", pr.Held, pr.Stalled)
				}
			})
			if !observed {
				step, _ := gate.held()
				t.Fatalf("the input was never seen waiting for rank %d (detector held in step %d)", tc.rank, step)
			}
			t.Logf("seen: rank %d %d steps behind, stalled %v; summary %+v", seen.BehindRank, seen.Behind, seen.Stalled, *sum.Backpressure)

			checkConsistent(t, p, sum)
			if got, want := sum.FramesProcessed, uint64(ranks*cfg.Workload.Steps); got != want || sum.Frames != int(want) {
				t.Errorf("frames: %d published, %d processed; want %d", sum.Frames, got, want)
			}
			if sum.BadFrames != 0 || sum.DroppedRecords != 0 {
				t.Errorf("%d bad frames (NATS drops a detector's frames beyond its buffer), %d dropped records", sum.BadFrames, sum.DroppedRecords)
			}
			if sum.Events != clean.Events || sum.Executions != clean.Executions {
				t.Errorf("events %d, executions %d; without a slow detector %d, %d", sum.Events, sum.Executions, clean.Events, clean.Executions)
			}
			if d := sum.Score.TruePositives - clean.Score.TruePositives; d*d*400 > clean.Score.TruePositives*clean.Score.TruePositives {
				t.Errorf("true positives %d, without a slow detector %d", sum.Score.TruePositives, clean.Score.TruePositives)
			}
			bp := sum.Backpressure
			if bp == nil {
				t.Fatal("the summary reports no back-pressure")
			}
			if bp.Bound != tc.maxLag || bp.MaxBehind != tc.maxLag {
				t.Errorf("summary: at most %d steps behind with bound %d, want %d and %d", bp.MaxBehind, bp.Bound, tc.maxLag, tc.maxLag)
			}
			// Which rank held the input longest in all depends on timing
			// (other ranks hold it too, briefly and often): not checked.
			if bp.HeldFrames == 0 || bp.SlowestRankHeldSeconds <= 0 || bp.HeldSeconds < bp.SlowestRankHeldSeconds {
				t.Errorf("summary: %+v, want the input held", *bp)
			}
		})
	}
}

// TestBackpressureText checks the summary line a person reads.
func TestBackpressureText(t *testing.T) {
	s := &Summary{Backpressure: &Backpressure{Bound: 16, HeldSeconds: 2.3, HeldFrames: 7, MaxBehind: 16, MaxBehindRank: 3, SlowestRank: 3, SlowestRankHeldSeconds: 2}}
	var b strings.Builder
	if err := s.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	want := "input waited 2.3s for detectors (7 frames held); at most 16 steps behind (bound 16); waited longest for rank 3 (2.0s)"
	if !strings.Contains(b.String(), want) {
		t.Errorf("summary text lacks %q:\n%s", want, b.String())
	}
}

func TestChosenLag(t *testing.T) {
	tests := []struct {
		name          string
		maxLag, ranks int
		want          int
	}{
		{"set by the user", 5, 4096, 5},
		{"one rank", 0, 1, 16},
		{"256 ranks", 0, 256, 16},
		{"1,024 ranks", 0, 1024, 4},
		{"4,096 ranks", 0, 4096, 2},
		{"16,384 ranks", 0, 16384, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := (Config{MaxLag: tc.maxLag}).lag(tc.ranks); got != tc.want {
				t.Errorf("lag(%d) with MaxLag %d = %d, want %d", tc.ranks, tc.maxLag, got, tc.want)
			}
		})
	}
}
