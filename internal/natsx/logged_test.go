package natsx

import (
	"bytes"
	"context"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// syncBuf is a log buffer the connection's callbacks write from their own
// goroutine.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A connection made with Logged says once when it loses its server and once
// when it is back, with the server's maximum payload.
func TestLoggedConnectionChanges(t *testing.T) {
	cfg := DefaultServerConfig(t.TempDir())
	cfg.JetStream = false
	s, err := StartServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(u.Port())
	var buf syncBuf
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, err := Connect(ctx, s.ClientURL(), "logged", Logged(zerolog.New(&buf)))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	s.Shutdown()
	waitLog(t, &buf, "NATS connection lost")
	cfg.Port = port
	s2, err := StartServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Shutdown()
	waitLog(t, &buf, "NATS connection regained")
	out := buf.String()
	if n := strings.Count(out, "NATS connection lost"); n != 1 {
		t.Errorf("loss logged %d times, want once:\n%s", n, out)
	}
	if !strings.Contains(out, `"max_payload":8388608`) {
		t.Errorf("the regained connection's log does not give the server's maximum payload:\n%s", out)
	}
}

func waitLog(t *testing.T, buf *syncBuf, msg string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(buf.String(), msg) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in the log after 20s:\n%s", msg, buf.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
