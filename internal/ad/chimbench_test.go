package ad

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/procstat"
)

// The chimbench-v1 stream (shared/bench/chimbench-v1.md), generated exactly.
const (
	cbSeed          = 42
	cbThreads       = 4
	cbFuncs         = 50
	cbMaxDepth      = 6
	cbMaxChildren   = 3
	cbOutlierOneIn  = 1000
	cbOutlierFactor = 10
	cbT0            = 1000000
	cbIdleGap       = 10
	cbMuBase        = 100
	cbMuStep        = 97
	cbSigmaDiv      = 10
	cbEventsPerStep = 100000
	cbSteps         = 100
)

type cbEvent struct {
	tid  uint32
	kind uint8
	fid  uint32
	ts   uint64
	inj  bool // on exits: the call was an injected outlier
}

// cbThread generates one thread's events, one root call tree at a time.
type cbThread struct {
	tid   uint32
	state uint64
	T     uint64
	first bool
	buf   []cbEvent
	pos   int
}

func newCBThread(tid uint32) *cbThread {
	return &cbThread{tid: tid, state: cbSeed + uint64(tid)*0xD1B54A32D192ED03, T: cbT0 + uint64(tid), first: true}
}

func (t *cbThread) next() uint64 {
	t.state += 0x9E3779B97F4A7C15
	z := t.state
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

func (t *cbThread) genCall(depth int) {
	fid := t.next() % cbFuncs
	var nchild uint64
	if depth < cbMaxDepth-1 {
		nchild = t.next() % (cbMaxChildren + 1)
	}
	var S uint64
	for range 12 {
		S += t.next() >> 32
	}
	z := int64(S) - (6 << 32)
	mu := int64(cbMuBase + cbMuStep*fid)
	sigma := mu / cbSigmaDiv
	E := mu + ((sigma * z) >> 32)
	inj := t.next()%cbOutlierOneIn == 0
	if inj {
		E *= cbOutlierFactor
	}
	E = max(E, int64(nchild)+1)
	t.buf = append(t.buf, cbEvent{tid: t.tid, kind: 0, fid: uint32(fid), ts: t.T})
	gap := uint64(E) / (nchild + 1)
	for range nchild {
		t.T += gap
		t.genCall(depth + 1)
	}
	t.T += uint64(E) - nchild*gap
	t.buf = append(t.buf, cbEvent{tid: t.tid, kind: 1, fid: uint32(fid), ts: t.T, inj: inj})
}

func (t *cbThread) peek() *cbEvent {
	if t.pos == len(t.buf) {
		t.buf, t.pos = t.buf[:0], 0
		if !t.first {
			t.T += cbIdleGap
		}
		t.first = false
		t.genCall(0)
	}
	return &t.buf[t.pos]
}

// cbStream is the merged stream of the four threads.
type cbStream struct {
	th    [cbThreads]*cbThread
	entry [cbThreads][]uint64 // entry ts stack per thread, for the truth
}

func newCBStream() *cbStream {
	s := &cbStream{}
	for i := range s.th {
		s.th[i] = newCBThread(uint32(i))
	}
	return s
}

// next returns the next event and, for an injected call's exit, its entry ts.
func (s *cbStream) next() (cbEvent, uint64) {
	best := 0
	for i := 1; i < cbThreads; i++ {
		if s.th[i].peek().ts < s.th[best].peek().ts {
			best = i
		}
	}
	t := s.th[best]
	ev := *t.peek()
	t.pos++
	var entry uint64
	if ev.kind == 0 {
		s.entry[best] = append(s.entry[best], ev.ts)
	} else {
		n := len(s.entry[best]) - 1
		entry = s.entry[best][n]
		s.entry[best] = s.entry[best][:n]
	}
	return ev, entry
}

type cbTruth struct {
	tid   uint32
	entry uint64
}

// chimbench returns the stream's frames (one per step, perStep events each)
// and the injected calls whose exit lies in them.
func chimbench(steps, perStep int) ([]frame.Frame, map[cbTruth]uint64) {
	s := newCBStream()
	truth := map[cbTruth]uint64{}
	frames := make([]frame.Frame, steps)
	for k := range frames {
		f := &frames[k]
		f.PID, f.Rank, f.Step = 0, 0, uint64(k)
		if k == 0 {
			for fid := range cbFuncs {
				f.Funcs = append(f.Funcs, frame.Name{ID: uint32(fid), Name: "func_" + strconv.Itoa(fid)})
			}
		}
		f.Events = make([]frame.FuncEvent, perStep)
		for i := range f.Events {
			ev, entry := s.next()
			f.Events[i] = frame.FuncEvent{Tid: ev.tid, Kind: frame.EventKind(ev.kind), FID: ev.fid, TS: ev.ts}
			if ev.inj {
				truth[cbTruth{ev.tid, entry}] = uint64(k)
			}
		}
		f.TStart, f.TEnd = f.Events[0].TS, f.Events[perStep-1].TS
	}
	return frames, truth
}

func cbHash(frames []frame.Frame) string {
	h := fnv.New64a()
	var b [32]byte
	for i := range frames {
		for _, ev := range frames[i].Events {
			binary.LittleEndian.PutUint64(b[0:], uint64(ev.Tid))
			binary.LittleEndian.PutUint64(b[8:], uint64(ev.Kind))
			binary.LittleEndian.PutUint64(b[16:], uint64(ev.FID))
			binary.LittleEndian.PutUint64(b[24:], ev.TS)
			h.Write(b[:])
		}
	}
	return fmt.Sprintf("%016x", h.Sum64())
}

func TestChimbenchStream(t *testing.T) {
	if testing.Short() {
		t.Skip("generates 10M events")
	}
	frames, truth := chimbench(cbSteps, cbEventsPerStep)
	if got := cbHash(frames[:1]); got != "0eea88c7b15ca667" {
		t.Errorf("step 0 hash %s, want 0eea88c7b15ca667", got)
	}
	if got := cbHash(frames); got != "e9c0ae5cb4b2ab5e" {
		t.Errorf("steps 0..99 hash %s, want e9c0ae5cb4b2ab5e", got)
	}
	var step0 int
	for _, s := range truth {
		if s == 0 {
			step0++
		}
	}
	if len(truth) != 4964 || step0 != 61 {
		t.Errorf("injected outliers %d (%d in step 0), want 4964 (61)", len(truth), step0)
	}
	var kinds [2]int
	var perTid [cbThreads]int
	for _, ev := range frames[0].Events {
		kinds[ev.Kind]++
		perTid[ev.Tid]++
	}
	if kinds != [2]int{50009, 49991} {
		t.Errorf("step 0 entries/exits %v, want [50009 49991]", kinds)
	}
	if perTid != [cbThreads]int{24991, 24873, 25138, 24998} {
		t.Errorf("step 0 per-thread counts %v", perTid)
	}
	last := frames[0].Events[cbEventsPerStep-1]
	if got := fmt.Sprintf("%d,%d,%d,%d", last.Tid, last.Kind, last.FID, last.TS); got != "1,1,0,32250487" {
		t.Errorf("last row of step 0 %s, want 1,1,0,32250487", got)
	}
}

// encodeFrames encodes frames in the binary form.
func encodeFrames(frames []frame.Frame) [][]byte {
	out := make([][]byte, len(frames))
	for i := range frames {
		out[i] = frame.AppendBinary(nil, &frames[i])
	}
	return out
}

// runEncoded decodes and processes every encoded frame with a new detector
// and returns it (closed).
func runEncoded(tb testing.TB, cfg Config, enc [][]byte, sink Sink) *Detector {
	cfg.Sink = sink
	d, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	var f frame.Frame
	ctx := context.Background()
	for _, b := range enc {
		if _, err := frame.DecodeBinary(b, &f); err != nil {
			tb.Fatal(err)
		}
		if err := d.Process(ctx, &f); err != nil {
			tb.Fatal(err)
		}
	}
	if err := d.Close(ctx); err != nil {
		tb.Fatal(err)
	}
	return d
}

var cbCache struct {
	enc   [][]byte
	truth map[cbTruth]uint64
}

func chimbenchEncoded() ([][]byte, map[cbTruth]uint64) {
	if cbCache.enc == nil {
		frames, truth := chimbench(cbSteps, cbEventsPerStep)
		cbCache.enc, cbCache.truth = encodeFrames(frames), truth
	}
	return cbCache.enc, cbCache.truth
}

func benchChimbench(b *testing.B, cfg Config) {
	enc, truth := chimbenchEncoded()
	var events float64
	var flagged, tp int
	var allocs, bytes uint64
	var cpu time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		sink := &MemorySink{}
		runtime.GC()
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		b.StartTimer()
		c0 := procstat.CPUTime()
		d := runEncoded(b, cfg, enc, sink)
		cpu += procstat.CPUTime() - c0
		b.StopTimer()
		runtime.ReadMemStats(&m1)
		allocs += m1.Mallocs - m0.Mallocs
		bytes += m1.TotalAlloc - m0.TotalAlloc
		events += float64(d.Stats().Events)
		all := sink.All()
		flagged = len(all.Anomalies)
		tp = 0
		for _, a := range all.Anomalies {
			if _, ok := truth[cbTruth{a.TID, a.Entry}]; ok {
				tp++
			}
		}
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(events/b.Elapsed().Seconds(), "events/s")
	if cpu > 0 {
		b.ReportMetric(events/cpu.Seconds(), "events/cpu-s")
	}
	b.ReportMetric(float64(allocs)/events, "allocs/event")
	b.ReportMetric(float64(bytes)/events, "B/event")
	b.ReportMetric(float64(flagged), "flagged")
	b.ReportMetric(float64(tp), "true-positives")
	b.ReportMetric(float64(len(truth)), "injected")
}

func BenchmarkChimbenchTail(b *testing.B) {
	benchChimbench(b, Config{Algorithm: Tail})
}

func BenchmarkChimbenchSSTD(b *testing.B) {
	benchChimbench(b, Config{Algorithm: SSTD})
}

func BenchmarkChimbenchHBOS(b *testing.B) {
	benchChimbench(b, Config{Algorithm: HBOS})
}

func BenchmarkChimbenchHBOSIsolation(b *testing.B) {
	benchChimbench(b, Config{Algorithm: HBOS, Isolation: 5})
}

func BenchmarkChimbenchCOPOD(b *testing.B) {
	benchChimbench(b, Config{Algorithm: COPOD})
}

// BenchmarkDetectorMemory1MPerStep reports the detector's heap for a rank
// producing 1M events per step (the chimbench generator, 10 steps of 1M
// events, window 5): the live heap after the last step with and without the
// decoded frame buffer, the largest live heap after a step without it, and
// the largest heap in use (garbage included) after a step.
func BenchmarkDetectorMemory1MPerStep(b *testing.B) {
	frames, _ := chimbench(10, 1_000_000)
	enc := encodeFrames(frames)
	frames = nil
	for i := 0; i < b.N; i++ {
		runtime.GC()
		var m0, m1, m2 runtime.MemStats
		runtime.ReadMemStats(&m0)
		d, err := New(Config{Algorithm: HBOS, Window: 5})
		if err != nil {
			b.Fatal(err)
		}
		var f frame.Frame
		var peak, peakLive uint64
		for _, e := range enc {
			if _, err := frame.DecodeBinary(e, &f); err != nil {
				b.Fatal(err)
			}
			if err := d.Process(context.Background(), &f); err != nil {
				b.Fatal(err)
			}
			runtime.ReadMemStats(&m2)
			peak = max(peak, m2.HeapInuse)
			runtime.GC()
			runtime.ReadMemStats(&m2)
			peakLive = max(peakLive, m2.HeapInuse)
		}
		runtime.GC()
		runtime.ReadMemStats(&m1)
		frameBytes := uint64(cap(f.Events)) * 24
		b.ReportMetric(float64(m1.HeapInuse-m0.HeapInuse)/(1<<20), "MiB-live")
		b.ReportMetric(float64(m1.HeapInuse-m0.HeapInuse-frameBytes)/(1<<20), "MiB-live-detector")
		b.ReportMetric(float64(peak-m0.HeapInuse)/(1<<20), "MiB-peak-heap")
		b.ReportMetric(float64(peakLive-m0.HeapInuse-frameBytes)/(1<<20), "MiB-max-live-detector")
		runtime.KeepAlive(d)
		runtime.KeepAlive(&f)
	}
}
