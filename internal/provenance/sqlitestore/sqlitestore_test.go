package sqlitestore

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/docblock"
	"github.com/kipimo-hpc/kipimo/internal/provenance/storetest"
)

func TestSharedSuite(t *testing.T) {
	storetest.Run(t, func(t *testing.T) provenance.Store {
		s, err := Open(context.Background(), filepath.Join(t.TempDir(), "prov.db"), Options{Synchronous: "NORMAL"})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}, storetest.Options{N: 1000, InsertBad: insertBad})
}

// insertBad stores, through SQL of its own on the store's file, anomalies
// like near whose documents are bad in each way a SQLite store can hold
// one, and a func_stats record that is not JSON (storetest.Options).
func insertBad(t *testing.T, ps provenance.Store, near provenance.Exec) []string {
	t.Helper()
	s := ps.(*Store)
	db, err := sql.Open("sqlite", "file:"+s.Path()+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	exec := func(q string, args ...any) sql.Result {
		t.Helper()
		r, err := db.Exec(q, args...)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return r
	}
	block := func(data []byte) int64 {
		id, err := exec("INSERT INTO anomalies_docs (data) VALUES (?)", data).LastInsertId()
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	other := near
	other.EventID = fmt.Sprintf("%d:%d:%d", near.RID, near.IOStep, 900001)
	var b docblock.Builder
	if _, err := b.AppendExec(&other); err != nil {
		t.Fatal(err)
	}
	disagreeing := block(b.AppendCompressed(nil))
	var braced docblock.Builder
	braced.Add([]byte(`{not json at all}`))
	notJSONInBlock := block(braced.AppendCompressed(nil))
	notZstd := block([]byte("not zstd"))
	docs := []any{
		[]byte(`{not json at all}`),       // a document held in its row, not JSON
		appendRef(nil, disagreeing, 0),    // a document of another function than its row's
		appendRef(nil, notJSONInBlock, 0), // a block's document, not JSON
		appendRef(nil, notZstd, 0),        // a block that does not decompress
		appendRef(nil, notZstd+1000, 0),   // a block that is not there
		appendRef(nil, disagreeing, 5),    // a slot the block does not have
		[]byte{docRef, 0xff},              // a reference that does not parse
		[]byte(`{"event_id":"1:2:3"}`),    // another record's document
	}
	var ids []string
	for i, doc := range docs {
		id := fmt.Sprintf("%d:%d:%d", near.RID, near.IOStep, 900000+i)
		if i == 1 {
			id = other.EventID
		}
		fn := near.Func
		if i == 1 {
			fn = "another_function"
		}
		exec("INSERT INTO anomalies "+execInsertColumns+" VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
			int64(near.PID), id, int64(near.RID), int64(near.TID), int64(near.FID), fn, int64(near.IOStep),
			int64(near.Entry), int64(near.Exit), int64(near.RuntimeTotal), int64(near.RuntimeExclusive), near.OutlierScore, near.IsGPUEvent, doc)
		ids = append(ids, id)
	}
	// A row whose columns cannot be an execution's.
	id := fmt.Sprintf("%d:%d:%d", near.RID, near.IOStep, 900100)
	exec("INSERT INTO anomalies "+execInsertColumns+" VALUES (?,?,'not a number',?,?,?,?,?,?,?,?,?,?,?)",
		int64(near.PID), id, int64(near.TID), int64(near.FID), near.Func, int64(near.IOStep),
		int64(near.Entry), int64(near.Exit), int64(near.RuntimeTotal), int64(near.RuntimeExclusive), near.OutlierScore, near.IsGPUEvent, []byte(`{}`))
	ids = append(ids, id)
	exec(`INSERT INTO func_stats (pid, func, doc) VALUES (0, 'zz_bad', '{not json}')`)
	return ids
}

func TestDiskUsageCountsCheckpointedLog(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "prov.db")
	s, err := Open(ctx, path, Options{Synchronous: "NORMAL"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	empty, err := s.DiskUsage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	execs := storetest.Generate(storetest.GenConfig{Seed: 1, N: 2000, Anomaly: true})
	if err := s.Write(ctx, storetest.ExecBatch(storetest.Anomalies, execs)); err != nil {
		t.Fatal(err)
	}
	full, err := s.DiskUsage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if wal, err := os.Stat(path + "-wal"); err == nil && wal.Size() != 0 {
		t.Errorf("log holds %d B after the checkpoint", wal.Size())
	}
	// Each record takes at least its compressed document, and the
	// documents are a few hundred bytes.
	if per := float64(full-empty) / float64(len(execs)); per < 200 || per > 2000 {
		t.Errorf("%.0f B per record on disk, want a few hundred", per)
	}
}

// TestTopNWithTies checks the queries whose sort column is indexed (they
// find the value at the limit first) against a full sort, on scores and
// runtimes with many ties.
func TestTopNWithTies(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "prov.db"), Options{Synchronous: "OFF"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	execs := storetest.Generate(storetest.GenConfig{Seed: 9, N: 400, Programs: 3, Anomaly: true})
	for i := range execs {
		execs[i].OutlierScore = float64(i % 7)
		execs[i].RuntimeTotal = uint64(100 + i%5)
		execs[i].Func = []string{"a", "b"}[i%2]
	}
	if err := s.Write(ctx, storetest.ExecBatch(storetest.Anomalies, execs)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		q    provenance.Query
		key  func(e provenance.Exec) float64
		keep func(e provenance.Exec) bool
	}{
		{"score desc", provenance.Query{Sort: "outlier_score", Desc: true, Limit: 25}, func(e provenance.Exec) float64 { return e.OutlierScore }, nil},
		{"score asc", provenance.Query{Sort: "outlier_score", Limit: 61}, func(e provenance.Exec) float64 { return e.OutlierScore }, nil},
		{"score beyond the matches", provenance.Query{Sort: "outlier_score", Desc: true, Limit: 1000}, func(e provenance.Exec) float64 { return e.OutlierScore }, nil},
		{"function's runtimes desc", provenance.Query{Func: "b", Sort: "runtime_total", Desc: true, Limit: 33}, func(e provenance.Exec) float64 { return float64(e.RuntimeTotal) },
			func(e provenance.Exec) bool { return e.Func == "b" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.q.Kind = storetest.Anomalies
			got, err := s.Query(ctx, tc.q)
			if err != nil {
				t.Fatal(err)
			}
			var want []provenance.Exec
			for _, e := range execs {
				if tc.keep == nil || tc.keep(e) {
					want = append(want, e)
				}
			}
			slices.SortStableFunc(want, func(a, b provenance.Exec) int {
				ka, kb := tc.key(a), tc.key(b)
				if ka != kb {
					if tc.q.Desc == (ka > kb) {
						return -1
					}
					return 1
				}
				if a.PID != b.PID {
					return cmp.Compare(a.PID, b.PID)
				}
				return strings.Compare(a.EventID, b.EventID)
			})
			want = want[:min(len(want), tc.q.Limit)]
			if len(got) != len(want) {
				t.Fatalf("%d results, want %d", len(got), len(want))
			}
			for i := range want {
				if got[i].PID != want[i].PID || got[i].EventID != want[i].EventID {
					t.Fatalf("result %d is %d/%s, want %d/%s", i, got[i].PID, got[i].EventID, want[i].PID, want[i].EventID)
				}
			}
		})
	}
}

// TestRewritesLeaveNoOrphanDocuments writes batches again, in part and with
// a record given twice: each record is stored once, and every document in a
// block belongs to a stored row.
func TestRewritesLeaveNoOrphanDocuments(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "prov.db"), Options{Synchronous: "OFF"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	execs := storetest.Generate(storetest.GenConfig{Seed: 4, N: 300, Anomaly: true})
	withTwice := append(slices.Clone(execs[250:300]), execs[260])
	for _, tc := range []struct {
		name  string
		batch []provenance.Exec
		total int64
	}{
		{"first 200", execs[:200], 200},
		{"the same again", execs[:200], 200},
		{"100 stored and 50 new", execs[100:250], 250},
		{"50 new, one of them twice", withTwice, 300},
		{"everything again", execs, 300},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := s.Write(ctx, storetest.ExecBatch(storetest.Anomalies, tc.batch)); err != nil {
				t.Fatal(err)
			}
			n, err := s.Count(ctx, provenance.Query{Kind: storetest.Anomalies})
			if err != nil || n != tc.total {
				t.Fatalf("%d records (%v), want %d", n, err, tc.total)
			}
			rows, err := s.r.QueryContext(ctx, "SELECT data FROM anomalies_docs")
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			var docs int64
			for rows.Next() {
				var data []byte
				if err := rows.Scan(&data); err != nil {
					t.Fatal(err)
				}
				d, err := docblock.Decode(data)
				if err != nil {
					t.Fatal(err)
				}
				docs += int64(len(d))
			}
			if docs != tc.total {
				t.Fatalf("blocks hold %d documents for %d records", docs, tc.total)
			}
		})
	}
	got, err := s.Get(ctx, storetest.Anomalies, execs[260].PID, execs[260].EventID)
	if err != nil || got.EventID != execs[260].EventID || got.Func != execs[260].Func {
		t.Fatalf("record given twice: %+v, %v", got.EventID, err)
	}
}

// TestReadsPlainJSONDocuments reads a row whose doc column is the record's
// JSON itself, as stores written before document blocks hold them, next to
// rows written now.
func TestReadsPlainJSONDocuments(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "prov.db"), Options{Synchronous: "OFF"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	execs := storetest.Generate(storetest.GenConfig{Seed: 12, N: 3, Anomaly: true})
	if err := s.Write(ctx, storetest.ExecBatch(storetest.Anomalies, execs[1:])); err != nil {
		t.Fatal(err)
	}
	old := execs[0]
	doc, err := json.Marshal(&old)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.w.ExecContext(ctx, insertSQL[storetest.Anomalies], int64(old.PID), old.EventID, int64(old.RID), int64(old.TID), int64(old.FID), old.Func,
		int64(old.IOStep), int64(old.Entry), int64(old.Exit), int64(old.RuntimeTotal), int64(old.RuntimeExclusive), old.OutlierScore, old.IsGPUEvent, string(doc)); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(ctx, storetest.Anomalies, old.PID, old.EventID)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, old) {
		t.Fatalf("plain JSON row read back as\n%+v\nwant\n%+v", got, old)
	}
	all, err := s.Query(ctx, provenance.Query{Kind: storetest.Anomalies, Limit: 10})
	if err != nil || len(all) != 3 {
		t.Fatalf("query over old and new rows: %d records, %v", len(all), err)
	}
}

// TestNewStoreFilesArePrivate: a new store's file, its log and its shared
// memory are readable and writable by their owner only, whatever the
// umask lets through.
func TestNewStoreFilesArePrivate(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "prov.db")
	s, err := Open(ctx, path, Options{Synchronous: "OFF"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Write(ctx, storetest.ExecBatch(storetest.Anomalies, storetest.Generate(storetest.GenConfig{Seed: 3, N: 10, Anomaly: true}))); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if perm := fi.Mode().Perm(); perm != 0o600 {
			t.Errorf("%s has mode %04o, want 0600", filepath.Base(p), perm)
		}
	}
}
