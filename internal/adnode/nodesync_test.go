package adnode_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/ad"
	"github.com/kipimo-hpc/kipimo/internal/adnode"
	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/pserver"
	"github.com/kipimo-hpc/kipimo/internal/stats"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

// stateSyncer serves sync requests from real pserver shard states, each
// request and reply going through their JSON wire form. It counts the
// requests it applied per shard.
type stateSyncer struct {
	mu      sync.Mutex
	shards  []*pserver.State
	applied []int
	// loseReply, when set, applies the request of the given call number
	// (counted from 1) and then fails as if its reply were lost.
	loseReply int
	// failCall, when set, fails the given call number without applying
	// anything, as a round trip that timed out before the pserver got it.
	failCall int
	calls    int
	// legacy answers as a pserver that knows no incarnations: its stale
	// ranks name none.
	legacy bool
}

func newStateSyncer(shards int) *stateSyncer {
	s := &stateSyncer{applied: make([]int, shards)}
	for range shards {
		s.shards = append(s.shards, pserver.NewState(8))
	}
	return s
}

func (s *stateSyncer) Sync(_ context.Context, shard int, req *syncproto.SyncRequest) (*syncproto.SyncReply, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	var wire syncproto.SyncRequest
	if err := json.Unmarshal(b, &wire); err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.calls++
	if s.calls == s.failCall {
		s.mu.Unlock()
		return nil, context.DeadlineExceeded
	}
	st := s.shards[shard]
	applied, err := st.Apply(&wire)
	rep := st.Reply(&wire, applied)
	if applied {
		s.applied[shard]++
	}
	lose := s.calls == s.loseReply
	if s.legacy {
		for i := range rep.Stale {
			rep.Stale[i].Incarnation = 0
		}
	}
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if lose {
		return nil, errors.New("reply lost")
	}
	b, err = json.Marshal(rep)
	if err != nil {
		return nil, err
	}
	var out syncproto.SyncReply
	return &out, json.Unmarshal(b, &out)
}

// frames generates every rank's frames of a small workload.
func frames(t *testing.T, wcfg workload.Config) [][]frame.Frame {
	t.Helper()
	w, err := workload.New(wcfg)
	if err != nil {
		t.Fatal(err)
	}
	out := make([][]frame.Frame, wcfg.Ranks)
	for r := range out {
		g := w.Rank(uint32(r))
		for {
			var f frame.Frame
			if _, err := g.Next(&f); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatal(err)
			}
			out[r] = append(out[r], f)
		}
	}
	return out
}

