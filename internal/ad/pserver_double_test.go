package ad

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/kipimo-hpc/kipimo/internal/psync"
	"github.com/kipimo-hpc/kipimo/internal/stats"
)

// fakePServer is a test double of one pserver shard set: it merges deltas
// exactly (Seq-idempotent per detector and shard) and answers with the merged
// models of the keys a request carried. down makes it refuse every request.
type fakePServer struct {
	mu       sync.Mutex
	models   map[string]*psync.GlobalModel
	lastSeq  map[[3]uint64]uint64
	steps    map[[2]uint64]psync.StepSummary
	requests int
	dups     int
	down     atomic.Bool
}

func newFakePServer() *fakePServer {
	return &fakePServer{models: map[string]*psync.GlobalModel{}, lastSeq: map[[3]uint64]uint64{}, steps: map[[2]uint64]psync.StepSummary{}}
}

var errDown = errors.New("pserver double is down")

func (p *fakePServer) Sync(ctx context.Context, shard int, req *psync.SyncRequest) (*psync.SyncReply, error) {
	if p.down.Load() {
		<-ctx.Done()
		return nil, errDown
	}
	return p.handle(shard, req), nil
}

func (p *fakePServer) handle(shard int, req *psync.SyncRequest) *psync.SyncReply {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.requests++
	// A node's request carries its ranks' Seqs: applied whole when none was
	// applied before.
	parts := req.Ranks
	if len(parts) == 0 {
		parts = []psync.RankPart{{PID: req.PID, Rank: req.Rank, Seq: req.Seq, Steps: req.Steps}}
	}
	rep := &psync.SyncReply{}
	fresh := req.Seq > 0 || len(req.Ranks) > 0
	for _, rp := range parts {
		id := [3]uint64{uint64(rp.PID), uint64(rp.Rank), uint64(shard)}
		if rp.Seq <= p.lastSeq[id] {
			fresh = false
			if len(req.Ranks) > 0 && rp.Seq > 0 {
				rep.Stale = append(rep.Stale, psync.RankSeq{PID: rp.PID, Rank: rp.Rank, Seq: rp.Seq})
			}
		}
	}
	if fresh {
		for _, d := range req.Models {
			g := p.models[d.Key]
			if g == nil {
				g = &psync.GlobalModel{Key: d.Key}
				p.models[d.Key] = g
			}
			more := append([]psync.ModelPart{{Moments: d.Moments, Histogram: d.Histogram}}, d.More...)
			for _, m := range more {
				g.Moments.Merge(m.Moments)
				if m.Histogram != nil {
					if g.Histogram == nil {
						g.Histogram = &stats.Histogram{}
					}
					if err := g.Histogram.Merge(*m.Histogram); err != nil {
						rep.Error = err.Error()
						return rep
					}
				}
			}
		}
		for _, rp := range parts {
			for _, s := range rp.Steps {
				p.steps[[2]uint64{uint64(rp.Rank), s.Step}] = s
			}
			p.lastSeq[[3]uint64{uint64(rp.PID), uint64(rp.Rank), uint64(shard)}] = rp.Seq
		}
		rep.Applied = true
	} else {
		p.dups++
	}
	rep.LastSeq = p.lastSeq[[3]uint64{uint64(req.PID), uint64(req.Rank), uint64(shard)}]
	for _, d := range req.Models {
		gm := p.models[d.Key]
		if gm == nil {
			continue
		}
		g := *gm
		if g.Histogram != nil {
			h := *g.Histogram
			h.Counts = append([]uint64(nil), h.Counts...)
			g.Histogram = &h
		}
		rep.Models = append(rep.Models, g)
	}
	return rep
}

func (p *fakePServer) total(key string) float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if g := p.models[key]; g != nil {
		return g.Moments.N
	}
	return 0
}
