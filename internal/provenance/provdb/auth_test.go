package provdb

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/daemon"
)

// TestHTTPAuthRule: the query API follows internal/daemon's rule for
// programs: the Authorization header only (no ?token=), CORS preflights
// without a token, refusals as 401 with the JSON error, and read-only
// methods once authorised.
func TestHTTPAuthRule(t *testing.T) {
	s, _ := filledStore(t)
	srv := httptest.NewServer(NewHTTPHandler(s, "s3cret", WithAllowOrigin("http://127.0.0.1:8080")))
	defer srv.Close()
	tests := []struct {
		name   string
		method string
		path   string
		header string
		code   int
	}{
		{"header", http.MethodGet, "/api/v1/count", "Bearer s3cret", 200},
		{"header, scheme in lower case", http.MethodGet, "/api/v1/count", "bearer s3cret", 200},
		{"no token", http.MethodGet, "/api/v1/count", "", 401},
		{"wrong token", http.MethodGet, "/api/v1/count", "Bearer nope", 401},
		{"query parameter is not accepted", http.MethodGet, "/api/v1/count?token=s3cret", "", 401},
		{"preflight without token", http.MethodOptions, "/api/v1/count", "", 204},
		{"write refused once authorised", http.MethodPost, "/api/v1/count", "Bearer s3cret", 405},
		{"write without token refused as unauthorised", http.MethodPost, "/api/v1/count", "", 401},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, srv.URL+tc.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.header != "" {
				req.Header.Set("Authorization", tc.header)
			}
			res, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			if res.StatusCode != tc.code {
				t.Fatalf("status %d, want %d", res.StatusCode, tc.code)
			}
			if got := res.Header.Get("Access-Control-Allow-Origin"); got != "http://127.0.0.1:8080" {
				t.Errorf("Access-Control-Allow-Origin %q", got)
			}
			if tc.code == http.StatusUnauthorized || tc.code == http.StatusMethodNotAllowed {
				var e daemon.ErrorBody
				if err := json.NewDecoder(res.Body).Decode(&e); err != nil || e.Error == "" {
					t.Errorf("error body: %v %+v", err, e)
				}
			}
			if tc.code == http.StatusUnauthorized && res.Header.Get("WWW-Authenticate") != `Bearer realm="kipimo"` {
				t.Errorf("WWW-Authenticate %q", res.Header.Get("WWW-Authenticate"))
			}
		})
	}
}
