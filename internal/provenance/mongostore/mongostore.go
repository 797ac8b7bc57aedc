// Package mongostore is the provenance store on MongoDB (replica set or
// sharded cluster), through go.mongodb.org/mongo-driver/v2. Each kind has
// its collection (anomalies, normalexecs, metadata, func_stats,
// counter_stats, profiles); a record's _id is its natural key, so a
// redelivered record can never be stored twice, and the indexes the queries
// need are created at start-up.
//
// Sharding: shard anomalies and normalexecs on {rid: "hashed"} (or
// {pid: 1, rid: 1} ranged, which keeps one rank's records together for
// per-rank queries); the other collections are small and stay unsharded.
// With a hashed rid shard key, inserts of all ranks spread over the shards
// and a query filtered by rank goes to one shard.
//
// Regular expressions on function names are passed to the server's $regex
// (PCRE); they are first checked to be valid Go RE2 expressions, and the
// common subset (classes, alternation, anchors, repetition) means the same
// in both.
package mongostore

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// DefaultDatabase is the database used when the URI names none.
const DefaultDatabase = "kipimo_prov"

// Store is a provenance.Store on a MongoDB database. Safe for concurrent
// use (the driver pools connections); its opener calls Close once.
type Store struct {
	client *mongo.Client
	db     *mongo.Database
}

type execDoc struct {
	ID              string `bson:"_id"`
	provenance.Exec `bson:",inline"`
}

type metaDoc struct {
	ID                  string `bson:"_id"`
	provenance.Metadata `bson:",inline"`
}

type funcDoc struct {
	ID                         string `bson:"_id"`
	provenance.GlobalFuncStats `bson:",inline"`
}

type counterDoc struct {
	ID                            string `bson:"_id"`
	provenance.GlobalCounterStats `bson:",inline"`
}

type profileDoc struct {
	ID                       string `bson:"_id"`
	provenance.ThreadProfile `bson:",inline"`
}

// Open connects to the MongoDB at uri (mongodb:// or mongodb+srv://) and
// creates the collections' indexes. The database is the URI's path, or
// DefaultDatabase. Credentials come from the URI and are never logged or
// put in errors.
func Open(ctx context.Context, uri string) (*Store, error) {
	u, err := url.Parse(uri)
	if err != nil || (u.Scheme != "mongodb" && u.Scheme != "mongodb+srv") {
		return nil, fmt.Errorf("open MongoDB provenance store: %q is not a mongodb:// URI", redact(uri))
	}
	dbName := strings.Trim(u.Path, "/")
	if dbName == "" {
		dbName = DefaultDatabase
	}
	opts := options.Client().ApplyURI(uri).SetAppName("kipimo-provdb").
		SetBSONOptions(&options.BSONOptions{UseJSONStructTags: true, NilSliceAsEmpty: true})
	client, err := mongo.Connect(opts)
	if err != nil {
		return nil, fmt.Errorf("open MongoDB provenance store %s: %w", redact(uri), err)
	}
	s := &Store{client: client, db: client.Database(dbName)}
	if err := client.Ping(ctx, nil); err != nil {
		_ = client.Disconnect(context.Background())
		return nil, fmt.Errorf("open MongoDB provenance store %s: %w", redact(uri), err)
	}
	if err := s.createIndexes(ctx); err != nil {
		_ = client.Disconnect(context.Background())
		return nil, fmt.Errorf("open MongoDB provenance store %s: %w", redact(uri), err)
	}
	return s, nil
}

func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "<unparsable URI>"
	}
	u.User = nil
	return u.String()
}

// coll is the collection of kind's records.
func (s *Store) coll(kind provenance.Kind) *mongo.Collection { return s.db.Collection(string(kind)) }

func (s *Store) createIndexes(ctx context.Context) error {
	for _, kind := range []provenance.Kind{provenance.KindAnomalies, provenance.KindNormalExecs} {
		var models []mongo.IndexModel
		for _, keys := range []bson.D{
			{{Key: "rid", Value: 1}, {Key: "func", Value: 1}},
			{{Key: "func", Value: 1}},
			{{Key: "io_step", Value: 1}},
			{{Key: "entry", Value: 1}},
			{{Key: "runtime_total", Value: 1}},
			{{Key: "runtime_exclusive", Value: 1}},
			{{Key: "outlier_score", Value: 1}},
		} {
			models = append(models, mongo.IndexModel{Keys: keys})
		}
		if _, err := s.coll(kind).Indexes().CreateMany(ctx, models); err != nil {
			return fmt.Errorf("create indexes of %s: %w", kind, err)
		}
	}
	if _, err := s.coll(provenance.KindMetadata).Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "pid", Value: 1}, {Key: "rid", Value: 1}}}); err != nil {
		return fmt.Errorf("create indexes of metadata: %w", err)
	}
	return nil
}

