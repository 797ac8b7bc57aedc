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
	id := [3]uint64{uint64(req.PID), uint64(req.Rank), uint64(shard)}
	rep := &psync.SyncReply{}
	if req.Seq > p.lastSeq[id] {
		for _, d := range req.Models {
			g := p.models[d.Key]
			if g == nil {
				g = &psync.GlobalModel{Key: d.Key}
				p.models[d.Key] = g
			}
			g.Moments.Merge(d.Moments)
			if d.Histogram != nil {
				if g.Histogram == nil {
					g.Histogram = &stats.Histogram{}
				}
				if err := g.Histogram.Merge(*d.Histogram); err != nil {
					rep.Error = err.Error()
					return rep
				}
			}
		}
		for _, s := range req.Steps {
			p.steps[[2]uint64{uint64(req.Rank), s.Step}] = s
		}
		p.lastSeq[id] = req.Seq
		rep.Applied = true
	} else {
		p.dups++
	}
	rep.LastSeq = p.lastSeq[id]
	for _, d := range req.Models {
		g := *p.models[d.Key]
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
