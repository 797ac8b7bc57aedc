package pserver

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/baseline"
)

// stallsAgainstClean returns a server whose state holds MPI_Irecv's 1%
// stalls and MPI_Wait, compared with a clean run of both as its baseline,
// and the dashboard's test server.
func stallsAgainstClean(t *testing.T) *httptest.Server {
	t.Helper()
	clean, err := New(Config{Run: "clean"}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	clean.st = irecvState(t, false)
	ref, err := baseline.FromFuncStats("runs/clean", clean.FuncStatsRecords(), baselineRule)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Run: "stalls", Baseline: ref}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	s.st = irecvState(t, true)
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	return ts
}

// GET /api/baseline answers the live comparison: the function with a new
// slow mode first, with its test; n bounds the rows; a run without a
// baseline answers 404 with what to do.
func TestBaselineAPI(t *testing.T) {
	ts := stallsAgainstClean(t)
	var rep baseline.Report
	if code := getJSON(t, ts.URL+"/api/baseline", &rep); code != 200 {
		t.Fatalf("GET /api/baseline: %d", code)
	}
	if rep.Source != "runs/clean" || len(rep.Functions) != 2 {
		t.Fatalf("report %+v: want runs/clean and both functions", rep)
	}
	f := rep.Functions[0]
	if f.Func != "MPI_Irecv" || f.NewMode == nil || f.NewMode.InMode != 200 || !strings.Contains(strings.Join(f.Slower, ","), "new slow mode") {
		t.Errorf("first row %+v: want MPI_Irecv with its new slow mode of 200 calls", f)
	}
	if w := rep.Functions[1]; w.Func != "MPI_Wait" || len(w.Slower) != 0 {
		t.Errorf("second row %+v: want MPI_Wait, not slower", w)
	}
	var one baseline.Report
	if getJSON(t, ts.URL+"/api/baseline?n=1", &one); len(one.Functions) != 1 {
		t.Errorf("n=1 gave %d rows", len(one.Functions))
	}
	if code := getJSON(t, ts.URL+"/api/baseline?n=x", nil); code != 400 {
		t.Errorf("n=x: %d, want 400", code)
	}
	none, err := New(Config{Run: "alone"}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	ts2 := httptest.NewServer(none.Handler())
	defer ts2.Close()
	if code := getJSON(t, ts2.URL+"/api/baseline", nil); code != 404 {
		t.Errorf("without a baseline: %d, want 404", code)
	}
}

// The dashboard shows the comparison panel only with a baseline: the
// function with the new mode heads it, marked slower, with the mode's
// calls and test (its screenshot in docs/dashboard.md is this test's, with
// KIPIMO_DASHBOARD_SCREENSHOTS set).
func TestBaselinePanelInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test skipped with -short")
	}
	ts := stallsAgainstClean(t)
	ctx := browser(t, 1280, 1000, 25*time.Second)
	if err := chromedp.Do(ctx, chromedp.Navigate(ts.URL+"/"),
		chromedp.Poll[chromedp.Void](`document.querySelectorAll("#baseline-table tbody tr").length > 0`)); err != nil {
		t.Fatalf("load the baseline panel: %v", err)
	}
	first := run(t, ctx, chromedp.Evaluate[string](textJS(`#baseline-table tbody tr:first-child`)))
	if !strings.HasPrefix(first, "MPI_Irecv") || !strings.Contains(first, "new slow mode") || !strings.Contains(first, "200 calls from") {
		t.Errorf("first row %q: want MPI_Irecv's new slow mode of 200 calls", first)
	}
	if !run(t, ctx, chromedp.Evaluate[bool](`document.querySelector("#baseline-table tbody tr:first-child").classList.contains("slower")`)) {
		t.Error("MPI_Irecv's row is not marked slower")
	}
	viewShot(t, ctx, "dashboard-baseline.png", "#p-baseline")

	// Without a baseline the panel stays hidden.
	none, err := New(Config{Run: "alone"}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	ts2 := httptest.NewServer(none.Handler())
	defer ts2.Close()
	if err := chromedp.Do(ctx, chromedp.Navigate(ts2.URL+"/"), chromedp.Poll[chromedp.Void](`window.kipimo && window.kipimo.ready === true`)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the panel's first poll has answered 404 by then
	if !run(t, ctx, chromedp.Evaluate[bool](`document.getElementById("p-baseline").hidden`)) {
		t.Error("the baseline panel shows in a run without a baseline")
	}
}
