package pserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/stats"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// poisonNegativeN is the 175-byte kind of request that used to break a
// pserver for the whole run: non-finite, negative moments.
const poisonNegativeN = `{"pid":0,"rank":9,"seq":1,"io_step":1,"algorithm":"sstd","models":[{"key":"solver::kernel_000",` +
	`"moments":{"n":-1e300,"mean":-1e300,"m2":-1e300,"m3":0,"m4":0,"min":-1e300,"max":-1e300}}]}`

// poisons are requests a detector never sends; each must be refused whole.
// Rank 1 of the generated run is a known rank (its last Seq is 2 when they
// are sent).
func poisons() []struct{ name, body string } {
	long := strings.Repeat("x", syncproto.MaxKeyLen+1)
	return []struct{ name, body string }{
		{"negative n", poisonNegativeN},
		{"huge n", `{"pid":0,"rank":9,"seq":1,"models":[{"key":"f","moments":{"n":1e300,"mean":1,"min":1,"max":1}}]}`},
		{"fractional n", `{"pid":0,"rank":9,"seq":1,"models":[{"key":"f","moments":{"n":1.5,"mean":1,"min":1,"max":1}}]}`},
		{"min above max", `{"pid":0,"rank":9,"seq":1,"models":[{"key":"f","moments":{"n":2,"mean":1,"min":3,"max":1}}]}`},
		{"m2 beyond the range", `{"pid":0,"rank":9,"seq":1,"models":[{"key":"f","moments":{"n":2,"mean":1,"m2":1e200,"min":0,"max":2}}]}`},
		{"negative m2", `{"pid":0,"rank":9,"seq":1,"models":[{"key":"f","moments":{"n":2,"mean":1,"m2":-1,"min":0,"max":2}}]}`},
		{"huge mean", `{"pid":0,"rank":9,"seq":1,"models":[{"key":"f","moments":{"n":1,"mean":1e300,"min":1e300,"max":1e300}}]}`},
		{"further rank's moments", `{"pid":0,"rank":9,"seq":1,"models":[{"key":"f","moments":{"n":1,"mean":1,"min":1,"max":1},"more":[{"moments":{"n":-1}}]}]}`},
		{"histogram edge", `{"pid":0,"rank":9,"seq":1,"models":[{"key":"f","histogram":{"first_edge":1e300,"bin_width":1e299,"counts":[1],"min":1e300,"max":1e300}}]}`},
		{"tail bounds", `{"pid":0,"rank":9,"seq":1,"models":[{"key":"f","tail":{"lo":0,"counts":[1],"mins":[5],"maxs":[1]}}]}`},
		{"counter moments", `{"pid":0,"rank":9,"seq":1,"counters":[{"name":"c","moments":{"n":-3,"mean":1}}]}`},
		{"step scores", `{"pid":0,"rank":9,"seq":1,"steps":[{"io_step":1,"scores":{"n":1,"mean":-1e300,"min":-1e300,"max":-1e300}}]}`},
		{"step anomalies", `{"pid":0,"rank":9,"seq":1,"steps":[{"io_step":1,"anomalies":18446744073709551615}]}`},
		{"function name", `{"pid":0,"rank":9,"seq":1,"models":[{"key":"` + long + `","moments":{"n":1,"mean":1,"min":1,"max":1}}]}`},
		{"sequence 2^62", `{"pid":0,"rank":1,"seq":4611686018427387904,"steps":[{"io_step":2}]}`},
		{"io_step 2^62", `{"pid":0,"rank":1,"seq":3,"steps":[{"io_step":4611686018427387904,"anomalies":1}]}`},
		{"rank twice in a node's request", `{"pid":0,"rank":9,"node":"n","ranks":[{"pid":0,"rank":9,"seq":1},{"pid":0,"rank":9,"seq":2}]}`},
		{"node's rank at 2^62", `{"pid":0,"rank":9,"node":"n","ranks":[{"pid":0,"rank":1,"seq":4611686018427387904}]}`},
	}
}

