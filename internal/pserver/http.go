package pserver

import (
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kipimo-hpc/kipimo/internal/daemon"
)

//go:embed web
var webFS embed.FS

// dashboard is what the dashboard's HTTP API reads: a live Server's state
// or a finished run's state rebuilt from its provenance store.
type dashboard struct {
	cfg     Config                                              // run, shard, window, provdb paths
	view    func(f func(st *State))                             // runs f on the state under its lock
	summary func(st *State) Summary                             // GET /api/summary
	hist    func(r *http.Request, fn string) (funcModel, error) // what a function's view is drawn from
	events  http.HandlerFunc                                    // GET /api/events
	metrics http.Handler                                        // GET /metrics; nil: none
	provdb  http.Handler                                        // /provdb/...
	hasProv bool                                                // whether provdb answers
	// funcStats is GET /api/func_stats of a live server (nil: a finished run's)
	funcStats func(st *State) LiveFuncStats
	// culprits is the culprit analysis GET /api/culprits answers with
	// (nil: the state's own, as a live server analyses it)
	culprits func(st *State) Culprits
}

// newHandler builds the HTTP API of a live server (see dashboard.handler).
func (s *Server) newHandler() http.Handler {
	d := &dashboard{
		cfg: s.cfg, view: s.View, summary: s.summary, events: s.serveEvents,
		metrics: promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}),
		provdb:  s.provdbProxy(), hasProv: s.cfg.ProvDBURL != "", funcStats: s.liveFuncStats,
	}
	d.hist = func(_ *http.Request, fn string) (fm funcModel, err error) {
		s.View(func(st *State) { fm = liveFuncModel(st, fn) })
		return fm, nil
	}
	return d.handler()
}

// handler builds the HTTP API:
//
//	GET /                       the dashboard page (embedded)
//	GET /api/config             run, shard and whether a provdb API is configured
//	GET /api/summary            Summary (status live, finished or stored)
//	GET /api/heatmap?steps=N&band=ID HeatMap of the last N steps (default: the window), of one band's ranks with band
//	GET /api/steps?last=N       []StepPoint
//	GET /api/top/ranks?n=&by=   []RankRow, by count (default) or severity
//	GET /api/top/functions?n=&by= []FuncAnomRow
//	GET /api/functions          []FuncRow
//	GET /api/function?func=F    FuncView: F's runtime histogram over all ranks and threshold
//	GET /api/rankfuncs?rank=&func=&n= []RankFuncRow
//	GET /api/counters           []CounterRow
//	GET /api/events             text/event-stream of Update, one per io_step
//	GET /api/culprits, /api/outliers  the culprit analysis (culprits_http.go)
//	GET /api/baseline?n=N       this run against its baseline (baseline_http.go)
//	GET /api/func_stats         the models merged so far (funcstats_http.go)
//	GET /metrics                Prometheus metrics (live servers)
//	    /provdb/...             the provdb query API (proxied, or on the store)
//
// With a token configured (Config.Token) every route but the page's own
// files (the page, its script and style sheet: no run data) needs it, by
// internal/daemon's rule for the dashboard: "Authorization: Bearer <token>"
// or, from a browser, ?token=<token> (EventSource cannot set headers).
func (d *dashboard) handler() http.Handler {
	api := http.NewServeMux()
	static, _ := fs.Sub(webFS, "web")
	files := http.FileServerFS(static)
	api.Handle("GET /", files)
	api.HandleFunc("GET /api/config", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, map[string]any{
			"run": d.cfg.Run, "shard": d.cfg.Shard, "shards": d.cfg.Shards,
			"window": d.cfg.Window, "provdb": d.hasProv,
			"provdb_list": d.cfg.ProvDBList, "provdb_record": d.cfg.ProvDBRecord,
		})
	})
	view := func(path string, f func(r *http.Request, st *State) (any, error)) {
		api.HandleFunc("GET "+path, func(w http.ResponseWriter, r *http.Request) {
			var v any
			var err error
			d.view(func(st *State) { v, err = f(r, st) })
			if err != nil {
				httpError(w, http.StatusBadRequest, err.Error())
				return
			}
			writeJSON(w, v)
		})
	}
	view("/api/summary", func(_ *http.Request, st *State) (any, error) { return d.summary(st), nil })
	view("/api/heatmap", func(r *http.Request, st *State) (any, error) {
		n, err := intParam(r, "steps", 0)
		if err != nil {
			return nil, err
		}
		return heatMapView(st, n, r.URL.Query().Get("band"))
	})
	view("/api/steps", func(r *http.Request, st *State) (any, error) {
		n, err := intParam(r, "last", 0)
		return stepSeries(st, n), err
	})
	view("/api/top/ranks", func(r *http.Request, st *State) (any, error) {
		n, err := intParam(r, "n", 10)
		if err != nil {
			return nil, err
		}
		by, err := byParam(r)
		return topRanks(st, n, by), err
	})
	view("/api/top/functions", func(r *http.Request, st *State) (any, error) {
		n, err := intParam(r, "n", 10)
		if err != nil {
			return nil, err
		}
		by, err := byParam(r)
		return topFuncs(st, n, by), err
	})
	view("/api/functions", func(_ *http.Request, st *State) (any, error) { return funcTable(st), nil })
	view("/api/counters", func(_ *http.Request, st *State) (any, error) { return counterTable(st), nil })
	view("/api/rankfuncs", func(r *http.Request, st *State) (any, error) {
		n, err := intParam(r, "n", 100)
		if err != nil {
			return nil, err
		}
		var rank *uint32
		if v := r.URL.Query().Get("rank"); v != "" {
			x, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				return nil, fmt.Errorf("rank %q is not a non-negative integer", v)
			}
			r32 := uint32(x)
			rank = &r32
		}
		return rankFuncs(st, rank, r.URL.Query().Get("func"), n), nil
	})
	api.HandleFunc("GET /api/function", func(w http.ResponseWriter, r *http.Request) {
		fn := r.URL.Query().Get("func")
		if fn == "" {
			httpError(w, http.StatusBadRequest, "func is required: GET /api/function?func=NAME")
			return
		}
		fm, err := d.hist(r, fn)
		if err != nil {
			httpError(w, http.StatusInternalServerError, err.Error())
			return
		}
		var v FuncView
		found := false
		d.view(func(st *State) { v, found = funcView(st, fn, fm) })
		if !found {
			httpError(w, http.StatusNotFound, fmt.Sprintf("no function %q in this run", fn))
			return
		}
		writeJSON(w, v)
	})
	api.HandleFunc("GET /api/events", d.events)
	d.culpritRoutes(api)
	d.baselineRoutes(api)
	d.funcStatsRoutes(api)
	if d.metrics != nil {
		api.Handle("GET /metrics", d.metrics)
	}
	api.Handle("GET /provdb/", d.provdb)
	if d.cfg.Token == "" {
		return api
	}
	guarded := daemon.Bearer(d.cfg.Token, daemon.HeaderOrQuery, api)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if (r.Method == http.MethodGet || r.Method == http.MethodHead) && isPageFile(static, r.URL.Path) {
			files.ServeHTTP(w, r)
			return
		}
		guarded.ServeHTTP(w, r)
	})
}

