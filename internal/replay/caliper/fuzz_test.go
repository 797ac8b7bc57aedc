package caliper

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/replay/steps"
)

// FuzzCaliper reads arbitrary .cali text: frames that encode or an error
// naming the file and line, never a panic.
func FuzzCaliper(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.cali")
	for _, p := range files {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(data[:min(len(data), 3000)]))
	}
	f.Add("__rec=node,id=20,attr=8,data=event.begin#function,parent=3\n__rec=node,id=21,attr=8,data=time.offset,parent=2\n__rec=node,id=22,attr=20,data=main\n__rec=ctx,ref=22,attr=21,data=5\n")
	f.Fuzz(func(t *testing.T, s string) {
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
		err := ReadFile(context.Background(), strings.NewReader(s), "fuzz.cali", 0, b)
		if err != nil && !strings.Contains(err.Error(), "fuzz.cali:") && !strings.Contains(err.Error(), "rank") {
			t.Fatalf("error does not say where: %v", err)
		}
	})
}

// synthCali is an event trace with time.offset: n begin/end snapshots of
// nested function regions on one thread.
func synthCali(n int) string {
	var b strings.Builder
	b.WriteString("__rec=node,id=20,attr=10,data=276,parent=3\n")
	b.WriteString("__rec=node,id=21,attr=8,data=function,parent=20\n")
	b.WriteString("__rec=node,id=22,attr=8,data=event.begin#function,parent=3\n")
	b.WriteString("__rec=node,id=23,attr=8,data=event.end#function,parent=3\n")
	b.WriteString("__rec=node,id=24,attr=8,data=time.offset,parent=2\n")
	next := 100
	begin := map[string]int{}
	end := map[string]int{}
	node := func(attr int, name string, m map[string]int) int {
		if id, ok := m[name]; ok {
			return id
		}
		next++
		fmt.Fprintf(&b, "__rec=node,id=%d,attr=%d,data=%s\n", next, attr, name)
		m[name] = next
		return next
	}
	depth := 0
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("f%d", depth)
		if depth < 3 && (i%3 != 2 || depth == 0) {
			fmt.Fprintf(&b, "__rec=ctx,ref=%d,attr=24,data=%d\n", node(22, name, begin), i*3)
			depth++
		} else {
			depth--
			fmt.Fprintf(&b, "__rec=ctx,ref=%d,attr=24,data=%d\n", node(23, fmt.Sprintf("f%d", depth), end), i*3)
		}
	}
	return b.String()
}

func BenchmarkCaliper(b *testing.B) {
	const n = 300_000
	data := synthCali(n)
	cfg := steps.Config{}
	if err := cfg.Validate(); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	events := 0
	for i := 0; i < b.N; i++ {
		bl := steps.New(cfg, func(*frame.Frame) error { return nil })
		if err := ReadFile(context.Background(), strings.NewReader(data), "bench.cali", 0, bl); err != nil {
			b.Fatal(err)
		}
		events += n
	}
	b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
}