// TestPoisonedSyncIsRefused sends every poison between the valid requests of
// a run, in each durability mode: each is answered with an error and
// counted, and the run is unharmed: later valid requests are answered, the
// models and aggregates are those of the valid requests alone, the JSON API
// answers valid JSON and the final statistics are published.
func TestPoisonedSyncIsRefused(t *testing.T) {
	for _, mode := range []string{DurabilityWAL, DurabilityNone} {
		t.Run(mode, func(t *testing.T) {
			_, nc := startNATS(t)
			run := "poison" + mode
			s := startServer(t, nc, Config{Run: run, Durability: mode})
			g := newGenRun(3, 4, 4, 0, 61)
			for _, row := range g.reqs[:2] {
				for i := range row {
					doSync(t, nc, run, 0, &row[i])
				}
			}
			ps := poisons()
			for _, p := range ps {
				rep := rawSync(t, nc, run, []byte(p.body))
				if rep.Error == "" || rep.Applied || !rep.Invalid {
					t.Errorf("%s: answered %+v, want an error", p.name, rep)
				} else if !strings.Contains(rep.Error, "invalid sync request") {
					t.Errorf("%s: error %q does not say the request is invalid", p.name, rep.Error)
				}
			}
			for _, row := range g.reqs[2:] {
				for i := range row {
					if rep := doSync(t, nc, run, 0, &row[i]); !rep.Applied {
						t.Fatalf("valid request %d/%d seq %d after the poisons was not applied", row[i].PID, row[i].Rank, row[i].Seq)
					}
				}
			}
			want := reference(t, g.all(), DefaultWindow)
			got := state(s)
			compareModels(t, mode, want, got)
			compareAggregates(t, mode, want, got)

			h := s.Handler()
			for _, path := range []string{"/api/functions", "/api/summary", "/api/counters", "/api/steps", "/api/top/functions"} {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
				if rec.Code != http.StatusOK || !json.Valid(rec.Body.Bytes()) || rec.Body.Len() == 0 {
					t.Errorf("GET %s: %d %q", path, rec.Code, rec.Body.String())
				}
			}
			var sum Summary
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/summary", nil))
			_ = json.Unmarshal(rec.Body.Bytes(), &sum)
			if sum.Invalid != uint64(len(ps)) || sum.IOStep != uint64(g.steps-1) {
				t.Errorf("summary: %d invalid requests at io_step %d, want %d at %d", sum.Invalid, sum.IOStep, len(ps), g.steps-1)
			}
			if !strings.Contains(scrape(t, h), fmt.Sprintf(`kipimo_ps_sync_requests_total{result="invalid"} %d`, len(ps))) {
				t.Error("the refused requests are not counted in kipimo_ps_sync_requests_total{result=\"invalid\"}")
			}

			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := s.Shutdown(ctx); err != nil {
				t.Fatalf("shutdown (final statistics): %v", err)
			}
			js, _ := jetstream.New(nc)
			str, err := js.Stream(ctx, natsx.ProvStream(run))
			if err != nil {
				t.Fatal(err)
			}
			msg, err := str.GetLastMsgForSubject(ctx, natsx.Subjects{Run: run}.Prov(string(provenance.KindFuncStats)))
			if err != nil {
				t.Fatalf("final func_stats: %v", err)
			}
			var recs []provenance.GlobalFuncStats
			if err := json.Unmarshal(msg.Data, &recs); err != nil || len(recs) != len(want.Models) {
				t.Fatalf("final func_stats: %d records (%v), want %d", len(recs), err, len(want.Models))
			}
		})
	}
}

// rawSync sends data as a sync request and returns the decoded reply.
func rawSync(t *testing.T, nc *nats.Conn, run string, data []byte) syncproto.SyncReply {
	t.Helper()
	m, err := nc.Request(natsx.Subjects{Run: run}.Sync(0), data, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var rep syncproto.SyncReply
	if err := json.Unmarshal(m.Data, &rep); err != nil {
		t.Fatalf("reply %q: %v", m.Data, err)
	}
	return rep
}

func scrape(t *testing.T, h http.Handler) string {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: %d", rec.Code)
	}
	return rec.Body.String()
}

