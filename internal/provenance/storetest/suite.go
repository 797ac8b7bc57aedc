package storetest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// Opener returns a new, empty store; the suite closes it.
type Opener func(t *testing.T) provenance.Store

// Options adapt the suite to an implementation's cost.
type Options struct {
	// N is the number of executions the query tests run on; default 400.
	N int
	// InsertBad stores in s, bypassing Write (as a corrupt file, a bug or
	// another writer could), anomalies whose stored documents are bad in
	// every way the store can hold one, and one func_stats record whose
	// document is bad. The anomalies are like near (its program, rank and
	// function), under other event ids, which it returns. Nil skips the
	// test of reads over bad documents.
	InsertBad func(t *testing.T, s provenance.Store, near provenance.Exec) []string
}

func ptr[T any](v T) *T { return &v }

// Run is the shared test suite of provenance.Store implementations.
func Run(t *testing.T, open Opener, opt Options) {
	if opt.N <= 0 {
		opt.N = 400
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	t.Run("WriteIsIdempotent", func(t *testing.T) {
		s := open(t)
		defer s.Close()
		execs := Generate(GenConfig{Seed: 1, N: 60, Programs: 2, Anomaly: true})
		if err := s.Write(ctx, ExecBatch(provenance.KindAnomalies, execs[:40])); err != nil {
			t.Fatal(err)
		}
		// A redelivered batch, then one overlapping the first.
		if err := s.Write(ctx, ExecBatch(provenance.KindAnomalies, execs[:40])); err != nil {
			t.Fatal(err)
		}
		if err := s.Write(ctx, ExecBatch(provenance.KindAnomalies, execs[20:])); err != nil {
			t.Fatal(err)
		}
		mustCount(ctx, t, s, provenance.Query{Kind: provenance.KindAnomalies}, 60)
		mustCount(ctx, t, s, provenance.Query{Kind: provenance.KindNormalExecs}, 0)
		// The same event id in another program is another record.
		other := execs[0]
		other.PID = 7
		if err := s.Write(ctx, ExecBatch(provenance.KindAnomalies, []provenance.Exec{other})); err != nil {
			t.Fatal(err)
		}
		mustCount(ctx, t, s, provenance.Query{Kind: provenance.KindAnomalies}, 61)

		meta, fs, cs, prof := GenerateOthers(0, 4)
		for range 2 {
			for _, b := range []provenance.Batch{
				{Kind: provenance.KindMetadata, Metadata: meta},
				{Kind: provenance.KindFuncStats, FuncStats: fs},
				{Kind: provenance.KindCounterStats, CounterStats: cs},
				{Kind: provenance.KindProfiles, Profiles: prof},
			} {
				if err := s.Write(ctx, b); err != nil {
					t.Fatal(err)
				}
			}
		}
		mustCount(ctx, t, s, provenance.Query{Kind: provenance.KindMetadata}, int64(len(meta)))
		mustCount(ctx, t, s, provenance.Query{Kind: provenance.KindMetadata, Rank: ptr[uint32](1)}, 2)
		mustCount(ctx, t, s, provenance.Query{Kind: provenance.KindFuncStats}, int64(len(fs)))
		mustCount(ctx, t, s, provenance.Query{Kind: provenance.KindCounterStats}, int64(len(cs)))
		mustCount(ctx, t, s, provenance.Query{Kind: provenance.KindProfiles}, int64(len(prof)))
		mustCount(ctx, t, s, provenance.Query{Kind: provenance.KindProfiles, PID: ptr[uint32](1)}, 0)
	})

	t.Run("GetReturnsTheRecordWhole", func(t *testing.T) {
		s := open(t)
		defer s.Close()
		execs := Generate(GenConfig{Seed: 2, N: 30})
		if err := s.Write(ctx, ExecBatch(provenance.KindNormalExecs, execs)); err != nil {
			t.Fatal(err)
		}
		for _, i := range []int{0, 7, 29} {
			got, err := s.Get(ctx, provenance.KindNormalExecs, execs[i].PID, execs[i].EventID)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, execs[i]) {
				t.Fatalf("record %s changed on the way:\n got %+v\nwant %+v", execs[i].EventID, got, execs[i])
			}
		}
		var gpu *provenance.Exec
		for i := range execs {
			if execs[i].IsGPUEvent {
				gpu = &execs[i]
				break
			}
		}
		if gpu != nil {
			got, err := s.Get(ctx, provenance.KindNormalExecs, gpu.PID, gpu.EventID)
			if err != nil || got.GPULocation == nil || *got.GPULocation != *gpu.GPULocation || got.GPUParent == nil {
				t.Fatalf("GPU context lost: %+v, %v", got.GPULocation, err)
			}
		}
		_, err := s.Get(ctx, provenance.KindNormalExecs, 0, "999:0:0")
		if !errors.Is(err, provenance.ErrNotFound) {
			t.Fatalf("missing record: error %v, want ErrNotFound", err)
		}
		_, err = s.Get(ctx, provenance.KindAnomalies, execs[0].PID, execs[0].EventID)
		if !errors.Is(err, provenance.ErrNotFound) {
			t.Fatalf("record of the other kind: error %v, want ErrNotFound", err)
		}
	})

	execs := Generate(GenConfig{Seed: 3, N: opt.N, Programs: 2, Anomaly: true})
	t.Run("QueriesMatchTheReference", func(t *testing.T) {
		s := open(t)
		defer s.Close()
		for i := 0; i < len(execs); i += 100 {
			if err := s.Write(ctx, ExecBatch(provenance.KindAnomalies, execs[i:min(i+100, len(execs))])); err != nil {
				t.Fatal(err)
			}
		}
		mid := execs[len(execs)/2]
		cases := []struct {
			name string
			q    provenance.Query
		}{
			{"all by entry", provenance.Query{Limit: provenance.MaxLimit}},
			{"program", provenance.Query{PID: ptr[uint32](1), Limit: 1000}},
			{"rank and thread", provenance.Query{Rank: ptr[uint32](3), TID: ptr[uint32](1), Limit: 1000}},
			{"function exact", provenance.Query{Func: "MPI_Allreduce", Sort: provenance.SortRuntimeTotal, Desc: true, Limit: 1000}},
			{"function regexp", provenance.Query{FuncRegexp: "^MPI_(Send|Recv)$", Limit: 1000}},
			{"function regexp special chars", provenance.Query{FuncRegexp: `Kokkos::.*\[type=`, Limit: 1000}},
			{"step range", provenance.Query{StepMin: ptr[uint64](5), StepMax: ptr[uint64](9), Sort: provenance.SortRuntimeExclusive, Limit: 1000}},
			{"time range", provenance.Query{From: ptr(mid.Entry - 2_000_000), To: ptr(mid.Entry + 2_000_000), Limit: 1000}},
			{"min runtime", provenance.Query{MinRuntime: 20000, Sort: provenance.SortRuntimeTotal, Limit: 1000}},
			{"min score", provenance.Query{MinScore: ptr(90.0), Sort: provenance.SortOutlierScore, Desc: true, Limit: 1000}},
			{"gpu only", provenance.Query{GPUOnly: true, Limit: 1000}},
			{"top 7 exclusive", provenance.Query{Sort: provenance.SortRuntimeExclusive, Desc: true, Limit: 7}},
			{"nothing", provenance.Query{Func: "no such function", Limit: 10}},
			{"all filters", provenance.Query{PID: ptr[uint32](0), Rank: ptr[uint32](2), FuncRegexp: "e", StepMin: ptr[uint64](1), MinScore: ptr(10.0), Limit: 1000}},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				q := tc.q
				if err := q.Normalize(); err != nil {
					t.Fatal(err)
				}
				want := reference(q, execs)
				got, err := s.Query(ctx, q)
				if err != nil {
					t.Fatal(err)
				}
				if g, w := ids(got), ids(want); !reflect.DeepEqual(g, w) {
					t.Fatalf("got %d records %v\nwant %d records %v", len(g), head(g), len(w), head(w))
				}
				cq := q
				cq.Limit = 0
				n, err := s.Count(ctx, cq)
				if err != nil {
					t.Fatal(err)
				}
				all := q
				all.Limit = provenance.MaxLimit
				if wn := int64(len(reference(all, execs))); n != wn {
					t.Fatalf("count %d, want %d", n, wn)
				}
				if tc.name == "nothing" && len(got) != 0 {
					t.Fatal("records found for a missing function")
				}
			})
		}
		for _, by := range []provenance.GroupBy{provenance.ByRank, provenance.ByFunc, provenance.ByStep, provenance.ByRankFunc} {
			for _, q := range []provenance.Query{{Limit: provenance.MaxLimit}, {PID: ptr[uint32](1), MinScore: ptr(50.0), Limit: 5}} {
				t.Run("aggregate by "+string(by), func(t *testing.T) {
					if err := q.Normalize(); err != nil {
						t.Fatal(err)
					}
					all := q
					all.Limit = provenance.MaxLimit
					want := Aggregate(reference(all, execs), by, q.Limit)
					got, err := s.Aggregate(ctx, q, by)
					if err != nil {
						t.Fatal(err)
					}
					if !reflect.DeepEqual(got, want) {
						t.Fatalf("aggregate by %s:\n got %s\nwant %s", by, groups(got), groups(want))
					}
				})
			}
		}
	})

	t.Run("EachStreamsInOrder", func(t *testing.T) {
		s := open(t)
		defer s.Close()
		tied := TiedExecs(Generate(GenConfig{Seed: 5, N: opt.N, Programs: 2, Anomaly: true}))
		for i := 0; i < len(tied); i += 100 {
			if err := s.Write(ctx, ExecBatch(provenance.KindAnomalies, tied[i:min(i+100, len(tied))])); err != nil {
				t.Fatal(err)
			}
		}
		cases := []struct {
			name string
			q    provenance.Query
		}{
			{"entry", provenance.Query{}},
			{"entry desc", provenance.Query{Desc: true}},
			{"runtime total", provenance.Query{Sort: provenance.SortRuntimeTotal}},
			{"runtime total desc", provenance.Query{Sort: provenance.SortRuntimeTotal, Desc: true}},
			{"runtime exclusive", provenance.Query{Sort: provenance.SortRuntimeExclusive}},
			{"score desc", provenance.Query{Sort: provenance.SortOutlierScore, Desc: true}},
			{"score", provenance.Query{Sort: provenance.SortOutlierScore}},
			{"function by runtime", provenance.Query{Func: "MPI_Send", Sort: provenance.SortRuntimeTotal, Desc: true}},
			{"filters", provenance.Query{PID: ptr[uint32](1), FuncRegexp: "^MPI_", MinScore: ptr(1.0)}},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				q := tc.q
				q.Limit = provenance.NoLimit
				if err := q.Normalize(); err != nil {
					t.Fatal(err)
				}
				want := ids(reference(q, tied))
				if got := eachIDs(ctx, t, s, q); !reflect.DeepEqual(got, want) {
					t.Fatalf("every record: got %d %v\nwant %d %v", len(got), head(got), len(want), head(want))
				}
				q7 := q
				q7.Limit = 7
				if got, w := eachIDs(ctx, t, s, q7), want[:min(7, len(want))]; !reflect.DeepEqual(got, w) {
					t.Fatalf("limit 7: got %v, want %v", got, w)
				}
				// Pages resumed by cursor, through its token, give every
				// record once, in order, ties split across pages included;
				// Query and Each agree on each page.
				var paged []string
				page := q
				page.Limit = 37
				for {
					recs, err := s.Query(ctx, page)
					if err != nil {
						t.Fatal(err)
					}
					if got := eachIDs(ctx, t, s, page); !reflect.DeepEqual(got, ids(recs)) {
						t.Fatalf("page after %v: each %v, query %v", page.After, head(got), head(ids(recs)))
					}
					paged = append(paged, ids(recs)...)
					if len(recs) < page.Limit {
						break
					}
					c, err := provenance.ParseCursor(provenance.CursorAfter(page, &recs[len(recs)-1]).String())
					if err != nil {
						t.Fatal(err)
					}
					page.After = c
				}
				if !reflect.DeepEqual(paged, want) {
					t.Fatalf("paged: got %d %v\nwant %d %v", len(paged), head(paged), len(want), head(want))
				}
			})
		}
		t.Run("callback error stops", func(t *testing.T) {
			stop := errors.New("stop")
			calls := 0
			err := s.Each(ctx, provenance.Query{Limit: provenance.NoLimit}, func(provenance.Exec) error {
				calls++
				if calls == 3 {
					return stop
				}
				return nil
			})
			if !errors.Is(err, stop) || calls != 3 {
				t.Fatalf("error %v after %d calls, want stop after 3", err, calls)
			}
		})
		t.Run("records are whole and the callback's own", func(t *testing.T) {
			byKey := map[string]provenance.Exec{}
			for _, e := range tied {
				byKey[provenance.ExecKey(e.PID, e.EventID)] = e
			}
			var kept []provenance.Exec
			err := s.Each(ctx, provenance.Query{Limit: provenance.NoLimit}, func(e provenance.Exec) error {
				kept = append(kept, e)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range kept {
				if w := byKey[provenance.ExecKey(e.PID, e.EventID)]; !reflect.DeepEqual(e, w) {
					t.Fatalf("record %s changed on the way:\n got %+v\nwant %+v", e.EventID, e, w)
				}
			}
		})
		t.Run("concurrent streams calling the store", func(t *testing.T) {
			// More streams than SQLite's pool of readers, each calling
			// the store from its callback.
			var wg sync.WaitGroup
			errs := make(chan error, 8)
			for range 8 {
				wg.Go(func() {
					n := 0
					err := s.Each(ctx, provenance.Query{Limit: provenance.NoLimit}, func(e provenance.Exec) error {
						n++
						if n <= 3 {
							if _, err := s.Get(ctx, provenance.KindAnomalies, e.PID, e.EventID); err != nil {
								return err
							}
							return s.Each(ctx, provenance.Query{Limit: 2}, func(provenance.Exec) error { return nil })
						}
						return nil
					})
					if err == nil && n != len(tied) {
						err = fmt.Errorf("stream saw %d records, want %d", n, len(tied))
					}
					if err != nil {
						errs <- err
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
		})
	})

	t.Run("BadStoredDocumentsAreSkipped", func(t *testing.T) {
		if opt.InsertBad == nil {
			t.Skip("no way to store a bad document given")
		}
		s := open(t)
		defer s.Close()
		good := Generate(GenConfig{Seed: 6, N: 120, Anomaly: true})
		if err := s.Write(ctx, ExecBatch(provenance.KindAnomalies, good)); err != nil {
			t.Fatal(err)
		}
		_, fs, _, _ := GenerateOthers(0, 3)
		if err := s.Write(ctx, provenance.Batch{Kind: provenance.KindFuncStats, FuncStats: fs}); err != nil {
			t.Fatal(err)
		}
		bad := opt.InsertBad(t, s, good[0])
		checkSkips := func(t *testing.T, sk *provenance.Skips, want int64) {
			t.Helper()
			if sk.Count() != want || (want > 0 && !errors.Is(sk.First(), provenance.ErrBadDocument)) {
				t.Fatalf("%d records reported skipped (first: %v), want %d wrapping ErrBadDocument", sk.Count(), sk.First(), want)
			}
		}
		for _, tc := range []struct {
			name string
			q    provenance.Query
		}{
			{"every record", provenance.Query{Limit: provenance.NoLimit}},
			{"by score, descending", provenance.Query{Sort: provenance.SortOutlierScore, Desc: true, Limit: provenance.NoLimit}},
			{"the program and rank", provenance.Query{PID: ptr(good[0].PID), Rank: ptr(good[0].RID), Limit: provenance.NoLimit}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				q := tc.q
				if err := q.Normalize(); err != nil {
					t.Fatal(err)
				}
				want := ids(reference(q, good))
				var sk provenance.Skips
				if got := eachIDs(provenance.WithSkips(ctx, &sk), t, s, q); !reflect.DeepEqual(got, want) {
					t.Fatalf("Each: got %d %v\nwant %d %v", len(got), head(got), len(want), head(want))
				}
				if q.Rank == nil {
					checkSkips(t, &sk, int64(len(bad)))
				} else if sk.Count() == 0 {
					t.Fatal("Each met no bad document on the rank of the bad ones")
				}
				q.Limit = provenance.MaxLimit
				var qk provenance.Skips
				recs, err := s.Query(provenance.WithSkips(ctx, &qk), q)
				if err != nil {
					t.Fatalf("Query: %v", err)
				}
				if got := ids(recs); !reflect.DeepEqual(got, want) {
					t.Fatalf("Query: got %d %v\nwant %d %v", len(got), head(got), len(want), head(want))
				}
				if qk.Count() != sk.Count() {
					t.Fatalf("Query reported %d skipped, Each %d", qk.Count(), sk.Count())
				}
			})
		}
		// A limited read still returns its limit of records where bad
		// ones are left out among them: the store reads further.
		t.Run("limits", func(t *testing.T) {
			refilled := false
			for _, sort := range []string{provenance.SortEntry, provenance.SortOutlierScore} {
				for _, limit := range []int{1, 5, 17, 60, 119, 120, 200} {
					q := provenance.Query{Sort: sort, Limit: limit}
					if err := q.Normalize(); err != nil {
						t.Fatal(err)
					}
					want := ids(reference(q, good))
					var sk provenance.Skips
					if got := eachIDs(provenance.WithSkips(ctx, &sk), t, s, q); !reflect.DeepEqual(got, want) {
						t.Fatalf("Each by %s, limit %d: got %d %v\nwant %d %v", sort, limit, len(got), head(got), len(want), head(want))
					}
					recs, err := s.Query(ctx, q)
					if err != nil {
						t.Fatal(err)
					}
					if got := ids(recs); !reflect.DeepEqual(got, want) {
						t.Fatalf("Query by %s, limit %d: got %d %v\nwant %d %v", sort, limit, len(got), head(got), len(want), head(want))
					}
					if sk.Count() > int64(len(bad)) {
						t.Fatalf("Each by %s, limit %d: %d records reported skipped, but only %d are bad", sort, limit, sk.Count(), len(bad))
					}
					refilled = refilled || sk.Count() > 0 && limit < len(good)
				}
			}
			if !refilled {
				t.Fatal("no limited read met a bad record: the test tests nothing")
			}
		})
		t.Run("Get refuses a bad record", func(t *testing.T) {
			for _, id := range bad {
				if _, err := s.Get(ctx, provenance.KindAnomalies, good[0].PID, id); err == nil || errors.Is(err, provenance.ErrNotFound) {
					t.Errorf("Get %s: error %v, want one for a bad document", id, err)
				}
			}
		})
		t.Run("func_stats", func(t *testing.T) {
			var sk provenance.Skips
			n := 0
			if err := s.FuncStats(provenance.WithSkips(ctx, &sk), func(provenance.GlobalFuncStats) error { n++; return nil }); err != nil {
				t.Fatal(err)
			}
			if n != len(fs) {
				t.Fatalf("%d func_stats records read, want the %d good ones", n, len(fs))
			}
			checkSkips(t, &sk, 1)
		})
		t.Run("without Skips", func(t *testing.T) {
			if got := eachIDs(ctx, t, s, provenance.Query{Limit: provenance.NoLimit}); len(got) != len(good) {
				t.Fatalf("%d records, want the %d good ones", len(got), len(good))
			}
		})
	})

	t.Run("BadQueriesAreRefused", func(t *testing.T) {
		s := open(t)
		defer s.Close()
		for name, q := range map[string]provenance.Query{
			"sort field": {Sort: "doc; DROP TABLE anomalies"},
			"kind":       {Kind: "users"},
			"regexp":     {FuncRegexp: "(unclosed"},
			"no limit":   {Limit: provenance.NoLimit},
			"limit":      {Limit: -2},
			"huge limit": {Limit: provenance.MaxLimit + 1},
			"cursor of another order": {Sort: provenance.SortRuntimeTotal,
				After: &provenance.Cursor{Sort: provenance.SortEntry, PID: 0, EventID: "1:2:3"}},
			"empty range": {StepMin: ptr[uint64](5), StepMax: ptr[uint64](1)},
		} {
			if _, err := s.Query(ctx, q); err == nil {
				t.Errorf("%s: query accepted", name)
			}
		}
		if err := s.Each(ctx, provenance.Query{Limit: -2}, func(provenance.Exec) error { return nil }); err == nil {
			t.Error("each: limit -2 accepted")
		}
		if err := s.Each(ctx, provenance.Query{Kind: provenance.KindMetadata}, func(provenance.Exec) error { return nil }); err == nil {
			t.Error("each: kind metadata accepted")
		}
		if _, err := s.Aggregate(ctx, provenance.Query{}, "pid"); err == nil {
			t.Error("aggregate by an unknown grouping accepted")
		}
		mustCount(ctx, t, s, provenance.Query{}, 0)
	})

	t.Run("FuncStatsReadBack", func(t *testing.T) {
		s := open(t)
		defer s.Close()
		var fs []provenance.GlobalFuncStats
		for _, pid := range []uint32{1, 0} {
			_, f, _, _ := GenerateOthers(pid, 1)
			slices.Reverse(f)
			fs = append(fs, f...)
		}
		fs[0].NaturalRange = &provenance.Range{Low: 2.5, High: 140}
		if err := s.Write(ctx, provenance.Batch{Kind: provenance.KindFuncStats, FuncStats: append(fs, fs[1])}); err != nil {
			t.Fatal(err)
		}
		var got []provenance.GlobalFuncStats
		if err := s.FuncStats(ctx, func(f provenance.GlobalFuncStats) error {
			got = append(got, f)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		want := slices.Clone(fs)
		slices.SortFunc(want, func(a, b provenance.GlobalFuncStats) int {
			if a.PID != b.PID {
				return int(a.PID) - int(b.PID)
			}
			return strings.Compare(a.Func, b.Func)
		})
		if !reflect.DeepEqual(got, want) {
			t.Errorf("func_stats read back\n got %+v\nwant %+v", got, want)
		}
		if r := provenance.FinalRanges(got); len(r) != 1 || r[fs[0].Func] != (provenance.Range{Low: 2.5, High: 140}) {
			t.Errorf("final ranges %v, want the one record's", r)
		}
	})

	t.Run("ProfilesAndMetadataReadBack", func(t *testing.T) {
		s := open(t)
		defer s.Close()
		// Two programs with the same ranks, written program 1 first and
		// in reverse rank order, plus an earlier snapshot and a record
		// written twice: read back once each, in key order.
		var meta []provenance.Metadata
		var prof []provenance.ThreadProfile
		for _, pid := range []uint32{1, 0} {
			m, _, _, p := GenerateOthers(pid, 3)
			slices.Reverse(m)
			slices.Reverse(p)
			meta, prof = append(meta, m...), append(prof, p...)
		}
		snap := prof[0]
		snap.Step, snap.Final = 4, false
		prof = append(prof, snap, prof[1])
		if err := s.Write(ctx, provenance.Batch{Kind: provenance.KindProfiles, Profiles: prof}); err != nil {
			t.Fatal(err)
		}
		if err := s.Write(ctx, provenance.Batch{Kind: provenance.KindMetadata, Metadata: append(meta, meta[0])}); err != nil {
			t.Fatal(err)
		}
		var keys []string
		if err := s.Profiles(ctx, func(p provenance.ThreadProfile) error {
			if len(p.Timers) == 0 {
				return fmt.Errorf("profile %s read back without its timers", p.Key())
			}
			keys = append(keys, p.Key())
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		want := []string{"0/0/0/19", "0/1/0/19", "0/2/0/19", "1/0/0/19", "1/1/0/19", "1/2/0/4", "1/2/0/19"}
		if !reflect.DeepEqual(keys, want) {
			t.Errorf("profiles read back %v, want %v", keys, want)
		}
		keys = keys[:0]
		if err := s.Metadata(ctx, func(m provenance.Metadata) error {
			keys = append(keys, m.Key()+"="+m.Value)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		want = want[:0]
		for _, pid := range []int{0, 1} {
			for r := range 3 {
				want = append(want, fmt.Sprintf("%d/%d/0/Hostname=node00", pid, r), fmt.Sprintf("%d/%d/16/CUDA Device=NVIDIA A100", pid, r))
			}
		}
		if !reflect.DeepEqual(keys, want) {
			t.Errorf("metadata read back %v, want %v", keys, want)
		}
		stop := errors.New("stop")
		n := 0
		if err := s.Profiles(ctx, func(provenance.ThreadProfile) error { n++; return stop }); err != stop || n != 1 {
			t.Errorf("Profiles with a callback error: err %v after %d calls, want the callback's error after 1", err, n)
		}
	})

	t.Run("ConcurrentOverlappingWrites", func(t *testing.T) {
		s := open(t)
		defer s.Close()
		execs := Generate(GenConfig{Seed: 4, N: 200, Programs: 2})
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for w := range 4 {
			wg.Go(func() {
				// Each writer writes overlapping halves, in its own order.
				for i := range 4 {
					lo := ((w + i) % 4) * 50
					if err := s.Write(ctx, ExecBatch(provenance.KindNormalExecs, execs[lo:min(lo+100, 200)])); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Go(func() {
			for range 5 {
				if _, err := s.Query(ctx, provenance.Query{Kind: provenance.KindNormalExecs, Limit: 50}); err != nil {
					errs <- err
					return
				}
			}
		})
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		mustCount(ctx, t, s, provenance.Query{Kind: provenance.KindNormalExecs}, 200)
	})
}

func mustCount(ctx context.Context, t *testing.T, s provenance.Store, q provenance.Query, want int64) {
	t.Helper()
	n, err := s.Count(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if n != want {
		t.Fatalf("count of %s = %d, want %d", q.Kind, n, want)
	}
}

// eachIDs is the keys of the records Each passes for q.
func eachIDs(ctx context.Context, t *testing.T, s provenance.Store, q provenance.Query) []string {
	t.Helper()
	out := []string{}
	if err := s.Each(ctx, q, func(e provenance.Exec) error {
		out = append(out, provenance.ExecKey(e.PID, e.EventID))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// TiedExecs changes execs in place so that many share each sort value
// (entry, runtime_total, runtime_exclusive, outlier_score), which makes the
// record key decide their order, and returns them.
func TiedExecs(execs []provenance.Exec) []provenance.Exec {
	for i := range execs {
		e := &execs[i]
		e.Entry = e.IOStepTStart + uint64(i%2)
		e.CallStack[0].Entry = e.Entry
		e.RuntimeTotal = 1000 + uint64(i%3)*10
		e.RuntimeExclusive = 500 + uint64(i%5)
		e.OutlierScore = float64(i%4) / 2
		e.Exit = e.Entry + e.RuntimeTotal
		e.CallStack[0].Exit = e.Exit
	}
	return execs
}

// reference answers q on execs in Go.
func reference(q provenance.Query, execs []provenance.Exec) []provenance.Exec {
	re, _ := q.Regexp()
	var out []provenance.Exec
	for i := range execs {
		if q.Match(&execs[i], re) {
			out = append(out, execs[i])
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return q.Less(&out[i], &out[j]) })
	if q.Limit > 0 && len(out) > q.Limit {
		out = out[:q.Limit]
	}
	return out
}

func ids(es []provenance.Exec) []string {
	out := make([]string, 0, len(es))
	for _, e := range es {
		out = append(out, provenance.ExecKey(e.PID, e.EventID))
	}
	return out
}

func head(s []string) string {
	if len(s) > 8 {
		s = s[:8]
	}
	return strings.Join(s, " ")
}

func groups(gs []provenance.Group) string {
	var b strings.Builder
	for i, g := range gs {
		if i == 8 {
			b.WriteString("...")
			break
		}
		if g.Rank != nil {
			fmt.Fprintf(&b, "rank=%d ", *g.Rank)
		}
		if g.Step != nil {
			fmt.Fprintf(&b, "step=%d ", *g.Step)
		}
		if g.Func != "" {
			fmt.Fprintf(&b, "func=%q ", g.Func)
		}
		fmt.Fprintf(&b, "count=%d; ", g.Count)
	}
	return b.String()
}
