package natsx

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
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

// Logged makes a connection log to log when it loses its server and when
// it reconnects (with the server's URL and its maximum payload), once per
// change, and the asynchronous errors the server reports (a slow consumer,
// a permission refused: at the 1st, 2nd, 4th... report), never once per
// message. Each component that connects passes it to Connect.
func Logged(log zerolog.Logger) nats.Option {
	return func(o *nats.Options) error {
		// A connection closed by its owner says nothing more: its
		// callbacks run after Close returns, when the owner's logger may
		// be gone.
		o.DisconnectedErrCB = func(nc *nats.Conn, err error) {
			if nc.IsClosed() {
				return
			}
			ev := log.Warn()
			if err != nil {
				ev = ev.Err(err)
			}
			ev.Msg("NATS connection lost: reconnecting")
		}
		o.ReconnectedCB = func(nc *nats.Conn) {
			log.Info().Str("server", Redact(nc.ConnectedUrlRedacted())).Int64("max_payload", nc.MaxPayload()).
				Uint64("reconnects", nc.Stats().Reconnects).Msg("NATS connection regained")
		}
		var asyncErrs atomic.Uint64
		o.AsyncErrorCB = func(_ *nats.Conn, sub *nats.Subscription, err error) {
			// A slow consumer is reported each time it falls behind again:
			// logged at the 1st, 2nd, 4th... report.
			if n := asyncErrs.Add(1); n&(n-1) != 0 {
				return
			}
			ev := log.Warn().Err(err).Uint64("reports", asyncErrs.Load())
			if sub != nil {
				ev = ev.Str("subject", sub.Subject)
			}
			ev.Msg("NATS reported an error")
		}
		return nil
	}
}