// TestReplaySkipsInvalidLogEntries puts a poisoned entry into the sync log
// behind the server's back (as a log written before requests were
// validated would hold): the running server and one restarted on the log
// skip and count it, and the state is that of the valid requests.
func TestReplaySkipsInvalidLogEntries(t *testing.T) {
	_, nc := startNATS(t)
	cfg := Config{Run: "replay", Durability: DurabilityWAL, SnapshotInterval: time.Hour}
	a := startServer(t, nc, cfg)
	g := newGenRun(3, 4, 4, 0, 71)
	for i := range g.reqs[0] {
		doSync(t, nc, "replay", 0, &g.reqs[0][i])
	}
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := js.Publish(ctx, natsx.Subjects{Run: "replay"}.PSWAL(0), []byte(poisonNegativeN)); err != nil {
		t.Fatal(err)
	}
	for i := range g.reqs[1] {
		doSync(t, nc, "replay", 0, &g.reqs[1][i]) // applied after the poisoned entry
	}
	if n := a.skipped.Load(); n != 1 {
		t.Errorf("running server skipped %d log entries, want 1", n)
	}
	a.abort()
	b := startServer(t, nc, cfg)
	defer b.Shutdown(context.Background())
	if n := b.skipped.Load(); n != 1 {
		t.Errorf("restarted server skipped %d log entries on replay, want 1", n)
	}
	if !strings.Contains(scrape(t, b.Handler()), `kipimo_ps_replay_skipped_total{source="wal"} 1`) {
		t.Error("the skipped entry is not counted in kipimo_ps_replay_skipped_total{source=\"wal\"}")
	}
	for _, row := range g.reqs[2:] {
		for i := range row {
			doSync(t, nc, "replay", 0, &row[i])
		}
	}
	want := reference(t, g.all(), DefaultWindow)
	got := state(b)
	compareModels(t, "replay", want, got)
	compareAggregates(t, "replay", want, got)
}

// TestSnapshotLoadDropsInvalidState stores a snapshot holding a non-finite
// model and counter and non-finite aggregate statistics (as a snapshot
// written before requests were validated could): the server that loads it
// drops or resets them, counts them, and serves valid JSON and final
// statistics.
func TestSnapshotLoadDropsInvalidState(t *testing.T) {
	_, nc := startNATS(t)
	g := newGenRun(2, 3, 3, 0, 73)
	st := reference(t, g.all(), DefaultWindow)
	st.Models["poisoned"] = &Model{Key: "poisoned", Summary: stats.Summary{Moments: stats.Moments{N: math.Inf(-1), Mean: math.NaN()}}}
	st.Counters["poisoned"] = &stats.Moments{N: 1, Mean: math.Inf(1)}
	st.Agg.Funcs[funcName(0)] = &AnomalyMetrics{Count: 1, Score: stats.Moments{N: 1, Mean: math.Inf(1), Min: 1, Max: 1}}
	data, _, err := encodeState(st)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	js, _ := jetstream.New(nc)
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: BucketName("snap"), History: 1, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := saveSnapshot(ctx, kv, 0, data, 0, false); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, nc, Config{Run: "snap", Durability: DurabilitySnapshot})
	if n := s.skipped.Load(); n != 3 {
		t.Errorf("skipped %d things of the snapshot, want 3 (a model, a counter, a statistic)", n)
	}
	got := state(s)
	if got.Models["poisoned"] != nil || got.Counters["poisoned"] != nil || len(got.Models) != len(st.Models)-1 {
		t.Errorf("the invalid model or counter was loaded (%d models)", len(got.Models))
	}
	if f := got.Agg.Funcs[funcName(0)]; f == nil || f.Count != 1 || f.Score.N != 0 {
		t.Errorf("aggregate with non-finite statistics: %+v, want its count kept and its statistics reset", f)
	}
	for _, path := range []string{"/api/functions", "/api/counters", "/api/top/functions"} {
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != http.StatusOK || !json.Valid(rec.Body.Bytes()) || rec.Body.Len() == 0 {
			t.Errorf("GET %s: %d %q", path, rec.Code, rec.Body.String())
		}
	}
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown (final statistics): %v", err)
	}
}

