package provdb

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/daemon"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// HTTPOption configures the query API.
type HTTPOption func(*httpAPI)

// WithAllowOrigin sets the Access-Control-Allow-Origin header of every
// answer (e.g. the pserver dashboard's origin, or "*").
func WithAllowOrigin(origin string) HTTPOption {
	return func(h *httpAPI) { h.origin = origin }
}

// WithStats adds the consumer's counters to /api/v1/health.
func WithStats(stats func() Stats) HTTPOption {
	return func(h *httpAPI) { h.stats = stats }
}

// WithLogger sets where the API logs the stored records with bad documents
// its answers leave out: one line at most every badLogEvery, with the
// count (default: none).
func WithLogger(log zerolog.Logger) HTTPOption {
	return func(h *httpAPI) { h.log = log }
}

// WithListPage sets the number of records an answer of /api/v1/records
// holds when its limit is 0 (default ListPage).
func WithListPage(n int) HTTPOption {
	return func(h *httpAPI) {
		if n > 0 {
			h.listPage = min(n, provenance.MaxLimit)
		}
	}
}

type httpAPI struct {
	listPage int
	store    provenance.Store
	token    string
	origin   string
	stats    func() Stats
	log      zerolog.Logger
	// skipped counts the stored records with bad documents left out of
	// answers; skipLog rate-limits the lines about them.
	skipped atomic.Int64
	skipLog rateLog
}

// noteSkips counts and logs the records an answer left out.
func (h *httpAPI) noteSkips(sk *provenance.Skips) {
	n := sk.Count()
	if n == 0 {
		return
	}
	total := h.skipped.Add(n)
	if ok, held := h.skipLog.allow(time.Now()); ok {
		h.log.Warn().Err(sk.First()).Int64("skipped", n).Int64("skipped_total", total).Int64("not_logged", held).
			Msg("records with bad stored documents left out of an answer (logged at most once a minute)")
	}
}

// NewHTTPHandler returns the read-only JSON query API on store. When token
// is not empty every request must carry "Authorization: Bearer <token>"
// (internal/daemon's rule; the API takes no ?token=).
//
//	GET /api/v1/health                          {"status":"ok", ...}
//	GET /api/v1/records?<filters>&cursor=<next> {"records":[...],"skipped":n,"next":"<cursor>"}
//	GET /api/v1/records/<kind>/<pid>/<event_id> one record whole
//	GET /api/v1/count?<filters>                 {"count":n}
//	GET /api/v1/aggregate?by=rank|func|step|rank,func&<filters> {"groups":[...]}
//	GET /api/v1/timeline?record=<event_id>|steps=A-B|ranks=LIST a Perfetto timeline (timeline.go)
//
// Filters are those of provenance.ParseQuery; unknown or malformed ones get
// 400 with a message naming them.
//
// /api/v1/records pages: an answer holds at most limit records (MaxLimit at
// most; limit=0, every record, gives pages of ListPage or WithListPage), streamed as they
// are read. When more records match after its last one, it ends with
// "next", a cursor: asking again with cursor=<next> (and the same filters,
// sort and order) gives the records after it, each once even where sort
// values tie, until an answer has no "next". An error after the first
// record aborts the answer, so that a client never takes a cut answer for
// a whole one. A stored record whose document is bad is left out of the
// answer, which then says how many were ("skipped", absent when none; the
// records of a page and its "next" are counted without them); the API
// logs them (WithLogger) and /api/v1/health counts them all ("skipped").
func NewHTTPHandler(store provenance.Store, token string, opts ...HTTPOption) http.Handler {
	h := &httpAPI{store: store, token: token, listPage: ListPage, log: zerolog.Nop(), skipLog: rateLog{every: badLogEvery}}
	for _, o := range opts {
		o(h)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/health", h.health)
	mux.HandleFunc("GET /api/v1/records", h.records)
	mux.HandleFunc("GET /api/v1/records/{kind}/{pid}/{event_id}", h.record)
	mux.HandleFunc("GET /api/v1/count", h.count)
	mux.HandleFunc("GET /api/v1/aggregate", h.aggregate)
	mux.HandleFunc("GET /api/v1/func_stats", h.funcStats)
	mux.HandleFunc("GET /api/v1/timeline", h.timeline)
	return h.wrap(mux)
}

// wrap adds the CORS headers (preflight requests pass without a token, as
// browsers send them without one), the bearer-token rule of
// internal/daemon (the header only) and the read-only method check.
func (h *httpAPI) wrap(next http.Handler) http.Handler {
	readOnly := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			writeError(w, http.StatusMethodNotAllowed, fmt.Errorf("method %s not allowed: the API is read-only", r.Method))
			return
		}
		next.ServeHTTP(w, r)
	})
	guarded := daemon.Bearer(h.token, daemon.HeaderOnly, readOnly)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h.origin != "" {
			w.Header().Set("Access-Control-Allow-Origin", h.origin)
			w.Header().Set("Access-Control-Allow-Headers", "Authorization")
			w.Header().Set("Vary", "Origin")
		}
		if r.Method == http.MethodOptions {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		guarded.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, v any) { daemon.WriteJSON(w, v) }

func writeError(w http.ResponseWriter, code int, err error) { daemon.WriteError(w, code, err) }

func (h *httpAPI) health(w http.ResponseWriter, r *http.Request) {
	if len(r.URL.Query()) > 0 {
		writeError(w, http.StatusBadRequest, errors.New("health takes no parameters"))
		return
	}
	n, err := h.store.Count(r.Context(), provenance.Query{})
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err)
		return
	}
	out := map[string]any{"status": "ok", "anomalies": n, "skipped": h.skipped.Load()}
	if h.stats != nil {
		out["consumer"] = h.stats()
	}
	writeJSON(w, out)
}

