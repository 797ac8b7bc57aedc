package bench

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/ad"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// syncMeter is the Syncer of a simulated node: it passes every request to
// the node's NATS syncer and keeps, per kind of request (a node's merged
// write, a node's read, a single rank's request), the count, the encoded
// sizes of requests and replies and the round trips as the node sees them.
// Sizes are those of the JSON the NATS syncer sends (encoded again here;
// the cost is one encoding per node request). Safe for concurrent use.
type syncMeter struct {
	next ad.Syncer
	m    *syncMeasures
}

// syncMeasures are shared by the nodes' meters.
type syncMeasures struct {
	mu    sync.Mutex
	kinds map[string]*syncKind
}

type syncKind struct {
	n, reqBytes, repBytes, parts, keys uint64
	rtt                                []time.Duration
}

// Sync implements ad.Syncer.
func (s *syncMeter) Sync(ctx context.Context, shard int, req *syncproto.SyncRequest) (*syncproto.SyncReply, error) {
	t0 := time.Now()
	rep, err := s.next.Sync(ctx, shard, req)
	rtt := time.Since(t0)
	if err != nil || rep == nil {
		return rep, err
	}
	kind := "rank request"
	if len(req.Ranks) > 0 {
		kind = "node write"
		if req.Reads() {
			kind = "node read"
		}
	}
	qb, _ := syncproto.MarshalRequest(req)
	pb, _ := syncproto.MarshalReply(rep)
	parts := uint64(max(1, len(req.Ranks)))
	var keys uint64
	for i := range req.Models {
		keys += uint64(1 + len(req.Models[i].More))
	}
	s.m.mu.Lock()
	k := s.m.kinds[kind]
	if k == nil {
		k = &syncKind{}
		s.m.kinds[kind] = k
	}
	k.n++
	k.reqBytes += uint64(len(qb))
	k.repBytes += uint64(len(pb))
	k.parts += parts
	k.keys += keys
	k.rtt = append(k.rtt, rtt)
	s.m.mu.Unlock()
	return rep, nil
}

// SimSyncs is what the nodes saw of one kind of sync request.
type SimSyncs struct {
	Kind     string `json:"kind"`
	Requests uint64 `json:"requests"`
	// RequestBytes and ReplyBytes are the mean JSON sizes; RanksPerRequest
	// the ranks' requests merged in one, KeyPartsPerRequest the model
	// deltas (one per key and rank) in one.
	RequestBytes       float64 `json:"request_bytes"`
	ReplyBytes         float64 `json:"reply_bytes"`
	RanksPerRequest    float64 `json:"ranks_per_request"`
	KeyPartsPerRequest float64 `json:"key_parts_per_request"`
	// RoundTripP50Ms and RoundTripP99Ms are from the node's send to the
	// reply's arrival, as the node saw them.
	RoundTripP50Ms float64 `json:"round_trip_p50_ms"`
	RoundTripP99Ms float64 `json:"round_trip_p99_ms"`
}

func (m *syncMeasures) results() []SimSyncs {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []SimSyncs
	for name, k := range m.kinds {
		if k.n == 0 {
			continue
		}
		slices.Sort(k.rtt)
		q := func(p float64) float64 {
			return float64(k.rtt[int(p*float64(len(k.rtt)-1))]) / float64(time.Millisecond)
		}
		n := float64(k.n)
		out = append(out, SimSyncs{
			Kind: name, Requests: k.n, RequestBytes: float64(k.reqBytes) / n, ReplyBytes: float64(k.repBytes) / n,
			RanksPerRequest: float64(k.parts) / n, KeyPartsPerRequest: float64(k.keys) / n,
			RoundTripP50Ms: q(0.5), RoundTripP99Ms: q(0.99),
		})
	}
	slices.SortFunc(out, func(a, b SimSyncs) int {
		switch {
		case a.Kind < b.Kind:
			return -1
		case a.Kind > b.Kind:
			return 1
		}
		return 0
	})
	return out
}
