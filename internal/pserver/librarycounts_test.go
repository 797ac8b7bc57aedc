package pserver

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/ad"
	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// applySyncer hands a detector's sync requests to a Server in process, in
// their JSON form, as the sync subject would.
type applySyncer struct {
	t *testing.T
	s *Server
}

func (a applySyncer) Sync(_ context.Context, _ int, req *syncproto.SyncRequest) (*syncproto.SyncReply, error) {
	data, err := json.Marshal(req)
	if err != nil {
		a.t.Fatal(err)
	}
	rep := a.s.applyRaw(data, 0)
	if rep.Error != "" {
		a.t.Errorf("sync refused: %s", rep.Error)
	}
	return rep, nil
}

// libStep is what a rank's event library reports at the end of one
// io_step: calls it summarised, calls it dropped whole, comm and counter
// events it dropped.
type libStep struct{ summarised, droppedCalls, droppedComms, droppedCtrs uint64 }

// The event library's summarised and dropped calls and dropped events
// reach the pserver through the detectors' step summaries: /api/summary's
// totals and the rank rows carry exactly what each rank's library
// reported, within the window of steps and folded out of it.
func TestLibraryCountsReachTheDashboard(t *testing.T) {
	for _, tc := range []struct {
		name   string
		window int
		ranks  [][]libStep // per rank, per io_step
	}{
		{"nothing dropped", 0, [][]libStep{{{}, {}}, {{}, {}}}},
		{"one rank drops", 0, [][]libStep{{{}, {}, {}}, {{0, 0, 0, 0}, {0, 17, 4, 0}, {0, 1, 0, 2}}}},
		{"every kind on every rank", 0, [][]libStep{
			{{500, 3, 2, 1}, {0, 0, 0, 0}, {40, 9, 0, 5}},
			{{7, 0, 0, 0}, {1000, 250, 30, 20}, {0, 0, 0, 0}},
			{{0, 1, 1, 1}, {0, 1, 1, 1}, {0, 1, 1, 1}},
		}},
		{"steps folded out of the window", 2, [][]libStep{
			{{1, 2, 3, 4}, {5, 6, 7, 8}, {9, 10, 11, 12}, {13, 14, 15, 16}, {0, 1, 0, 0}},
			{{0, 0, 0, 0}, {100, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 9}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(Config{Run: "lib", Window: tc.window}, zerolog.Nop())
			if err != nil {
				t.Fatal(err)
			}
			want, wantRank := feedLibraryRun(t, s, tc.ranks)
			ts := httptest.NewServer(s.Handler())
			t.Cleanup(ts.Close)
			var sum Summary
			getJSON(t, ts.URL+"/api/summary", &sum)
			if got := sum.Totals; got.SummarisedCalls != want.SummarisedCalls || got.DroppedCalls != want.DroppedCalls || got.DroppedEvents != want.DroppedEvents {
				t.Errorf("/api/summary: %d summarised, %d calls and %d events dropped; want %d, %d, %d",
					got.SummarisedCalls, got.DroppedCalls, got.DroppedEvents, want.SummarisedCalls, want.DroppedCalls, want.DroppedEvents)
			}
			var rows []RankRow
			getJSON(t, ts.URL+"/api/top/ranks?n=0", &rows)
			if len(rows) != len(tc.ranks) {
				t.Fatalf("%d rank rows, want %d", len(rows), len(tc.ranks))
			}
			for _, r := range rows {
				w := wantRank[r.Rank]
				if r.SummarisedCalls != w.SummarisedCalls || r.DroppedCalls != w.DroppedCalls || r.DroppedEvents != w.DroppedEvents {
					t.Errorf("rank %d row: %d summarised, %d calls and %d events dropped; want %d, %d, %d",
						r.Rank, r.SummarisedCalls, r.DroppedCalls, r.DroppedEvents, w.SummarisedCalls, w.DroppedCalls, w.DroppedEvents)
				}
			}
		})
	}
}

// feedLibraryRun runs a detector per rank on frames whose event library
// reports ranks[rank][io_step], syncing to s, and returns the totals
// expected over the run and per rank.
func feedLibraryRun(t *testing.T, s *Server, ranks [][]libStep) (Totals, map[uint32]Totals) {
	t.Helper()
	ctx := context.Background()
	var want Totals
	wantRank := map[uint32]Totals{}
	for rank, steps := range ranks {
		d, err := ad.New(ad.Config{Rank: uint32(rank), Syncer: applySyncer{t, s}})
		if err != nil {
			t.Fatal(err)
		}
		var wr Totals
		for i, ls := range steps {
			ts := uint64(i) * 1000
			f := &frame.Frame{
				Rank: uint32(rank), Step: uint64(i), TStart: ts, TEnd: ts + 1000,
				Funcs: []frame.Name{{ID: 1, Name: "main"}},
				Counters: []frame.Name{
					{ID: 1, Name: "Kipimo Summary Calls: main => poll"},
					{ID: 2, Name: "Kipimo Dropped Calls: work"},
					{ID: 3, Name: "Kipimo Dropped Comm Events"},
					{ID: 4, Name: "Kipimo Dropped Counter Events"},
				},
				Events: []frame.FuncEvent{
					{Tid: 0, Kind: frame.Entry, FID: 1, TS: ts},
					{Tid: 0, Kind: frame.Exit, FID: 1, TS: ts + 999},
				},
			}
			for cid, v := range []uint64{ls.summarised, ls.droppedCalls, ls.droppedComms, ls.droppedCtrs} {
				if v > 0 {
					f.CounterEvents = append(f.CounterEvents, frame.CounterEvent{Tid: 0, CID: uint32(cid + 1), Value: v, TS: ts + 999})
				}
			}
			if err := d.Process(ctx, f); err != nil {
				t.Fatal(err)
			}
			wr.SummarisedCalls += ls.summarised
			wr.DroppedCalls += ls.droppedCalls
			wr.DroppedEvents += ls.droppedComms + ls.droppedCtrs
		}
		if err := d.Close(ctx); err != nil {
			t.Fatal(err)
		}
		wantRank[uint32(rank)] = wr
		want.SummarisedCalls += wr.SummarisedCalls
		want.DroppedCalls += wr.DroppedCalls
		want.DroppedEvents += wr.DroppedEvents
	}
	return want, wantRank
}

// The dashboard's header shows the calls and events the ranks' event
// library dropped, in the warning colour when any, and the calls it
// summarised; the rank rows show each rank's dropped calls.
func TestLibraryDropsInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test skipped with -short")
	}
	chromium(t) // skips (or fails in CI) before the server is fed
	s, err := New(Config{Run: "lib"}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	feedLibraryRun(t, s, [][]libStep{{{}, {}}, {{40, 0, 0, 0}, {2_000, 1_234, 4, 1}}})
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)

	ctx := browser(t, 1280, 900, 25*time.Second)
	filled := `window.kipimo && window.kipimo.ready === true && document.getElementById("t-dropped").textContent !== "-" && document.querySelectorAll("#top-ranks tbody tr:not(.empty)").length === 2`
	if err := chromedp.Do(ctx, chromedp.Navigate(ts.URL+"/"), chromedp.Poll[chromedp.Void](filled)); err != nil {
		t.Fatalf("dashboard not filled: %v", err)
	}
	for _, c := range []struct{ what, js, want string }{
		{"header dropped", textJS(`#t-dropped`), "1,234 calls, 5 events"},
		{"header dropped class", `document.getElementById("t-dropped").className`, "warn"},
		{"header summarised", textJS(`#t-summ`), "2,040"},
		{"rank rows' dropped calls", `[...document.querySelectorAll("#top-ranks tbody tr")].map((tr) => tr.cells[0].innerText + "=" + tr.cells[4].innerText + (tr.cells[4].classList.contains("warn") ? "!" : "")).sort().join(" ")`,
			"0=0 1=1,234 (+5 events)!"},
	} {
		if got := run(t, ctx, chromedp.Evaluate[string](c.js)); got != c.want {
			t.Errorf("%s: %q, want %q", c.what, got, c.want)
		}
	}
}
