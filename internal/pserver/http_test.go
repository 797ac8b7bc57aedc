package pserver

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/daemon"
)

// fedServer returns a Server (not connected to NATS) fed with a synthetic run
// whose rank slow is much more anomalous, and an HTTP test server on its
// handler.
func fedServer(t *testing.T, cfg Config, ranks, steps int, slow uint32) (*Server, *httptest.Server, *genRun) {
	t.Helper()
	if cfg.Run == "" {
		cfg.Run = "web"
	}
	s, err := New(cfg, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	g := newGenRun(ranks, steps, 12, slow, 61)
	for _, row := range g.reqs {
		for i := range row {
			data, _ := json.Marshal(row[i])
			if rep := s.applyRaw(data, 0); rep.Error != "" {
				t.Fatal(rep.Error)
			}
		}
	}
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	return s, ts, g
}

func getJSON(t *testing.T, url string, v any) int {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if v != nil && res.StatusCode == 200 {
		if err := json.NewDecoder(res.Body).Decode(v); err != nil {
			t.Fatalf("%s: %v", url, err)
		}
	}
	return res.StatusCode
}

func TestJSONEndpoints(t *testing.T) {
	const slow = 6
	_, ts, g := fedServer(t, Config{}, 10, 20, slow)
	want := reference(t, g.all(), DefaultWindow)

	var sum Summary
	getJSON(t, ts.URL+"/api/summary", &sum)
	if sum.Totals != want.Agg.Total() || sum.Ranks != 10 || sum.IOStep != 19 || sum.Models != 12 {
		t.Errorf("summary %+v does not match the run (totals %+v)", sum, want.Agg.Total())
	}
	var ranks []RankRow
	getJSON(t, ts.URL+"/api/top/ranks?n=3", &ranks)
	if len(ranks) != 3 || ranks[0].Rank != slow || ranks[0].Anomalies != want.Agg.Ranks[DetectorID{0, slow}].Anomalies {
		t.Errorf("top ranks %+v, want rank %d first", ranks, slow)
	}
	getJSON(t, ts.URL+"/api/top/ranks?by=severity&n=1", &ranks)
	if len(ranks) != 1 || ranks[0].Rank != slow {
		t.Errorf("top ranks by severity %+v, want rank %d", ranks, slow)
	}
	var heat HeatMap
	getJSON(t, ts.URL+"/api/heatmap?steps=5", &heat)
	if len(heat.Steps) != 5 || heat.Steps[4] != 19 || len(heat.Ranks) != 10 {
		t.Fatalf("heat map has steps %v and %d ranks", heat.Steps, len(heat.Ranks))
	}
	perRank := map[uint32]uint64{}
	for _, c := range heat.Cells {
		perRank[heat.Ranks[c[0]].Rank] += c[2]
	}
	for r, n := range perRank {
		if r != slow && n >= perRank[slow] {
			t.Errorf("heat map: rank %d has %d anomalies, slow rank %d only %d", r, n, slow, perRank[slow])
		}
	}
	var steps []StepPoint
	getJSON(t, ts.URL+"/api/steps?last=3", &steps)
	if len(steps) != 3 || steps[2].Step != 19 || steps[2].Anomalies != want.Agg.Steps[19].Anomalies || steps[2].Ranks != 10 {
		t.Errorf("steps %+v", steps)
	}
	var funcs []FuncRow
	getJSON(t, ts.URL+"/api/functions", &funcs)
	if len(funcs) != 12 {
		t.Fatalf("%d functions, want 12", len(funcs))
	}
	for _, f := range funcs {
		m := want.Models[f.Func]
		if !f.HasModel || f.Count != m.Moments.N || !closeRel(f.Stddev, m.Moments.Stddev()) || f.Anomalies != m.Anomalies {
			t.Errorf("function row %+v does not match model %+v", f, m)
		}
	}
	var tf []FuncAnomRow
	getJSON(t, ts.URL+"/api/top/functions?n=2", &tf)
	if len(tf) != 2 || tf[0].Anomalies < tf[1].Anomalies || tf[0].Anomalies != want.Agg.Funcs[tf[0].Func].Count {
		t.Errorf("top functions %+v", tf)
	}
	var rf []RankFuncRow
	getJSON(t, ts.URL+"/api/rankfuncs?rank=6", &rf)
	if len(rf) == 0 {
		t.Fatal("no (rank, function) metrics for the slow rank")
	}
	for _, r := range rf {
		w := want.Agg.RankFunc[RankFunc{DetectorID{0, 6}, r.Func}]
		if r.Rank != 6 || w == nil || r.Count != w.Count || r.FirstStep != w.FirstStep || r.LastStep != w.LastStep {
			t.Errorf("rank-function row %+v, want %+v", r, w)
		}
	}
	var counters []CounterRow
	getJSON(t, ts.URL+"/api/counters", &counters)
	if len(counters) != 2 || counters[0].Count != want.Counters[counters[0].Counter].N {
		t.Errorf("counters %+v", counters)
	}
	for _, bad := range []string{"/api/top/ranks?by=speed", "/api/heatmap?steps=-1", "/api/rankfuncs?rank=x"} {
		if code := getJSON(t, ts.URL+bad, nil); code != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400", bad, code)
		}
	}
	res, err := http.Get(ts.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if !strings.Contains(string(body), `<canvas id="heatmap"`) {
		t.Error("the dashboard page is not served at /")
	}
}

func TestToken(t *testing.T) {
	_, ts, _ := fedServer(t, Config{Token: "s3cret"}, 2, 2, 0)
	tests := []struct {
		name, url, header string
		code              int
	}{
		{"none", "/api/summary", "", 401},
		{"wrong", "/api/summary", "Bearer nope", 401},
		{"header", "/api/summary", "Bearer s3cret", 200},
		{"query", "/api/summary?token=s3cret", "", 200},
		{"metrics need it too", "/metrics", "", 401},
		{"event stream: wrong query", "/api/events?token=nope", "", 401},
		{"wrong header decides over right query", "/api/summary?token=s3cret", "Bearer nope", 401},
		{"page without token", "/", "", 200},
		{"page opened with the token", "/?token=s3cret", "", 200},
		{"page script without token", "/app.js", "", 200},
		{"page style sheet without token", "/style.css", "", 200},
		{"no such page file", "/secret.json", "", 401},
		{"provdb proxy needs it", "/provdb/api/v1/records", "", 401},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest("GET", ts.URL+tc.url, nil)
			if tc.header != "" {
				req.Header.Set("Authorization", tc.header)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != tc.code {
				t.Errorf("status %d, want %d", res.StatusCode, tc.code)
			}
		})
	}
}

