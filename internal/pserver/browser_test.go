package pserver

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provdb"
	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
)

// chromium finds Debian's chromium, or skips (fails with
// KIPIMO_REQUIRE_BROWSER=1).
func chromium(t *testing.T) string {
	t.Helper()
	for _, p := range []string{os.Getenv("KIPIMO_CHROMIUM"), "/usr/bin/chromium"} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("chromium"); err == nil {
		return p
	}
	if os.Getenv("KIPIMO_REQUIRE_BROWSER") == "1" {
		t.Fatal("chromium is not installed and KIPIMO_REQUIRE_BROWSER=1: install it (apt-get install chromium)")
	}
	t.Skip("chromium is not installed (apt-get install chromium); set KIPIMO_REQUIRE_BROWSER=1 to make this a failure")
	return ""
}

// provStore fills a real SQLite provenance store with anomaly records of the
// slow rank, each with a call stack, an event window and, for GPU kernels,
// the GPU context, and serves provdb's query API on it.
func provStore(t *testing.T, slow uint32, steps int) *httptest.Server {
	t.Helper()
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "prov.db"), sqlitestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	var execs []provenance.Exec
	for step := range steps {
		id := func(i int) string { return fmt.Sprintf("%d:%d:%d", slow, step, i) }
		base := uint64(step)*1000 + 10
		e := provenance.Exec{
			PID: 0, RID: slow, TID: 0, EventID: id(3), FID: 0, Func: funcName(0),
			Entry: base + 100, Exit: base + 700, RuntimeTotal: 600, RuntimeExclusive: 550,
			IOStep: uint64(step), OutlierScore: 40 + float64(step), OutlierSeverity: 550,
			CallStack: []provenance.CallFrame{
				{Func: funcName(0), EventID: id(3), Entry: base + 100, Exit: base + 700, IsAnomaly: true},
				{Func: "timestep", EventID: id(1), Entry: base + 50},
				{Func: "main", EventID: fmt.Sprintf("%d:0:0", slow), Entry: 1},
			},
			EventWindow: provenance.EventWindow{ExecWindow: []provenance.WindowExec{
				{Func: "timestep", EventID: id(1), Entry: base + 50, Exit: base + 900},
				{Func: "halo_exchange", EventID: id(2), Entry: base + 60, Exit: base + 95, ParentEventID: id(1)},
				{Func: funcName(0), EventID: id(3), Entry: base + 100, Exit: base + 700, ParentEventID: id(1), IsAnomaly: true},
			}},
		}
		e.Explanation = &provenance.Explanation{Key: funcName(0), Value: 550, NaturalMax: 100, Threshold: 140, Ratio: 5.5,
			Text: fmt.Sprintf("5.5× the largest natural runtime of %s (100 µs) at io_step %d", funcName(0), step)}
		if step%2 == 1 {
			e.IsGPUEvent = true
			e.TID = 7
			e.GPULocation = &provenance.GPULocation{Device: 1, Context: 2, Stream: 14, Thread: 7}
			e.GPUParent = &provenance.GPUParent{EventID: id(2), TID: 0, CallStack: []provenance.CallFrame{{Func: "cudaLaunchKernel", EventID: id(2)}}}
		}
		execs = append(execs, e)
	}
	if err := st.Write(ctx, provenance.Batch{Kind: "anomalies", Execs: execs}); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(provdb.NewHTTPHandler(st, ""))
	t.Cleanup(ts.Close)
	return ts
}

