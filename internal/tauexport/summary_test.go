package tauexport

import (
	"bufio"
	"context"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/taudb"
	"github.com/kipimo-hpc/kipimo/internal/taudb/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// records is a Source holding its records in memory.
type records struct {
	profiles []provenance.ThreadProfile
	meta     []provenance.Metadata
}

func (r records) Profiles(_ context.Context, fn func(provenance.ThreadProfile) error) error {
	for _, p := range r.profiles {
		if err := fn(p); err != nil {
			return err
		}
	}
	return nil
}

func (r records) Metadata(_ context.Context, fn func(provenance.Metadata) error) error {
	for _, m := range r.meta {
		if err := fn(m); err != nil {
			return err
		}
	}
	return nil
}

// build is ReadTrial on records in memory.
func build(name string, profiles []provenance.ThreadProfile, meta []provenance.Metadata) (*taudb.Trial, error) {
	return ReadTrial(context.Background(), records{profiles, meta}, name)
}

// profiles gives 2 ranks x 2 threads; thread 1 of rank 1 never calls solve.
func profiles() []provenance.ThreadProfile {
	var out []provenance.ThreadProfile
	for r := uint32(0); r < 2; r++ {
		for tid := uint32(0); tid < 2; tid++ {
			scale := float64(1 + r*2 + tid)
			p := provenance.ThreadProfile{Rank: r, TID: tid, Step: 9, Final: true,
				Metadata: map[string]string{"Hostname": "node" + string(rune('a'+r))}}
			p.Timers = []provenance.TimerProfile{
				{Name: "MPI_Init()", Group: "MPI", Calls: 1, Inclusive: 10 * scale, Exclusive: 10 * scale},
				{Name: "main => MPI_Init()", Group: "TAU_CALLPATH|MPI", Calls: 1, Inclusive: 10 * scale, Exclusive: 10 * scale},
				{Name: "main", Calls: 1, Subrs: 2, Inclusive: 1000.4 * scale, Exclusive: 490.2 * scale},
			}
			if !(r == 1 && tid == 1) {
				p.Timers = append(p.Timers,
					provenance.TimerProfile{Name: "solve", Group: "TAU_USER", Calls: 3, Inclusive: 500.2 * scale, Exclusive: 500.2 * scale, SumSqExclusive: 9e4},
					provenance.TimerProfile{Name: "main => solve", Group: "TAU_CALLPATH|TAU_USER", Calls: 3, Inclusive: 500.2 * scale, Exclusive: 500.2 * scale})
			}
			p.Counters = []provenance.CounterProfile{{Name: "Message size : main => MPI_Init()", Count: 2, Min: 4, Max: 8, Mean: 6, SumSqr: 80}}
			out = append(out, p)
		}
	}
	// An earlier, non-final snapshot of rank 0 thread 0 must be ignored.
	out = append(out, provenance.ThreadProfile{Rank: 0, TID: 0, Step: 3, Timers: []provenance.TimerProfile{{Name: "main", Calls: 1, Inclusive: 1, Exclusive: 1}}})
	return out
}

func runMeta() []provenance.Metadata {
	return []provenance.Metadata{
		{Descr: "Executable", Value: "/bin/app", RID: 7, TID: 0}, // unknown rank: every thread
		{Descr: "CPU Cores", Value: "64", RID: 1, TID: 5},        // rank 1, no such thread: all of rank 1
		{Descr: "GPU", Value: "none", RID: 0, TID: 1},            // exactly rank 0 thread 1
		{Descr: "Metric Name", Value: "ignored", RID: 0, TID: 0}, // reserved
	}
}

func TestReadTrial(t *testing.T) {
	tr, err := build("run", profiles(), runMeta())
	if err != nil {
		t.Fatal(err)
	}
	if tr.NodeCount != 2 || tr.ThreadsPerContext != 2 || tr.TotalThreads != 4 {
		t.Errorf("shape = %d nodes, %d threads/context, %d threads", tr.NodeCount, tr.ThreadsPerContext, tr.TotalThreads)
	}
	time := tr.Metric(MetricName)
	main := tr.Timer("main")
	if main == nil || strings.Join(main.Groups, "|") != DefaultGroup {
		t.Fatalf("main timer = %+v", main)
	}
	// The root is rounded to whole microseconds.
	if v := tr.Thread(0).CallDataFor(main.Root()).Value(time); v.Inclusive != 1000 || v.Exclusive != 490 {
		t.Errorf("root on thread 0 = %v / %v, want 1000 / 490 (the final profile, rounded)", v.Inclusive, v.Exclusive)
	}
	solve := tr.Callpath("main => solve")
	if solve == nil || solve.Parent != main.Root() {
		t.Fatalf("main => solve = %+v", solve)
	}
	mean := tr.Thread(taudb.MeanWithoutNulls).CallDataFor(solve).Value(time).Inclusive
	var sum float64
	for _, scale := range []float64{1, 2, 3} {
		sum += 500.2 * scale
	}
	if want := sum * (1.0 / 3); mean != want {
		t.Errorf("mean of main => solve = %v, want %v over the 3 threads that ran it", mean, want)
	}
	if v := tr.Thread(0).CallDataFor(tr.Timer("solve").Root()).Value(time).SumExclusiveSquared; v == nil || *v != 9e4 {
		t.Errorf("sum of squares not kept: %v", v)
	}
	if c := tr.Counter("Message size : main => MPI_Init()"); c == nil || tr.Thread(3).CounterValueFor(c).SumSquares != 80 {
		t.Errorf("context counter = %+v", c)
	}
	if v, ok := tr.Primary("Executable"); !ok || v != "/bin/app" {
		t.Errorf("Executable = %q, %v; want trial-level /bin/app", v, ok)
	}
	secondary := map[string][]int{}
	for _, s := range tr.SecondaryMetadata {
		secondary[s.Name] = append(secondary[s.Name], s.Thread.Index)
	}
	for name, want := range map[string][]int{"Hostname": {0, 1, 2, 3}, "CPU Cores": {2, 3}, "GPU": {1}} {
		if got := secondary[name]; len(got) != len(want) {
			t.Errorf("secondary %q on threads %v, want %v", name, got, want)
		}
	}
	if _, ok := tr.Primary("Metric Name"); ok {
		t.Error("Metric Name leaked into the metadata")
	}
}

func TestWriteProfilesReadsBack(t *testing.T) {
	tr, err := build("run", profiles(), runMeta())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := Write(context.Background(), tr, Options{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	back, err := taudb.ReadDir(dir, "run")
	if err != nil {
		t.Fatal(err)
	}
	time, btime := tr.Metric(MetricName), back.Metric(MetricName)
	for _, th := range tr.Threads {
		bt := back.Thread(th.Index)
		if bt == nil {
			t.Fatalf("thread %d missing after re-reading", th.Index)
		}
		for _, d := range th.CallData {
			bd := bt.CallDataFor(back.Callpath(d.Callpath.Name))
			if bd == nil {
				t.Errorf("thread %d: %q missing", th.Index, d.Callpath.Name)
				continue
			}
			a, b := d.Value(time), bd.Value(btime)
			if bd.Calls != d.Calls || math.Abs(a.Inclusive-b.Inclusive) > 1e-9 || math.Abs(a.ExclusivePercent-b.ExclusivePercent) > 1e-9 {
				t.Errorf("thread %d %q: read back %v %v, wrote %v %v", th.Index, d.Callpath.Name, bd.Calls, b.Inclusive, d.Calls, a.Inclusive)
			}
		}
	}
	// What hatchet needs: line 3 is the root with integer values, " # " before
	// the metadata and Metric Name first.
	f, err := os.Open(filepath.Join(dir, "profile.1.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if !strings.HasPrefix(lines[1], "# Name Calls Subrs Excl Incl ProfileCalls # <metadata><attribute><name>Metric Name</name><value>TIME</value>") {
		t.Errorf("line 2 = %q", lines[1])
	}
	if lines[2] != `"main" 1 2 1961 4002 0 GROUP="TAU_USER" ` {
		t.Errorf("line 3 = %q, want the root with integer values", lines[2])
	}
}

func TestBuildTrialErrors(t *testing.T) {
	cases := []struct {
		name     string
		profiles []provenance.ThreadProfile
		want     string
	}{
		{"none", nil, "no thread profiles"},
		{"nan", []provenance.ThreadProfile{{Timers: []provenance.TimerProfile{{Name: "f", Calls: 1, Inclusive: math.NaN()}}}}, "NaN"},
		{"empty name", []provenance.ThreadProfile{{Timers: []provenance.TimerProfile{{Name: "  ", Calls: 1}}}}, "empty name"},
		{"counter twice", []provenance.ThreadProfile{{Counters: []provenance.CounterProfile{{Name: "c", Count: 1}, {Name: "c", Count: 1}}}}, "twice"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := build("x", tc.profiles, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want one mentioning %q", err, tc.want)
			}
		})
	}
	if _, err := Write(context.Background(), taudb.NewTrial("x"), Options{}); err == nil {
		t.Error("Write with no destination: no error")
	}
}

func TestWriteToTAUdb(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	tr, err := build("kipimo run", profiles(), runMeta())
	if err != nil {
		t.Fatal(err)
	}
	id, err := Write(ctx, tr, Options{Dir: t.TempDir(), DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	s, err := taudb.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	list, err := s.Trials(ctx, taudb.Filter{Name: "kipimo run", Metadata: map[string]string{"Executable": "/bin/app"}})
	if err != nil || len(list) != 1 || list[0].ID != id || list[0].TotalThreads != 4 {
		t.Fatalf("Trials = %+v, %v; want the one trial %d with 4 threads", list, err, id)
	}
	back, err := s.LoadTrial(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(back.Timers) != len(tr.Timers) || len(back.Callpaths) != len(tr.Callpaths) || len(back.Threads) != len(tr.Threads) {
		t.Errorf("loaded %d timers %d call paths %d threads, saved %d %d %d",
			len(back.Timers), len(back.Callpaths), len(back.Threads), len(tr.Timers), len(tr.Callpaths), len(tr.Threads))
	}
	m := back.Thread(taudb.Total).CallDataFor(back.Callpath("main => solve")).Value(back.Metric(MetricName))
	want := tr.Thread(taudb.Total).CallDataFor(tr.Callpath("main => solve")).Value(tr.Metric(MetricName))
	if m.Inclusive != want.Inclusive || m.ExclusivePercent != want.ExclusivePercent {
		t.Errorf("total of main => solve from TAUdb = %+v, want %+v", m, want)
	}
}

// BenchmarkBuildTrialThreads builds (ReadTrial) trials of 256 and 4,096 threads, each
// with its metadata: the cost per thread stays flat as threads grow.
func BenchmarkBuildTrialThreads(b *testing.B) {
	for _, n := range []int{256, 4096} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			var profiles []provenance.ThreadProfile
			var meta []provenance.Metadata
			for r := 0; r < n; r++ {
				profiles = append(profiles, provenance.ThreadProfile{Rank: uint32(r), Final: true, Timers: []provenance.TimerProfile{
					{Name: "main", Calls: 1, Subrs: 1, Inclusive: 100, Exclusive: 10},
					{Name: "solve", Calls: 4, Inclusive: 90, Exclusive: 90},
					{Name: "main => solve", Calls: 4, Inclusive: 90, Exclusive: 90},
				}})
				for k := 0; k < 10; k++ {
					meta = append(meta, provenance.Metadata{RID: uint32(r), Descr: "key " + strconv.Itoa(k), Value: "v"})
				}
			}
			b.ResetTimer()
			for b.Loop() {
				if _, err := build("scale", profiles, meta); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/thread")
		})
	}
}
