package natsx

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestEmbeddedServerRoundTrip(t *testing.T) {
	s, err := StartServer(DefaultServerConfig(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	if !strings.HasPrefix(s.ClientURL(), "nats://127.0.0.1:") {
		t.Fatalf("client URL %q is not on loopback", s.ClientURL())
	}
	nc, err := Connect(context.Background(), s.ClientURL(), "test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sub, err := nc.SubscribeSync(Subjects{Run: "r1"}.Frames(0, 3))
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish("kipimo.r1.frames.0.3", []byte("x")); err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsg(2 * time.Second)
	if err != nil || string(m.Data) != "x" {
		t.Fatalf("got %v, %v", m, err)
	}
}

func TestConnectErrors(t *testing.T) {
	cases := []struct {
		name, url, want string
	}{
		{"empty", "", "empty"},
		{"bad scheme", "http://127.0.0.1:4222", "scheme"},
		{"no host", "nats://:4222", "no host"},
		{"unreachable", "nats://127.0.0.1:1", "connect to NATS at nats://127.0.0.1:1"},
		{"password hidden", "nats://alice:s3cret@127.0.0.1:1", "nats://127.0.0.1:1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			_, err := Connect(ctx, tc.url, "test")
			if err == nil {
				t.Fatal("connected")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Fatalf("error leaks the password: %q", err)
			}
		})
	}
}

func TestValidRun(t *testing.T) {
	for _, ok := range []string{"run1", "a-b_C9"} {
		if err := ValidRun(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "a.b", "a b", "a*", "a>"} {
		if err := ValidRun(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
