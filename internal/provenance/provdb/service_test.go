package provdb

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provstream"
	"github.com/kipimo-hpc/kipimo/internal/provenance/storetest"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestServiceCountsAndTerminatesBadBatches publishes good batches of every
// kind mixed with undecodable ones: the good are stored and acknowledged,
// the bad counted, terminated (never redelivered) and logged once per kind.
func TestServiceCountsAndTerminatesBadBatches(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _, js, store := jetStreamAndStore(ctx, t)
	var logs syncBuffer
	log := zerolog.New(&logs)
	svc := New(Config{Run: "r", Fetch: 4, FetchWait: 200 * time.Millisecond}, store, js, log)
	if err := svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	subj := func(kind provenance.Kind) string { return provstream.Subject("r", kind) }
	execs := storetest.Generate(storetest.GenConfig{Seed: 8, N: 90, Anomaly: true})
	meta, fs, cs, prof := storetest.GenerateOthers(0, 3)
	bad := 0
	pubBad := func(kind provenance.Kind, data string) {
		t.Helper()
		bad++
		m := &nats.Msg{Subject: subj(kind), Data: []byte(data), Header: nats.Header{}}
		m.Header.Set(jetstream.MsgIDHeader, "bad"+string(rune('a'+bad)))
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		if err := provstream.PublishBatch(ctx, js, subj(provenance.KindAnomalies), "a"+string(rune('0'+i)), execs[i*30:(i+1)*30]); err != nil {
			t.Fatal(err)
		}
		pubBad(provenance.KindAnomalies, `{"not":"an array"}`)
	}
	pubBad(provenance.KindAnomalies, `[{"event_id":"no colons"}]`)
	pubBad(provenance.KindMetadata, `[{"descr":""}]`)
	for kind, recs := range map[provenance.Kind]any{provenance.KindMetadata: meta, provenance.KindFuncStats: fs, provenance.KindCounterStats: cs, provenance.KindProfiles: prof} {
		if err := provstream.PublishBatch(ctx, js, subj(kind), string(kind), recs); err != nil {
			t.Fatal(err)
		}
	}
	for svc.Stats().Batches < 7 || svc.Stats().Bad < int64(bad) {
		if ctx.Err() != nil {
			t.Fatalf("stats %+v, want 7 batches and %d bad", svc.Stats(), bad)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cons, err := js.Consumer(ctx, natsx.ProvStream("r"), "provdb")
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumAckPending != 0 || info.NumPending != 0 || info.NumRedelivered != 0 {
		t.Fatalf("consumer: %d pending acks, %d pending, %d redelivered; bad batches must be terminated", info.NumAckPending, info.NumPending, info.NumRedelivered)
	}
	if err := svc.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	st := svc.Stats()
	want := map[provenance.Kind]int64{provenance.KindAnomalies: 90, provenance.KindMetadata: int64(len(meta)), provenance.KindFuncStats: int64(len(fs)), provenance.KindCounterStats: int64(len(cs)), provenance.KindProfiles: int64(len(prof)), provenance.KindNormalExecs: 0}
	for k, n := range want {
		if st.Written[k] != n {
			t.Errorf("written %s = %d, want %d", k, st.Written[k], n)
		}
		c, err := store.Count(ctx, provenance.Query{Kind: k})
		if err != nil || c != n {
			t.Errorf("store holds %d %s (%v), want %d", c, k, err, n)
		}
	}
	if st.Bad != int64(bad) {
		t.Errorf("bad = %d, want %d", st.Bad, bad)
	}
	if n := strings.Count(logs.String(), "bad provenance batch"); n != 2 {
		t.Errorf("%d log lines about bad batches, want 2 (one per kind):\n%s", n, logs.String())
	}
}

func TestMainFlagErrors(t *testing.T) {
	ctx := context.Background()
	cases := map[string]struct {
		args []string
		want string
	}{
		"no run":        {[]string{"--store", filepath.Join(t.TempDir(), "p.db")}, "--run is required"},
		"bad run":       {[]string{"--run", "a.b"}, "--run"},
		"stray arg":     {[]string{"--run", "r", "extra"}, "no arguments"},
		"bad log level": {[]string{"--run", "r", "--log-level", "loud"}, "--log-level"},
		"no token file": {[]string{"--run", "r", "--token-file", filepath.Join(t.TempDir(), "none")}, "--token-file"},
		"bad nats url":  {[]string{"--run", "r", "--store", filepath.Join(t.TempDir(), "p.db"), "--nats", "http://x"}, "scheme"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var stderr bytes.Buffer
			err := Main(ctx, tc.args, &stderr)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// TestMainEndToEnd runs provdb as its main does: records published on the
// run's stream become visible through the HTTP API (with a token), and
// cancelling the context (SIGTERM) stops it cleanly.
func TestMainEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dir := t.TempDir()
	srv, err := natsx.StartServer(natsx.DefaultServerConfig(dir))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("t0k\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	var stderr syncBuffer
	go func() {
		done <- Main(runCtx, []string{"--nats", srv.ClientURL(), "--store", filepath.Join(dir, "p.db"), "--run", "e2e", "--http", addr, "--token-file", tokenFile}, &stderr)
	}()
	nc, err := natsx.Connect(ctx, srv.ClientURL(), "producer")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := provstream.EnsureStream(ctx, js, "e2e"); err != nil {
		t.Fatal(err)
	}
	execs := storetest.Generate(storetest.GenConfig{Seed: 12, N: 30, Anomaly: true})
	if err := provstream.PublishBatch(ctx, js, provstream.Subject("e2e", provenance.KindAnomalies), "e2e-0", execs); err != nil {
		t.Fatal(err)
	}
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/api/v1/count", nil)
		req.Header.Set("Authorization", "Bearer t0k")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			var c struct{ Count int64 }
			_ = json.NewDecoder(resp.Body).Decode(&c)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && c.Count == 30 {
				break
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("records never visible through the API (last error %v); log:\n%s", err, stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("provdb stopped with %v", err)
	}
	if !strings.Contains(stderr.String(), "provdb stopped") {
		t.Fatalf("no clean-shutdown log line:\n%s", stderr.String())
	}
}