// TestIncarnations applies the requests of restarted detectors: a new
// incarnation is accepted from Seq 1 and counted once, what the previous
// one sent is neither lost nor counted again (its late retries stay
// duplicates), and a detector without incarnations (0) is deduplicated as
// before.
func TestIncarnations(t *testing.T) {
	req := func(rank uint32, inc, seq uint64, step uint64) *syncproto.SyncRequest {
		var m stats.Moments
		m.Push(float64(10 + seq))
		return &syncproto.SyncRequest{
			PID: 1, Rank: rank, Seq: seq, Incarnation: inc, Algorithm: "sstd",
			Models: []syncproto.ModelDelta{{Key: "f", Moments: m}},
			Steps:  []syncproto.StepSummary{{Step: step, Executions: 1}},
		}
	}
	type call struct {
		r       *syncproto.SyncRequest
		applied bool
		lastSeq uint64
	}
	tests := []struct {
		name  string
		calls []call
		incs  uint64 // new incarnations counted
	}{
		{"without incarnations", []call{
			{req(0, 0, 1, 0), true, 1}, {req(0, 0, 2, 1), true, 2}, {req(0, 0, 2, 1), false, 2}, {req(0, 0, 1, 0), false, 2},
		}, 0},
		{"restart", []call{
			{req(0, 0xa, 1, 0), true, 1}, {req(0, 0xa, 2, 1), true, 2}, {req(0, 0xa, 3, 2), true, 3},
			{req(0, 0xb, 1, 3), true, 1},  // the restarted process starts again at 1
			{req(0, 0xa, 3, 2), false, 3}, // a late retry of the old process
			{req(0, 0xb, 1, 3), false, 1}, // a retry of the new one
			{req(0, 0xb, 2, 4), true, 2},
			{req(0, 0xa, 4, 5), true, 4}, // the old process was not dead after all
		}, 1},
		{"first sync is not a restart", []call{
			{req(0, 0xa, 1, 0), true, 1}, {req(1, 0xb, 1, 0), true, 1},
		}, 0},
		{"upgrade from no incarnation", []call{
			{req(0, 0, 1, 0), true, 1}, {req(0, 0, 2, 1), true, 2}, {req(0, 0xc, 1, 2), true, 1}, {req(0, 0, 2, 1), false, 2},
		}, 1},
		{"many restarts", []call{
			{req(0, 1, 5, 0), true, 5}, {req(0, 2, 1, 1), true, 1}, {req(0, 3, 1, 2), true, 1}, {req(0, 4, 1, 3), true, 1},
			{req(0, 1, 5, 0), false, 5}, {req(0, 2, 1, 1), false, 1}, {req(0, 5, 1, 4), true, 1},
		}, 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := NewState(16)
			var applied []syncproto.SyncRequest
			for i, c := range tc.calls {
				ok, err := st.Apply(c.r)
				if err != nil {
					t.Fatalf("call %d: %v", i, err)
				}
				rep := st.Reply(c.r, ok)
				if ok != c.applied || rep.LastSeq != c.lastSeq {
					t.Errorf("call %d (incarnation %x seq %d): applied %v last_seq %d, want %v %d", i, c.r.Incarnation, c.r.Seq, ok, rep.LastSeq, c.applied, c.lastSeq)
				}
				if ok {
					applied = append(applied, *c.r)
				}
			}
			if st.Incarnations != tc.incs {
				t.Errorf("%d new incarnations counted, want %d", st.Incarnations, tc.incs)
			}
			var want stats.Moments
			for i := range applied {
				want.Merge(applied[i].Models[0].Moments)
			}
			if got := st.Models["f"].Moments; !momentsEqual(got, want) {
				t.Errorf("model %+v, want the merge of the applied requests %+v", got, want)
			}
			// The state survives a snapshot with its incarnations.
			data, _, err := encodeState(st)
			if err != nil {
				t.Fatal(err)
			}
			back, err := decodeState(data, 16)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range tc.calls {
				if ok, _ := back.Apply(c.r); ok {
					t.Fatalf("after a snapshot, incarnation %x seq %d applied again", c.r.Incarnation, c.r.Seq)
				}
			}
		})
	}
}