func TestProvDBProxy(t *testing.T) {
	t.Run("absent", func(t *testing.T) {
		_, ts, _ := fedServer(t, Config{}, 2, 2, 0)
		res, err := http.Get(ts.URL + "/provdb/api/anomalies?rank=1")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "--provdb-url") {
			t.Errorf("status %d body %s, want 503 naming --provdb-url", res.StatusCode, body)
		}
	})
	// The token the page was opened with never reaches provdb, whether
	// the pserver checks one or not; nor does the Authorization header.
	for _, tc := range []struct{ name, token string }{{"present", "tk"}, {"present, no token configured", ""}} {
		t.Run(tc.name, func(t *testing.T) {
			var got *http.Request
			prov := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				got = r
				w.Write([]byte(`[]`))
			}))
			defer prov.Close()
			_, ts, _ := fedServer(t, Config{ProvDBURL: prov.URL + "/base", Token: tc.token}, 2, 2, 0)
			res, err := http.Get(ts.URL + "/provdb/api/anomalies?rank=1&token=tk")
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != 200 || got == nil {
				t.Fatalf("status %d, provdb reached: %v", res.StatusCode, got != nil)
			}
			if got.URL.Path != "/base/api/anomalies" || got.URL.Query().Get("rank") != "1" || got.URL.Query().Has("token") || got.Header.Get("Authorization") != "" {
				t.Errorf("provdb saw %v with Authorization %q", got.URL, got.Header.Get("Authorization"))
			}
		})
	}
	// With --provdb-token-file the proxy reaches a provdb that checks a
	// token (both daemons with one, as in the compose set-up) with
	// provdb's token, not the page's.
	t.Run("provdb token", func(t *testing.T) {
		prov := httptest.NewServer(daemon.Bearer("pt", daemon.HeaderOnly, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(`[]`))
		})))
		defer prov.Close()
		_, ts, _ := fedServer(t, Config{ProvDBURL: prov.URL, Token: "tk", ProvDBToken: "pt"}, 2, 2, 0)
		for _, tc := range []struct {
			url  string
			want int
		}{
			{"/provdb/api/anomalies?rank=1&token=tk", http.StatusOK},
			{"/provdb/api/anomalies?rank=1", http.StatusUnauthorized}, // the pserver's own check
		} {
			res, err := http.Get(ts.URL + tc.url)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != tc.want {
				t.Errorf("GET %s: %d, want %d", tc.url, res.StatusCode, tc.want)
			}
		}
	})
}

