package load

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/baseline"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
	"github.com/kipimo-hpc/kipimo/internal/stats"
)

var rule = stats.TailRule{Ratio: 1.4, Recur: 5, RecurFrac: 0.005, Resolution: 1, Alpha: 1e-4}

// funcStats are a finished run's final records: MPI_Irecv with its
// histogram, over 20 io_steps.
func funcStats() []provenance.GlobalFuncStats {
	var h stats.TailHist
	for i := range 1000 {
		h.Add(float64(8 + i%5))
	}
	return []provenance.GlobalFuncStats{{PID: 0, FID: 1, Func: "MPI_Irecv", Stats: provenance.FuncStats{Count: 1000, Accumulate: 10000, Mean: 10},
		NaturalHist: &h, IOSteps: 20}}
}

func check(t *testing.T, r *baseline.Reference, err error, source string) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	k := r.Keys["MPI_Irecv"]
	if r.Source != source || r.Kind != baseline.KindRun || r.IOSteps != 20 || k == nil || k.Calls != 1000 || !k.HasModes() || k.P99 != 12 {
		t.Fatalf("reference %+v key %+v: want MPI_Irecv's 1,000 calls over 20 io_steps with its histogram", r, k)
	}
}

// A Kipimo run is read from its store file, its run directory and its
// provdb's HTTP API alike.
func TestReferenceOfRun(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "provenance.db")
	st, err := sqlitestore.Open(ctx, path, sqlitestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Write(ctx, provenance.Batch{Kind: provenance.KindFuncStats, FuncStats: funcStats()}); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	r, err := Reference(ctx, path, Options{Rule: rule})
	check(t, r, err, path)
	r, err = Reference(ctx, dir, Options{Rule: rule})
	check(t, r, err, dir)

	body, err := json.Marshal(map[string]any{"func_stats": funcStats(), "skipped": 0})
	if err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != "/api/v1/func_stats" || req.Header.Get("Authorization") != "Bearer s3cret" {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		w.Write(body)
	}))
	defer srv.Close()
	r, err = Reference(ctx, srv.URL, Options{Rule: rule, TokenFile: tokenFile})
	check(t, r, err, srv.URL)
	if _, err := Reference(ctx, srv.URL, Options{Rule: rule}); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("without the token: %v, want provdb's refusal", err)
	}
}

// A TAU profile gives calls and times only.
func TestReferenceOfTAUProfile(t *testing.T) {
	r, err := Reference(context.Background(), "../../format/tauprofile/testdata/profiles/hatchet-tau-cpi-mpi", Options{Rule: rule})
	if err != nil {
		t.Fatal(err)
	}
	var init *baseline.Key
	for n, k := range r.Keys {
		if strings.HasPrefix(n, "MPI_Init") && !strings.Contains(n, "=>") {
			init = k
		}
	}
	if r.Kind != baseline.KindTAU || r.IOSteps != 0 || init == nil || init.Calls != 4 || init.TotalUs <= 0 || init.HasModes() {
		t.Fatalf("reference %+v MPI_Init %+v: want a TAU reference with MPI_Init's 4 calls (one per rank), no histograms", r, init)
	}
}

func TestReferenceErrors(t *testing.T) {
	ctx := context.Background()
	empty := filepath.Join(t.TempDir(), "empty.db")
	st, err := sqlitestore.Open(ctx, empty, sqlitestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	for _, tc := range []struct{ ref, want string }{
		{"", "empty reference"},
		{empty, "no final func_stats"},
		{"taudb:7", "no TAUdb"},
		{filepath.Join(t.TempDir(), "missing"), ""},
	} {
		if _, err := Reference(ctx, tc.ref, Options{Rule: rule}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Reference(%q): %v, want an error saying %q", tc.ref, err, tc.want)
		}
	}
}

// FuzzDecodeFuncStats: provdb's reply never panics the decoder, and what
// it accepts builds a reference or a clear error.
func FuzzDecodeFuncStats(f *testing.F) {
	good, _ := json.Marshal(map[string]any{"func_stats": funcStats()})
	f.Add(good)
	f.Add([]byte(`{"func_stats":[{"func":"f","stats":{"count":2},"natural_hist":{"lo":5,"counts":[1],"mins":[0.6],"maxs":[0.6]}}]}`))
	f.Add([]byte(`{"func_stats":[],"skipped":3}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		fs, err := DecodeFuncStats(bytes.NewReader(data))
		if err != nil {
			return
		}
		r, err := baseline.FromFuncStats("fuzz", fs, rule)
		if err != nil {
			return
		}
		for _, k := range r.Keys {
			if k.HasModes() && (k.Beyond > k.Calls || k.P0() <= 0 || k.P0() > 1) {
				t.Fatalf("key %+v", k)
			}
		}
	})
}
