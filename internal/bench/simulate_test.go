package bench

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

// TestSimulateSmall runs the simulated deployment at 512 ranks on 8 nodes
// with 2 pserver shards and 2 provdb, and checks what must hold: every
// rank's frames processed, one merged write per node per shard per wave
// (from the pserver's counters), everything the detectors sent stored by
// provdb, the pserver's per-rank anomaly counts equal to the detectors',
// and the server's per-connection counts against what was published.
func TestSimulateSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("simulates 512 ranks on 8 nodes")
	}
	const ranks, perNode, shards, provdbs, steps, events = 512, 64, 2, 2, 5, 600
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := Simulate(ctx, SimConfig{
		Out: t.TempDir(), Ranks: ranks, RanksPerNode: perNode, Shards: shards, ProvDBs: provdbs,
		Steps: steps, EventsPerStep: events, Log: testWriter{t},
	})
	if err != nil {
		t.Fatal(err)
	}
	nodes := ranks / perNode

	// What the workload holds, counted apart from the simulation.
	wl := workload.DefaultConfig()
	wl.Ranks, wl.Steps, wl.EventsPerStep, wl.ThreadsPerRank = ranks, steps, events, 1
	w, err := workload.New(wl)
	if err != nil {
		t.Fatal(err)
	}
	var wantEvents int64
	var f frame.Frame
	for r := range ranks {
		g := w.Rank(uint32(r))
		for {
			if _, err := g.Next(&f); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatal(err)
			}
			wantEvents += int64(f.NumEvents())
		}
	}

	if res.Frames != ranks*steps || res.Events != wantEvents {
		t.Errorf("published %d frames and %d events, want %d and %d", res.Frames, res.Events, ranks*steps, wantEvents)
	}
	if res.DetectorEvents != uint64(wantEvents) {
		t.Errorf("the detectors processed %d events, want %d", res.DetectorEvents, wantEvents)
	}
	if res.FramesMissing != 0 {
		t.Errorf("%d ranks did not process all %d frames", res.FramesMissing, steps)
	}
	if res.Nodes != nodes || res.ExpectedWritesPerStep != nodes*shards {
		t.Errorf("%d nodes, %d writes expected per step; want %d and %d", res.Nodes, res.ExpectedWritesPerStep, nodes, nodes*shards)
	}
	if len(res.StepsMeasured) != steps {
		t.Fatalf("%d waves measured, want %d", len(res.StepsMeasured), steps)
	}
	for _, st := range res.StepsMeasured {
		if !st.Settled {
			t.Errorf("wave %d: syncs still unanswered when it ended", st.Step)
		}
		for sh, n := range st.Writes {
			if n != uint64(nodes) {
				t.Errorf("wave %d: shard %d applied %d merged writes, want one per node (%d)", st.Step, sh, n, nodes)
			}
		}
		if st.RankParts != ranks*shards {
			t.Errorf("wave %d: %d ranks' requests in the merged writes, want %d", st.Step, st.RankParts, ranks*shards)
		}
	}
	if res.RecordsDropped != 0 || res.Records == 0 {
		t.Errorf("detectors made %d records, sinks dropped %d", res.Records, res.RecordsDropped)
	}
	if res.RecordsPublished != res.Records || res.RecordsStored != int64(res.Records) {
		t.Errorf("detectors made %d records, sinks published %d, the store holds %d", res.Records, res.RecordsPublished, res.RecordsStored)
	}
	if res.Anomalies == 0 || res.StoredAnomalies != int64(res.Anomalies) {
		t.Errorf("detectors found %d anomalies, the store holds %d", res.Anomalies, res.StoredAnomalies)
	}
	if res.RankAnomalyMismatches != 0 {
		t.Errorf("%d ranks' anomaly counts differ between the pserver and their detector", res.RankAnomalyMismatches)
	}
	if len(res.ProvWritten) != provdbs {
		t.Fatalf("%d provdb instances reported, want %d", len(res.ProvWritten), provdbs)
	}
	var written int64
	for i, n := range res.ProvWritten {
		if n == 0 {
			t.Errorf("provdb %d wrote nothing: the durable consumer was not shared", i)
		}
		written += n
	}
	if written < res.RecordsStored {
		t.Errorf("provdb instances wrote %d records, fewer than the %d stored", written, res.RecordsStored)
	}

	comp := map[string]SimComponent{}
	for _, c := range res.Components {
		comp[c.Name] = c
	}
	// The publisher's connection sent every frame and one end of stream
	// per rank, nothing else.
	if p := comp[simPublisher]; p.Instances != 1 || p.InMsgs != uint64(ranks*(steps+1)) {
		t.Errorf("publisher: %d connections, %d messages in; want 1 and %d", p.Instances, p.InMsgs, ranks*(steps+1))
	}
	if a := comp[simAD]; a.Instances != nodes || a.OutMsgs < uint64(ranks*(steps+1)) {
		t.Errorf("ad: %d connections, %d messages delivered; want %d and at least %d", a.Instances, a.OutMsgs, nodes, ranks*(steps+1))
	}
	var applied uint64
	for _, n := range res.NodeWrites {
		applied += n
	}
	applied += res.RankWrites + res.Duplicates
	if p := comp[simPServer]; p.Instances != shards || p.OutMsgs < applied {
		t.Errorf("pserver: %d connections, %d messages delivered; want %d and at least the %d requests it handled", p.Instances, p.OutMsgs, shards, applied)
	}
	if p := comp[simProvDB]; p.Instances != provdbs || p.OutMsgs == 0 {
		t.Errorf("provdb: %d connections, %d messages delivered", p.Instances, p.OutMsgs)
	}
	if comp[simAD].LiveHeapMiB <= 0 || res.HeapLiveMiB <= 0 {
		t.Errorf("no heap attributed to the detectors (%.1f MiB of %.1f MiB live)", comp[simAD].LiveHeapMiB, res.HeapLiveMiB)
	}
	if res.SyncP99Ms <= 0 || res.DetectSeconds <= 0 {
		t.Errorf("sync p99 %.3g ms, detection %.3g s", res.SyncP99Ms, res.DetectSeconds)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// heapHog keeps an allocation of the harness alive across a collection.
var heapHog []byte

func TestHeapByComponent(t *testing.T) {
	const size = 64 << 20
	before, _ := heapByComponent()
	heapHog = make([]byte, size)
	for i := range heapHog {
		heapHog[i] = byte(i)
	}
	after, live := heapByComponent()
	grew := (after[simHarness] - before[simHarness]) * (1 << 20)
	if grew < 0.9*size || grew > 1.1*size {
		t.Errorf("the harness's heap grew by %.1f MiB after allocating 64 MiB", grew/(1<<20))
	}
	if live < size/(1<<20) {
		t.Errorf("live heap %.1f MiB, less than the 64 MiB held", live)
	}
	runtime.KeepAlive(heapHog)
	heapHog = nil
}

func TestClassifyStack(t *testing.T) {
	pcs := make([]uintptr, 32)
	n := runtime.Callers(1, pcs)
	if got := classifyStack(pcs[:n]); got != simHarness {
		t.Errorf("this test's stack is %q, want %q", got, simHarness)
	}
	if got := classifyStack(nil); got != simOther {
		t.Errorf("an empty stack is %q, want %q", got, simOther)
	}
}

func TestComponentOf(t *testing.T) {
	tests := []struct{ name, conn, want string }{
		{"publisher", "publisher", simPublisher},
		{"a node's ad", "ad-0042", simAD},
		{"a pserver shard", "pserver-3", simPServer},
		{"a provdb instance", "provdb-1", simProvDB},
		{"the harness", "harness", simHarness},
		{"an unnamed connection", "", simOther},
		{"a name that only starts like one", "adx-1", simOther},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := componentOf(tc.conn); got != tc.want {
				t.Errorf("componentOf(%q) = %q, want %q", tc.conn, got, tc.want)
			}
		})
	}
}

