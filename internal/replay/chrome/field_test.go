package chrome

import (
	"context"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/replay/steps"
)

// Traces written by real tools (testdata/field, copied byte for byte from
// ../shared/fixtures/field; sources in its MANIFEST.tsv). Each expected count
// comes from outside the reader: a small encoding/json count in the test, or
// a literal counted with Python's json module (the comment says how).

// beCount counts B/E spans of a JSON event list as Chrome's importer does,
// with encoding/json: per (pid, tid), events sorted by time, an E closes the
// innermost open B; events whose ts is negative are skipped.
func beCount(t *testing.T, events []map[string]any) (spans, unclosed, endsWithoutBegin, x int) {
	t.Helper()
	type ev struct {
		ts  float64
		end bool
	}
	byThread := map[string][]ev{}
	var order []string
	for _, e := range events {
		ts, err := strconv.ParseFloat(strings.Trim(strings.TrimSpace(jsonText(e["ts"])), `"`), 64)
		if err != nil || ts < 0 {
			continue
		}
		switch e["ph"] {
		case "X":
			x++
		case "B", "E":
			k := jsonText(e["pid"]) + "/" + jsonText(e["tid"])
			if _, ok := byThread[k]; !ok {
				order = append(order, k)
			}
			byThread[k] = append(byThread[k], ev{ts, e["ph"] == "E"})
		}
	}
	for _, k := range order {
		evs := byThread[k]
		// insertion sort: stable by time
		for i := 1; i < len(evs); i++ {
			for j := i; j > 0 && evs[j].ts < evs[j-1].ts; j-- {
				evs[j], evs[j-1] = evs[j-1], evs[j]
			}
		}
		open := 0
		for _, e := range evs {
			switch {
			case !e.end:
				open++
			case open > 0:
				open--
				spans++
			default:
				endsWithoutBegin++
			}
		}
		unclosed += open
	}
	return
}