// isPageFile reports whether p is "/" or names a file of the embedded page
// (static), which a browser loads without the token.
func isPageFile(static fs.FS, p string) bool {
	name := strings.TrimPrefix(path.Clean("/"+p), "/")
	if name == "" {
		return true
	}
	if !fs.ValidPath(name) {
		return false
	}
	st, err := fs.Stat(static, name)
	return err == nil && st.Mode().IsRegular()
}

func (s *Server) provdbProxy() http.Handler {
	if s.cfg.ProvDBURL == "" {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			httpError(w, http.StatusServiceUnavailable, "no provenance query API is configured: start the pserver with --provdb-url")
		})
	}
	target, err := url.Parse(s.cfg.ProvDBURL)
	if err != nil {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			httpError(w, http.StatusServiceUnavailable, fmt.Sprintf("provdb URL %q: %v", s.cfg.ProvDBURL, err))
		})
	}
	p := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.URL.Path = strings.TrimSuffix(target.Path, "/") + strings.TrimPrefix(pr.In.URL.Path, "/provdb")
			pr.Out.URL.RawPath = ""
			q := pr.In.URL.Query()
			q.Del(daemon.TokenParam) // a page opened with ?token= on a server without one
			pr.Out.URL.RawQuery = q.Encode()
			pr.Out.Header.Del("Authorization")
			if s.cfg.ProvDBToken != "" {
				pr.Out.Header.Set("Authorization", "Bearer "+s.cfg.ProvDBToken)
			}
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			httpError(w, http.StatusBadGateway, "the provenance query API at "+target.Redacted()+" did not answer: "+err.Error())
		},
	}
	return p
}

// serveEvents streams an Update every io_step until the client leaves or the
// server stops.
func (s *Server) serveEvents(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		httpError(w, http.StatusInternalServerError, "streaming is not supported by this connection")
		return
	}
	c := s.hub.add()
	if c == nil {
		httpError(w, http.StatusServiceUnavailable, "server is shutting down")
		return
	}
	defer s.hub.remove(c)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	first, _ := json.Marshal(s.update(r.Context()))
	fmt.Fprintf(w, "retry: 2000\nevent: update\ndata: %s\n\n", first)
	fl.Flush()
	ping := time.NewTicker(15 * time.Second)
	defer ping.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-ping.C:
			fmt.Fprint(w, ": ping\n\n")
			fl.Flush()
		case data, ok := <-c.ch:
			if !ok {
				return
			}
			fmt.Fprintf(w, "event: update\ndata: %s\n\n", data)
			fl.Flush()
		}
	}
}

func writeJSON(w http.ResponseWriter, v any) { daemon.WriteJSON(w, v) }

func httpError(w http.ResponseWriter, code int, msg string) {
	daemon.WriteError(w, code, errors.New(msg))
}

func intParam(r *http.Request, name string, def int) (int, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > 1_000_000 {
		return 0, fmt.Errorf("%s %q is not an integer in 0..1000000", name, v)
	}
	return n, nil
}

func byParam(r *http.Request) (string, error) {
	switch v := r.URL.Query().Get("by"); v {
	case "", "count":
		return "count", nil
	case "severity":
		return "severity", nil
	default:
		return "", fmt.Errorf("by %q is not count or severity", v)
	}
}
