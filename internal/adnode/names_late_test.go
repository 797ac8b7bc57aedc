package adnode

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/ad"
	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/replay"
	"github.com/kipimo-hpc/kipimo/internal/replay/publish"
	"github.com/kipimo-hpc/kipimo/internal/replay/steps"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

// stepSource is a replay.Source over frames in memory, step by step (every
// rank's frame of a step before the next step's), calling before(step) once
// before the first frame of each step.
type stepSource struct {
	byRank map[uint32][]*frame.Frame
	before func(step uint64) error
}

func (s *stepSource) Frames(ctx context.Context, emit func(*frame.Frame) error) (replay.Stats, error) {
	var st replay.Stats
	ranks := slices.Sorted(func(yield func(uint32) bool) {
		for r := range s.byRank {
			if !yield(r) {
				return
			}
		}
	})
	for i := 0; ; i++ {
		any := false
		for _, r := range ranks {
			fs := s.byRank[r]
			if i >= len(fs) {
				continue
			}
			if !any && s.before != nil {
				if err := s.before(fs[i].Step); err != nil {
					return st, err
				}
			}
			any = true
			if err := emit(fs[i]); err != nil {
				return st, err
			}
			st.Frames++
			st.Events += fs[i].NumEvents()
		}
		if !any {
			return st, ctx.Err()
		}
	}
}

