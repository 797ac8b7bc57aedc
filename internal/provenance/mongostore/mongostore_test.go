package mongostore

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/storetest"
)

var dbSeq atomic.Int64

func suite(t *testing.T, uri string, n int) {
	storetest.Run(t, func(t *testing.T) provenance.Store {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// A fresh database per store, so each subtest starts empty.
		db := fmt.Sprintf("kipimo_test_%d_%d", os.Getpid(), dbSeq.Add(1))
		s, err := Open(ctx, withDB(uri, db))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.db.Drop(context.Background()) })
		return s
	}, storetest.Options{N: n})
}

func withDB(uri, db string) string {
	// uri is mongodb://host:port/ possibly with a query.
	for i := len("mongodb://"); i < len(uri); i++ {
		if uri[i] == '/' {
			return uri[:i+1] + db + uri[i+1:]
		}
	}
	return uri + "/" + db
}

func TestSharedSuiteFerretDB(t *testing.T) {
	if testing.Short() {
		t.Skip("FerretDB suite skipped in -short mode")
	}
	suite(t, storetest.StartFerretDB(t), 200)
}

func TestSharedSuiteMongoDB(t *testing.T) {
	uri := os.Getenv("KIPIMO_TEST_MONGO_URI")
	if uri == "" {
		t.Skip("KIPIMO_TEST_MONGO_URI is not set: no real MongoDB to test against")
	}
	suite(t, uri, 1000)
}

func TestOpenErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, uri := range []string{"postgres://x", "::", "mongodb://alice:s3cret@127.0.0.1:1/?serverSelectionTimeoutMS=300"} {
		_, err := Open(ctx, uri)
		if err == nil {
			t.Fatalf("%s: opened", uri)
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Fatalf("error leaks the password: %v", err)
		}
	}
}
