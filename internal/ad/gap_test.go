package ad

import (
	"context"
	"errors"
	"fmt"
	"io"
	"reflect"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

// withoutStep is rank's stream with step k emptied (its names and metadata
// kept) and every execution that step touches removed from the other
// frames: those entered in it, and those open across it (entered before,
// exited in or after it, or never). It is what a detector may learn from the
// stream when step k is lost.
func withoutStep(t *testing.T, enc [][]byte, k int) [][]byte {
	t.Helper()
	frames := make([]frame.Frame, len(enc))
	for i, b := range enc {
		if _, err := frame.DecodeBinary(b, &frames[i]); err != nil {
			t.Fatal(err)
		}
	}
	type pos struct{ f, i int }
	drop := map[pos]bool{}
	open := map[uint32][]pos{}
	for fi := range frames {
		for i, ev := range frames[fi].Events {
			p := pos{fi, i}
			if ev.Kind == frame.Entry {
				open[ev.Tid] = append(open[ev.Tid], p)
				continue
			}
			st := open[ev.Tid]
			if len(st) == 0 || frames[st[len(st)-1].f].Events[st[len(st)-1].i].FID != ev.FID {
				t.Fatalf("the clean stream is not well nested at frame %d event %d", fi, i)
			}
			entry := st[len(st)-1]
			open[ev.Tid] = st[:len(st)-1]
			if entry.f <= k && fi >= k {
				drop[entry], drop[p] = true, true
			}
		}
	}
	for _, st := range open {
		for _, p := range st {
			if p.f <= k {
				drop[p] = true
			}
		}
	}
	out := make([][]byte, len(frames))
	for fi := range frames {
		f := &frames[fi]
		if fi == k {
			f.Events, f.CounterEvents, f.Comms = nil, nil, nil
		} else {
			kept := f.Events[:0]
			for i, ev := range f.Events {
				if !drop[pos{fi, i}] {
					kept = append(kept, ev)
				}
			}
			f.Events = kept
		}
		out[fi] = frame.AppendBinary(nil, f)
	}
	return out
}

// modelsOf is every model's global statistics after Close, by name.
func modelsOf(d *Detector) map[string]string {
	out := map[string]string{}
	for _, m := range d.models.list {
		out[m.name] = fmt.Sprintf("moments %+v tail %+v hist %+v", m.global.Moments, m.global.Tail, m.global.Histogram)
	}
	return out
}

// runFrames processes enc (nil entries are skipped, as frames lost on the
// way; frames the detector refuses are left to its counts) and closes the
// detector.
func runFrames(t *testing.T, cfg Config, enc [][]byte) *Detector {
	t.Helper()
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, b := range enc {
		if b == nil {
			continue
		}
		var f frame.Frame
		if _, err := frame.DecodeBinary(b, &f); err != nil {
			t.Fatal(err)
		}
		// Refused frames are counted in Stats, which the tests check.
		_ = d.Process(ctx, &f)
	}
	if err := d.Close(ctx); err != nil {
		t.Fatal(err)
	}
	return d
}

// A lost or refused frame never pairs an entry before the gap with an exit
// after it: the models of a stream with one step lost equal those of the
// same stream with that step's executions removed, for each rank in turn and
// each algorithm's model.
func TestGapNeverInventsExecutions(t *testing.T) {
	// Names in every frame, as publishers re-send them: a lost frame loses
	// no name.
	wcfg := workload.DefaultConfig()
	wcfg.Ranks, wcfg.ThreadsPerRank, wcfg.Steps, wcfg.EventsPerStep, wcfg.GPU, wcfg.Seed = 3, 2, 10, 3000, true, 7
	byRank, _ := encodedFramesNamed(t, wcfg, true)
	for _, algo := range []string{Tail, HBOS} {
		for r, enc := range byRank {
			k := 2 + 3*r // a different step of each rank
			cfg := Config{Rank: uint32(r), Algorithm: algo}
			want := runFrames(t, cfg, withoutStep(t, enc, k))
			wantModels := modelsOf(want)

			lost := append([][]byte(nil), enc...)
			lost[k] = nil
			var bad frame.Frame
			if _, err := frame.DecodeBinary(enc[k], &bad); err != nil {
				t.Fatal(err)
			}
			bad.Events[0].FID = maxFID // refused: an id out of range
			refused := append([][]byte(nil), enc...)
			refused[k] = frame.AppendBinary(nil, &bad)

			for _, tc := range []struct {
				name       string
				frames     [][]byte
				badFrames  uint64
				staleFrame uint64
			}{
				{"lost", lost, 0, 0},
				{"refused", refused, 1, 0},
			} {
				t.Run(fmt.Sprintf("%s/rank%d/%s", algo, r, tc.name), func(t *testing.T) {
					d := runFrames(t, cfg, tc.frames)
					st := d.Stats()
					if st.MissingSteps != 1 || st.BadFrames != tc.badFrames {
						t.Errorf("missing steps %d, bad frames %d; want 1 and %d", st.MissingSteps, st.BadFrames, tc.badFrames)
					}
					if st.LostAtGap == 0 {
						t.Errorf("no execution was open across step %d: the case tests nothing", k)
					}
					got := modelsOf(d)
					if len(got) != len(wantModels) {
						t.Errorf("%d models, want %d", len(got), len(wantModels))
					}
					for name, g := range got {
						if g != wantModels[name] {
							t.Errorf("model %q\n got %s\nwant %s", name, g, wantModels[name])
						}
					}
					if st.Executions+st.LostAtGap < want.Stats().Executions {
						t.Errorf("executions %d + lost %d < %d of the stream without the step", st.Executions, st.LostAtGap, want.Stats().Executions)
					}
				})
			}
		}
	}
}

// A frame of a step already processed (a duplicate, or one overtaken by
// its successors) is dropped and counted as stale, not bad, and changes
// nothing.
func TestStaleFrameDropped(t *testing.T) {
	w, err := syntheticWorkload(1, 6, 2000)
	if err != nil {
		t.Fatal(err)
	}
	enc := w.frames[0]
	cfg := Config{Rank: 0}
	want := modelsOf(runFrames(t, cfg, enc))
	dup := append(append(append([][]byte(nil), enc[:4]...), enc[3], enc[1]), enc[4:]...)
	d := runFrames(t, cfg, dup)
	st := d.Stats()
	if st.StaleFrames != 2 || st.BadFrames != 0 || st.MissingSteps != 0 || st.LostAtGap != 0 {
		t.Errorf("stale %d bad %d missing %d lost %d; want 2 0 0 0", st.StaleFrames, st.BadFrames, st.MissingSteps, st.LostAtGap)
	}
	if got := modelsOf(d); !reflect.DeepEqual(got, want) {
		t.Errorf("models changed by stale frames:\n got %v\nwant %v", got, want)
	}
}

// A frame whose io_step jumps absurdly far ahead (forged, or corrupted) is
// refused as malformed: taken, it would make every later frame stale.
func TestFarFutureFrameRefused(t *testing.T) {
	d, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	names := []frame.Name{{ID: 1, Name: "f"}}
	for _, s := range []uint64{0, 1, 1 << 62, 2, 3} {
		_ = d.Process(ctx, nameStep{fids: []uint32{1}, names: names}.frame(s))
	}
	if err := d.Close(ctx); err != nil {
		t.Fatal(err)
	}
	st := d.Stats()
	if st.Frames != 4 || st.BadFrames != 1 || st.StaleFrames != 0 || st.MissingSteps != 0 {
		t.Errorf("processed %d, bad %d, stale %d, missing %d; want 4 1 0 0", st.Frames, st.BadFrames, st.StaleFrames, st.MissingSteps)
	}
}

// encodedFramesNamed generates a workload's frames, binary encoded, by rank,
// with every name known so far sent again in every frame when everyFrame is
// set (as publishers re-send them).
func encodedFramesNamed(tb testing.TB, wcfg workload.Config, everyFrame bool) ([][][]byte, uint64) {
	tb.Helper()
	w, err := workload.New(wcfg)
	if err != nil {
		tb.Fatal(err)
	}
	out := make([][][]byte, wcfg.Ranks)
	var events uint64
	for r := range out {
		g := w.Rank(uint32(r))
		var funcs, ctrs []frame.Name
		for {
			var f frame.Frame
			if _, err := g.Next(&f); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				tb.Fatal(err)
			}
			if everyFrame {
				funcs, ctrs = append(funcs, f.Funcs...), append(ctrs, f.Counters...)
				f.Funcs, f.Counters = funcs, ctrs
			}
			events += uint64(len(f.Events) + len(f.CounterEvents) + len(f.Comms))
			out[r] = append(out[r], frame.AppendBinary(nil, &f))
		}
	}
	return out, events
}