func TestSSEStreamAndSlowClients(t *testing.T) {
	s, ts, _ := fedServer(t, Config{UpdateEvery: time.Millisecond, SSEBuffer: 4}, 4, 3, 1)
	s.wg.Add(1)
	go s.updateLoop()
	defer func() { close(s.stop); s.hub.close(); s.wg.Wait() }()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", ts.URL+"/api/events", nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if ct := res.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	// A client that never reads: registered directly so its queue fills.
	stuck := s.hub.add()
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	readUpdate := func() Update {
		t.Helper()
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				var u Update
				if err := json.Unmarshal([]byte(data), &u); err != nil {
					t.Fatal(err)
				}
				return u
			}
		}
		t.Fatalf("stream ended: %v", sc.Err())
		return Update{}
	}
	first := readUpdate()
	if first.Summary.IOStep != 2 || len(first.TopRanks) == 0 || first.TopRanks[0].Rank != 1 {
		t.Errorf("first update %+v", first.Summary)
	}
	// Ten more steps: every one is pushed to the reading client; the stuck one
	// keeps 4 and the rest are dropped and counted.
	more := newGenRun(4, 13, 12, 1, 61)
	for step := 3; step < 13; step++ {
		for i := range more.reqs[step] {
			data, _ := json.Marshal(more.reqs[step][i])
			s.applyRaw(data, 0)
		}
		u := readUpdate()
		for u.Summary.IOStep < uint64(step) {
			u = readUpdate()
		}
		if u.Heat.Steps[len(u.Heat.Steps)-1] != uint64(step) || u.Steps[len(u.Steps)-1].Step != uint64(step) {
			t.Fatalf("update for step %d carries steps %v", step, u.Heat.Steps)
		}
	}
	s.hub.mu.Lock()
	dropped, queued := stuck.dropped, len(stuck.ch)
	s.hub.mu.Unlock()
	if queued != 4 || dropped == 0 {
		t.Errorf("stuck client: %d queued, %d dropped; want 4 queued and some dropped", queued, dropped)
	}
}

func TestGrafanaDashboardUsesExportedMetrics(t *testing.T) {
	data, err := os.ReadFile("../../deploy/grafana/kipimo.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Query any `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("dashboard does not parse: %v", err)
	}
	if dash.Title == "" || len(dash.Panels) == 0 {
		t.Fatal("dashboard has no title or panels")
	}
	s, ts, _ := fedServer(t, Config{}, 2, 2, 0)
	s.metrics.syncLatency.Observe(0.001)
	res, err := http.Get(ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	exported := map[string]bool{}
	for _, line := range strings.Split(string(body), "\n") {
		if name, ok := strings.CutPrefix(line, "# TYPE "); ok {
			f := strings.Fields(name)
			exported[f[0]] = true
			if f[1] == "histogram" {
				for _, suf := range []string{"_bucket", "_sum", "_count"} {
					exported[f[0]+suf] = true
				}
			}
		}
	}
	re := regexp.MustCompile(`\b[a-z_]+_[a-z0-9_]+\b`)
	var exprs []string
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, v := range dash.Templating.List {
		if q, ok := v.Query.(string); ok {
			exprs = append(exprs, q)
		}
	}
	used := 0
	for _, e := range exprs {
		for _, name := range re.FindAllString(e, -1) {
			if !strings.HasPrefix(name, "kipimo_") {
				continue
			}
			used++
			if !exported[name] {
				t.Errorf("dashboard query %q uses %s, which the pserver does not export", e, name)
			}
		}
	}
	if used < 10 {
		t.Errorf("dashboard uses only %d kipimo metrics", used)
	}
	for _, name := range []string{"kipimo_frames_total", "kipimo_anomalies_total", "kipimo_bad_frames_total", "kipimo_ps_sync_latency_seconds", "kipimo_ps_merges_total", "kipimo_process_cpu_seconds_total"} {
		if !exported[name] {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}

func TestRankSeriesAreBounded(t *testing.T) {
	_, ts, _ := fedServer(t, Config{MaxRankSeries: 3}, 8, 2, 0)
	res, err := http.Get(ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if n := strings.Count(string(body), "kipimo_rank_anomalies_total{"); n != 3 {
		t.Errorf("%d per-rank anomaly series, want 3 (--max-rank-series)", n)
	}
	if strings.Contains(string(body), "func=") {
		t.Error("a metric is labelled by function")
	}
}
