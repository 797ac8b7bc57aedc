package mongostore

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

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
	}, storetest.Options{N: n, InsertBad: insertBad})
}

// insertBad stores, with inserts of its own, anomalies like near whose
// documents are bad in each way a MongoDB store can hold one, and a
// func_stats record whose statistics are not an object
// (storetest.Options).
func insertBad(t *testing.T, ps provenance.Store, near provenance.Exec) []string {
	t.Helper()
	s := ps.(*Store)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id := func(i int) string { return fmt.Sprintf("%d:%d:%d", near.RID, near.IOStep, 900000+i) }
	fields := func(eventID string) bson.D {
		return bson.D{{Key: "pid", Value: int64(near.PID)}, {Key: "event_id", Value: eventID}, {Key: "rid", Value: int64(near.RID)},
			{Key: "func", Value: near.Func}, {Key: "io_step", Value: int64(near.IOStep)}, {Key: "entry", Value: int64(near.Entry)},
			{Key: "runtime_total", Value: int64(near.RuntimeTotal)}, {Key: "outlier_score", Value: near.OutlierScore}}
	}
	docs := []struct {
		eventID string
		doc     bson.D
	}{
		// a field of the wrong type
		{id(0), append(fields(id(0)), bson.E{Key: "call_stack", Value: "not an array"})},
		// a key that is not the record's
		{id(1), fields(id(2))},
		// an event id that is not one
		{"x", fields("not an event id")},
	}
	var ids []string
	for _, d := range docs {
		key := provenance.ExecKey(near.PID, d.eventID)
		if _, err := s.coll(provenance.KindAnomalies).InsertOne(ctx, append(bson.D{{Key: "_id", Value: key}}, d.doc...)); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, d.eventID)
	}
	if _, err := s.coll(provenance.KindFuncStats).InsertOne(ctx, bson.D{{Key: "_id", Value: "0/zz_bad"}, {Key: "pid", Value: 0},
		{Key: "func", Value: "zz_bad"}, {Key: "stats", Value: "not an object"}}); err != nil {
		t.Fatal(err)
	}
	return ids
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