// Close disconnects from the server.
func (s *Store) Close() error {
	if err := s.client.Disconnect(context.Background()); err != nil {
		return fmt.Errorf("close MongoDB provenance store: %w", err)
	}
	return nil
}

// Write inserts b's records unordered; records whose _id exists are skipped
// (duplicate-key errors are the idempotency working, not failures).
func (s *Store) Write(ctx context.Context, b provenance.Batch) error {
	if !provenance.ValidKind(b.Kind) {
		return fmt.Errorf("write provenance batch: unknown kind %q", b.Kind)
	}
	if b.Len() == 0 {
		return nil
	}
	docs := make([]any, 0, b.Len())
	switch b.Kind {
	case provenance.KindAnomalies, provenance.KindNormalExecs:
		for _, e := range b.Execs {
			docs = append(docs, execDoc{ID: provenance.ExecKey(e.PID, e.EventID), Exec: e})
		}
	case provenance.KindMetadata:
		for _, m := range b.Metadata {
			docs = append(docs, metaDoc{ID: m.Key(), Metadata: m})
		}
	case provenance.KindFuncStats:
		for _, f := range b.FuncStats {
			docs = append(docs, funcDoc{ID: f.Key(), GlobalFuncStats: f})
		}
	case provenance.KindCounterStats:
		for _, c := range b.CounterStats {
			docs = append(docs, counterDoc{ID: c.Key(), GlobalCounterStats: c})
		}
	case provenance.KindProfiles:
		for _, p := range b.Profiles {
			docs = append(docs, profileDoc{ID: p.Key(), ThreadProfile: p})
		}
	}
	_, err := s.coll(b.Kind).InsertMany(ctx, docs, options.InsertMany().SetOrdered(false))
	if err != nil && !onlyDuplicates(err) {
		return fmt.Errorf("write %s batch: %w", b.Kind, err)
	}
	return nil
}

// onlyDuplicates reports whether err is a bulk write error made only of
// duplicate-key errors.
func onlyDuplicates(err error) bool {
	var bwe mongo.BulkWriteException
	if !errors.As(err, &bwe) {
		return false
	}
	if bwe.WriteConcernError != nil || len(bwe.WriteErrors) == 0 {
		return false
	}
	for _, we := range bwe.WriteErrors {
		if we.Code != 11000 {
			return false
		}
	}
	return true
}

// filter builds the query document of q; user strings are values only.
func filter(q provenance.Query) bson.D {
	f := bson.D{}
	rankField := "rid"
	if q.Kind == provenance.KindProfiles {
		rankField = "rank"
	}
	if q.PID != nil {
		f = append(f, bson.E{Key: "pid", Value: int64(*q.PID)})
	}
	if q.Kind != provenance.KindFuncStats && q.Kind != provenance.KindCounterStats {
		if q.Rank != nil {
			f = append(f, bson.E{Key: rankField, Value: int64(*q.Rank)})
		}
		if q.TID != nil {
			f = append(f, bson.E{Key: "tid", Value: int64(*q.TID)})
		}
	}
	if !provenance.IsExecKind(q.Kind) {
		return f
	}
	if q.Func != "" {
		f = append(f, bson.E{Key: "func", Value: q.Func})
	}
	if q.FuncRegexp != "" {
		f = append(f, bson.E{Key: "func", Value: bson.D{{Key: "$regex", Value: q.FuncRegexp}}})
	}
	rng := func(field string, lo, hi *uint64) {
		r := bson.D{}
		if lo != nil {
			r = append(r, bson.E{Key: "$gte", Value: int64(*lo)})
		}
		if hi != nil {
			r = append(r, bson.E{Key: "$lte", Value: int64(*hi)})
		}
		if len(r) > 0 {
			f = append(f, bson.E{Key: field, Value: r})
		}
	}
	rng("io_step", q.StepMin, q.StepMax)
	rng("entry", q.From, nil)
	rng("exit", nil, q.To)
	if q.MinRuntime > 0 {
		f = append(f, bson.E{Key: "runtime_total", Value: bson.D{{Key: "$gte", Value: int64(q.MinRuntime)}}})
	}
	if q.MinScore != nil {
		f = append(f, bson.E{Key: "outlier_score", Value: bson.D{{Key: "$gte", Value: *q.MinScore}}})
	}
	if q.GPUOnly {
		f = append(f, bson.E{Key: "is_gpu_event", Value: true})
	}
	if a := q.After; a != nil {
		// After the cursor in the query's order: a later sort value, or
		// the same one and a greater key (pid, event_id).
		op := "$gt"
		if q.Desc {
			op = "$lt"
		}
		v, pid := a.SortArg(), int64(a.PID)
		f = append(f, bson.E{Key: "$or", Value: bson.A{
			bson.D{{Key: q.Sort, Value: bson.D{{Key: op, Value: v}}}},
			bson.D{{Key: q.Sort, Value: v}, {Key: "pid", Value: bson.D{{Key: "$gt", Value: pid}}}},
			bson.D{{Key: q.Sort, Value: v}, {Key: "pid", Value: pid}, {Key: "event_id", Value: bson.D{{Key: "$gt", Value: a.EventID}}}},
		}})
	}
	return f
}