func jsonText(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func readField(t *testing.T, name string) ([]frame.Frame, steps.Stats) {
	t.Helper()
	frames, st, err := collect(t, steps.Config{Step: 100 * time.Millisecond}, func(b *steps.Builder) error {
		return Read(context.Background(), []string{"testdata/field/" + name}, b)
	})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return frames, st
}

func TestFieldTraces(t *testing.T) {
	cases := []struct {
		name string
		// events decodes the file with encoding/json for the independent
		// count (nil: the expectations are literals).
		events func(t *testing.T, data []byte) []map[string]any
		want   steps.Stats // Executions and the loss counts are checked
	}{
		{
			// Issue item 2: the array is left open after "},\n".
			name: "speedscope_te_simple-partial-trailing-comma.json",
			events: func(t *testing.T, data []byte) []map[string]any {
				var evs []map[string]any
				text := strings.TrimRight(strings.TrimSpace(string(data)), ",") + "]"
				if err := json.Unmarshal([]byte(text), &evs); err != nil {
					t.Fatal(err)
				}
				return evs
			},
		},
		{
			// Issue items 3 and 4: timestamps are strings; one E is at a
			// negative time (its B on tid 1 is then unclosed).
			name: "openclcourse_L5_Profiling_tau_trace.json",
			events: func(t *testing.T, data []byte) []map[string]any {
				var evs []map[string]any
				text := strings.TrimRight(strings.TrimSpace(string(data)), ",") + "]"
				if err := json.Unmarshal([]byte(text), &evs); err != nil {
					t.Fatal(err)
				}
				return evs
			},
			want: steps.Stats{Losses: steps.Losses{{Kind: steps.LossBadTime, Count: 1}}},
		},
		{
			// Issue item 7: B events never closed.
			name: "catapult_main_thread_has_unclosed_slices.json",
			events: func(t *testing.T, data []byte) []map[string]any {
				var evs []map[string]any
				if err := json.Unmarshal(data, &evs); err != nil {
					t.Fatal(err)
				}
				return evs
			},
		},
		{
			// Issue item 7: nestable async b/e/n events. Counted by hand:
			// id 0x313 closes URL_REQUEST_DELEGATE, URL_REQUEST_INNER,
			// URL_REQUEST_START_JOB and REQUEST_BAR (its
			// URL_REQUEST_DELEGATE_UNMATCHED_BEGIN never ends); id 0x314
			// closes URL_REQUEST_INNER, URL_REQUEST_START_JOB,
			// URL_REQUEST_DELEGATE and REQUEST_FOO (its
			// URL_REQUEST_DELEGATE_UNMATCHED_END has no begin); two "n".
			name: "catapult_nestable_async.json",
			want: steps.Stats{Executions: 8, Threads: 2, Losses: steps.Losses{
				{Kind: steps.LossInstant, Count: 2}, {Kind: steps.LossUnclosed, Count: 1}, {Kind: steps.LossEndWithoutBegin, Count: 1}}},
		},
		{
			// Issue items 5 and 10. Counted with Python's json module: 138,373
			// X events; 3,551 of them end after the innermost span that
			// holds their start on their (pid, tid) (sorted by start, longer
			// first), 3,453 dma_request on the device and 98 hccl:* on CPU
			// threads; 4 "i" events; 410 fwdbwd flow events (205 s, 205 f).
			name: "hta_mtia_trace_single_rank_mtia_rank_0.json.gz",
			want: steps.Stats{Executions: 138373, Losses: steps.Losses{
				{Kind: steps.LossOverlap, Count: 3551}, {Kind: steps.LossInstant, Count: 4}, {Kind: steps.LossFlow, Count: 410}}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.want
			if tc.events != nil {
				data, err := os.ReadFile("testdata/field/" + tc.name)
				if err != nil {
					t.Fatal(err)
				}
				spans, unclosed, endsWithoutBegin, x := beCount(t, tc.events(t, data))
				want.Executions = spans + x
				want.Losses.Add(steps.LossUnclosed, unclosed, "")
				want.Losses.Add(steps.LossEndWithoutBegin, endsWithoutBegin, "")
			}
			frames, st := readField(t, tc.name)
			if st.Executions != want.Executions {
				t.Errorf("executions = %d, want %d", st.Executions, want.Executions)
			}
			if want.Threads != 0 && st.Threads != want.Threads {
				t.Errorf("threads = %d, want %d", st.Threads, want.Threads)
			}
			for _, l := range want.Losses {
				if got := st.Losses.Count(l.Kind); got != l.Count {
					t.Errorf("%s losses = %d, want %d (all: %v)", l.Kind, got, l.Count, st.Losses)
				}
			}
			for _, l := range st.Losses {
				if want.Losses.Count(l.Kind) == 0 {
					t.Errorf("unexpected loss %+v", l)
				}
				if l.Example == "" {
					t.Errorf("loss %s has no example", l.Kind)
				}
			}
			entries, exits := 0, 0
			for _, f := range frames {
				for _, e := range f.Events {
					if e.Kind == frame.Entry {
						entries++
					} else {
						exits++
					}
				}
			}
			if entries != want.Executions || exits != want.Executions {
				t.Errorf("%d entries and %d exits in the frames, want %d each", entries, exits, want.Executions)
			}
		})
	}
}

// TestFieldOverlapsKeepTheirTime checks issue item 5: spans that overlap
// their parent are moved whole, so the frames hold every span's full time.
// hccl:all_to_all lasts 2,528,937 µs. Python's json module sums
// floor(ts+dur+0.5) - floor(ts+0.5) over the 138,373 X events: 156,299,809 µs.
func TestFieldOverlapsKeepTheirTime(t *testing.T) {
	frames, _ := readField(t, "hta_mtia_trace_single_rank_mtia_rank_0.json.gz")
	type key struct{ rank, tid uint32 }
	stacks := map[key][]uint64{}
	names := map[uint32]string{}
	var total, allToAll uint64
	for _, f := range frames {
		for _, n := range f.Funcs {
			names[n.ID] = n.Name
		}
		for _, e := range f.Events {
			k := key{f.Rank, e.Tid}
			if e.Kind == frame.Entry {
				stacks[k] = append(stacks[k], e.TS)
				continue
			}
			s := stacks[k]
			d := e.TS - s[len(s)-1]
			stacks[k] = s[:len(s)-1]
			total += d
			if names[e.FID] == "hccl:all_to_all" {
				allToAll = max(allToAll, d)
			}
		}
	}
	if total != 156299809 {
		t.Errorf("spans in the frames last %d µs in all, want 156,299,809", total)
	}
	if allToAll < 2528937 || allToAll > 2528938 {
		t.Errorf("hccl:all_to_all lasts %d µs, want 2,528,937", allToAll)
	}
}

// TestFieldAccelerator checks issue item 10: MTIA device events (cat
// mtia_ccp_events; Python's json module counts 25,814 on pid 9, tids 4, 408
// and 801) are on GPU threads, each marked with its accelerator.
func TestFieldAccelerator(t *testing.T) {
	frames, _ := readField(t, "hta_mtia_trace_single_rank_mtia_rank_0.json.gz")
	gpu := map[uint32]bool{}
	lanes := map[uint32]bool{}
	accel := map[uint32]string{}
	streams := map[string]bool{}
	for _, f := range frames {
		for _, m := range f.Metadata {
			switch {
			case m.Key == "GPU Stream":
				gpu[m.Tid] = true
				streams[m.Value] = true
			case m.Key == "Accelerator":
				accel[m.Tid] = m.Value
			case m.Key == "Thread Name" && strings.Contains(m.Value, "(overlapping spans"):
				lanes[m.Tid] = true
			}
		}
	}
	devices := 0
	for tid := range gpu {
		if accel[tid] != "MTIA" {
			t.Errorf("GPU thread %d: accelerator %q, want MTIA", tid, accel[tid])
		}
		if !lanes[tid] {
			devices++
		}
	}
	if devices != 3 || len(streams) != 3 {
		t.Errorf("%d device threads on %d streams (%v), want 3 of each", devices, len(streams), streams)
	}
	onGPU := 0
	for _, f := range frames {
		for _, e := range f.Events {
			if e.Kind == frame.Exit && gpu[e.Tid] {
				onGPU++
			}
		}
	}
	if onGPU != 25814 {
		t.Errorf("%d executions on GPU threads, want the 25,814 MTIA device events", onGPU)
	}
}

// TestBeginEndTimeOrder: Chrome sorts a thread's B/E events by time before
// matching them, so an E written before its B still closes it (issue item 7).
func TestBeginEndTimeOrder(t *testing.T) {
	cases := []struct {
		name, trace         string
		execs, lost         int
		kind                string
		wantStart, wantStop uint64
	}{
		{"E before B in the file", `[{"ph":"E","pid":1,"tid":1,"ts":20},{"ph":"B","name":"a","pid":1,"tid":1,"ts":10}]`, 1, 0, "", 10, 20},
		{"E before any B in time", `[{"ph":"E","pid":1,"tid":1,"ts":5},{"ph":"B","name":"a","pid":1,"tid":1,"ts":10},{"ph":"E","pid":1,"tid":1,"ts":12}]`, 1, 1, steps.LossEndWithoutBegin, 10, 12},
		{"async nested by name", `[{"ph":"b","cat":"c","id":1,"name":"o","pid":1,"tid":1,"ts":1},{"ph":"b","cat":"c","id":1,"name":"i","pid":1,"tid":1,"ts":2},{"ph":"e","cat":"c","id":1,"name":"o","pid":1,"tid":1,"ts":9}]`, 1, 1, steps.LossUnclosed, 1, 9},
		{"legacy async", `[{"ph":"S","cat":"c","id":"0x1","name":"job","pid":1,"ts":3},{"ph":"T","cat":"c","id":"0x1","name":"job","pid":1,"ts":4},{"ph":"F","cat":"c","id":"0x1","name":"job","pid":1,"ts":8}]`, 1, 1, steps.LossAsyncStep, 3, 8},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Parse(strings.NewReader(tc.trace), "order.json")
			if err != nil || f.Err != nil {
				t.Fatal(err, f.Err)
			}
			frames, st, err := collect(t, steps.Config{}, func(b *steps.Builder) error { return Feed([]*File{f}, b, nil) })
			if err != nil {
				t.Fatal(err)
			}
			if st.Executions != tc.execs {
				t.Errorf("executions %d, want %d", st.Executions, tc.execs)
			}
			if tc.kind != "" && st.Losses.Count(tc.kind) != tc.lost {
				t.Errorf("losses %v, want %d %s", st.Losses, tc.lost, tc.kind)
			}
			var ts []uint64
			for _, fr := range frames {
				for _, e := range fr.Events {
					ts = append(ts, e.TS)
				}
			}
			if len(ts) != 2 || ts[0] != tc.wantStart || ts[1] != tc.wantStop {
				t.Errorf("event times %v, want [%d %d]", ts, tc.wantStart, tc.wantStop)
			}
		})
	}
}