// TestDashboardInBrowser feeds a pserver with synthetic sync traffic over NATS
// in which one rank is much more anomalous, opens the dashboard in headless
// chromium and checks that the heat map and the top-ranks list single out
// that rank, that live updates arrive, and that clicking the rank shows an
// anomaly's call stack from the provenance query API.
func TestDashboardInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test skipped with -short")
	}
	chromium(t) // skips (or fails in CI) before the server is fed
	const slow, ranks, steps = 5, 12, 20
	prov := provStore(t, slow, steps)
	_, nc := startNATS(t)
	s := startServer(t, nc, Config{Run: "web", Durability: DurabilityNone, HTTPAddr: "127.0.0.1:0", ProvDBURL: prov.URL, UpdateEvery: 20 * time.Millisecond})
	defer s.Shutdown(context.Background())
	g := newGenRun(ranks, steps, 12, slow, 71)
	feed := func(from, to int) {
		for _, row := range g.reqs[from:to] {
			for i := range row {
				doSync(t, nc, "web", 0, &row[i])
			}
		}
	}
	feed(0, steps/2)

	ctx := browser(t, 1280, 1800, 25*time.Second)

	url := "http://" + s.HTTPAddr() + "/"
	if err := chromedp.Do(ctx, chromedp.Navigate(url), chromedp.Poll[chromedp.Void](`window.kipimo && window.kipimo.ready === true`)); err != nil {
		t.Fatalf("load dashboard: %v", err)
	}
	// The rest of the run arrives while the page is open: it must follow live.
	feed(steps/2, steps)
	final := strconv.Itoa(steps - 1)
	if err := chromedp.Do(ctx, chromedp.Poll[chromedp.Void](`document.getElementById("t-step").textContent === "`+final+`" && window.kipimo.heat.steps.has(`+final+`)`)); err != nil {
		t.Fatalf("the page did not reach io_step %s through the SSE stream: %v", final, err)
	}

	topRank := run(t, ctx, chromedp.Evaluate[string](textJS(`#top-ranks tbody tr:first-child td:first-child`)))
	rows := run(t, ctx, chromedp.Evaluate[int](`document.querySelectorAll("#top-ranks tbody tr").length`))
	// The heat-map row with the most red pixels, read back from the canvas.
	hottest := run(t, ctx, chromedp.Evaluate[int](`(() => {
		const L = window.kipimo.layout, g = document.getElementById("heatmap").getContext("2d");
		let best = -1, bestV = -1;
		for (const r of L.rows) {
			const y = Math.ceil(r.y), h = Math.max(1, Math.floor(r.y + r.h) - y);
			const d = g.getImageData(L.x0, y, L.x1 - L.x0, h).data;
			let s = 0;
			for (let i = 0; i < d.length; i += 4) s += 255 - d[i + 1];
			if (s > bestV) { bestV = s; best = r.rank; }
		}
		return best;
	})()`))
	if n := run(t, ctx, chromedp.Evaluate[int](`document.querySelectorAll("#func-table tbody tr").length`)); n != 12 {
		t.Errorf("function table has %d rows, want 12", n)
	}
	if topRank != strconv.Itoa(slow) || rows != 10 {
		t.Errorf("top-ranks list starts with rank %q (%d rows), want rank %d", topRank, rows, slow)
	}
	if hottest != slow {
		t.Errorf("the heat map's hottest row is rank %v, want rank %d", hottest, slow)
	}

	// Tables are re-rendered by live updates, so click inside the page (a
	// node looked up first may be replaced before a protocol click lands).
	if !run(t, ctx, chromedp.Evaluate[bool](clickJS(`#top-ranks tbody tr`))) {
		t.Fatal("no top-ranks row to click")
	}
	// The anomaly list shows the clicked rank once its answer arrived.
	if err := chromedp.Do(ctx, chromedp.Poll[chromedp.Void](`(window.kipimo.listed || "").includes("rank=`+strconv.Itoa(slow)+`") && document.querySelectorAll("#callstack li").length > 0`)); err != nil {
		t.Fatalf("click-through: %v", err)
	}
	stack := run(t, ctx, chromedp.Evaluate[string](textJS(`#callstack`)))
	records := run(t, ctx, chromedp.Evaluate[string](textJS(`#records tbody`)))
	gpu := run(t, ctx, chromedp.Evaluate[string](textJS(`#gpu`)))
	why := run(t, ctx, chromedp.Evaluate[string](textJS(`#record-why`)))
	if out := os.Getenv("KIPIMO_DASHBOARD_SCREENSHOT"); out != "" {
		if err := os.WriteFile(out, run(t, ctx, chromedp.FullScreenshot(100)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Root first: main > timestep > the anomalous kernel.
	iMain, iStep, iKern := strings.Index(stack, "main"), strings.Index(stack, "timestep"), strings.Index(stack, funcName(0))
	if iMain < 0 || iStep < iMain || iKern < iStep {
		t.Errorf("call stack shown as %q, want main > timestep > %s", stack, funcName(0))
	}
	// Sorted by outlier_score descending: the last step's record (odd, GPU) first.
	if !strings.Contains(records, fmt.Sprintf("%d:%d:3", slow, steps-1)) {
		t.Errorf("records list %q lacks the highest-scored anomaly", records)
	}
	if !strings.Contains(gpu, "device 1") || !strings.Contains(gpu, "stream 14") {
		t.Errorf("GPU context shown as %q", gpu)
	}
	// Why the shown record (the highest-scored: the last step's) was flagged.
	if want := fmt.Sprintf("5.5× the largest natural runtime of %s (100 µs) at io_step %d", funcName(0), steps-1); !strings.Contains(why, want) {
		t.Errorf("explanation shown as %q, want %q", why, want)
	}
}

// TestDashboardWithoutProvDB checks the page's message when no provenance
// query API is configured.
func TestDashboardWithoutProvDB(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test skipped with -short")
	}
	chromium(t) // skips (or fails in CI) before the server is fed
	_, ts, _ := fedServer(t, Config{}, 4, 3, 2)
	ctx := browser(t, 1280, 1800, 20*time.Second)
	if err := chromedp.Do(ctx, chromedp.Navigate(ts.URL+"/"), chromedp.Poll[chromedp.Void](`window.kipimo && window.kipimo.ready === true`)); err != nil {
		t.Fatal(err)
	}
	if !run(t, ctx, chromedp.Evaluate[bool](clickJS(`#func-table tbody tr`))) {
		t.Fatal("no function row to click")
	}
	if err := chromedp.Do(ctx, chromedp.Poll[chromedp.Void](`document.getElementById("details-msg").textContent.length > 0`)); err != nil {
		t.Fatal(err)
	}
	msg := run(t, ctx, chromedp.Evaluate[string](textJS(`#details-msg`)))
	if !strings.Contains(msg, "--provdb-url") {
		t.Errorf("message %q does not tell how to configure the provenance API", msg)
	}
}

func run[T any](t *testing.T, ctx context.Context, a chromedp.Action[T]) T {
	t.Helper()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// clickJS is a page expression that clicks the first element matching sel
// and reports whether there was one.
func clickJS(sel string) string {
	return `(() => { const e = document.querySelector(` + strconv.Quote(sel) + `); if (!e) return false; e.click(); return true; })()`
}

// textJS is a page expression giving the text of the first element matching
// sel ("" when there is none), read atomically inside the page.
func textJS(sel string) string {
	return `(() => { const e = document.querySelector(` + strconv.Quote(sel) + `); return e ? e.innerText : ""; })()`
}
