package natsx

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// ServerConfig configures an embedded NATS server.
type ServerConfig struct {
	// Dir holds JetStream's store (Dir/jetstream). Required when JetStream is on.
	Dir string
	// Host is the listen address; default 127.0.0.1.
	Host string
	// Port is the client port; 0 or -1 picks a free port.
	Port int
	// JetStream enables persistence. Default on (see DefaultServerConfig).
	JetStream bool
	// MaxPayload is the largest message in bytes; default 8 MiB.
	MaxPayload int32
	// StartTimeout bounds how long Start waits for the server to accept clients.
	StartTimeout time.Duration
}

// DefaultServerConfig is a loopback server on a free port with JetStream in dir.
func DefaultServerConfig(dir string) ServerConfig {
	return ServerConfig{Dir: dir, Host: "127.0.0.1", Port: -1, JetStream: true, MaxPayload: 8 << 20, StartTimeout: 10 * time.Second}
}

// Validate checks cfg and fills defaults.
func (c *ServerConfig) Validate() error {
	if c.Host == "" {
		c.Host = "127.0.0.1"
	}
	if net.ParseIP(c.Host) == nil && c.Host != "localhost" {
		return fmt.Errorf("embedded NATS: host %q is not an IP address", c.Host)
	}
	if c.Port == 0 {
		c.Port = -1
	}
	if c.Port < -1 || c.Port > 65535 {
		return fmt.Errorf("embedded NATS: port %d out of range", c.Port)
	}
	if c.JetStream && c.Dir == "" {
		return errors.New("embedded NATS: JetStream needs a store directory")
	}
	if c.MaxPayload <= 0 {
		c.MaxPayload = 8 << 20
	}
	if c.StartTimeout <= 0 {
		c.StartTimeout = 10 * time.Second
	}
	return nil
}

// Server is an in-process NATS server. It is owned by whoever started it, who
// must call Shutdown; its methods are safe for concurrent use.
type Server struct {
	ns *server.Server
}

// StartServer starts an embedded NATS server and waits until it accepts clients.
func StartServer(cfg ServerConfig) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	opts := &server.Options{
		ServerName: "kipimo-embedded",
		Host:       cfg.Host,
		Port:       cfg.Port,
		NoLog:      true,
		NoSigs:     true,
		MaxPayload: cfg.MaxPayload,
		JetStream:  cfg.JetStream,
	}
	if cfg.JetStream {
		sd := filepath.Join(cfg.Dir, "jetstream")
		if err := os.MkdirAll(sd, 0o755); err != nil {
			return nil, fmt.Errorf("embedded NATS: create store directory: %w", err)
		}
		opts.StoreDir = sd
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(cfg.StartTimeout) {
		ns.Shutdown()
		return nil, fmt.Errorf("embedded NATS: not ready for connections after %s", cfg.StartTimeout)
	}
	return &Server{ns: ns}, nil
}

// ClientURL is the nats:// URL clients connect to.
func (s *Server) ClientURL() string { return s.ns.ClientURL() }

// Shutdown stops the server and waits until it has stopped.
func (s *Server) Shutdown() {
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
}
