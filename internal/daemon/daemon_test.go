package daemon

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/pflag"
)

func TestBearer(t *testing.T) {
	// next echoes the query it sees, so that the tests can check that the
	// token parameter never reaches the handler.
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, r.URL.RawQuery)
	})
	tests := []struct {
		name      string
		token     string
		places    TokenPlaces
		method    string
		target    string
		header    string
		code      int
		nextQuery string // the query next saw, when it ran
	}{
		{name: "no token configured", places: HeaderOnly, target: "/x?a=1", code: 200, nextQuery: "a=1"},
		{name: "no token configured, query kept", places: HeaderOrQuery, target: "/x?token=t", code: 200, nextQuery: "token=t"},

		{name: "header: right", token: "s3", places: HeaderOnly, target: "/x", header: "Bearer s3", code: 200},
		{name: "header: scheme in lower case", token: "s3", places: HeaderOnly, target: "/x", header: "bearer s3", code: 200},
		{name: "header: missing", token: "s3", places: HeaderOnly, target: "/x", code: 401},
		{name: "header: wrong", token: "s3", places: HeaderOnly, target: "/x", header: "Bearer s4", code: 401},
		{name: "header: prefix of the token", token: "s3cret", places: HeaderOnly, target: "/x", header: "Bearer s3", code: 401},
		{name: "header: other scheme", token: "s3", places: HeaderOnly, target: "/x", header: "Basic s3", code: 401},
		{name: "header: scheme without token", token: "s3", places: HeaderOnly, target: "/x", header: "Bearer", code: 401},
		{name: "header only: query refused", token: "s3", places: HeaderOnly, target: "/x?token=s3", code: 401},

		{name: "header or query: header", token: "s3", places: HeaderOrQuery, target: "/x?a=1", header: "Bearer s3", code: 200, nextQuery: "a=1"},
		{name: "header or query: query, removed before next", token: "s3", places: HeaderOrQuery, target: "/x?a=1&token=s3", code: 200, nextQuery: "a=1"},
		{name: "header or query: HEAD with query", token: "s3", places: HeaderOrQuery, method: http.MethodHead, target: "/x?token=s3", code: 200},
		{name: "header or query: wrong query", token: "s3", places: HeaderOrQuery, target: "/x?token=s4", code: 401},
		{name: "header or query: empty query", token: "s3", places: HeaderOrQuery, target: "/x?token=", code: 401},
		{name: "header or query: POST with query", token: "s3", places: HeaderOrQuery, method: http.MethodPost, target: "/x?token=s3", code: 401},
		{name: "header or query: wrong header decides over right query", token: "s3", places: HeaderOrQuery, target: "/x?token=s3", header: "Bearer s4", code: 401},
		{name: "header or query: neither", token: "s3", places: HeaderOrQuery, target: "/x", code: 401},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			method := tc.method
			if method == "" {
				method = http.MethodGet
			}
			req := httptest.NewRequest(method, tc.target, nil)
			if tc.header != "" {
				req.Header.Set("Authorization", tc.header)
			}
			rec := httptest.NewRecorder()
			Bearer(tc.token, tc.places, next).ServeHTTP(rec, req)
			if rec.Code != tc.code {
				t.Fatalf("status %d, want %d (body %q)", rec.Code, tc.code, rec.Body.String())
			}
			if tc.code == http.StatusUnauthorized {
				if got := rec.Header().Get("WWW-Authenticate"); got != `Bearer realm="kipimo"` {
					t.Errorf("WWW-Authenticate %q", got)
				}
				var e ErrorBody
				if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error != "missing or wrong bearer token" {
					t.Errorf("body %q (%v), want the JSON error", rec.Body.String(), err)
				}
				return
			}
			if method == http.MethodGet && rec.Body.String() != tc.nextQuery {
				t.Errorf("handler saw query %q, want %q", rec.Body.String(), tc.nextQuery)
			}
		})
	}
}

