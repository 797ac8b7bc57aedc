package daemon

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/rs/zerolog"
)

// TokenPlaces says where a request may carry the bearer token (see the
// package documentation for the rule).
type TokenPlaces int

const (
	// HeaderOnly accepts "Authorization: Bearer <token>" only (provdb's
	// query API).
	HeaderOnly TokenPlaces = iota
	// HeaderOrQuery also accepts ?token=<token> on GET and HEAD requests
	// (the dashboard, opened by a browser).
	HeaderOrQuery
)

// TokenParam is the query parameter that carries the token where
// HeaderOrQuery allows it.
const TokenParam = "token"

// Realm is the realm of every WWW-Authenticate challenge.
const Realm = "kipimo"

// errUnauthorized is the message of every refused request.
var errUnauthorized = errors.New("missing or wrong bearer token")

// Bearer returns next behind the bearer-token rule: with an empty token
// every request passes; otherwise a request passes only with the token in a
// place allows, and ?token= is removed from the request next sees.
func Bearer(token string, places TokenPlaces, next http.Handler) http.Handler {
	if token == "" {
		return next
	}
	want := []byte(token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := tokenOf(r, places)
		if !ok || subtle.ConstantTimeCompare([]byte(got), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="`+Realm+`"`)
			WriteError(w, http.StatusUnauthorized, errUnauthorized)
			return
		}
		if places == HeaderOrQuery {
			r = withoutTokenParam(r)
		}
		next.ServeHTTP(w, r)
	})
}

// tokenOf returns the token r carries where places allows, and whether it
// carries one there.
func tokenOf(r *http.Request, places TokenPlaces) (string, bool) {
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, tok, ok := strings.Cut(h, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") {
			return "", false
		}
		return strings.TrimSpace(tok), true
	}
	if places != HeaderOrQuery || (r.Method != http.MethodGet && r.Method != http.MethodHead) {
		return "", false
	}
	q := r.URL.Query()
	if !q.Has(TokenParam) {
		return "", false
	}
	return q.Get(TokenParam), true
}

// withoutTokenParam returns r without the query parameter TokenParam.
func withoutTokenParam(r *http.Request) *http.Request {
	q := r.URL.Query()
	if !q.Has(TokenParam) {
		return r
	}
	q.Del(TokenParam)
	r2 := r.Clone(r.Context())
	r2.URL.RawQuery = q.Encode()
	r2.RequestURI = r2.URL.RequestURI()
	return r2
}

// ErrorBody is the body of every JSON error answer: {"error":"<message>"}.
type ErrorBody struct {
	Error string `json:"error"`
}

// WriteJSON answers 200 with v as JSON (HTML characters left unescaped)
// and "Cache-Control: no-store": answers are live data.
func WriteJSON(w http.ResponseWriter, v any) {
	writeJSON(w, http.StatusOK, v)
}

// WriteError answers code with ErrorBody{err's message}.
func WriteError(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, ErrorBody{Error: err.Error()})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v) // the status is sent: only a cut answer tells the client
}

// ShutdownTimeout bounds a daemon's graceful shutdown: open HTTP requests,
// pending writes and flushes get this long after the daemon is told to stop.
const ShutdownTimeout = 30 * time.Second

// ShutdownContext is the context of a shutdown that begins when ctx ends:
// not cancelled with ctx, but bounded by ShutdownTimeout.
func ShutdownContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), ShutdownTimeout)
}

// HTTPServer is a daemon's HTTP listener. Listen starts it; its serving
// goroutine is owned by the HTTPServer and ends in Shutdown or Close, which
// its owner calls once.
type HTTPServer struct {
	srv  *http.Server
	ln   net.Listener
	log  zerolog.Logger
	done chan struct{}
	err  error // why Serve ended, when not by Shutdown or Close; read after done
}

// Timeouts of a daemon's HTTP server. A request's head must arrive within
// ReadHeaderTimeout; a kept-alive connection on which no request comes for
// IdleTimeout is closed by the server, so that idle clients cannot hold
// connections (and file descriptors) for ever. Neither bounds a request
// under way: answers that stream (the dashboard's event stream, a listing
// of every record) take as long as they take.
const (
	ReadHeaderTimeout = 10 * time.Second
	IdleTimeout       = 2 * time.Minute
)

// ListenOption changes a setting of Listen.
type ListenOption func(*http.Server)

// WithIdleTimeout closes kept-alive connections idle for d instead of
// IdleTimeout.
func WithIdleTimeout(d time.Duration) ListenOption {
	return func(s *http.Server) { s.IdleTimeout = d }
}

// Listen binds addr (the value of --flag, named in errors) and serves h on
// it until Shutdown or Close, with ReadHeaderTimeout and IdleTimeout.
func Listen(flag, addr string, h http.Handler, log zerolog.Logger, opts ...ListenOption) (*HTTPServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--%s %s: %w", flag, addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: ReadHeaderTimeout, IdleTimeout: IdleTimeout}
	for _, o := range opts {
		o(srv)
	}
	s := &HTTPServer{
		srv:  srv,
		ln:   ln,
		log:  log,
		done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.err = err
			s.log.Error().Err(err).Str("addr", s.Addr()).Msg("HTTP server stopped")
		}
	}()
	log.Info().Str("addr", s.Addr()).Msg("HTTP listening")
	return s, nil
}

// Addr is the address the listener is bound to (with the port chosen when
// addr asked for port 0).
func (s *HTTPServer) Addr() string { return s.ln.Addr().String() }

// Done is closed when the server stops serving, by Shutdown, Close or a
// listener error (Err says which).
func (s *HTTPServer) Done() <-chan struct{} { return s.done }

// Err is why the server stopped serving on its own; nil while it serves and
// after Shutdown or Close.
func (s *HTTPServer) Err() error {
	select {
	case <-s.done:
		return s.err
	default:
		return nil
	}
}

// Shutdown stops accepting connections and waits for the requests under way
// (long-lived streams included) to end, at most until ctx ends, then closes
// what is left.
func (s *HTTPServer) Shutdown(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if err != nil {
		_ = s.srv.Close()
		err = fmt.Errorf("stop HTTP server on %s: %w", s.Addr(), err)
	}
	<-s.done
	return err
}

// Close stops the server at once, cutting the requests under way.
func (s *HTTPServer) Close() {
	_ = s.srv.Close()
	<-s.done
}