func parse(w http.ResponseWriter, r *http.Request, allowBy bool) (provenance.Query, bool) {
	v := r.URL.Query()
	if !allowBy && v.Has("by") {
		writeError(w, http.StatusBadRequest, errors.New(`parameter "by" belongs to /api/v1/aggregate`))
		return provenance.Query{}, false
	}
	q, err := provenance.ParseQuery(v)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return q, false
	}
	return q, true
}

// ListPage is the number of records an answer of /api/v1/records holds
// when its limit is 0 (every record); "next" resumes after them.
const ListPage = 10000

// errPageFull stops a page's stream at the record after its last.
var errPageFull = errors.New("page full")

func (h *httpAPI) records(w http.ResponseWriter, r *http.Request) {
	q, ok := parse(w, r, false)
	if !ok {
		return
	}
	if !provenance.IsExecKind(q.Kind) {
		writeError(w, http.StatusBadRequest, fmt.Errorf("kind %s cannot be listed: use anomalies or normalexecs", q.Kind))
		return
	}
	page := q.Limit
	if page == provenance.NoLimit {
		page = h.listPage
	}
	page = min(page, provenance.MaxLimit)
	// One record more than the page tells whether "next" is due.
	sq := q
	sq.Limit = page + 1
	var (
		bw      *bufio.Writer
		buf     bytes.Buffer
		n       int
		last    provenance.Exec
		next    *provenance.Cursor
		started bool
	)
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	start := func() {
		started = true
		w.Header().Set("Content-Type", "application/json")
		bw = bufio.NewWriterSize(w, 64<<10)
		bw.WriteString(`{"records":[`)
	}
	var sk provenance.Skips
	defer h.noteSkips(&sk)
	err := h.store.Each(provenance.WithSkips(r.Context(), &sk), sq, func(e provenance.Exec) error {
		if n == page {
			next = provenance.CursorAfter(q, &last)
			return errPageFull
		}
		if !started {
			start()
		}
		buf.Reset()
		if err := enc.Encode(&e); err != nil {
			return fmt.Errorf("encode record %s: %w", provenance.ExecKey(e.PID, e.EventID), err)
		}
		if n > 0 {
			bw.WriteByte(',')
		}
		if _, err := bw.Write(bytes.TrimSuffix(buf.Bytes(), []byte("\n"))); err != nil {
			return fmt.Errorf("write records: %w", err)
		}
		n++
		last = e
		return nil
	})
	if err != nil && !errors.Is(err, errPageFull) {
		if started {
			// The status is sent: only a cut connection tells the client.
			panic(http.ErrAbortHandler)
		}
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	if !started {
		start()
	}
	bw.WriteByte(']')
	if n := sk.Count(); n > 0 {
		bw.WriteString(`,"skipped":` + strconv.FormatInt(n, 10))
	}
	if next != nil {
		bw.WriteString(`,"next":"` + next.String() + `"`)
	}
	bw.WriteString("}\n")
	_ = bw.Flush()
}

func (h *httpAPI) record(w http.ResponseWriter, r *http.Request) {
	kind := provenance.Kind(r.PathValue("kind"))
	if !provenance.IsExecKind(kind) {
		writeError(w, http.StatusBadRequest, fmt.Errorf("kind %q is not anomalies or normalexecs", kind))
		return
	}
	pid, err := strconv.ParseUint(r.PathValue("pid"), 10, 32)
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("program %q is not a non-negative 32-bit integer", r.PathValue("pid")))
		return
	}
	id := r.PathValue("event_id")
	if _, _, _, err := provenance.ParseEventID(id); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	e, err := h.store.Get(r.Context(), kind, uint32(pid), id)
	if errors.Is(err, provenance.ErrNotFound) {
		writeError(w, http.StatusNotFound, err)
		return
	}
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, e)
}

func (h *httpAPI) count(w http.ResponseWriter, r *http.Request) {
	q, ok := parse(w, r, false)
	if !ok {
		return
	}
	n, err := h.store.Count(r.Context(), q)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, map[string]any{"kind": q.Kind, "count": n})
}

// funcStats answers {"func_stats":[...]}: every func_stats record, in
// (pid, func) order; the run's final statistics and natural ranges.
func (h *httpAPI) funcStats(w http.ResponseWriter, r *http.Request) {
	if len(r.URL.Query()) > 0 {
		writeError(w, http.StatusBadRequest, errors.New("func_stats takes no parameters"))
		return
	}
	out := []provenance.GlobalFuncStats{}
	var sk provenance.Skips
	defer h.noteSkips(&sk)
	if err := h.store.FuncStats(provenance.WithSkips(r.Context(), &sk), func(f provenance.GlobalFuncStats) error {
		out = append(out, f)
		return nil
	}); err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	reply := map[string]any{"func_stats": out}
	if n := sk.Count(); n > 0 {
		reply["skipped"] = n
	}
	writeJSON(w, reply)
}

func (h *httpAPI) aggregate(w http.ResponseWriter, r *http.Request) {
	q, ok := parse(w, r, true)
	if !ok {
		return
	}
	by, err := provenance.ParseGroupBy(r.URL.Query().Get("by"))
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	if !provenance.IsExecKind(q.Kind) {
		writeError(w, http.StatusBadRequest, fmt.Errorf("kind %s cannot be aggregated: use anomalies or normalexecs", q.Kind))
		return
	}
	gs, err := h.store.Aggregate(r.Context(), q, by)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	if gs == nil {
		gs = []provenance.Group{}
	}
	writeJSON(w, map[string]any{"by": by, "groups": gs})
}