// lateFrames reads a source's frames by rank, each a copy.
func lateFrames(t *testing.T, src replay.Source) map[uint32][]*frame.Frame {
	t.Helper()
	out := map[uint32][]*frame.Frame{}
	if _, err := src.Frames(context.Background(), func(f *frame.Frame) error {
		out[f.Rank] = append(out[f.Rank], cloneFrame(f))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// entered is the names of the functions entered in the frames from frame
// index from on, read from the frames' own dictionaries: every function a
// detector that sees those frames makes a model of (by function name,
// the default).
func entered(byRank map[uint32][]*frame.Frame, from int) []string {
	set := map[string]bool{}
	for _, fs := range byRank {
		names := map[uint32]string{}
		for i, f := range fs {
			for _, n := range f.Funcs {
				names[n.ID] = n.Name
			}
			if i < from {
				continue
			}
			for _, e := range f.Events {
				if e.Kind == frame.Entry {
					set[names[e.FID]] = true
				}
			}
		}
	}
	return slices.Sorted(func(yield func(string) bool) {
		for k := range set {
			if !yield(k) {
				return
			}
		}
	})
}

func modelKeys(ds []*ad.Detector) []string {
	set := map[string]bool{}
	for _, d := range ds {
		for _, k := range d.ModelKeys() {
			set[k] = true
		}
	}
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// A detector started 10 steps into a `kipimo replay`-style publication
// learns every name: its frames wait for the dictionary the publisher
// re-sends, nothing is stored under a made-up name, and its models are
// those of the functions it saw run, the same set as a detector that saw the
// whole stream.
func TestLateDetectorLearnsEveryName(t *testing.T) {
	const late = 10
	genDir := t.TempDir()
	wcfg := workload.DefaultConfig()
	wcfg.Ranks, wcfg.Steps, wcfg.EventsPerStep = 2, 48, 3000
	w, err := workload.New(wcfg)
	if err != nil {
		t.Fatal(err)
	}
	for r := 0; r < wcfg.Ranks; r++ {
		writeRank(t, w.Rank(uint32(r)), replay.RankFile(genDir, uint32(r)))
	}
	kanika, err := filepath.Glob("../replay/tautrace/testdata/kanika_phase1/tautrace.*.0.0.trc")
	if err != nil || len(kanika) == 0 {
		t.Fatalf("kanika trace: %v", err)
	}
	tests := []struct {
		name   string
		format string
		files  []string
		cfg    steps.Config
	}{
		{"generated run of 2 ranks", replay.FormatFrames, []string{genDir}, steps.Config{}},
		{"TAU trace of 12 ranks", replay.FormatTAU, kanika, steps.Config{Step: 20 * time.Millisecond}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src, err := replay.Open(tc.format, tc.files, tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			byRank := lateFrames(t, src)
			var ranks []uint32
			for r, fs := range byRank {
				ranks = append(ranks, r)
				if len(fs) < late+2*publish.DefaultNamesEvery {
					t.Fatalf("rank %d has %d frames: too few to start %d late and learn the names", r, len(fs), late)
				}
			}
			slices.Sort(ranks)
			cfg := ad.Config{Algorithm: ad.SSTD, Logger: zerolog.Nop()}

			// On time: every frame, in order.
			var onTime []*ad.Detector
			for _, r := range ranks {
				c := cfg
				c.Rank = r
				d, err := ad.New(c)
				if err != nil {
					t.Fatal(err)
				}
				for _, f := range byRank[r] {
					if err := d.Process(context.Background(), f); err != nil {
						t.Fatal(err)
					}
				}
				if err := d.Close(context.Background()); err != nil {
					t.Fatal(err)
				}
				onTime = append(onTime, d)
			}

			// Late: detectors served on NATS start once steps 0..9 are
			// published.
			_, nc := startNATS(t)
			const run = "late"
			sink := &MemorySink{}
			coll := NewCollector(len(ranks), nil)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			type result struct {
				stats []ad.Stats
				err   error
			}
			done := make(chan result, 1)
			start := func(step uint64) error {
				if step != late {
					return nil
				}
				// Steps before are gone: published with no subscriber.
				if err := nc.Flush(); err != nil {
					return err
				}
				ready := make(chan struct{})
				c := cfg
				c.Sink = sink
				go func() {
					st, err := Serve(ctx, ServeConfig{Conn: nc, Run: run, Ranks: ranks, Collector: coll, Detector: c,
						Logger: zerolog.Nop(), Ready: func() { close(ready) }})
					done <- result{st, err}
				}()
				select {
				case <-ready:
					return nil
				case r := <-done:
					t.Fatalf("serve ended before it was ready: %v", r.err)
				}
				return nil
			}
			pub := &stepSource{byRank: byRank, before: start}
			if _, _, err := publish.Frames(ctx, nc, natsx.Subjects{Run: run}, pub, publish.Pace{EndOfStream: true}); err != nil {
				t.Fatal(err)
			}
			res := <-done
			if res.err != nil {
				t.Fatal(res.err)
			}
			for _, s := range res.stats {
				want := uint64(len(byRank[s.Rank]) - late)
				if s.Frames != want || s.UnnamedFrames != 0 || s.BadFrames != 0 {
					t.Errorf("rank %d: %d frames processed, %d dropped unnamed, %d bad; want %d, 0, 0", s.Rank, s.Frames, s.UnnamedFrames, s.BadFrames, want)
				}
			}
			// Nothing stored under a made-up name.
			b, err := json.Marshal(sink.All())
			if err != nil {
				t.Fatal(err)
			}
			for _, made := range []string{`fid_`, `cid_`} {
				if i := strings.Index(string(b), made); i >= 0 {
					t.Errorf("records hold %q: …%s…", made, string(b[max(0, i-80):min(len(b), i+80)]))
				}
			}
			lateKeys := modelKeys(coll.detectors)
			onKeys := modelKeys(onTime)
			for _, k := range lateKeys {
				if strings.HasPrefix(k, "fid_") {
					t.Errorf("model key %q", k)
				}
			}
			// Independent expectations: the functions entered in the frames
			// each saw.
			if want := entered(byRank, 0); !slices.Equal(onKeys, want) {
				t.Errorf("on-time models %q, want the functions entered %q", onKeys, want)
			}
			if want := entered(byRank, late); !slices.Equal(lateKeys, want) {
				t.Errorf("late models %q, want the functions entered from step %d %q", lateKeys, late, want)
			}
			// The same keys as the on-time detector's, for the functions
			// that ran while the late one listened (set-up functions entered
			// in the first steps only, and those still open then, such as
			// main, are not among them).
			from := entered(byRank, late)
			var onFrom []string
			for _, k := range onKeys {
				if _, ok := slices.BinarySearch(from, k); ok {
					onFrom = append(onFrom, k)
				}
			}
			if !slices.Equal(lateKeys, onFrom) {
				t.Errorf("late detector's models %q, on-time detector's for the functions entered from step %d %q", lateKeys, late, onFrom)
			}
			held := 0
			for _, d := range coll.detectors {
				if d.WaitedForNames() {
					held++
				}
			}
			if held == 0 {
				t.Error("no late detector waited for a name: the test does not test the wait")
			}
			t.Logf("%d ranks (%d waited for names): %d models late, %d on time", len(ranks), held, len(lateKeys), len(onKeys))
		})
	}
}

// writeRank writes a generated rank's frames to path, as `kipimo gen` does.
func writeRank(t *testing.T, g *workload.RankGen, path string) {
	t.Helper()
	fh, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	fw := frame.NewWriter(fh)
	var f frame.Frame
	for {
		if _, err := g.Next(&f); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if err := fw.Write(&f); err != nil {
			t.Fatal(err)
		}
	}
	if err := fw.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := fh.Close(); err != nil {
		t.Fatal(err)
	}
}
