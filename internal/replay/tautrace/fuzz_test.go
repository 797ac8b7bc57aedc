package tautrace

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/replay/steps"
)

// FuzzTAUTrace reads arbitrary .trc bytes with the Hecatoncheir definitions:
// it must return frames that encode, or an error naming the file, never
// panic.
func FuzzTAUTrace(f *testing.F) {
	for _, p := range []string{"testdata/hecatoncheir/tautrace.0.0.0.trc", "testdata/opencl_course_L5/tautrace.0.0.2.trc"} {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data[:min(len(data), 2400)])
	}
	text, err := os.ReadFile("testdata/hecatoncheir/events.0.edf")
	if err != nil {
		f.Fatal(err)
	}
	edf, err := ParseEDF(bytes.NewReader(text), "events.0.edf")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg := steps.Config{Step: time.Millisecond, MaxGap: 1000}
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		var buf []byte
		b := steps.New(cfg, func(fr *frame.Frame) error {
			if err := fr.Validate(); err != nil {
				t.Fatalf("invalid frame: %v", err)
			}
			buf = frame.AppendBinary(buf[:0], fr)
			return nil
		})
		err := ReadInputs(context.Background(), []Input{{Name: "fuzz.trc", R: bytes.NewReader(data), EDF: edf}}, b)
		if err != nil && !strings.Contains(err.Error(), "fuzz.trc") && !strings.Contains(err.Error(), "rank") {
			t.Fatalf("error does not say where: %v", err)
		}
	})
}

// FuzzTAUEDF parses arbitrary event definition files.
func FuzzTAUEDF(f *testing.F) {
	text, err := os.ReadFile("testdata/opencl_course_L5/events.0.edf")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(text[:min(len(text), 3000)]))
	f.Fuzz(func(t *testing.T, s string) {
		e, err := ParseEDF(strings.NewReader(s), "fuzz.edf")
		if err != nil {
			if !strings.Contains(err.Error(), "fuzz.edf") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		for _, d := range e.Defs() {
			if e.Lookup(d.ID) == nil {
				t.Fatalf("definition %d not found", d.ID)
			}
		}
	})
}

// synthTrace is n records of one thread: EV_INIT, then nested entries and
// exits of 8 functions (ids 57-64), a user event every 64 calls.
func synthTrace(n int) []byte {
	out := make([]byte, 0, n*RecordSize)
	rec := func(ev int32, par int64, ts uint64) {
		var b [RecordSize]byte
		binary.LittleEndian.PutUint32(b[0:], uint32(ev))
		binary.LittleEndian.PutUint64(b[8:], uint64(par))
		binary.LittleEndian.PutUint64(b[16:], ts)
		out = append(out, b[:]...)
	}
	ts := uint64(1_700_000_000_000_000)
	rec(EVInit, 3, ts)
	depth := 0
	for i := 0; len(out) < n*RecordSize; i++ {
		ts += 1 + uint64(i&3)
		switch {
		case i%64 == 63 && depth > 0:
			rec(62, 0, ts) // "TauTraceClockOffsetStart" user event
			rec(62, int64(i), ts)
			rec(62, 0, ts)
		case depth < 4 && (i%3 != 2 || depth == 0):
			rec(int32(57+depth), 1, ts)
			depth++
		default:
			depth--
			rec(int32(57+depth), -1, ts)
		}
	}
	return out[:n*RecordSize]
}

func BenchmarkTAUTrace(b *testing.B) {
	const n = 2_000_000
	data := synthTrace(n)
	text, err := os.ReadFile("testdata/hecatoncheir/events.0.edf")
	if err != nil {
		b.Fatal(err)
	}
	edf, err := ParseEDF(bytes.NewReader(text), "events.0.edf")
	if err != nil {
		b.Fatal(err)
	}
	cfg := steps.Config{Step: 100 * time.Millisecond}
	if err := cfg.Validate(); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	var events int
	for i := 0; i < b.N; i++ {
		bl := steps.New(cfg, func(*frame.Frame) error { return nil })
		if err := ReadInputs(context.Background(), []Input{{Name: "bench.trc", R: bytes.NewReader(data), EDF: edf}}, bl); err != nil {
			b.Fatal(err)
		}
		events += n
	}
	b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
}
