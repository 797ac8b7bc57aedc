package natsx

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// Connect opens a connection to the NATS server(s) at rawURL (comma-separated
// for a cluster). A malformed URL or an unreachable server fails within the
// dial timeout, with an error that names the server but never its
// credentials. Once connected, the connection reconnects for ever.
func Connect(ctx context.Context, rawURL, name string, opts ...nats.Option) (*nats.Conn, error) {
	shown, err := CheckURL(rawURL)
	if err != nil {
		return nil, err
	}
	timeout := 5 * time.Second
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
		timeout = max(time.Until(dl), time.Millisecond)
	}
	all := append([]nats.Option{
		nats.Name(name),
		nats.Timeout(timeout),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectBufSize(64 << 20),
	}, opts...)
	nc, err := nats.Connect(rawURL, all...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", shown, err)
	}
	return nc, nil
}

// CheckURL validates a NATS URL list and returns it with passwords and
// tokens removed, fit for logs and error messages.
func CheckURL(rawURL string) (string, error) {
	if strings.TrimSpace(rawURL) == "" {
		return "", fmt.Errorf("NATS URL is empty")
	}
	var shown []string
	for _, part := range strings.Split(rawURL, ",") {
		part = strings.TrimSpace(part)
		if !strings.Contains(part, "://") {
			part = "nats://" + part
		}
		u, err := url.Parse(part)
		if err != nil {
			return "", fmt.Errorf("NATS URL %q: %w", Redact(part), err)
		}
		switch u.Scheme {
		case "nats", "tls", "ws", "wss":
		default:
			return "", fmt.Errorf("NATS URL %s: scheme %q is not nats, tls, ws or wss", u.Redacted(), u.Scheme)
		}
		if u.Hostname() == "" {
			return "", fmt.Errorf("NATS URL %s: no host", u.Redacted())
		}
		shown = append(shown, Redact(part))
	}
	return strings.Join(shown, ","), nil
}

// Redact removes any user information from a URL.
func Redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		if err != nil {
			return "<unparsable URL>"
		}
		return raw
	}
	u.User = nil
	return u.String()
}
