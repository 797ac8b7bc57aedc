package chrome

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/replay/steps"
)

// FuzzChrome parses and converts arbitrary JSON: frames that encode or an
// error naming the file, never a panic.
func FuzzChrome(f *testing.F) {
	f.Add([]byte(`{"traceEvents":[{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":1,"tid":1,"ts":10,"dur":5,"args":{"correlation":7}},{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":12,"dur":3,"args":{"correlation":7,"device":0,"stream":7}}],"distributedInfo":{"rank":3}}`))
	f.Add([]byte(`[{"ph":"B","name":"a","pid":"p","tid":"t","ts":1},{"ph":"E","pid":"p","tid":"t","ts":2.5},{"ph":"s","cat":"ac2g","id":1,"pid":1,"tid":1,"ts":1},{"ph":"f","cat":"ac2g","id":1,"pid":0,"tid":7,"ts":2,"bp":"e"}`))
	f.Add(gzipped(`{"traceEvents":[{"ph":"X","name":"x","pid":1,"tid":1,"ts":1e6,"dur":1e5}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse(bytes.NewReader(data), "fuzz.json")
		if err != nil {
			if !strings.Contains(err.Error(), "fuzz.json") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		cfg := steps.Config{MaxGap: 1000}
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
		_ = Feed([]*File{file}, b, file.Err)
	})
}

func gzipped(s string) []byte {
	var b bytes.Buffer
	z := gzip.NewWriter(&b)
	z.Write([]byte(s))
	z.Close()
	return b.Bytes()
}

// synthChrome is a PyTorch-like trace of n X events: CPU ops with nested
// launches, and kernels on two streams linked by correlation ids.
func synthChrome(n int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"schemaVersion":1,"traceEvents":[`)
	ts := 4_203_669_603_000.0 // µs with three decimals, as Kineto writes on ROCm
	corr := 0
	for i := 0; i < n; i += 3 {
		if i > 0 {
			b.WriteByte(',')
		}
		corr++
		fmt.Fprintf(&b, `{"ph":"X","cat":"cpu_op","name":"aten::op%d","pid":100,"tid":100,"ts":%.3f,"dur":20,"args":{"External id":%d}},`, i%17, ts, corr)
		fmt.Fprintf(&b, `{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":100,"tid":100,"ts":%.3f,"dur":5,"args":{"correlation":%d}},`, ts+2, corr)
		fmt.Fprintf(&b, `{"ph":"X","cat":"kernel","name":"kernel%d","pid":0,"tid":%d,"ts":%.3f,"dur":9,"args":{"device":0,"stream":%d,"correlation":%d}}`, i%5, 7+corr%2, ts+10, 7+corr%2, corr)
		ts += 25
	}
	b.WriteString(`]}`)
	return b.Bytes()
}

func BenchmarkChrome(b *testing.B) {
	const n = 300_000
	data := synthChrome(n)
	cfg := steps.Config{}
	if err := cfg.Validate(); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	events := 0
	for i := 0; i < b.N; i++ {
		f, err := Parse(bytes.NewReader(data), "bench.json")
		if err != nil || f.Err != nil {
			b.Fatal(err, f.Err)
		}
		bl := steps.New(cfg, func(*frame.Frame) error { return nil })
		if err := Feed([]*File{f}, bl, nil); err != nil {
			b.Fatal(err)
		}
		events += n
	}
	b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
}