// runLockstep runs one detector per rank in lockstep, each on its own
// goroutine, syncing through syncer, and returns every rank's stats.
func runLockstep(t *testing.T, byRank [][]frame.Frame, cfg ad.Config, syncer ad.Syncer) []ad.Stats {
	t.Helper()
	b := ad.NewBarrier()
	ds := make([]*ad.Detector, len(byRank))
	for r := range byRank {
		c := cfg
		c.Rank, c.Barrier, c.Syncer = uint32(r), b, syncer
		d, err := ad.New(c)
		if err != nil {
			t.Fatal(err)
		}
		b.Join(uint32(r))
		ds[r] = d
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := make([]error, len(ds))
	var wg sync.WaitGroup
	for r, d := range ds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range byRank[r] {
				if err := d.Process(ctx, &byRank[r][i]); err != nil {
					errs[r] = err
					break
				}
			}
			errs[r] = errors.Join(errs[r], d.Close(ctx))
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	out := make([]ad.Stats, len(ds))
	for i, d := range ds {
		out[i] = d.Stats()
	}
	return out
}

// TestNodeSyncSameModel runs the same ranks in lockstep once with every
// rank syncing on its own and once through a NodeSyncer, against real
// pserver shard states, and requires the same global models, counters and
// per-rank step summaries to the bit, with one request per shard per step
// through the node.
func TestNodeSyncSameModel(t *testing.T) {
	wcfg := workload.DefaultConfig()
	wcfg.Ranks, wcfg.Steps, wcfg.EventsPerStep, wcfg.ThreadsPerRank = 6, 6, 3000, 2
	byRank := frames(t, wcfg)
	tests := []struct {
		alg      string
		maxParts int // 0: the default; small: each batch in several requests
	}{
		{ad.Tail, 0}, {ad.SSTD, 0}, {ad.HBOS, 0}, {ad.Tail, 40},
	}
	for _, tc := range tests {
		alg := tc.alg
		t.Run(fmt.Sprintf("%s, at most %d parts per request", alg, tc.maxParts), func(t *testing.T) {
			cfg := ad.Config{PID: wcfg.PID, Algorithm: alg, Shards: 3, SyncWait: time.Second, SyncTimeout: 10 * time.Second}
			perRank := newStateSyncer(cfg.Shards)
			sa := runLockstep(t, byRank, cfg, perRank)
			node := newStateSyncer(cfg.Shards)
			ns := adnode.NewNodeSyncer(node, "test-node", 0, 10*time.Second)
			ns.MaxParts = tc.maxParts
			defer ns.Close()
			sb := runLockstep(t, byRank, cfg, ns)
			for r := range sa {
				if sa[r].Anomalies != sb[r].Anomalies || sa[r].Executions != sb[r].Executions {
					t.Errorf("rank %d: %d anomalies in %d executions per rank, %d in %d through the node", r, sa[r].Anomalies, sa[r].Executions, sb[r].Anomalies, sb[r].Executions)
				}
			}
			for i := range cfg.Shards {
				a, b := perRank.shards[i], node.shards[i]
				if len(a.Models) == 0 {
					t.Fatalf("shard %d holds no model", i)
				}
				if !reflect.DeepEqual(a.Models, b.Models) {
					for k, m := range a.Models {
						if !reflect.DeepEqual(m, b.Models[k]) {
							t.Errorf("shard %d key %q:\nper rank %+v\nnode     %+v", i, k, *m, b.Models[k])
							break
						}
					}
				}
				if !reflect.DeepEqual(a.Counters, b.Counters) {
					t.Errorf("shard %d: counters differ", i)
				}
				if fa, fb := aggString(a.Agg), aggString(b.Agg); fa != fb {
					t.Errorf("shard %d: rank aggregates differ:\n%s\n%s", i, fa, fb)
				}
			}
			// In lockstep every step boundary (one per frame, and the end
			// of the last step at Close) is one write and one read per
			// shard for the whole node, and Close one last write, each
			// carrying every rank's request.
			req, ranks := ns.Syncs()
			want := uint64(cfg.Shards * (2*(len(byRank[0])+1) + 1))
			switch {
			case tc.maxParts == 0 && req != want:
				t.Errorf("node sent %d requests, want shards × (2 × (frames+1) + 1) = %d", req, want)
			case tc.maxParts > 0 && req <= want:
				t.Errorf("node sent %d requests with at most %d parts each, want more than %d", req, tc.maxParts, want)
			}
			if ranks != want*uint64(wcfg.Ranks) {
				t.Errorf("node requests carried %d ranks' requests, want %d (every rank in every batch)", ranks, want*uint64(wcfg.Ranks))
			}
			if perRank.applied[0] < wcfg.Ranks*wcfg.Steps {
				t.Errorf("per-rank syncs applied %d requests on shard 0, want at least ranks × steps = %d", perRank.applied[0], wcfg.Ranks*wcfg.Steps)
			}
		})
	}
}

// aggString prints the per-rank totals and per-(rank, function) anomaly
// metrics of aggregates.
func aggString(a *pserver.Aggregates) string {
	var lines []string
	for _, id := range a.RankIDs() {
		lines = append(lines, fmt.Sprintf("%v %+v", id, *a.Ranks[id]))
	}
	for k, m := range a.RankFunc {
		lines = append(lines, fmt.Sprintf("%v %+v", k, *m))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// delta is a one-key request of rank with seq whose values are vals.
func delta(rank uint32, seq uint64, vals ...float64) *syncproto.SyncRequest {
	var m stats.Moments
	for _, v := range vals {
		m.Push(v)
	}
	return &syncproto.SyncRequest{Rank: rank, Seq: seq, Algorithm: ad.SSTD, Models: []syncproto.ModelDelta{{Key: "f", Moments: m}},
		Steps: []syncproto.StepSummary{{Step: seq, Executions: uint64(len(vals))}}}
}

// inc sets r's incarnation.
func inc(r *syncproto.SyncRequest, incarnation uint64) *syncproto.SyncRequest {
	r.Incarnation = incarnation
	return r
}

// syncAll calls ns.Sync for every request at once and returns the errors.
func syncAll(ns *adnode.NodeSyncer, reqs ...*syncproto.SyncRequest) []error {
	errs := make([]error, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			rep, err := ns.Sync(ctx, 0, r)
			if err == nil && (len(rep.Models) != 1 || rep.Models[0].Key != "f") {
				err = fmt.Errorf("rank %d got models %+v", r.Rank, rep.Models)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	return errs
}

// TestNodeSyncExactlyOnce checks that a node's requests count every rank's
// delta once when replies are lost and ranks resend, alone or mixed with
// other ranks' new requests, and that a batch missing a member goes after
// the linger.
func TestNodeSyncExactlyOnce(t *testing.T) {
	type round struct {
		reqs     []*syncproto.SyncRequest
		loseNext bool // the pserver applies the round's first request and loses its reply
		wantErr  bool
	}
	tests := []struct {
		name    string
		members int
		rounds  []round
		want    float64 // values in the global model at the end
		applied int     // requests the pserver applied
		legacy  bool    // the pserver names no incarnation in stale
	}{
		{
			name:    "every rank in one request",
			members: 3,
			rounds:  []round{{reqs: []*syncproto.SyncRequest{delta(0, 1, 1, 2), delta(1, 1, 3), delta(2, 1, 4, 5, 6)}}},
			want:    6, applied: 1,
		},
		{
			name:    "reply lost, all resent",
			members: 2,
			rounds: []round{
				{reqs: []*syncproto.SyncRequest{delta(0, 1, 1), delta(1, 1, 2)}, loseNext: true, wantErr: true},
				{reqs: []*syncproto.SyncRequest{delta(0, 1, 1), delta(1, 1, 2)}},
			},
			want: 2, applied: 1,
		},
		{
			name:    "reply lost, one rank resends with another's new request",
			members: 2,
			rounds: []round{
				{reqs: []*syncproto.SyncRequest{delta(0, 1, 1)}, loseNext: true, wantErr: true},
				{reqs: []*syncproto.SyncRequest{delta(0, 1, 1), delta(1, 1, 2, 3)}},
				{reqs: []*syncproto.SyncRequest{delta(0, 2, 4), delta(1, 2, 5)}},
			},
			want: 5, applied: 3,
		},
		{
			name:    "reply lost, one rank of an incarnation resends with another's new request",
			members: 2,
			rounds: []round{
				{reqs: []*syncproto.SyncRequest{inc(delta(0, 1, 1), 7)}, loseNext: true, wantErr: true},
				{reqs: []*syncproto.SyncRequest{inc(delta(0, 1, 1), 7), inc(delta(1, 1, 2, 3), 8)}},
				{reqs: []*syncproto.SyncRequest{inc(delta(0, 2, 4), 7), inc(delta(1, 2, 5), 8)}},
			},
			want: 5, applied: 3,
		},
		{
			name:    "the same from a pserver without incarnations",
			members: 2,
			rounds: []round{
				{reqs: []*syncproto.SyncRequest{inc(delta(0, 1, 1), 7)}, loseNext: true, wantErr: true},
				{reqs: []*syncproto.SyncRequest{inc(delta(0, 1, 1), 7), inc(delta(1, 1, 2, 3), 8)}},
				{reqs: []*syncproto.SyncRequest{inc(delta(0, 2, 4), 7), inc(delta(1, 2, 5), 8)}},
			},
			want: 5, applied: 3, legacy: true,
		},
		{
			name:    "a restarted rank (new incarnation) with another rank",
			members: 2,
			rounds: []round{
				{reqs: []*syncproto.SyncRequest{inc(delta(0, 1, 1), 7), inc(delta(1, 1, 2), 8)}},
				{reqs: []*syncproto.SyncRequest{inc(delta(0, 2, 3), 7), inc(delta(1, 1, 4), 9)}},
			},
			want: 4, applied: 2,
		},
		{
			name:    "a member with nothing to send does not hold the batch",
			members: 4,
			rounds:  []round{{reqs: []*syncproto.SyncRequest{delta(0, 1, 1), delta(2, 1, 2)}}},
			want:    2, applied: 1,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ps := newStateSyncer(1)
			ps.legacy = tc.legacy
			ns := adnode.NewNodeSyncer(ps, "test-node", 20*time.Millisecond, 5*time.Second)
			defer ns.Close()
			for range tc.members {
				ns.Join()
			}
			for i, r := range tc.rounds {
				if r.loseNext {
					ps.mu.Lock()
					ps.loseReply = ps.calls + 1
					ps.mu.Unlock()
				}
				errs := syncAll(ns, r.reqs...)
				for _, err := range errs {
					if (err != nil) != r.wantErr {
						t.Fatalf("round %d: error %v, want error %v", i, err, r.wantErr)
					}
				}
			}
			st := ps.shards[0]
			if got := st.Models["f"].Moments.N; got != tc.want {
				t.Errorf("global model holds %v values, want %v", got, tc.want)
			}
			if ps.applied[0] != tc.applied {
				t.Errorf("pserver applied %d requests, want %d", ps.applied[0], tc.applied)
			}
			var execs uint64
			for _, rt := range st.Agg.Ranks {
				execs += rt.Executions
			}
			if float64(execs) != tc.want {
				t.Errorf("step summaries count %d executions, want %v", execs, tc.want)
			}
		})
	}
}

// TestNodeSyncLockstepRetriesWholeBatch: with linger 0 (detectors in
// lockstep) a batch split into several requests whose later request fails
// (lost before or after the pserver applied it) is sent again by the
// syncer until answered. Handing the failure back to its ranks would leave
// their retries waiting forever in a new batch for members already
// answered by the first request.
func TestNodeSyncLockstepRetriesWholeBatch(t *testing.T) {
	tests := []struct {
		name            string
		failCall, loseN int
	}{
		{"second request lost before the pserver", 2, 0},
		{"second request's reply lost", 0, 2},
		{"first request lost before the pserver", 1, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ps := newStateSyncer(1)
			ps.failCall, ps.loseReply = tc.failCall, tc.loseN
			ns := adnode.NewNodeSyncer(ps, "test-node", 0, time.Second)
			ns.MaxParts = 6 // two ranks' requests (3 parts each) per request
			defer ns.Close()
			for range 4 {
				ns.Join()
			}
			for i, err := range syncAll(ns, delta(0, 1, 1), delta(1, 1, 2), delta(2, 1, 3), delta(3, 1, 4)) {
				if err != nil {
					t.Fatalf("rank %d: %v", i, err)
				}
			}
			st := ps.shards[0]
			if got := st.Models["f"].Moments.N; got != 4 {
				t.Errorf("global model holds %v values, want 4", got)
			}
			if ps.applied[0] != 2 {
				t.Errorf("pserver applied %d requests, want 2", ps.applied[0])
			}
			if got := ns.Retries(); got != 1 {
				t.Errorf("%d retries, want 1", got)
			}
		})
	}
}
