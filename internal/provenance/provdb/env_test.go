package provdb

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
)

// jetStreamAndStore starts what a service test runs on: an embedded NATS
// server with JetStream on 127.0.0.1, a connection to it and an SQLite
// store in t's temporary directory, all closed when t ends.
func jetStreamAndStore(ctx context.Context, t *testing.T) (*natsx.Server, *nats.Conn, jetstream.JetStream, *sqlitestore.Store) {
	t.Helper()
	srv, err := natsx.StartServer(natsx.DefaultServerConfig(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := natsx.Connect(ctx, srv.ClientURL(), "test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	store, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "p.db"), sqlitestore.Options{Synchronous: "OFF"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	return srv, nc, js, store
}
