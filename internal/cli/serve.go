package cli

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	_ "modernc.org/sqlite" // database/sql driver "sqlite", for the func_stats table

	"github.com/kipimo-hpc/kipimo/internal/daemon"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provdb"
	"github.com/kipimo-hpc/kipimo/internal/pserver"
	"github.com/kipimo-hpc/kipimo/internal/run"
)

type serveOpts struct {
	store     string
	http      string
	run       string
	window    int
	tokenFile string
}

func newServeCmd() *cobra.Command {
	var o serveOpts
	cmd := &cobra.Command{
		Use:   "serve --store FILE",
		Short: "Serve the dashboard of a finished run from its provenance store",
		Long: `Serve the dashboard of a finished run from its provenance store alone, with no
detector, parameter server or NATS: the heat map of anomalies per rank and
io_step, the anomalies per io_step, the top ranks and functions, the function
table (from the run's func_stats records), each function's runtime histogram
with its detection threshold (built from the stored executions), and the
anomaly list with call stacks, event windows and GPU contexts, and the culprit
analysis (outlier ranks and culprits by time lost) from the culprits.json that
kipimo run writes beside its store. The store is opened read-only; the server
runs until interrupted.`,
		Example: `  kipimo run --out kipimo-out --run r1 ...                # keeps kipimo-out/r1/provenance.db
  kipimo serve --store kipimo-out/r1/provenance.db        # later: its dashboard on a free port
  kipimo serve --store kipimo-out/r1/provenance.db --http 127.0.0.1:8080`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return o.serve(cmd) },
	}
	f := cmd.Flags()
	f.StringVar(&o.store, "store", "", "provenance store of the run: a SQLite file (or a mongodb:// URI, without func_stats)")
	f.StringVar(&o.http, "http", "127.0.0.1:0", "dashboard address (port 0 picks a free port)")
	f.StringVar(&o.run, "run", "", "run name shown on the page (default: the store's directory for provenance.db, else its file name)")
	f.IntVar(&o.window, "window", pserver.DefaultWindow, "io_steps shown in the heat map (the last ones)")
	f.StringVar(&o.tokenFile, "token-file", "", "file holding a bearer token the browser must give (?token=)")
	_ = cmd.MarkFlagRequired("store")
	return cmd
}

