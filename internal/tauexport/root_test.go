package tauexport

import (
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// rootOf is thread 0's ".TAU application" inclusive and exclusive time.
func rootOf(t *testing.T, profiles []provenance.ThreadProfile) (incl, excl float64) {
	t.Helper()
	tr, err := build("run", profiles, nil)
	if err != nil {
		t.Fatal(err)
	}
	root := tr.Timer(ApplicationRoot)
	if root == nil {
		t.Fatalf("no %s timer", ApplicationRoot)
	}
	v := tr.Thread(0).CallDataFor(root.Root()).Value(tr.Metric(MetricName))
	return v.Inclusive, v.Exclusive
}

// The added root is the thread's wall time when the profile has it, its
// exclusive time what the top-level calls leave; calls in Overflow ran below
// another call and never count as top-level.
func TestApplicationRoot(t *testing.T) {
	mpi := []provenance.TimerProfile{
		{Name: "MPI_Send", Calls: 4, Inclusive: 100, Exclusive: 100},
		{Name: "MPI_Recv", Calls: 2, Inclusive: 50, Exclusive: 50},
	}
	for _, tc := range []struct {
		name                 string
		p                    provenance.ThreadProfile
		wantIncl, wantExcl   float64
		wantTopLevelSendCall uint64
	}{
		{"wall time known", provenance.ThreadProfile{Final: true, Timers: mpi, FirstTS: 1000, LastTS: 2000}, 1000, 850, 4},
		{"wall time unknown: the top-level calls", provenance.ThreadProfile{Final: true, Timers: mpi}, 150, 0, 4},
		{"overflowed calls are not top-level", provenance.ThreadProfile{Final: true, FirstTS: 0, LastTS: 5000,
			Timers: []provenance.TimerProfile{
				{Name: "main", Calls: 1, Subrs: 3, Inclusive: 4000, Exclusive: 3900},
				{Name: "MPI_Send", Calls: 4, Inclusive: 100, Exclusive: 100},
				{Name: "main => MPI_Send", Calls: 1, Inclusive: 25, Exclusive: 25},
				{Name: "MPI_Recv", Calls: 2, Inclusive: 50, Exclusive: 50},
			},
			Overflow: []provenance.TimerProfile{{Name: "MPI_Send", Calls: 3, Inclusive: 75, Exclusive: 75}},
		}, 5000, 950, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			incl, excl := rootOf(t, []provenance.ThreadProfile{tc.p})
			if incl != tc.wantIncl || excl != tc.wantExcl {
				t.Errorf("%s = %v incl, %v excl; want %v, %v", ApplicationRoot, incl, excl, tc.wantIncl, tc.wantExcl)
			}
			var calls uint64
			for _, l := range treeTimers(&tc.p) {
				if l.Name == ApplicationRoot+" => MPI_Send" {
					calls = l.Calls
				}
			}
			if calls != tc.wantTopLevelSendCall {
				t.Errorf("top-level MPI_Send calls %d, want %d", calls, tc.wantTopLevelSendCall)
			}
		})
	}
}

// A profile split into parts reads as the whole one; a missing part is an
// error that names it.
func TestSplitProfileJoined(t *testing.T) {
	whole := provenance.ThreadProfile{Step: 9, Final: true, FirstTS: 10, LastTS: 4010,
		Counters: []provenance.CounterProfile{{Name: "bytes", Count: 2, Min: 1, Max: 3, Mean: 2, SumSqr: 10}}}
	for i, tm := range []struct {
		name  string
		calls uint64
	}{{"main", 1}, {"main => a", 2}, {"main => b", 3}, {"a", 2}, {"b", 3}, {"main => a => c", 6}, {"c", 6}} {
		whole.Timers = append(whole.Timers, provenance.TimerProfile{Name: tm.name, Calls: tm.calls, Inclusive: float64(100 * (7 - i)), Exclusive: 10})
	}
	var parts []provenance.ThreadProfile
	for i, cut := range [][2]int{{0, 3}, {3, 5}, {5, 7}} {
		q := whole
		q.Timers = whole.Timers[cut[0]:cut[1]]
		q.Part, q.Parts = i, 3
		if i > 0 {
			q.Counters = nil
		}
		parts = append(parts, q)
	}
	parts[0], parts[2] = parts[2], parts[0] // any order
	want, err := build("run", []provenance.ThreadProfile{whole}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := build("run", parts, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := want.Metric(MetricName)
	for _, name := range []string{"main", "main => a => c", "c"} {
		w, g := want.Callpath(name), got.Callpath(name)
		if !strings.Contains(name, "=>") {
			if want.Timer(name) == nil || got.Timer(name) == nil {
				t.Fatalf("%s missing", name)
			}
			w, g = want.Timer(name).Root(), got.Timer(name).Root()
		}
		if w == nil || g == nil {
			t.Fatalf("%s missing: whole %v, joined %v", name, w, g)
		}
		if wv, gv := want.Thread(0).CallDataFor(w).Value(m), got.Thread(0).CallDataFor(g).Value(m); wv.Inclusive != gv.Inclusive || wv.Exclusive != gv.Exclusive {
			t.Errorf("%s: joined %v/%v, whole %v/%v", name, gv.Inclusive, gv.Exclusive, wv.Inclusive, wv.Exclusive)
		}
	}
	if _, err := build("run", parts[:2], nil); err == nil {
		t.Error("a profile with a part missing was read")
	}
}