func TestSeriesValue(t *testing.T) {
	body := []byte("# HELP kipimo_ps_node_syncs_total x\n# TYPE kipimo_ps_node_syncs_total counter\nkipimo_ps_node_syncs_total 40\n" +
		"kipimo_ps_sync_requests_total{result=\"applied\"} 552\nkipimo_ps_sync_requests_total{result=\"duplicate\"} 40\nkipimo_bad 1e+06\nkipimo_broken x\n")
	tests := []struct {
		name, series string
		want         float64
		fails        bool
	}{
		{"plain counter", "kipimo_ps_node_syncs_total", 40, false},
		{"labelled series", `kipimo_ps_sync_requests_total{result="applied"}`, 552, false},
		{"other label", `kipimo_ps_sync_requests_total{result="duplicate"}`, 40, false},
		{"exponent", "kipimo_bad", 1e6, false},
		{"absent series reads 0", `kipimo_ps_sync_requests_total{result="bad"}`, 0, false},
		{"a prefix is not the series", "kipimo_ps_node", 0, false},
		{"unparsable value", "kipimo_broken", 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := seriesValue(body, tc.series)
			if (err != nil) != tc.fails || got != tc.want {
				t.Errorf("seriesValue(%q) = %g, %v; want %g (error %v)", tc.series, got, err, tc.want, tc.fails)
			}
		})
	}
}

func FuzzSeriesValue(f *testing.F) {
	f.Add("kipimo_ps_node_syncs_total 40\n", "kipimo_ps_node_syncs_total")
	f.Add("kipimo_ps_sync_requests_total{result=\"applied\"} 552\n", `kipimo_ps_sync_requests_total{result="applied"}`)
	f.Add("x NaN\nx 1\n", "x")
	f.Fuzz(func(t *testing.T, body, series string) {
		v, err := seriesValue([]byte(body), series)
		if err != nil && v != 0 {
			t.Fatalf("error %v with value %g", err, v)
		}
	})
}