func (o *serveOpts) serve(cmd *cobra.Command) error {
	ctx := cmd.Context()
	if o.window <= 0 {
		return fmt.Errorf("--window %d: want a positive number of io_steps", o.window)
	}
	token, err := daemon.Secret("token-file", o.tokenFile)
	if err != nil {
		return err
	}
	mongo := strings.HasPrefix(o.store, "mongodb://") || strings.HasPrefix(o.store, "mongodb+srv://")
	st, err := provdb.OpenStore(ctx, o.store, true)
	if err != nil {
		return err
	}
	defer st.Close()
	var fs []provenance.GlobalFuncStats
	if !mongo {
		if fs, err = readFuncStats(ctx, o.store); err != nil {
			return err
		}
	}
	name := o.run
	if name == "" {
		name = strings.TrimSuffix(filepath.Base(o.store), filepath.Ext(o.store))
		if name == "provenance" { // kipimo run's <out>/<run>/provenance.db
			name = filepath.Base(filepath.Dir(o.store))
		}
		if mongo {
			name = "stored"
		}
	}
	var culprits *pserver.Culprits
	if !mongo {
		if culprits, err = culpritsBeside(o.store); err != nil {
			return err
		}
	}
	t0 := time.Now()
	d, err := pserver.NewStoreDashboard(ctx, st, pserver.StoreOptions{Run: name, Window: o.window, Token: token, FuncStats: fs, Culprits: culprits})
	if err != nil {
		return err
	}
	var sum pserver.Summary
	if err := getLocal(d.Handler(), "/api/summary", token, &sum); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.http)
	if err != nil {
		return fmt.Errorf("--http %s: %w", o.http, err)
	}
	srv := &http.Server{Handler: d.Handler(), ReadHeaderTimeout: 10 * time.Second}
	out := cmd.OutOrStdout()
	fmt.Fprintf(out, "run %s from %s: %d anomalies on %d ranks over %d io_steps, %d functions with final statistics (read in %s)\n",
		name, o.store, sum.Totals.Anomalies, sum.Ranks, sum.Totals.Steps, len(fs), time.Since(t0).Round(time.Millisecond))
	if len(fs) == 0 {
		fmt.Fprintln(out, "note: the store holds no func_stats records (the run did not finish, or they are in MongoDB): the function table shows anomaly counts only")
	}
	if culprits == nil && !mongo {
		fmt.Fprintf(out, "note: no %s beside the store (kipimo run writes it when the run ends): the culprit panel is empty\n", run.CulpritsFile)
	}
	if d.Truncated > 0 {
		fmt.Fprintf(out, "note: %d anomaly records not read: an io_step holds more than %d\n", d.Truncated, provenance.MaxLimit)
	}
	u := "http://" + ln.Addr().String() + "/"
	if token != "" {
		u += "?token=" + url.QueryEscape(token)
	}
	fmt.Fprintf(out, "dashboard: %s (until interrupted)\n", u)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("dashboard server: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if srv.Shutdown(sctx) != nil {
		_ = srv.Close() // an open event stream never goes idle
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// culpritsBeside reads the culprit analysis kipimo run writes beside its
// provenance store (culprits.json in the run's directory), or returns nil
// when there is none.
func culpritsBeside(store string) (*pserver.Culprits, error) {
	path := filepath.Join(filepath.Dir(store), run.CulpritsFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var c pserver.Culprits
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return &c, nil
}

// readFuncStats reads the func_stats records of a SQLite provenance store:
// provenance.Store has no method listing them, so the table is read directly,
// read-only.
func readFuncStats(ctx context.Context, path string) ([]provenance.GlobalFuncStats, error) {
	u := url.URL{Scheme: "file", Opaque: path, RawQuery: "mode=ro&_pragma=query_only(1)&_pragma=busy_timeout(10000)"}
	db, err := sql.Open("sqlite", u.String())
	if err != nil {
		return nil, fmt.Errorf("read func_stats of %s: %w", path, err)
	}
	defer db.Close()
	rows, err := db.QueryContext(ctx, `SELECT doc FROM func_stats ORDER BY func, pid`)
	if err != nil {
		return nil, fmt.Errorf("read func_stats of %s: %w", path, err)
	}
	defer rows.Close()
	var out []provenance.GlobalFuncStats
	for rows.Next() {
		var doc []byte
		if err := rows.Scan(&doc); err != nil {
			return nil, fmt.Errorf("read func_stats of %s: %w", path, err)
		}
		var f provenance.GlobalFuncStats
		if err := json.Unmarshal(doc, &f); err != nil {
			return nil, fmt.Errorf("read func_stats of %s: record %d: %w", path, len(out), err)
		}
		out = append(out, f)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read func_stats of %s: %w", path, err)
	}
	return out, nil
}

// getLocal answers GET path from h in process, decoding the JSON into v.
func getLocal(h http.Handler, path, token string, v any) error {
	req, err := http.NewRequest(http.MethodGet, path, nil)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := &memResponse{header: http.Header{}}
	h.ServeHTTP(rec, req)
	if rec.code != 0 && rec.code != http.StatusOK {
		return fmt.Errorf("GET %s: %d %s", path, rec.code, rec.body.String())
	}
	return json.Unmarshal([]byte(rec.body.String()), v)
}

// memResponse is a minimal in-memory http.ResponseWriter.
type memResponse struct {
	header http.Header
	code   int
	body   strings.Builder
}

func (m *memResponse) Header() http.Header         { return m.header }
func (m *memResponse) WriteHeader(code int)        { m.code = code }
func (m *memResponse) Write(b []byte) (int, error) { return m.body.Write(b) }