func TestSecret(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	writeMode := func(name, body string, mode os.FileMode) string {
		p := write(name, body)
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name    string
		path    string
		want    string
		wantErr []string // substrings of the error
	}{
		{name: "no file given", path: "", want: ""},
		{name: "token with newline", path: write("nl", "t0k\n"), want: "t0k"},
		{name: "token with surrounding whitespace", path: write("ws", "  \tt0k \r\n"), want: "t0k"},
		{name: "inner space kept", path: write("inner", "a b\n"), want: "a b"},
		{name: "missing file", path: filepath.Join(dir, "nope"), wantErr: []string{"--token-file", "nope", "no such file"}},
		{name: "empty file", path: write("empty", ""), wantErr: []string{"--token-file", "empty", "is empty"}},
		{name: "whitespace only", path: write("blank", " \n\t\n"), wantErr: []string{"--token-file", "blank", "is empty"}},
		{name: "directory", path: dir, wantErr: []string{"--token-file", "read secret"}},
		{name: "readable by its group", path: writeMode("group", "t0k\n", 0o640), want: "t0k"},
		{name: "read-only for its owner", path: writeMode("owner", "t0k\n", 0o400), want: "t0k"},
		{name: "readable by every user", path: writeMode("world", "t0k\n", 0o644), wantErr: []string{"--token-file", "world", "readable by every user", "chmod 600 " + filepath.Join(dir, "world")}},
		{name: "only others may read", path: writeMode("others", "t0k\n", 0o604), wantErr: []string{"chmod 600"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Secret("token-file", tc.path)
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatalf("got %q, want an error", got)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestWriteJSONAndError(t *testing.T) {
	tests := []struct {
		name  string
		write func(w http.ResponseWriter)
		code  int
		body  string
	}{
		{"value", func(w http.ResponseWriter) { WriteJSON(w, map[string]any{"n": 3, "f": "a<b>&c"}) }, 200, `{"f":"a<b>&c","n":3}` + "\n"},
		{"bad request", func(w http.ResponseWriter) { WriteError(w, 400, errors.New(`rank "x" is not a number`)) }, 400, `{"error":"rank \"x\" is not a number"}` + "\n"},
		{"not found", func(w http.ResponseWriter) { WriteError(w, 404, errors.New("no function <f>")) }, 404, `{"error":"no function <f>"}` + "\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			tc.write(rec)
			if rec.Code != tc.code || rec.Body.String() != tc.body {
				t.Errorf("got %d %q, want %d %q", rec.Code, rec.Body.String(), tc.code, tc.body)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			if cc := rec.Header().Get("Cache-Control"); cc != "no-store" {
				t.Errorf("Cache-Control %q", cc)
			}
		})
	}
}

func TestNewLogger(t *testing.T) {
	tests := []struct {
		level   string
		debugOK bool
		infoOK  bool
		err     bool
	}{
		{"debug", true, true, false},
		{"info", false, true, false},
		{"warn", false, false, false},
		{"error", false, false, false},
		{"loud", false, false, true},
		{"", false, false, true},
	}
	for _, tc := range tests {
		t.Run(tc.level, func(t *testing.T) {
			var buf bytes.Buffer
			log, err := NewLogger(&buf, tc.level)
			if tc.err {
				if err == nil || !strings.Contains(err.Error(), "--log-level") {
					t.Fatalf("error %v, want one naming --log-level", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			log.Debug().Msg("d")
			log.Info().Msg("i")
			out := buf.String()
			if strings.Contains(out, `"message":"d"`) != tc.debugOK || strings.Contains(out, `"message":"i"`) != tc.infoOK {
				t.Errorf("level %s logged %q", tc.level, out)
			}
			if tc.infoOK && !strings.Contains(out, `"time":`) {
				t.Errorf("no timestamp in %q", out)
			}
		})
	}
}

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    string
		wantErr string
	}{
		{name: "default", want: "d"},
		{name: "flag", args: []string{"--name", "f"}, want: "f"},
		{name: "environment", env: map[string]string{"KIPIMO_NAME": "e"}, want: "e"},
		{name: "positional", args: []string{"--name", "f", "extra"}, wantErr: `unexpected arguments ["extra"]: tool takes no arguments`},
		{name: "one dash", args: []string{"-name", "f"}, wantErr: "use --name"},
		{name: "help", args: []string{"--help"}, wantErr: pflag.ErrHelp.Error()},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fs := pflag.NewFlagSet("tool", pflag.ContinueOnError)
			v := fs.String("name", "d", "a name")
			var stderr bytes.Buffer
			err := ParseFlags(fs, "tool", "Usage: tool", tc.args, func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }, &stderr)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || *v != tc.want {
				t.Fatalf("got %q, %v; want %q", *v, err, tc.want)
			}
		})
	}
}

func TestExitCode(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want int
	}{
		{"success", nil, 0},
		{"help", pflag.ErrHelp, 0},
		{"wrapped help", fmt.Errorf("parse: %w", pflag.ErrHelp), 0},
		{"failure", errors.New("boom"), 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := ExitCode(tc.err); got != tc.want {
				t.Errorf("ExitCode(%v) = %d, want %d", tc.err, got, tc.want)
			}
		})
	}
}

