package ad

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/kipimo-hpc/kipimo/internal/stats"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// fakePServer is a test double of one pserver shard set: it merges deltas
// exactly (Seq-idempotent per detector and shard) and answers with the merged
// models of the keys a request carried. down makes it refuse every request.
type fakePServer struct {
	mu       sync.Mutex
	models   map[string]*syncproto.GlobalModel
	lastSeq  map[[3]uint64]uint64
	steps    map[[2]uint64]syncproto.StepSummary
	requests int
	dups     int
	down     atomic.Bool
}

func newFakePServer() *fakePServer {
	return &fakePServer{models: map[string]*syncproto.GlobalModel{}, lastSeq: map[[3]uint64]uint64{}, steps: map[[2]uint64]syncproto.StepSummary{}}
}

var errDown = errors.New("pserver double is down")

func (p *fakePServer) Sync(ctx context.Context, shard int, req *syncproto.SyncRequest) (*syncproto.SyncReply, error) {
	if p.down.Load() {
		<-ctx.Done()
		return nil, errDown
	}
	return p.handle(shard, req), nil
}

func (p *fakePServer) handle(shard int, req *syncproto.SyncRequest) *syncproto.SyncReply {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.requests++
	// A node's request carries its ranks' Seqs: applied whole when none was
	// applied before.
	parts := req.Ranks
	if len(parts) == 0 {
		parts = []syncproto.RankPart{{PID: req.PID, Rank: req.Rank, Seq: req.Seq, Steps: req.Steps}}
	}
	rep := &syncproto.SyncReply{}
	fresh := req.Seq > 0 || len(req.Ranks) > 0
	for _, rp := range parts {
		id := [3]uint64{uint64(rp.PID), uint64(rp.Rank), uint64(shard)}
		if rp.Seq <= p.lastSeq[id] {
			fresh = false
			if len(req.Ranks) > 0 && rp.Seq > 0 {
				rep.Stale = append(rep.Stale, syncproto.RankSeq{PID: rp.PID, Rank: rp.Rank, Seq: rp.Seq})
			}
		}
	}
	if fresh {
		for _, d := range req.Models {
			g := p.models[d.Key]
			if g == nil {
				g = &syncproto.GlobalModel{Key: d.Key}
				p.models[d.Key] = g
			}
			if d.Tail != nil {
				if g.Tail == nil {
					g.Tail = &stats.TailHist{}
				}
				if err := g.Tail.Merge(*d.Tail); err != nil {
					rep.Error = err.Error()
					return rep
				}
			}
			more := append([]syncproto.ModelPart{{Moments: d.Moments, Histogram: d.Histogram}}, d.More...)
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
				// An applied summary of a step already summarized (the
				// end of the run closes the last step again) adds to it.
				k := [2]uint64{uint64(rp.Rank), s.Step}
				if prev, ok := p.steps[k]; ok {
					s.Anomalies += prev.Anomalies
					s.Executions += prev.Executions
					if s.Peer == nil {
						// a summary of executions labelled after the
						// step they ran in carries none
						s.Peer = prev.Peer
					}
				}
				p.steps[k] = s
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
		if g.Tail != nil {
			t := g.Tail.Clone()
			g.Tail = &t
		}
		if g.Histogram != nil {
			h := *g.Histogram
			h.Counts = append([]uint64(nil), h.Counts...)
			g.Histogram = &h
		}
		rep.Models = append(rep.Models, g)
	}
	return rep
}

// stepCount is the number of (rank, step) summaries received.
func (p *fakePServer) stepCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.steps)
}
