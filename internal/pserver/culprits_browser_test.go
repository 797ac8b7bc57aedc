package pserver

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// The dashboard's culprit panel: the late rank heads the culprits, its row
// in the outlier map is coloured at its io_step, and its burst's link fills
// the anomaly filters with its rank and io_steps.
func TestCulpritPanelInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test skipped with -short")
	}
	chromium(t) // skips (or fails in CI) before the server is fed
	const n, late, lateStep = 64, 9, 3
	_, nc := startNATS(t)
	s := startServer(t, nc, Config{Run: "web", Durability: DurabilityNone, HTTPAddr: "127.0.0.1:0", UpdateEvery: 20 * time.Millisecond})
	defer s.Shutdown(context.Background())
	for _, req := range ringSteps(n, 8, late, lateStep) {
		doSync(t, nc, "web", 0, &req)
	}
	ctx := browser(t, 1280, 1800, 25*time.Second)
	if err := chromedp.Do(ctx, chromedp.Navigate("http://"+s.HTTPAddr()+"/"),
		chromedp.Poll[chromedp.Void](`document.querySelectorAll("#culprit-table tbody tr").length > 0`)); err != nil {
		t.Fatalf("load the culprit panel: %v", err)
	}
	top := run(t, ctx, chromedp.Evaluate[string](textJS(`#culprit-table tbody tr:first-child td:first-child`)))
	if top != strconv.Itoa(late) {
		t.Errorf("the culprit table starts with rank %q, want %d", top, late)
	}
	// the outlier map's one row, coloured at the late step's column only
	lit := run(t, ctx, chromedp.Evaluate[int](`(() => {
		const c = document.getElementById("outlier-map"), d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
		let n = 0;
		for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++;
		return n;
	})()`))
	if lit == 0 {
		t.Error("the outlier map is blank")
	}
	if !run(t, ctx, chromedp.Evaluate[bool](`(() => { const a = document.querySelector("#burst-list a"); if (!a) return false; a.click(); return true; })()`)) {
		t.Fatal("no burst link to click")
	}
	got := run(t, ctx, chromedp.Evaluate[string](`[document.getElementById("f-rank").value, document.getElementById("f-step-min").value, document.getElementById("f-step-max").value].join(" ")`))
	if want := strconv.Itoa(late) + " " + strconv.Itoa(lateStep-1) + " " + strconv.Itoa(lateStep+1); got != want {
		t.Errorf("the burst link set the filters to %q, want %q", got, want)
	}
}