// TestHTTPServerLifecycle: Listen serves on 127.0.0.1, Shutdown waits for a
// request under way and ends serving; a taken address is an error naming the
// flag.
func TestHTTPServerLifecycle(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(started)
			<-release
		}
		WriteJSON(w, map[string]string{"path": r.URL.Path})
	})
	s, err := Listen("http", "127.0.0.1:0", h, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	res, err := http.Get("http://" + s.Addr() + "/a")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if string(body) != `{"path":"/a"}`+"\n" {
		t.Fatalf("body %q", body)
	}
	if _, err := Listen("http", s.Addr(), h, zerolog.Nop()); err == nil || !strings.Contains(err.Error(), "--http "+s.Addr()) {
		t.Errorf("second listener on %s: %v, want an error naming --http", s.Addr(), err)
	}
	slow := make(chan error, 1)
	go func() {
		res, err := http.Get("http://" + s.Addr() + "/slow")
		if err == nil {
			_, err = io.ReadAll(res.Body)
			res.Body.Close()
		}
		slow <- err
	}()
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- s.Shutdown(ctx) }()
	select {
	case err := <-stopped:
		t.Fatalf("Shutdown returned (%v) with a request under way", err)
	case <-s.Done():
		t.Fatal("serving ended with a request under way")
	default:
	}
	close(release)
	if err := <-slow; err != nil {
		t.Errorf("request under way: %v", err)
	}
	if err := <-stopped; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if s.Err() != nil {
		t.Errorf("Err after Shutdown: %v", s.Err())
	}
	if _, err := http.Get("http://" + s.Addr() + "/a"); err == nil {
		t.Error("still serving after Shutdown")
	}
}

// TestHTTPServerClosesIdleConnections: a kept-alive connection on which no
// request comes is closed by the server once its idle timeout passes, and
// a daemon's server has the timeouts of the package.
func TestHTTPServerClosesIdleConnections(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { WriteJSON(w, "ok") })
	def, err := Listen("http", "127.0.0.1:0", h, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer def.Close()
	if def.srv.IdleTimeout != IdleTimeout || def.srv.ReadHeaderTimeout != ReadHeaderTimeout || IdleTimeout <= 0 {
		t.Fatalf("idle timeout %v and read-header timeout %v, want %v and %v", def.srv.IdleTimeout, def.srv.ReadHeaderTimeout, IdleTimeout, ReadHeaderTimeout)
	}
	s, err := Listen("http", "127.0.0.1:0", h, zerolog.Nop(), WithIdleTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	conn, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET /a HTTP/1.1\r\nHost: kipimo\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(res.Body); err != nil || res.StatusCode != 200 || res.Close {
		t.Fatalf("answer %d (close %v, %v): want 200 on a kept-alive connection", res.StatusCode, res.Close, err)
	}
	// Idle now: the server must close the connection well before this
	// bound (which only keeps a failing test from hanging).
	if err := conn.SetReadDeadline(time.Now().Add(20 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if n, err := br.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("idle connection: read %d bytes, %v; want it closed by the server (EOF)", n, err)
	}
}
