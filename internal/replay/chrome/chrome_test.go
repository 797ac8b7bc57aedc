package chrome

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/replay/steps"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/golden")

func collect(t testing.TB, cfg steps.Config, read func(*steps.Builder) error) ([]frame.Frame, steps.Stats, error) {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var out []frame.Frame
	b := steps.New(cfg, func(f *frame.Frame) error {
		c := *f
		c.Funcs = append([]frame.Name(nil), f.Funcs...)
		c.Counters = append([]frame.Name(nil), f.Counters...)
		c.Metadata = append([]frame.Meta(nil), f.Metadata...)
		c.Events = append([]frame.FuncEvent(nil), f.Events...)
		c.CounterEvents = append([]frame.CounterEvent(nil), f.CounterEvents...)
		c.Comms = append([]frame.CommEvent(nil), f.Comms...)
		out = append(out, c)
		return nil
	})
	err := read(b)
	return out, b.Stats(), err
}

func gunzip(t *testing.T, path string) []byte {
	t.Helper()
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	z, err := gzip.NewReader(fh)
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(z)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// plain counts with encoding/json, independently of the reader.
type plain struct {
	X, GPUThreads int
	GPUCorr       int // GPU events with args.correlation
	Launches      int // cuda_runtime calls whose correlation a GPU event has
}

func countPlain(t *testing.T, data []byte) plain {
	var doc struct {
		TraceEvents []map[string]any `json:"traceEvents"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	var p plain
	gpuThreads := map[string]bool{}
	corr := map[float64]bool{}
	for _, e := range doc.TraceEvents {
		if e["ph"] != "X" {
			continue
		}
		p.X++
		switch e["cat"] {
		case "kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation":
			k, _ := json.Marshal([]any{e["pid"], e["tid"]})
			gpuThreads[string(k)] = true
			if a, ok := e["args"].(map[string]any); ok {
				if c, ok := a["correlation"].(float64); ok {
					p.GPUCorr++
					corr[c] = true
				}
			}
		}
	}
	for _, e := range doc.TraceEvents {
		if e["ph"] == "X" && e["cat"] == "cuda_runtime" {
			if a, ok := e["args"].(map[string]any); ok {
				if c, ok := a["correlation"].(float64); ok && corr[c] {
					p.Launches++
				}
			}
		}
	}
	p.GPUThreads = len(gpuThreads)
	return p
}

func TestFixtures(t *testing.T) {
	files, _ := filepath.Glob("testdata/*.json.gz")
	if len(files) != 3 {
		t.Fatalf("want the 3 fixture traces, found %v", files)
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			want := countPlain(t, gunzip(t, path))
			frames, st, err := collect(t, steps.Config{Step: 10 * time.Millisecond}, func(b *steps.Builder) error {
				return Read(context.Background(), []string{path}, b)
			})
			if err != nil {
				t.Fatal(err)
			}
			if st.Executions != want.X {
				t.Errorf("executions = %d, X events = %d", st.Executions, want.X)
			}
			// GPU streams: threads with stream metadata, less the extra
			// threads of spans that overlap their parent (they repeat the
			// stream of their thread).
			lanes := map[uint32]bool{}
			for _, f := range frames {
				for _, m := range f.Metadata {
					if m.Key == "Thread Name" && strings.Contains(m.Value, "(overlapping spans") {
						lanes[m.Tid] = true
					}
				}
			}
			streams := 0
			for _, f := range frames {
				for _, m := range f.Metadata {
					if strings.HasSuffix(m.Key, " Stream") && !lanes[m.Tid] {
						streams++
					}
				}
			}
			if streams != want.GPUThreads {
				t.Errorf("gpu streams = %d, want %d", streams, want.GPUThreads)
			}
			// Correlation counters: one per GPU event with a correlation id,
			// one per launch whose GPU side is present; GPU ones on GPU threads.
			gpuTid := map[uint32]bool{}
			var corrGPU, corrCPU, entries, exits int
			for _, f := range frames {
				for _, m := range f.Metadata {
					if strings.HasSuffix(m.Key, " Stream") {
						gpuTid[m.Tid] = true
					}
				}
				for _, c := range f.CounterEvents {
					if gpuTid[c.Tid] {
						corrGPU++
					} else {
						corrCPU++
					}
				}
				for _, e := range f.Events {
					if e.Kind == frame.Entry {
						entries++
					} else {
						exits++
					}
				}
			}
			if corrGPU < want.GPUCorr {
				t.Errorf("GPU correlation samples = %d, GPU events with a correlation = %d", corrGPU, want.GPUCorr)
			}
			if corrCPU != want.Launches {
				t.Errorf("CPU correlation samples = %d, launches with a GPU side = %d", corrCPU, want.Launches)
			}
			if entries != want.X || exits != want.X {
				t.Errorf("entries %d, exits %d, want %d each", entries, exits, want.X)
			}
			g, _ := json.MarshalIndent(struct {
				Stats                  steps.Stats
				CorrGPU, CorrCPU, Rank int
			}{st, corrGPU, corrCPU, int(frames[0].Rank)}, "", " ")
			gp := filepath.Join("testdata", "golden", strings.TrimSuffix(filepath.Base(path), ".json.gz")+".json")
			if *update {
				os.MkdirAll(filepath.Dir(gp), 0o755)
				if err := os.WriteFile(gp, g, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			old, err := os.ReadFile(gp)
			if err != nil {
				t.Fatalf("%v (run go test -update)", err)
			}
			if !bytes.Equal(old, g) {
				t.Errorf("summary differs from %s:\n%s", gp, g)
			}
		})
	}
}

func TestBeginEndAndFlows(t *testing.T) {
	// B/E nesting with an E that has no B and a B that never ends; a kernel
	// linked only by an ac2g flow; an "f" without an "s".
	trace := `[
{"ph":"B","name":"outer","pid":1,"tid":1,"ts":10},
{"ph":"B","name":"inner","pid":1,"tid":1,"ts":12},
{"ph":"E","pid":1,"tid":1,"ts":15},
{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":1,"tid":1,"ts":16,"dur":2},
{"ph":"s","cat":"ac2g","name":"ac2g","id":77,"pid":1,"tid":1,"ts":16},
{"ph":"E","pid":1,"tid":1,"ts":20},
{"ph":"E","pid":1,"tid":1,"ts":21},
{"ph":"B","name":"never ends","pid":1,"tid":1,"ts":22},
{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":30,"dur":5},
{"ph":"f","cat":"ac2g","name":"ac2g","id":77,"pid":0,"tid":7,"ts":30,"bp":"e"},
{"ph":"X","cat":"kernel","name":"k2","pid":0,"tid":7,"ts":40,"dur":5},
{"ph":"f","cat":"ac2g","name":"ac2g","id":78,"pid":0,"tid":7,"ts":40,"bp":"e"}
`
	f, err := Parse(strings.NewReader(trace), "be.json")
	if err != nil || f.Err != nil {
		t.Fatal(err, f.Err)
	}
	frames, st, err := collect(t, steps.Config{}, func(b *steps.Builder) error { return Feed([]*File{f}, b, nil) })
	if err != nil {
		t.Fatal(err)
	}
	if st.Executions != 5 || st.GPUThreads != 1 || st.Threads != 2 {
		t.Errorf("stats %+v, want 5 executions (outer, inner, launch, k, k2), 1 GPU thread of 2", st)
	}
	var samples []frame.CounterEvent
	for _, fr := range frames {
		samples = append(samples, fr.CounterEvents...)
	}
	if len(samples) != 3 || samples[0].Value != 77 || samples[1].Value != 77 || samples[2].Value != 78 {
		t.Errorf("correlation samples %+v, want 77 on the launch and on k, 78 on k2", samples)
	}
}

func TestTruncated(t *testing.T) {
	path := "testdata/benchmark_result_493459_1694039959_trace.json.gz"
	data := gunzip(t, path)
	cut := data[:len(data)*2/3]
	frames, _, err := collect(t, steps.Config{Step: 10 * time.Millisecond}, func(b *steps.Builder) error {
		f, err := Parse(bytes.NewReader(cut), "cut.json")
		if err != nil {
			return err
		}
		return Feed([]*File{f}, b, f.Err)
	})
	if err == nil || !errors.Is(err, steps.ErrStopped) || !strings.Contains(err.Error(), "cut.json: byte offset") {
		t.Fatalf("err = %v, want a stop naming cut.json and the offset", err)
	}
	if len(frames) == 0 {
		t.Fatal("no frames before the damage")
	}
}

func TestMalformed(t *testing.T) {
	cases := []struct{ name, text, want string }{
		{"not json", "hello", "not a JSON trace"},
		{"number", "42", "not a JSON trace"},
		{"no events", `{"a":1}`, "no traceEvents"},
		{"events not array", `{"traceEvents":{}}`, "not an array"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(strings.NewReader(tc.text), "bad.json")
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "bad.json") {
				t.Errorf("err = %v, want %q naming bad.json", err, tc.want)
			}
		})
	}
	f, err := Parse(strings.NewReader(`{"traceEvents":[{"ph":"X","ts":-5,"dur":1},{"ph":"X","ts":5,"dur":1}]}`), "neg.json")
	if err != nil || f.Err != nil || spans(f) != 1 || f.losses.Count(steps.LossBadTime) != 1 {
		t.Errorf("negative timestamp: err %v, f.Err %v, %d spans, losses %v; want it skipped and counted", err, f.Err, spans(f), f.losses)
	}
}

// spans is the number of completed spans f read (X events and matched
// begin/end pairs, async ones included).
func spans(f *File) int {
	f.settle()
	return len(f.spans)
}
