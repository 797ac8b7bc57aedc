package storetest

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/FerretDB/FerretDB/ferretdb"
)

// StartFerretDB runs an in-process FerretDB (SQLite backend) on a loopback
// port until the test ends and returns its MongoDB URI. It is how the
// MongoDB store is tested without a MongoDB server; FerretDB is imported
// by tests only, never by a shipped binary.
func StartFerretDB(t testing.TB) string {
	t.Helper()
	f, err := ferretdb.New(&ferretdb.Config{
		Listener:  ferretdb.ListenerConfig{TCP: "127.0.0.1:0"},
		Handler:   "sqlite",
		SQLiteURL: "file:" + t.TempDir() + "/",
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = f.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return f.MongoDBURI()
}
