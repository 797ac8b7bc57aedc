package frame

import (
	"bytes"
	"flag"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files and fuzz seeds under testdata/")

// equalFrames compares frames field by field, treating nil and empty slices
// as equal.
func equalFrames(a, b *Frame) bool {
	return a.PID == b.PID && a.Rank == b.Rank && a.Step == b.Step &&
		a.TStart == b.TStart && a.TEnd == b.TEnd &&
		slices.Equal(a.Funcs, b.Funcs) && slices.Equal(a.Counters, b.Counters) &&
		slices.Equal(a.Metadata, b.Metadata) && slices.Equal(a.Events, b.Events) &&
		slices.Equal(a.CounterEvents, b.CounterEvents) && slices.Equal(a.Comms, b.Comms)
}

// testFrames are the hand-made frames of the round-trip and golden tests.
// Golden files exist for those whose name has no space.
func testFrames() []struct {
	name string
	f    *Frame
} {
	const maxU64 = math.MaxUint64
	const maxU32 = math.MaxUint32
	return []struct {
		name string
		f    *Frame
	}{
		{"empty", &Frame{}},
		{"dictionary", &Frame{PID: 7, Rank: 2, Step: 0, TStart: 1000, TEnd: 2000,
			Funcs:    []Name{{0, "main"}, {1, "MPI_Send"}, {5, "foo(int, double)"}},
			Counters: []Name{{0, "PAPI_TOT_CYC"}, {3, "Correlation ID"}}}},
		{"threads_interleaved", &Frame{PID: 1, Rank: 0, Step: 3, TStart: 100, TEnd: 900,
			Funcs: []Name{{0, "main"}, {1, "work"}},
			Events: []FuncEvent{
				{0, Entry, 0, 110}, {1, Entry, 0, 111}, {3, Entry, 0, 115}, {0, Entry, 1, 200},
				{1, Entry, 1, 250}, {3, Exit, 0, 260}, {0, Exit, 1, 400}, {1, Exit, 1, 401},
				{0, Exit, 0, 800}, {1, Exit, 0, 899},
			}}},
		{"counters_comms", &Frame{PID: 1, Rank: 5, Step: 9, TStart: 5000, TEnd: 9000,
			Counters: []Name{{0, "PAPI_TOT_CYC"}},
			Events:   []FuncEvent{{0, Entry, 4, 5001}, {0, Exit, 4, 8000}},
			CounterEvents: []CounterEvent{
				{0, 0, 123456789, 5001}, {0, 0, 123999999, 7999}, {2, 3, 42, 6000},
			},
			Comms: []CommEvent{
				{0, Send, 17, 4, 4096, 5100}, {0, Recv, 17, 6, 1 << 40, 5200}, {2, Send, 0, 0, 0, 5000},
			}}},
		{"metadata_unicode", &Frame{PID: 2, Rank: 1, Step: 1, TStart: 1, TEnd: 1,
			Metadata: []Meta{
				{0, "Hostname", "nœud-42.ñandú.example"},
				{0, "CPU Type", "Ünïcödé 中文 \U0001F680"},
				{7, "CUDA Context", "1"}, {7, "CUDA Device", "0"}, {7, "CUDA Stream", "13"},
				{0, "escapes", "quote\" backslash\\ tab\t newline\n nul\x00 ls\u2028 ps\u2029 </script>"},
				{0, "", ""},
			}}},
		{"max_values", &Frame{PID: maxU32, Rank: maxU32, Step: maxU64, TStart: maxU64, TEnd: 0,
			Funcs:    []Name{{maxU32, "max"}},
			Counters: []Name{{maxU32, "max"}},
			Metadata: []Meta{{maxU32, "k", "v"}},
			Events:   []FuncEvent{{maxU32, Exit, maxU32, maxU64}, {0, Entry, maxU32, 0}, {maxU32, Entry, 0, 0}},
			CounterEvents: []CounterEvent{
				{maxU32, maxU32, maxU64, maxU64}, {0, 0, 0, 0},
			},
			Comms: []CommEvent{{maxU32, Recv, maxU32, maxU32, maxU64, maxU64}, {0, Send, 0, 0, 0, maxU64}},
		}},
		{"backwards_timestamps", &Frame{PID: 1, Rank: 0, Step: 2, TStart: 10_000, TEnd: 5_000,
			Events: []FuncEvent{
				{0, Entry, 1, 20_000}, {0, Exit, 1, 15_000}, {0, Entry, 2, 3}, {0, Exit, 2, 1 << 62},
				{0, Entry, 3, 0},
			},
			CounterEvents: []CounterEvent{{0, 1, 5, 9_000}, {0, 1, 4, 8_000}},
			Comms:         []CommEvent{{0, Recv, 1, 2, 3, 100}, {0, Send, 1, 2, 3, 50}},
		}},
		{"many_threads", manyThreads()},
		{"varint_widths", varintWidths()},
		{"generated", genFrame(genConfig{Seed: 1, Threads: 4, Funcs: 50, MaxDepth: 6, Events: 400})},
		{"empty slices not nil", &Frame{Funcs: []Name{}, Counters: []Name{}, Metadata: []Meta{},
			Events: []FuncEvent{}, CounterEvents: []CounterEvent{}, Comms: []CommEvent{}}},
	}
}

// varintWidths has event heads and timestamp deltas of 1 to 5 bytes, mixed,
// so the decoder's word-at-a-time path and its byte-wise path both run and
// hand over to each other at every width.
func varintWidths() *Frame {
	f := &Frame{PID: 4, Rank: 8, Step: 15, TStart: 1 << 40, TEnd: 1<<40 + 1<<30}
	fids := []uint32{0, 3, 63, 64, 1000, 8191, 8192, 1 << 20, 1<<21 + 5, 1 << 30}
	gaps := []uint64{0, 1, 63, 64, 8191, 8192, 1<<20 - 1, 1 << 20, 1 << 27, 1 << 33}
	ts := make([]uint64, 16)
	for i := range ts {
		ts[i] = f.TStart
	}
	for i := range 200 {
		tid := uint32(i*7) % 16
		kind := EventKind(i % 2)
		step := gaps[(i*3)%len(gaps)]
		if i%5 == 4 {
			ts[tid] -= step // backwards
		} else {
			ts[tid] += step
		}
		f.Events = append(f.Events, FuncEvent{tid, kind, fids[(i*7)%len(fids)], ts[tid]})
	}
	return f
}

// manyThreads has more threads than the codec tracks on the stack, with
// sparse tids.
func manyThreads() *Frame {
	f := &Frame{PID: 9, Rank: 1, Step: 4, TStart: 1000, TEnd: 2000}
	for i := range 300 {
		tid := uint32(i*i*7 + 3)
		f.Events = append(f.Events, FuncEvent{tid, Entry, uint32(i % 5), 1000 + uint64(i)})
	}
	for i := range 300 {
		tid := uint32((299-i)*(299-i)*7 + 3)
		f.Events = append(f.Events, FuncEvent{tid, Exit, uint32((299 - i) % 5), 1500 + uint64(i)})
	}
	return f
}

func TestRoundTrip(t *testing.T) {
	for _, tc := range testFrames() {
		t.Run(tc.name, func(t *testing.T) {
			bin := AppendBinary(nil, tc.f)
			var g Frame
			n, err := DecodeBinary(bin, &g)
			if err != nil {
				t.Fatalf("DecodeBinary: %v", err)
			}
			if n != len(bin) {
				t.Fatalf("DecodeBinary used %d bytes of %d", n, len(bin))
			}
			if !equalFrames(tc.f, &g) {
				t.Fatalf("binary round trip changed the frame:\n got %+v\nwant %+v", g, *tc.f)
			}
			js, err := AppendJSON(nil, &g)
			if err != nil {
				t.Fatalf("AppendJSON: %v", err)
			}
			if bytes.IndexByte(js, '\n') >= 0 {
				t.Fatalf("JSON form spans lines: %s", js)
			}
			var h Frame
			if err := DecodeJSON(js, &h); err != nil {
				t.Fatalf("DecodeJSON: %v\n%s", err, js)
			}
			if !equalFrames(tc.f, &h) {
				t.Fatalf("JSON round trip changed the frame:\n got %+v\nwant %+v", h, *tc.f)
			}
			if again := AppendBinary(nil, &h); !bytes.Equal(again, bin) {
				t.Fatalf("binary -> JSON -> binary is not byte-identical")
			}
		})
	}
}

// TestDecodeReusesFrame decodes frames of different sizes into one Frame and
// checks nothing of an earlier frame leaks into a later one.
func TestDecodeReusesFrame(t *testing.T) {
	var g Frame
	for _, tc := range append(testFrames(), testFrames()...) {
		bin := AppendBinary(nil, tc.f)
		if _, err := DecodeBinary(bin, &g); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !equalFrames(tc.f, &g) {
			t.Fatalf("%s: decoding into a reused frame changed it", tc.name)
		}
		js, _ := AppendJSON(nil, tc.f)
		if err := DecodeJSON(js, &g); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !equalFrames(tc.f, &g) {
			t.Fatalf("%s: JSON decoding into a reused frame changed it", tc.name)
		}
	}
}

func TestGolden(t *testing.T) {
	for _, tc := range testFrames() {
		if bytes.ContainsRune([]byte(tc.name), ' ') {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			bin := AppendBinary(nil, tc.f)
			js, err := AppendJSON(nil, tc.f)
			if err != nil {
				t.Fatal(err)
			}
			js = append(js, '\n')
			binPath := filepath.Join("testdata", tc.name+".bin")
			jsPath := filepath.Join("testdata", tc.name+".json")
			if *update {
				writeFile(t, binPath, bin)
				writeFile(t, jsPath, js)
			}
			wantBin, err := os.ReadFile(binPath)
			if err != nil {
				t.Fatalf("%v (run go test -update to create it)", err)
			}
			wantJS, err := os.ReadFile(jsPath)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(bin, wantBin) {
				t.Errorf("binary encoding differs from %s", binPath)
			}
			if !bytes.Equal(js, wantJS) {
				t.Errorf("JSON encoding differs from %s:\n got %s\nwant %s", jsPath, js, wantJS)
			}
			// The golden files decode to the frame, each by its own decoder.
			var g Frame
			if _, err := DecodeBinary(wantBin, &g); err != nil || !equalFrames(&g, tc.f) {
				t.Errorf("%s does not decode to the frame (err %v)", binPath, err)
			}
			if err := DecodeJSON(wantJS, &g); err != nil || !equalFrames(&g, tc.f) {
				t.Errorf("%s does not decode to the frame (err %v)", jsPath, err)
			}
		})
	}
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestConcatenatedFrames(t *testing.T) {
	var file []byte
	frames := testFrames()
	for _, tc := range frames {
		file = AppendBinary(file, tc.f)
	}
	var g Frame
	off := 0
	for _, tc := range frames {
		n, err := DecodeBinary(file[off:], &g)
		if err != nil {
			t.Fatalf("%s at %d: %v", tc.name, off, err)
		}
		if !equalFrames(&g, tc.f) {
			t.Fatalf("%s: frame differs", tc.name)
		}
		off += n
	}
	if off != len(file) {
		t.Fatalf("consumed %d of %d bytes", off, len(file))
	}
}

func TestEncodedSize(t *testing.T) {
	// The compactness target: at most 6 bytes per event on the synthetic
	// MPI-like workload, dictionary included.
	f := benchFrame()
	bin := AppendBinary(nil, f)
	per := float64(len(bin)) / float64(f.NumEvents())
	if per > 6 {
		t.Fatalf("%.2f bytes per event, want <= 6", per)
	}
	t.Logf("%d events, %d bytes, %.3f B/event", f.NumEvents(), len(bin), per)
}

func TestDecodeBinaryNoAllocs(t *testing.T) {
	f := benchFrame()
	bin := AppendBinary(nil, f)
	var g Frame
	if _, err := DecodeBinary(bin, &g); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(5, func() {
		if _, err := DecodeBinary(bin, &g); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per decode into a reused frame, want 0", allocs)
	}
}