// findOptions sorts as q says and limits to q.Limit (none for NoLimit).
func findOptions(q provenance.Query) *options.FindOptionsBuilder {
	dir := 1
	if q.Desc {
		dir = -1
	}
	opts := options.Find().
		SetSort(bson.D{{Key: q.Sort, Value: dir}, {Key: "pid", Value: 1}, {Key: "event_id", Value: 1}})
	if q.Limit > 0 {
		opts.SetLimit(int64(q.Limit))
	}
	return opts
}

// Query returns the matching executions.
func (s *Store) Query(ctx context.Context, q provenance.Query) ([]provenance.Exec, error) {
	if err := q.Normalize(); err != nil {
		return nil, fmt.Errorf("query: %w", err)
	}
	if err := q.CheckBounded(); err != nil {
		return nil, fmt.Errorf("query: %w", err)
	}
	if !provenance.IsExecKind(q.Kind) {
		return nil, fmt.Errorf("query: kind %s does not hold executions", q.Kind)
	}
	out := []provenance.Exec{}
	err := provenance.EachFilled(ctx, q, func(ctx context.Context, q provenance.Query, fn func(provenance.Exec) error) error {
		return s.each(ctx, q, findOptions(q), "query", fn)
	}, func(e provenance.Exec) error {
		out = append(out, e)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// decodeExec decodes the execution at cur, normalized, and checks it as
// ingest does a record (its event id, exit not before entry) and against
// its _id, the key the store finds it by. An error wraps
// provenance.ErrBadDocument.
func decodeExec(cur *mongo.Cursor) (provenance.Exec, error) {
	var d execDoc
	if err := cur.Decode(&d); err != nil {
		return provenance.Exec{}, fmt.Errorf("%w: _id %v: %w", provenance.ErrBadDocument, cur.Current.Lookup("_id"), err)
	}
	if err := checkExec(&d); err != nil {
		return provenance.Exec{}, err
	}
	return d.Exec, nil
}

// checkExec checks d and normalizes its execution.
func checkExec(d *execDoc) error {
	if err := d.Exec.Validate(); err != nil {
		return fmt.Errorf("%w: _id %s: %w", provenance.ErrBadDocument, d.ID, err)
	}
	if key := provenance.ExecKey(d.PID, d.EventID); key != d.ID {
		return fmt.Errorf("%w: _id %s: its fields make the key %s", provenance.ErrBadDocument, d.ID, key)
	}
	d.Exec.Normalize()
	return nil
}

// eachBatch is the number of documents a server cursor of Each returns per
// round trip.
const eachBatch = 500

// Each streams the matching executions to fn through one server cursor,
// eachBatch documents a round trip. The sort may exceed the server's memory
// for sorts without an index; it may then use disk (allowDiskUse).
func (s *Store) Each(ctx context.Context, q provenance.Query, fn func(provenance.Exec) error) error {
	if err := q.Normalize(); err != nil {
		return fmt.Errorf("list: %w", err)
	}
	if !provenance.IsExecKind(q.Kind) {
		return fmt.Errorf("list: kind %s does not hold executions", q.Kind)
	}
	return provenance.EachFilled(ctx, q, func(ctx context.Context, q provenance.Query, fn func(provenance.Exec) error) error {
		return s.each(ctx, q, findOptions(q).SetBatchSize(eachBatch).SetAllowDiskUse(true), "list", fn)
	}, fn)
}

// each finds what q (normalized) selects with opts and passes the
// executions to fn, leaving out those whose documents are bad (reported to
// provenance.Skip); op names the read in errors. fn's errors are returned
// unwrapped.
func (s *Store) each(ctx context.Context, q provenance.Query, opts *options.FindOptionsBuilder, op string, fn func(provenance.Exec) error) error {
	cur, err := s.coll(q.Kind).Find(ctx, filter(q), opts)
	if err != nil {
		return fmt.Errorf("%s %s: %w", op, q.Kind, err)
	}
	defer cur.Close(context.WithoutCancel(ctx))
	for cur.Next(ctx) {
		e, err := decodeExec(cur)
		if err != nil {
			provenance.Skip(ctx, 1, fmt.Errorf("%s %s: %w", op, q.Kind, err))
			continue
		}
		if err := fn(e); err != nil {
			return err
		}
	}
	if err := cur.Err(); err != nil {
		return fmt.Errorf("%s %s: %w", op, q.Kind, err)
	}
	return nil
}

// Profiles streams the profiles collection in key order through one server
// cursor.
func (s *Store) Profiles(ctx context.Context, fn func(provenance.ThreadProfile) error) error {
	sort := bson.D{{Key: "pid", Value: 1}, {Key: "rank", Value: 1}, {Key: "tid", Value: 1}, {Key: "io_step", Value: 1}}
	return eachDoc(ctx, s.coll(provenance.KindProfiles), sort, func(cur *mongo.Cursor) error {
		var d profileDoc
		if err := cur.Decode(&d); err != nil {
			provenance.Skip(ctx, 1, fmt.Errorf("list profiles: %w: _id %v: %w", provenance.ErrBadDocument, cur.Current.Lookup("_id"), err))
			return nil
		}
		return fn(d.ThreadProfile)
	})
}

// Metadata streams the metadata collection in key order through one server
// cursor.
func (s *Store) Metadata(ctx context.Context, fn func(provenance.Metadata) error) error {
	sort := bson.D{{Key: "pid", Value: 1}, {Key: "rid", Value: 1}, {Key: "tid", Value: 1}, {Key: "descr", Value: 1}}
	return eachDoc(ctx, s.coll(provenance.KindMetadata), sort, func(cur *mongo.Cursor) error {
		var d metaDoc
		if err := cur.Decode(&d); err != nil {
			provenance.Skip(ctx, 1, fmt.Errorf("list metadata: %w: _id %v: %w", provenance.ErrBadDocument, cur.Current.Lookup("_id"), err))
			return nil
		}
		return fn(d.Metadata)
	})
}

// FuncStats streams the func_stats records in (pid, func) order.
func (s *Store) FuncStats(ctx context.Context, fn func(provenance.GlobalFuncStats) error) error {
	sort := bson.D{{Key: "pid", Value: 1}, {Key: "func", Value: 1}}
	return eachDoc(ctx, s.coll(provenance.KindFuncStats), sort, func(cur *mongo.Cursor) error {
		var d funcDoc
		if err := cur.Decode(&d); err != nil {
			provenance.Skip(ctx, 1, fmt.Errorf("list func_stats: %w: _id %v: %w", provenance.ErrBadDocument, cur.Current.Lookup("_id"), err))
			return nil
		}
		return fn(d.GlobalFuncStats)
	})
}

// eachDoc calls fn at each document of c in sort's order, eachBatch
// documents a round trip; fn's errors are returned unwrapped.
func eachDoc(ctx context.Context, c *mongo.Collection, sort bson.D, fn func(*mongo.Cursor) error) error {
	opts := options.Find().SetSort(sort).SetBatchSize(eachBatch).SetAllowDiskUse(true)
	cur, err := c.Find(ctx, bson.D{}, opts)
	if err != nil {
		return fmt.Errorf("list %s: %w", c.Name(), err)
	}
	defer cur.Close(context.WithoutCancel(ctx))
	for cur.Next(ctx) {
		if err := fn(cur); err != nil {
			return err
		}
	}
	if err := cur.Err(); err != nil {
		return fmt.Errorf("list %s: %w", c.Name(), err)
	}
	return nil
}

// Get returns one execution whole.
func (s *Store) Get(ctx context.Context, kind provenance.Kind, pid uint32, eventID string) (provenance.Exec, error) {
	if !provenance.IsExecKind(kind) {
		return provenance.Exec{}, fmt.Errorf("get: kind %q does not hold executions", kind)
	}
	key := provenance.ExecKey(pid, eventID)
	cur, err := s.coll(kind).Find(ctx, bson.D{{Key: "_id", Value: key}}, options.Find().SetLimit(1))
	if err != nil {
		return provenance.Exec{}, fmt.Errorf("get %s %s: %w", kind, key, err)
	}
	defer cur.Close(context.WithoutCancel(ctx))
	if !cur.Next(ctx) {
		if err := cur.Err(); err != nil {
			return provenance.Exec{}, fmt.Errorf("get %s %s: %w", kind, key, err)
		}
		return provenance.Exec{}, fmt.Errorf("get %s %s: %w", kind, key, provenance.ErrNotFound)
	}
	e, err := decodeExec(cur)
	if err != nil {
		return provenance.Exec{}, fmt.Errorf("get %s %s: %w", kind, key, err)
	}
	return e, nil
}

// Count counts the matching records.
func (s *Store) Count(ctx context.Context, q provenance.Query) (int64, error) {
	if err := q.Normalize(); err != nil {
		return 0, fmt.Errorf("count: %w", err)
	}
	n, err := s.coll(q.Kind).CountDocuments(ctx, filter(q))
	if err != nil {
		return 0, fmt.Errorf("count %s: %w", q.Kind, err)
	}
	return n, nil
}

// Aggregate counts the matching executions per group with a $match/$group
// pipeline ($sum only, which FerretDB also supports); groups are ordered
// and limited on the client.
func (s *Store) Aggregate(ctx context.Context, q provenance.Query, by provenance.GroupBy) ([]provenance.Group, error) {
	if err := q.Normalize(); err != nil {
		return nil, fmt.Errorf("aggregate: %w", err)
	}
	if !provenance.IsExecKind(q.Kind) {
		return nil, fmt.Errorf("aggregate: kind %s does not hold executions", q.Kind)
	}
	var id bson.D
	switch by {
	case provenance.ByRank:
		id = bson.D{{Key: "rid", Value: "$rid"}}
	case provenance.ByFunc:
		id = bson.D{{Key: "func", Value: "$func"}}
	case provenance.ByStep:
		id = bson.D{{Key: "io_step", Value: "$io_step"}}
	case provenance.ByRankFunc:
		id = bson.D{{Key: "rid", Value: "$rid"}, {Key: "func", Value: "$func"}}
	default:
		return nil, fmt.Errorf("aggregate: cannot group by %q", by)
	}
	pipe := mongo.Pipeline{
		{{Key: "$match", Value: filter(q)}},
		{{Key: "$group", Value: bson.D{{Key: "_id", Value: id}, {Key: "n", Value: bson.D{{Key: "$sum", Value: 1}}}}}},
	}
	cur, err := s.coll(q.Kind).Aggregate(ctx, pipe)
	if err != nil {
		return nil, fmt.Errorf("aggregate %s by %s: %w", q.Kind, by, err)
	}
	var rows []struct {
		ID struct {
			RID    int64  `bson:"rid"`
			Func   string `bson:"func"`
			IOStep int64  `bson:"io_step"`
		} `bson:"_id"`
		N int64 `bson:"n"`
	}
	if err := cur.All(ctx, &rows); err != nil {
		return nil, fmt.Errorf("aggregate %s by %s: %w", q.Kind, by, err)
	}
	out := make([]provenance.Group, 0, len(rows))
	for _, r := range rows {
		out = append(out, provenance.MakeGroup(by, uint32(r.ID.RID), r.ID.Func, uint64(r.ID.IOStep), r.N))
	}
	return provenance.SortGroups(out, q.Limit), nil
}

var _ provenance.Store = (*Store)(nil)