// TestNodeRequestIncarnations checks a node's request: the staleness of a
// rank is judged in its own incarnation, and Stale names it.
func TestNodeRequestIncarnations(t *testing.T) {
	st := NewState(16)
	node := func(parts ...syncproto.RankPart) *syncproto.SyncRequest {
		return &syncproto.SyncRequest{Node: "n", Algorithm: "sstd", Ranks: parts}
	}
	if ok, err := st.Apply(node(syncproto.RankPart{Rank: 0, Seq: 1, Incarnation: 7}, syncproto.RankPart{Rank: 1, Seq: 1, Incarnation: 8})); !ok || err != nil {
		t.Fatalf("first node request: %v %v", ok, err)
	}
	// Rank 0 restarted (incarnation 9, seq 1); rank 1 resends.
	r := node(syncproto.RankPart{Rank: 0, Seq: 1, Incarnation: 9}, syncproto.RankPart{Rank: 1, Seq: 1, Incarnation: 8})
	ok, err := st.Apply(r)
	if ok || err != nil {
		t.Fatalf("node request with a stale rank applied: %v %v", ok, err)
	}
	rep := st.Reply(r, ok)
	if len(rep.Stale) != 1 || rep.Stale[0] != (syncproto.RankSeq{Rank: 1, Seq: 1, Incarnation: 8}) {
		t.Errorf("stale %+v, want rank 1 seq 1 of incarnation 8", rep.Stale)
	}
	if ok, err := st.Apply(node(syncproto.RankPart{Rank: 0, Seq: 1, Incarnation: 9})); !ok || err != nil {
		t.Errorf("the restarted rank's own request: %v %v", ok, err)
	}
}

// TestCheckBounds checks the bounds on Seq and io_step against the state.
func TestCheckBounds(t *testing.T) {
	st := NewState(16)
	if _, err := st.Apply(&syncproto.SyncRequest{Rank: 0, Seq: 1, Steps: []syncproto.StepSummary{{Step: 100}}}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		req  syncproto.SyncRequest
		ok   bool
	}{
		{"next seq", syncproto.SyncRequest{Seq: 2}, true},
		{"seq at the bound", syncproto.SyncRequest{Seq: 1 + syncproto.MaxSeqAdvance}, true},
		{"seq beyond", syncproto.SyncRequest{Seq: 2 + syncproto.MaxSeqAdvance}, false},
		{"new incarnation beyond", syncproto.SyncRequest{Seq: 1 + syncproto.MaxSeqAdvance, Incarnation: 5}, false},
		{"new rank at the bound", syncproto.SyncRequest{Rank: 3, Seq: syncproto.MaxSeqAdvance}, true},
		{"io_step at the bound", syncproto.SyncRequest{Seq: 2, Steps: []syncproto.StepSummary{{Step: 100 + syncproto.MaxStepAdvance}}}, true},
		{"io_step beyond", syncproto.SyncRequest{Seq: 2, Steps: []syncproto.StepSummary{{Step: 101 + syncproto.MaxStepAdvance}}}, false},
		{"old io_step", syncproto.SyncRequest{Seq: 2, Steps: []syncproto.StepSummary{{Step: 0}}}, true},
		{"read", syncproto.SyncRequest{Seq: 0, Steps: []syncproto.StepSummary{{Step: math.MaxInt64}}}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := st.Check(&tc.req)
			if (err == nil) != tc.ok || (err != nil && !errors.Is(err, syncproto.ErrInvalid)) {
				t.Errorf("Check: %v, want ok %v", err, tc.ok)
			}
		})
	}
}