func TestSimConfigFill(t *testing.T) {
	tests := []struct {
		name  string
		cfg   SimConfig
		fails bool
	}{
		{"defaults", SimConfig{Out: "x"}, false},
		{"no scratch directory", SimConfig{}, true},
		{"one rank per node", SimConfig{Out: "x", RanksPerNode: 1}, true},
		{"too few events", SimConfig{Out: "x", EventsPerStep: 10}, true},
		{"negative period", SimConfig{Out: "x", StepPeriod: -time.Second}, true},
		{"too many shards", SimConfig{Out: "x", Shards: 65}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.cfg
			err := c.fill()
			if (err != nil) != tc.fails {
				t.Fatalf("fill: %v, want failure %v", err, tc.fails)
			}
			if err == nil && (c.Ranks != 16384 || c.RanksPerNode != 64 || c.Shards != 4 || c.ProvDBs != 2) {
				t.Errorf("defaults %d ranks, %d per node, %d shards, %d provdb", c.Ranks, c.RanksPerNode, c.Shards, c.ProvDBs)
			}
		})
	}
}

func TestBoundMs(t *testing.T) {
	h := histogram{bounds: []float64{0.001, 0.5, 2, math.Inf(1)}, counts: []float64{50, 90, 98, 100}, count: 100}
	tests := []struct {
		name   string
		q      float64
		want   float64
		beyond bool
	}{
		{"p50 in the first bucket", 0.5, 1, false},
		{"p90 at the second bound", 0.9, 500, false},
		{"p98 at the last finite bound", 0.98, 2000, false},
		{"p99 beyond it reads as it, and is named", 0.99, 2000, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var res SimResult
			if got := res.boundMs(h, tc.q, "q"); got != tc.want || (len(res.SyncBeyond) > 0) != tc.beyond {
				t.Errorf("boundMs(%g) = %g (beyond %v), want %g (beyond %v)", tc.q, got, res.SyncBeyond, tc.want, tc.beyond)
			}
		})
	}
	var res SimResult
	if got := res.boundMs(histogram{}, 0.5, "empty"); got != 0 {
		t.Errorf("an empty histogram's p50 = %g, want 0", got)
	}
}

// spin does a fixed amount of CPU work.
func spin(n int) uint64 {
	x := uint64(1)
	for i := range n {
		x = x*6364136223846793005 + uint64(i)
	}
	return x
}

// labelledProfile profiles a fixed amount of work done under the label
// component=busy and as much again unlabelled.
func labelledProfile(tb testing.TB) []byte {
	var buf bytes.Buffer
	if err := pprof.StartCPUProfile(&buf); err != nil {
		tb.Skipf("a CPU profile is running already: %v", err)
	}
	var sink uint64
	pprof.Do(context.Background(), pprof.Labels("component", "busy"), func(context.Context) { sink += spin(400_000_000) })
	sink += spin(100_000_000)
	pprof.StopCPUProfile()
	if sink == 42 {
		tb.Log("unlikely")
	}
	return buf.Bytes()
}

func TestCPUByLabel(t *testing.T) {
	data := labelledProfile(t)
	by, total, err := cpuByLabel(data, "component")
	if err != nil {
		t.Fatal(err)
	}
	if total <= 0 {
		t.Fatalf("no CPU time in the profile")
	}
	var sum float64
	for _, v := range by {
		sum += v
	}
	if math.Abs(sum-total) > 1e-9*total {
		t.Errorf("labels sum to %g s, the total is %g s", sum, total)
	}
	// Four times as much work was done under the label as without it.
	if share := by["busy"] / total; share < 0.6 {
		t.Errorf("the labelled work has %.0f%% of the CPU time (%v), want about 80%%", 100*share, by)
	}
	if _, _, err := cpuByLabel(data[:len(data)/2], "component"); err == nil {
		t.Error("a truncated profile decoded")
	}
	if _, _, err := cpuByLabel([]byte("not gzip"), "component"); err == nil {
		t.Error("a profile that is not gzip decoded")
	}
}

func FuzzCPUByLabel(f *testing.F) {
	f.Add(labelledProfile(f))
	f.Fuzz(func(t *testing.T, data []byte) {
		by, total, err := cpuByLabel(data, "component")
		if err != nil {
			return
		}
		var sum float64
		for _, v := range by {
			sum += v
		}
		if math.IsNaN(total) || (total != 0 && math.Abs(sum-total) > 1e-6*math.Abs(total)) {
			t.Fatalf("labels sum to %g, total %g", sum, total)
		}
	})
}

func FuzzProtoFields(f *testing.F) {
	f.Add([]byte{0x08, 0x96, 0x01, 0x12, 0x02, 'h', 'i'})
	f.Add([]byte{0x0b})
	f.Fuzz(func(t *testing.T, b []byte) {
		_ = protoFields(b, 0, func(field, wire int, v uint64, data []byte, off int) error {
			if off < 0 || off > len(b) || len(data) > len(b) {
				t.Fatalf("field %d at offset %d with %d bytes, message of %d", field, off, len(data), len(b))
			}
			return nil
		})
	})
}
