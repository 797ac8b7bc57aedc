package pserver

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestDashboardInBrowserAt4096Ranks opens the dashboard of a live run of
// 4,096 ranks (generated step summaries, half of the run arriving while the
// page is open) in headless chromium and checks that the heat map is drawn
// as 64 bands of 64 ranks whose cells are the sums of their ranks' counts,
// that the band of the anomalous ranks is the hottest row, that clicking it
// shows its 64 ranks with their own counts and the button back, and that
// what the page receives and holds stays bounded: every push under 32 KiB
// (the per-rank map of 4,096 ranks is hundreds of KiB) and the page's DOM
// under 600 nodes.
func TestDashboardInBrowserAt4096Ranks(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test skipped with -short")
	}
	chromium(t) // skips (or fails in CI) before the server is fed
	const ranks, steps, bandRanks = 4096, 6, 64
	hot := [2]uint32{1030, 1040}
	g := newScaleRun(ranks, steps, hot, 3)
	_, nc := startNATS(t)
	s := startServer(t, nc, Config{Run: "scale", Durability: DurabilityNone, HTTPAddr: "127.0.0.1:0", UpdateEvery: 50 * time.Millisecond})
	defer s.Shutdown(context.Background())
	feed := func(from, to int) {
		for step := from; step < to; step++ {
			for r := range ranks {
				q := g.request(step, r)
				if rep := s.apply(&q, 0); rep.Error != "" {
					t.Fatalf("step %d rank %d: %s", step, r, rep.Error)
				}
			}
		}
	}
	feed(0, steps/2)

	ctx := browser(t, 1280, 1800, 40*time.Second)
	if err := chromedp.Do(ctx, chromedp.Navigate("http://"+s.HTTPAddr()+"/"), chromedp.Poll[chromedp.Void](`window.kipimo && window.kipimo.ready === true`)); err != nil {
		t.Fatalf("load dashboard: %v", err)
	}
	feed(steps/2, steps)

	// The expected bands, and their cells computed from the generated
	// counts: "b<id>" -> [anomalies, ranks with anomalies] per step.
	type band struct {
		ID          string `json:"id"`
		First, Last uint32
	}
	var bands []band
	want := make([]map[string][2]uint64, steps)
	for i := range ranks / bandRanks {
		b := band{First: uint32(i * bandRanks), Last: uint32(i*bandRanks + bandRanks - 1)}
		b.ID = fmt.Sprintf("0:%d-%d", b.First, b.Last)
		bands = append(bands, b)
		for step := range steps {
			if want[step] == nil {
				want[step] = map[string][2]uint64{}
			}
			if sum, n := g.bandSum(step, b.First, b.Last); sum > 0 {
				want[step]["b"+b.ID] = [2]uint64{sum, n}
			}
		}
	}
	wantJSON, _ := json.Marshal(want)
	// The page has every step once its cells are those expected; pushes may
	// lag the feeding, so this is polled.
	cellsJS := `(() => {
		const want = ` + string(wantJSON) + `, h = window.kipimo.heat;
		return want.every((cells, step) => {
			const got = h.steps.get(step);
			if (!got || got.size !== Object.keys(cells).length) return false;
			return Object.entries(cells).every(([k, [n, hot]]) => { const c = got.get(k); return c && c.n === n && c.hot === hot; });
		});
	})()`
	if err := chromedp.Do(ctx, chromedp.Poll[chromedp.Void](cellsJS)); err != nil {
		got := run(t, ctx, chromedp.Evaluate[string](`JSON.stringify([...window.kipimo.heat.steps].map(([s, m]) => [s, m.size]))`))
		t.Fatalf("the banded cells never matched the generated counts (steps and cell counts shown: %s): %v", got, err)
	}
	if err := chromedp.Do(ctx, chromedp.Poll[chromedp.Void](`document.getElementById("t-ranks").textContent === "4,096"`)); err != nil {
		t.Fatalf("the ranks total is not 4,096: %v", err)
	}
	var rows []struct {
		Band struct {
			ID          string
			First, Last uint32
			Ranks       int
		}
	}
	if err := json.Unmarshal([]byte(run(t, ctx, chromedp.Evaluate[string](`JSON.stringify(window.kipimo.layout.rows)`))), &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(bands) {
		t.Fatalf("the heat map has %d rows, want %d bands", len(rows), len(bands))
	}
	for i, r := range rows {
		if r.Band.ID != bands[i].ID || r.Band.First != bands[i].First || r.Band.Last != bands[i].Last || r.Band.Ranks != bandRanks {
			t.Fatalf("row %d is band %+v, want %+v of %d ranks", i, r.Band, bands[i], bandRanks)
		}
	}
	hotBand := int(hot[0]) / bandRanks
	hottest := run(t, ctx, chromedp.Evaluate[int](`(() => {
		const L = window.kipimo.layout, g = document.getElementById("heatmap").getContext("2d");
		let best = -1, bestV = -1;
		L.rows.forEach((r, i) => {
			const y = Math.ceil(r.y), h = Math.max(1, Math.floor(r.y + r.h) - y);
			const d = g.getImageData(L.x0, y, L.x1 - L.x0, h).data;
			let s = 0;
			for (let j = 0; j < d.length; j += 4) s += 255 - d[j + 1];
			if (s > bestV) { bestV = s; best = i; }
		});
		return best;
	})()`))
	if hottest != hotBand {
		t.Errorf("the hottest heat-map row is band %d, want %d (ranks %d-%d)", hottest, hotBand, hot[0], hot[1])
	}
	push := run(t, ctx, chromedp.Evaluate[map[string]float64](`window.kipimo.push`))
	nodes := run(t, ctx, chromedp.Evaluate[int](`document.getElementsByTagName("*").length`))
	if push["n"] < 1 || push["maxBytes"] > 32<<10 {
		t.Errorf("pushes %v: want at least one, none over 32 KiB", push)
	}
	t.Logf("%v pushes, the largest %v bytes; %d DOM nodes", push["n"], push["maxBytes"], nodes)
	if nodes > 600 {
		t.Errorf("the page holds %d DOM nodes, want at most 600", nodes)
	}

	shot(t, ctx, "dashboard-4096-bands.png")

	// Click the hot band: the heat map shows its ranks alone.
	clickRow := `(() => {
		const L = window.kipimo.layout, c = document.getElementById("heatmap"), r = c.getBoundingClientRect();
		const row = L.rows[` + fmt.Sprint(hotBand) + `], x = (L.x0 + 2) * r.width / c.width, y = (row.y + row.h / 2) * r.height / c.height;
		c.dispatchEvent(new MouseEvent("click", { clientX: r.left + x, clientY: r.top + y, bubbles: true }));
		return true;
	})()`
	run(t, ctx, chromedp.Evaluate[bool](clickRow))
	if err := chromedp.Do(ctx, chromedp.Poll[chromedp.Void](`window.kipimo.band !== null && window.kipimo.layout && window.kipimo.layout.banded === false`)); err != nil {
		t.Fatalf("clicking band %d did not open it: %v", hotBand, err)
	}
	var drill struct {
		Ranks []uint32
		Cells map[string]map[string]uint64
		Back  bool
	}
	if err := json.Unmarshal([]byte(run(t, ctx, chromedp.Evaluate[string](`JSON.stringify({
		ranks: window.kipimo.layout.rows.map((r) => r.rank),
		cells: Object.fromEntries([...window.kipimo.band.steps].map(([s, m]) => [s, Object.fromEntries(m)])),
		back: !document.getElementById("heat-back").hidden,
	})`))), &drill); err != nil {
		t.Fatal(err)
	}
	if len(drill.Ranks) != bandRanks || drill.Ranks[0] != uint32(hotBand*bandRanks) || drill.Ranks[bandRanks-1] != uint32(hotBand*bandRanks+bandRanks-1) || !drill.Back {
		t.Fatalf("the opened band shows ranks %v (button back shown: %v), want %d-%d", drill.Ranks, drill.Back, hotBand*bandRanks, hotBand*bandRanks+bandRanks-1)
	}
	wantTitle := fmt.Sprintf("ranks %d-%d (64 of 4,096)", hotBand*bandRanks, hotBand*bandRanks+bandRanks-1)
	if title := run(t, ctx, chromedp.Evaluate[string](textJS(`#heat-range`))); !strings.Contains(title, wantTitle) {
		t.Errorf("the opened band is titled %q, want it to say %q", title, wantTitle)
	}
	for step := range steps {
		cells := drill.Cells[fmt.Sprint(step)]
		n := 0
		for r := hotBand * bandRanks; r < (hotBand+1)*bandRanks; r++ {
			if a := g.anomalies[step][r]; a > 0 {
				n++
				if got := cells[fmt.Sprintf("0:%d", r)]; got != a {
					t.Errorf("opened band, step %d rank %d: %d anomalies, want %d", step, r, got, a)
				}
			}
		}
		if len(cells) != n {
			t.Errorf("opened band, step %d: %d cells, want %d", step, len(cells), n)
		}
	}
	shot(t, ctx, "dashboard-4096-band-open.png")
	// And back to the bands.
	run(t, ctx, chromedp.Evaluate[bool](clickJS(`#heat-back`)))
	if err := chromedp.Do(ctx, chromedp.Poll[chromedp.Void](`window.kipimo.band === null && window.kipimo.layout.banded === true && window.kipimo.layout.rows.length === 64`)); err != nil {
		t.Fatalf("the button back did not show the bands again: %v", err)
	}
}

// shot saves a screenshot of the page as name in $KIPIMO_DASHBOARD_SCREENSHOTS,
// when that is set.
func shot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("KIPIMO_DASHBOARD_SCREENSHOTS")
	if dir == "" {
		return
	}
	if err := os.WriteFile(filepath.Join(dir, name), run(t, ctx, chromedp.FullScreenshot(100)), 0o644); err != nil {
		t.Fatal(err)
	}
}
