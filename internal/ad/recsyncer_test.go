package ad

import (
	"context"
	"sync"

	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// recordingSyncer keeps every request and reply it passes to a fakePServer.
type recordingSyncer struct {
	ps   *fakePServer
	mu   sync.Mutex
	reqs []syncproto.SyncRequest
	reps []syncproto.SyncReply
}

func (r *recordingSyncer) Sync(ctx context.Context, shard int, req *syncproto.SyncRequest) (*syncproto.SyncReply, error) {
	rep, err := r.ps.Sync(ctx, shard, req)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reqs = append(r.reqs, *req)
	if rep != nil {
		r.reps = append(r.reps, *rep)
	}
	return rep, err
}
