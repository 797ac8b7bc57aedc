package pserver

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/kipimo-hpc/kipimo/internal/stats"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// tailEpoch is the run's start on an epoch clock (µs): 2026-11-18.
const tailEpoch = 1_795_000_000_000_000

// tailRun is the sync requests of a live run of ranks ranks over steps
// io_steps, one second each on the epoch's clock, detected with the
// default natural-range model: one function, compute, runs 20..22 µs with
// two 5 ms calls (rank 3, io_step 7); every rank flags an anomaly now and
// then, rank slow many in every step.
func tailRun(ranks, steps int, slow uint32) [][]syncproto.SyncRequest {
	rule := stats.TailRule{Ratio: 1.4, Recur: 5, RecurFrac: 0.002, Resolution: 1}
	var out [][]syncproto.SyncRequest
	for step := range steps {
		var row []syncproto.SyncRequest
		for r := range ranks {
			var tail stats.TailHist
			var m stats.Moments
			for i := range 200 {
				x := 20 + float64((i+r)%3)
				if r == 3 && step == 7 && i < 2 {
					x = 5000
				}
				tail.Add(x)
				m.Push(x)
			}
			anom := uint64((step + r) % 4 / 3) // 0 or 1
			if uint32(r) == slow {
				anom = 12
			}
			t0 := tailEpoch + uint64(step)*1_000_000
			sum := syncproto.StepSummary{Step: uint64(step), MinTS: t0, MaxTS: t0 + 999_999, Anomalies: anom, Executions: 200, Events: 400}
			if anom > 0 {
				sum.Funcs = []syncproto.FuncAnomalyMetrics{{Func: "compute", Count: anom, FirstTS: t0 + 10, LastTS: t0 + 900_000}}
			}
			row = append(row, syncproto.SyncRequest{PID: 0, Rank: uint32(r), Seq: uint64(step + 1), Step: uint64(step), Algorithm: "tail", TailRule: &rule,
				Models: []syncproto.ModelDelta{{Key: "compute", Moments: m, Tail: &tail, Anomalies: anom}},
				Steps:  []syncproto.StepSummary{sum}})
		}
		out = append(out, row)
	}
	return out
}

// browser opens a headless chromium of the given window size.
func browser(t *testing.T, w, h int, timeout time.Duration) context.Context {
	t.Helper()
	path := chromium(t)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.Flag("headless", true), chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.NoFirstRun, chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(w, h),
	)
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	ctx, cancel = context.WithTimeout(ctx, timeout)
	t.Cleanup(cancel)
	return ctx
}

// viewShot saves what the window shows, or the element sel when given, as
// name in $KIPIMO_DASHBOARD_SCREENSHOTS, when that is set
// (docs/dashboard.md's pictures are made so).
func viewShot(t *testing.T, ctx context.Context, name, sel string) {
	t.Helper()
	dir := os.Getenv("KIPIMO_DASHBOARD_SCREENSHOTS")
	if dir == "" {
		return
	}
	shot := chromedp.CaptureScreenshot()
	if sel != "" {
		shot = chromedp.Screenshot(chromedp.CSS(sel))
	}
	if err := os.WriteFile(filepath.Join(dir, name), run(t, ctx, shot), 0o644); err != nil {
		t.Fatal(err)
	}
}