// TestCounterEvents: "C" events become counter samples named "<name> <arg>".
func TestCounterEvents(t *testing.T) {
	trace := `{"traceEvents":[
{"ph":"C","name":"mem","pid":1,"ts":10,"args":{"used":1024,"free":"2048.4"}},
{"ph":"C","name":"mem","pid":1,"ts":20,"args":{"used":-1}},
{"ph":"X","name":"f","pid":1,"tid":1,"ts":10,"dur":15}]}`
	f, err := Parse(strings.NewReader(trace), "c.json")
	if err != nil || f.Err != nil {
		t.Fatal(err, f.Err)
	}
	frames, st, err := collect(t, steps.Config{}, func(b *steps.Builder) error { return Feed([]*File{f}, b, nil) })
	if err != nil {
		t.Fatal(err)
	}
	names := map[uint32]string{}
	got := map[string]uint64{}
	for _, fr := range frames {
		for _, n := range fr.Counters {
			names[n.ID] = n.Name
		}
		for _, c := range fr.CounterEvents {
			got[names[c.CID]] = c.Value
		}
	}
	if len(got) != 2 || got["mem used"] != 1024 || got["mem free"] != 2048 {
		t.Errorf("counter samples %v, want mem used 1024 and mem free 2048", got)
	}
	if st.Losses.Count(steps.LossCounterValue) != 1 {
		t.Errorf("losses %v, want the negative sample counted", st.Losses)
	}
}
