package workload

import (
	"bytes"
	"context"
	"errors"
	"io"
	"reflect"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/replay"
	"github.com/kipimo-hpc/kipimo/internal/replay/steps"
)

// FuzzReadTruth feeds arbitrary bytes to the truth reader: it must return
// records or an error, never panic, and what it reads must survive a
// write/read round trip unchanged.
func FuzzReadTruth(f *testing.F) {
	f.Add([]byte(`{"pid":0,"rank":1,"tid":0,"fid":9,"func":"lj_kernel","io_step":3,"entry":1750000000062387,"exit":1750000000062688,"runtime_exclusive":301,"kind":"slow_call"}` + "\n"))
	f.Add([]byte("\n\n{}\n"))
	f.Add([]byte(`{"pid":-1}`))
	f.Add([]byte(`{"func":"\ud800"}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		recs, err := ReadTruth(bytes.NewReader(in))
		if err != nil {
			return
		}
		var buf bytes.Buffer
		if err := WriteTruth(&buf, recs); err != nil {
			t.Fatal(err)
		}
		back, err := ReadTruth(&buf)
		if err != nil {
			t.Fatalf("re-reading written truth: %v", err)
		}
		if len(recs) == 0 && len(back) == 0 {
			return
		}
		if !reflect.DeepEqual(recs, back) {
			t.Fatalf("round trip changed %+v into %+v", recs, back)
		}
	})
}

// framesSource yields decoded frames.
type framesSource []frame.Frame

func (s framesSource) Frames(ctx context.Context, emit func(*frame.Frame) error) (replay.Stats, error) {
	for i := range s {
		if err := emit(&s[i]); err != nil {
			return replay.Stats{}, err
		}
	}
	return replay.Stats{}, ctx.Err()
}

// FuzzReplayFrames feeds arbitrary binary frames to the trace pairing and
// replays what it built: no panic, every generated frame valid, and every
// injected execution at least 1.5 times its function's natural maximum.
// Seeds are the evaluation traces' frames.
func FuzzReplayFrames(f *testing.F) {
	for _, a := range EvalApps("testdata/eval")[1:] { // the small ones
		src, err := replay.Open(a.Format, a.Files, steps.Config{})
		if err != nil {
			f.Fatal(err)
		}
		var b []byte
		if _, err := src.Frames(context.Background(), func(fr *frame.Frame) error {
			b = frame.AppendBinary(b, fr)
			return nil
		}); err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		var frames framesSource
		for len(in) > 0 && len(frames) < 64 {
			var fr frame.Frame
			n, err := frame.DecodeBinary(in, &fr)
			if err != nil || n == 0 {
				break
			}
			in = in[n:]
			frames = append(frames, fr)
		}
		rd := newTraceReader()
		a, err := rd.readSource(context.Background(), "fuzz", frames, DefaultMaxIdle)
		if err != nil {
			return
		}
		cfg := DefaultTraceConfig(TraceApp{Files: []string{"fuzz"}})
		cfg.Ranks, cfg.Steps, cfg.EventsPerStep, cfg.Rate = 2, 2, 1, 0.5
		w, err := rd.build(cfg, []*tapp{a})
		if err != nil {
			return
		}
		specs := w.Functions()
		var out frame.Frame
		for r := range cfg.Ranks {
			g := w.Rank(uint32(r))
			for {
				truth, err := g.Next(&out)
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				if err := out.Validate(); err != nil {
					t.Fatalf("generated frame rank %d step %d: %v", r, out.Step, err)
				}
				for _, tr := range truth {
					if m := specs[tr.FID].NaturalMax; float64(tr.Exclusive) < 1.5*m || m < MinInjectMax {
						t.Fatalf("injected %d µs into %s, natural max %v µs", tr.Exclusive, tr.Func, m)
					}
				}
			}
		}
	})
}