// The dashboard of an 8-rank run with the default algorithm, opened from a
// deep link, shows the view the link names: the function (drawn from its
// natural-range histogram, with bins and the range), the anomaly list's
// rank and io_step, and the record; the page's link is the one it was
// opened with; editing the hash moves the view, and clicking rewrites the
// link. Times are shown against the run's start, with dates.
func TestDashboardDeepLinks(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test skipped with -short")
	}
	const slow, ranks, steps = 5, 8, 12
	prov := provStore(t, slow, steps)
	_, nc := startNATS(t)
	s := startServer(t, nc, Config{Run: "links", Durability: DurabilityNone, HTTPAddr: "127.0.0.1:0", ProvDBURL: prov.URL, UpdateEvery: 20 * time.Millisecond})
	defer s.Shutdown(context.Background())
	for _, row := range tailRun(ranks, steps, slow) {
		for i := range row {
			if rep := s.apply(&row[i], 0); rep.Error != "" {
				t.Fatal(rep.Error)
			}
		}
	}
	ctx := browser(t, 1280, 1100, 30*time.Second)
	link := url.Values{"func": {"compute"}, "rank": {"5"}, "step_min": {"3"}, "step_max": {"3"}, "record": {"5:3:3"}}
	page := "http://" + s.HTTPAddr() + "/"
	if err := chromedp.Do(ctx, chromedp.Navigate(page+"#"+link.Encode()),
		chromedp.Poll[chromedp.Void](`window.kipimo && window.kipimo.linked === true && window.kipimo.record === "5:3:3" && window.kipimo.funcView && window.kipimo.funcView.func === "compute" && document.querySelectorAll("#callstack li").length > 0`)); err != nil {
		t.Fatalf("open the deep link: %v", err)
	}
	got := run(t, ctx, chromedp.Evaluate[map[string]string](`({
		func: document.getElementById("fv-func").value, rank: document.getElementById("f-rank").value,
		smin: document.getElementById("f-step-min").value, smax: document.getElementById("f-step-max").value,
		link: window.kipimo.linkParams(), hash: location.hash, legend: document.getElementById("fv-legend").textContent,
		bins: String(window.kipimo.funcView.bins.length), model: window.kipimo.funcView.model,
		start: document.getElementById("t-start").textContent, when: document.getElementById("record-id").textContent,
		anom: document.getElementById("t-anom-what").textContent, scale: document.getElementById("heat-scale").textContent,
	})`))
	if got["func"] != "compute" || got["rank"] != "5" || got["smin"] != "3" || got["smax"] != "3" {
		t.Errorf("the link's view: function %q, rank %q, io_steps %q..%q", got["func"], got["rank"], got["smin"], got["smax"])
	}
	back, err := url.ParseQuery(got["link"])
	if err != nil || !reflect.DeepEqual(back, link) || got["hash"] != "#"+got["link"] {
		t.Errorf("the page's link is %q (hash %q), want the one it was opened with, %q", got["link"], got["hash"], link.Encode())
	}
	if got["bins"] == "0" || got["model"] != ModelNaturalRange || !strings.Contains(got["legend"], "natural range: flagged") {
		t.Errorf("function view: %s bins, model %q, legend %q; want the natural-range histogram", got["bins"], got["model"], got["legend"])
	}
	if !strings.HasPrefix(got["start"], "2026-11-") || !strings.Contains(got["when"], "entered at") || !strings.Contains(got["anom"], "flagged live") {
		t.Errorf("start %q, record %q, anomalies %q: want dates, times against the start, and which anomalies are counted", got["start"], got["when"], got["anom"])
	}
	if !strings.Contains(got["scale"], "typical") {
		t.Errorf("the heat map's colour scale reads %q", got["scale"])
	}
	viewShot(t, ctx, "dashboard-8-ranks.png", "")
	viewShot(t, ctx, "dashboard-function.png", "#p-function")

	// Editing the hash moves the view.
	run(t, ctx, chromedp.Evaluate[bool](`(location.hash = "#rank=5&record=5%3A1%3A3", true)`))
	if err := chromedp.Do(ctx, chromedp.Poll[chromedp.Void](`window.kipimo.record === "5:1:3" && document.getElementById("f-step-min").value === ""`)); err != nil {
		t.Fatalf("the edited hash did not open record 5:1:3: %v", err)
	}
	// Clicking the slow rank lists its anomalies, highest score first, and
	// the link says so.
	run(t, ctx, chromedp.Evaluate[bool](clickJS(`#top-ranks tbody tr`)))
	want := fmt.Sprintf("record=%s", url.QueryEscape(fmt.Sprintf("%d:%d:3", slow, steps-1)))
	if err := chromedp.Do(ctx, chromedp.Poll[chromedp.Void](`location.hash.includes(`+fmt.Sprintf("%q", want)+`) && location.hash.includes("rank=5")`)); err != nil {
		h := run(t, ctx, chromedp.Evaluate[string](`location.hash`))
		t.Fatalf("after the click the link is %q, want it to hold %s: %v", h, want, err)
	}
}

// At 4,096 noisy ranks with one slow rank, the heat map's colour scale
// puts the slow rank's band, and it alone, in the top colour, drawn on the
// canvas.
func TestDashboardOneSlowRankAt4096(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test skipped with -short")
	}
	const ranks, steps, slow = 4096, 8, 2730
	g := noisyRun(ranks, steps, slow, 3, 40)
	_, nc := startNATS(t)
	s := startServer(t, nc, Config{Run: "noisy", Durability: DurabilityNone, HTTPAddr: "127.0.0.1:0", UpdateEvery: 50 * time.Millisecond})
	defer s.Shutdown(context.Background())
	for step := range steps {
		for r := range ranks {
			q := g.request(step, r)
			if rep := s.apply(&q, 0); rep.Error != "" {
				t.Fatal(rep.Error)
			}
		}
	}
	ctx := browser(t, 1280, 700, 40*time.Second)
	if err := chromedp.Do(ctx, chromedp.Navigate("http://"+s.HTTPAddr()+"/"),
		chromedp.Poll[chromedp.Void](`window.kipimo && window.kipimo.ready === true && window.kipimo.layout && window.kipimo.layout.banded && window.kipimo.heat.steps.size === `+fmt.Sprint(steps))); err != nil {
		t.Fatalf("load dashboard: %v", err)
	}
	// Rows whose cells are drawn in the top colour (#8e0b0b).
	top := run(t, ctx, chromedp.Evaluate[[]int](`(() => {
		const L = window.kipimo.layout, g = document.getElementById("heatmap").getContext("2d"), out = [];
		L.rows.forEach((r, i) => {
			const y = Math.ceil(r.y), h = Math.max(1, Math.floor(r.y + r.h) - y);
			const d = g.getImageData(L.x0, y, L.x1 - L.x0, h).data;
			for (let j = 0; j < d.length; j += 4) if (d[j] === 0x8e && d[j + 1] === 0x0b && d[j + 2] === 0x0b) { out.push(i); return; }
		});
		return out;
	})()`))
	slowBand := slow / 64
	if len(top) != 1 || top[0] != slowBand {
		t.Errorf("rows in the top colour: %v, want only band %d (rank %d)", top, slowBand, slow)
	}
	viewShot(t, ctx, "dashboard-4096-ranks.png", "")
}
