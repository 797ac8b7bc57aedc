package pserver

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
	"github.com/kipimo-hpc/kipimo/internal/stats"
)

// storedRun writes a finished run into a new SQLite provenance store:
// anomalies on every rank (many more on the slow one) with call stacks,
// event windows and, for odd steps, GPU contexts; normal executions; and the
// final func_stats records, which it also returns.
func storedRun(t testing.TB, ranks, steps, funcs int, slow uint32) (*sqlitestore.Store, []provenance.GlobalFuncStats) {
	t.Helper()
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "prov.db"), sqlitestore.Options{Synchronous: "OFF"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	rng := rand.New(rand.NewPCG(3, 5))
	mom := make([]stats.Moments, funcs)
	anoms := make([]uint64, funcs)
	var anom, normal []provenance.Exec
	for step := range steps {
		for r := range ranks {
			for f := range funcs {
				base := 100 * float64(f+1)
				n := 0
				if uint32(r) == slow && f%3 == 0 {
					n = 2 + rng.IntN(3)
				} else if rng.Float64() < 0.04 {
					n = 1
				}
				for i := range 4 + n {
					id := func(j int) string { return fmt.Sprintf("%d:%d:%d", r, step, 100*f+10*i+j) }
					x := base * (1 + rng.NormFloat64()/10)
					isAnom := i >= 4
					if isAnom {
						x = base * (3 + rng.Float64()*3)
					}
					rt := uint64(max(x, 1))
					t0 := uint64(step)*100000 + uint64(1000*f+100*i)
					e := provenance.Exec{
						PID: 0, RID: uint32(r), TID: 0, EventID: id(2), FID: uint32(f), Func: funcName(f),
						Entry: t0, Exit: t0 + rt, RuntimeTotal: rt, RuntimeExclusive: rt,
						IOStep: uint64(step),
					}
					mom[f].Push(float64(rt))
					if !isAnom {
						normal = append(normal, e)
						continue
					}
					anoms[f]++
					e.OutlierScore, e.OutlierSeverity = 10+rng.Float64()*20, float64(rt)
					e.CallStack = []provenance.CallFrame{
						{Func: funcName(f), EventID: id(2), Entry: t0, Exit: t0 + rt, IsAnomaly: true},
						{Func: "timestep", EventID: id(1), Entry: t0 - 50},
						{Func: "main", EventID: fmt.Sprintf("%d:0:0", r), Entry: 1},
					}
					e.EventWindow = provenance.EventWindow{ExecWindow: []provenance.WindowExec{
						{Func: "timestep", EventID: id(1), Entry: t0 - 50, Exit: t0 + rt + 200},
						{Func: "halo_exchange", EventID: id(3), Entry: t0 - 40, Exit: t0 - 5, ParentEventID: id(1)},
						{Func: funcName(f), EventID: id(2), Entry: t0, Exit: t0 + rt, ParentEventID: id(1), IsAnomaly: true},
					}}
					if step%2 == 1 {
						e.IsGPUEvent, e.TID = true, 7
						e.GPULocation = &provenance.GPULocation{Device: 1, Context: 2, Stream: 14, Thread: 7}
						e.GPUParent = &provenance.GPUParent{EventID: id(3), TID: 0, CallStack: []provenance.CallFrame{{Func: "cudaLaunchKernel", EventID: id(3)}}}
					}
					anom = append(anom, e)
				}
			}
		}
	}
	var fs []provenance.GlobalFuncStats
	for f := range funcs {
		fs = append(fs, provenance.GlobalFuncStats{FID: uint32(f), Func: funcName(f), Stats: provenance.FuncStatsOf(mom[f]), Anomalies: anoms[f]})
	}
	for _, b := range []provenance.Batch{
		{Kind: provenance.KindAnomalies, Execs: anom},
		{Kind: provenance.KindNormalExecs, Execs: normal},
		{Kind: provenance.KindFuncStats, FuncStats: fs},
	} {
		if err := st.Write(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	return st, fs
}

func TestStoreDashboardViews(t *testing.T) {
	const ranks, steps, slow = 6, 10, 2
	st, fs := storedRun(t, ranks, steps, 5, slow)
	for i := range fs {
		// The final models' natural ranges, as the default algorithm
		// keeps them (the records have no explanation, so all stand).
		fs[i].NaturalRange = &provenance.Range{Low: 20, High: 140}
	}
	d, err := NewStoreDashboard(context.Background(), st, StoreOptions{Run: "old", FuncStats: fs})
	if err != nil {
		t.Fatal(err)
	}
	n, err := st.Count(context.Background(), provenance.Query{Kind: provenance.KindAnomalies})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(d.Handler())
	defer ts.Close()

	var sum Summary
	getJSON(t, ts.URL+"/api/summary", &sum)
	if sum.Status != StatusStored || sum.Totals.Anomalies != uint64(n) || sum.Ranks != ranks || sum.IOStep != steps-1 || sum.Run != "old" {
		t.Errorf("summary %+v, want status stored, %d anomalies, %d ranks, io_step %d", sum, n, ranks, steps-1)
	}
	var top []RankRow
	getJSON(t, ts.URL+"/api/top/ranks?n=3", &top)
	if len(top) != 3 || top[0].Rank != slow {
		t.Errorf("top ranks %+v, want rank %d first", top, slow)
	}
	var heat HeatMap
	getJSON(t, ts.URL+"/api/heatmap", &heat)
	var cells uint64
	for _, c := range heat.Cells {
		cells += c[2]
	}
	if len(heat.Steps) != steps || len(heat.Ranks) != ranks || cells != uint64(n) {
		t.Errorf("heat map %d steps x %d ranks holding %d anomalies, want %d x %d holding %d", len(heat.Steps), len(heat.Ranks), cells, steps, ranks, n)
	}
	var funcs []FuncRow
	getJSON(t, ts.URL+"/api/functions", &funcs)
	if len(funcs) != len(fs) {
		t.Fatalf("%d function rows, want %d", len(funcs), len(fs))
	}
	for _, r := range funcs {
		for _, f := range fs {
			if f.Func == r.Func && (!closeRel(r.Mean, f.Stats.Mean) || !closeRel(r.Stddev, f.Stats.Stddev) || r.Count != f.Stats.Count || r.Anomalies != f.Anomalies) {
				t.Errorf("function row %+v does not match func_stats %+v", r, f)
			}
		}
	}
	var fv FuncView
	if code := getJSON(t, ts.URL+"/api/function?func="+funcName(0), &fv); code != 200 {
		t.Fatalf("function view: %d", code)
	}
	normals, err := st.Count(context.Background(), provenance.Query{Kind: provenance.KindNormalExecs, Func: funcName(0)})
	if err != nil {
		t.Fatal(err)
	}
	// Drawn from the stored normal executions alone, labelled by the final
	// model's natural range.
	if len(fv.Bins) == 0 || fv.Total != uint64(normals) || fv.Anomalies.Count == 0 || fv.Model != ModelNaturalRange || fv.ThresholdRuntime != 140 || fv.LowThreshold != 20 {
		t.Errorf("function view %+v: want bins of the %d normal executions, anomalies and the natural range 20..140", fv, normals)
	}
	for _, b := range fv.Bins {
		if b.Anomalous != (b.Lo > 140 || b.Hi < 20) {
			t.Errorf("bin %+v labelled against the range 20..140", b)
		}
	}
	for _, tc := range []struct {
		url  string
		code int
	}{
		{"/api/function?func=nope", 404},
		{"/api/function", 400},
		{"/provdb/api/v1/records?rank=2&func=" + funcName(0) + "&token=x", 200},
	} {
		if code := getJSON(t, ts.URL+tc.url, nil); code != tc.code {
			t.Errorf("GET %s: %d, want %d", tc.url, code, tc.code)
		}
	}
}

func TestFuncViewLive(t *testing.T) {
	s, ts, _ := fedServer(t, Config{}, 6, 8, 1)
	var fv FuncView
	getJSON(t, ts.URL+"/api/function?func="+funcName(0), &fv)
	var m *Model
	s.View(func(st *State) { m = st.Models[funcName(0)] })
	if fv.Total != m.Histogram.Total() || len(fv.Bins) == 0 || fv.Source == "" {
		t.Errorf("function view of an HBOS model: total %d (want %d), %d bins, source %q", fv.Total, m.Histogram.Total(), len(fv.Bins), fv.Source)
	}
	for i := 1; i < len(fv.Bins); i++ {
		if fv.Bins[i].Lo < fv.Bins[i-1].Hi-1e-9 {
			t.Fatalf("bins %d and %d overlap: %+v %+v", i-1, i, fv.Bins[i-1], fv.Bins[i])
		}
	}
	getJSON(t, ts.URL+"/api/function?func="+funcName(1), &fv) // SSTD: moments only
	if len(fv.Bins) != 0 || !fv.Row.HasModel || fv.Row.HasHistogram {
		t.Errorf("function view of an SSTD model: %+v", fv)
	}
	var sum Summary
	getJSON(t, ts.URL+"/api/summary", &sum)
	if sum.Status != StatusLive {
		t.Errorf("status %q before Finish, want live", sum.Status)
	}
	s.finished.Store(true)
	getJSON(t, ts.URL+"/api/summary", &sum)
	if sum.Status != StatusFinished {
		t.Errorf("status %q after Finish, want finished", sum.Status)
	}
}

// box is a label's bounding box in CSS pixels, as the page reports it.
type box struct {
	Where                    string
	Text                     string
	Left, Top, Right, Bottom float64
}

// labelBoxesJS collects the boxes of every visible DOM text node (the
// rendered text, not its element) and every label drawn on a canvas.
const labelBoxesJS = `(() => {
	const out = [];
	const w = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
	for (let n = w.nextNode(); n; n = w.nextNode()) {
		if (!n.textContent.trim() || n.parentElement.closest("select,option,datalist,script,button")) continue;
		const r = document.createRange(); r.selectNodeContents(n);
		for (const b of r.getClientRects()) {
			if (b.width < 1 || b.height < 1) continue;
			out.push({Where: "dom " + n.parentElement.tagName.toLowerCase() + (n.parentElement.id ? "#" + n.parentElement.id : ""), Text: n.textContent.trim().slice(0, 40), Left: b.left, Top: b.top, Right: b.right, Bottom: b.bottom});
		}
	}
	for (const b of window.kipimo.labelBoxes()) out.push({Where: "canvas #" + b.canvas, Text: b.text, Left: b.left, Top: b.top, Right: b.right, Bottom: b.bottom});
	return out;
})()`

// overlaps lists the pairs of boxes that overlap by more than half a pixel
// both ways.
func overlaps(bs []box) []string {
	var out []string
	for i := range bs {
		for j := i + 1; j < len(bs); j++ {
			a, b := bs[i], bs[j]
			if min(a.Right, b.Right)-max(a.Left, b.Left) > 0.5 && min(a.Bottom, b.Bottom)-max(a.Top, b.Top) > 0.5 {
				out = append(out, fmt.Sprintf("%s %q %v and %s %q %v", a.Where, a.Text, [4]float64{a.Left, a.Top, a.Right, a.Bottom}, b.Where, b.Text, [4]float64{b.Left, b.Top, b.Right, b.Bottom}))
			}
		}
	}
	return out
}

func TestOverlaps(t *testing.T) {
	for _, tc := range []struct {
		name string
		bs   []box
		want int
	}{
		{"apart", []box{{Left: 0, Top: 0, Right: 10, Bottom: 10}, {Left: 20, Top: 0, Right: 30, Bottom: 10}}, 0},
		{"touching", []box{{Left: 0, Top: 0, Right: 10, Bottom: 10}, {Left: 10, Top: 0, Right: 20, Bottom: 10}}, 0},
		{"drawn twice", []box{{Left: 5, Top: 5, Right: 50, Bottom: 17}, {Left: 5, Top: 5, Right: 50, Bottom: 17}}, 1},
		{"crossing", []box{{Left: 0, Top: 0, Right: 10, Bottom: 10}, {Left: 5, Top: 5, Right: 15, Bottom: 15}, {Left: 100, Top: 0, Right: 110, Bottom: 10}}, 1},
	} {
		if got := overlaps(tc.bs); len(got) != tc.want {
			t.Errorf("%s: %d overlaps %v, want %d", tc.name, len(got), got, tc.want)
		}
	}
}

// TestDashboardPanels opens the dashboard of a live run, of a finished run
// still served and of a run read back from its provenance store, at 8 and
// 1,024 ranks, takes a full-page screenshot of each, and checks that every
// panel has content, that the status badge tells which of the three it is,
// and that no text on the page or on its canvases overlaps another.
func TestDashboardPanels(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test skipped with -short")
	}
	path := chromium(t)
	shots := t.TempDir()
	for _, tc := range []struct {
		name   string
		ranks  int
		steps  int
		mode   string // live, finished or stored
		status string // badge text
	}{
		{"live-8", 8, 40, "live", "live"},
		{"finished-1024", 1024, 24, "finished", "finished"},
		{"stored-8", 8, 40, "stored", "finished (from store)"},
		{"stored-1024", 1024, 4, "stored", "finished (from store)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const slow = 5
			var url string
			var live *Server
			switch tc.mode {
			case "stored":
				st, fs := storedRun(t, tc.ranks, tc.steps, 12, slow)
				d, err := NewStoreDashboard(context.Background(), st, StoreOptions{Run: tc.name, FuncStats: fs})
				if err != nil {
					t.Fatal(err)
				}
				ts := httptest.NewServer(d.Handler())
				t.Cleanup(ts.Close)
				url = ts.URL
			default:
				prov := provStore(t, slow, tc.steps)
				s, ts, _ := fedServer(t, Config{Run: tc.name, ProvDBURL: prov.URL}, tc.ranks, tc.steps, slow)
				if tc.mode == "finished" {
					s.finished.Store(true)
				} else {
					live = s
				}
				url = ts.URL
			}

			opts := append(chromedp.DefaultExecAllocatorOptions[:],
				chromedp.ExecPath(path), chromedp.Flag("headless", true), chromedp.Flag("no-sandbox", true),
				chromedp.Flag("disable-gpu", true), chromedp.Flag("disable-background-networking", true),
				chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
				chromedp.Flag("hide-scrollbars", true),
				chromedp.NoFirstRun, chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 1000),
			)
			actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
			defer cancel()
			ctx, cancel := chromedp.NewContext(actx)
			defer cancel()
			ctx, cancel = context.WithTimeout(ctx, 60*time.Second)
			defer cancel()
			ready := `window.kipimo && window.kipimo.ready === true && window.kipimo.funcView && document.querySelectorAll("#callstack li").length > 0 && document.getElementById("status").textContent === ` + jsString(tc.status)
			if err := chromedp.Do(ctx, chromedp.Navigate(url+"/"), chromedp.Poll[chromedp.Void](ready)); err != nil {
				status := run(t, ctx, chromedp.Evaluate[string](textJS(`#status`)))
				t.Fatalf("dashboard not filled (status %q): %v", status, err)
			}

			// Every panel has content.
			type panel struct {
				name, js string
				min      int
			}
			for _, p := range []panel{
				{"totals", `[...document.querySelectorAll("#totals dd")].filter((e) => e.textContent !== "-").length`, 5},
				{"heat-map rows", `window.kipimo.layout.rows.length`, min(tc.ranks, maxBands)}, // a row per rank, or 64 bands beyond 128 ranks
				{"heat-map cells", inkJS("heatmap"), 50},
				{"heat-map labels", `window.kipimo.labels.heatmap.length`, 3},
				{"series", inkJS("series"), 50},
				{"top ranks", `document.querySelectorAll("#top-ranks tbody tr:not(.empty)").length`, 8},
				{"top functions", `document.querySelectorAll("#top-funcs tbody tr:not(.empty)").length`, 4},
				{"function table", `document.querySelectorAll("#func-table tbody tr:not(.empty)").length`, 12},
				{"function histogram bins", `window.kipimo.funcView.bins.length`, 3},
				{"function histogram anomalous bins", `window.kipimo.funcView.bins.filter((b) => b.anomalous).length`, 1},
				{"function threshold label", `window.kipimo.labels.funchist.filter((l) => l.text.startsWith("threshold")).length`, 1},
				{"function anomaly marks", `window.kipimo.funcMarks.length`, 1},
				{"function legend", `document.getElementById("fv-legend").textContent.length`, 20},
				{"anomaly list", `document.querySelectorAll("#records tbody tr:not(.empty)").length`, 2},
				{"call stack", `document.querySelectorAll("#callstack li").length`, 3},
				{"event window", inkJS("timeline"), 50},
				{"GPU context", `document.getElementById("gpu").textContent.length`, 10},
			} {
				if n := run(t, ctx, chromedp.Evaluate[int](p.js)); n < p.min {
					t.Errorf("panel %s: %d, want at least %d", p.name, n, p.min)
				}
			}
			if msg := run(t, ctx, chromedp.Evaluate[string](textJS(`#details-msg`))); msg != "" {
				t.Errorf("anomaly panel message %q", msg)
			}

			// The anomaly list filters by rank, function and io_step.
			step := tc.steps - 1
			filter := fmt.Sprintf(`(() => { document.getElementById("f-rank").value = "%d"; document.getElementById("f-func").value = %s;
				document.getElementById("f-step-min").value = document.getElementById("f-step-max").value = "%d";
				document.getElementById("filters").requestSubmit(); return true; })()`, slow, jsString(funcName(0)), step)
			run(t, ctx, chromedp.Evaluate[bool](filter))
			want := fmt.Sprintf("%d:%d:", slow, step)
			rowsOK := fmt.Sprintf(`(() => { const rs = [...document.querySelectorAll("#records tbody tr")]; return rs.length > 0 && rs.every((r) => r.cells[0].textContent.startsWith(%s) && r.cells[3].textContent === %s); })()`, jsString(want), jsString(funcName(0)))
			if err := chromedp.Do(ctx, chromedp.Poll[chromedp.Void](rowsOK+` && document.getElementById("record-id").textContent.includes(`+jsString(want)+`)`)); err != nil {
				t.Errorf("filtered anomaly list (rank %d, %s, io_step %d): %v; rows %q", slow, funcName(0), step, err, run(t, ctx, chromedp.Evaluate[string](textJS(`#records tbody`))))
			}
			if gpu := run(t, ctx, chromedp.Evaluate[string](textJS(`#gpu`))); (step%2 == 1) != strings.Contains(gpu, "stream 14") {
				t.Errorf("GPU context of an io_step %d anomaly: %q", step, gpu)
			}

			// No label overlaps another, on the page or on a canvas.
			var boxes []box
			raw := run(t, ctx, chromedp.Evaluate[string](`JSON.stringify(`+labelBoxesJS+`)`))
			if err := json.Unmarshal([]byte(raw), &boxes); err != nil {
				t.Fatal(err)
			}
			if len(boxes) < 100 {
				t.Errorf("only %d labels on the page", len(boxes))
			}
			if o := overlaps(boxes); len(o) > 0 {
				t.Errorf("%d overlapping labels, first: %s", len(o), strings.Join(o[:min(len(o), 5)], "; "))
			}

			if live != nil {
				// The run ends while the page is open: the badge follows.
				live.finished.Store(true)
				if err := chromedp.Do(ctx, chromedp.Poll[chromedp.Void](`document.getElementById("status").textContent === "finished"`)); err != nil {
					t.Errorf("the badge did not turn finished when the run ended: %v", err)
				}
			}

			png := run(t, ctx, chromedp.FullScreenshot(100))
			out := filepath.Join(shots, "dashboard-"+tc.name+".png")
			if err := os.WriteFile(out, png, 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("screenshot: %s", out)
			if dir := os.Getenv("KIPIMO_DASHBOARD_SCREENSHOTS"); dir != "" {
				if err := os.WriteFile(filepath.Join(dir, "dashboard-"+tc.name+".png"), png, 0o644); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// inkJS counts the pixels of canvas id that are not white.
func inkJS(id string) string {
	return `(() => { const c = document.getElementById(` + jsString(id) + `), d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
		let n = 0; for (let i = 0; i < d.length; i += 4) if (d[i] < 240 || d[i + 1] < 240 || d[i + 2] < 240) n++; return n; })()`
}

func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
