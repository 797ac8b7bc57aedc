package adnode

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// NATSSyncer is a Syncer over NATS request/reply on Subjects.Sync(shard),
// with JSON bodies (schemas/sync.schema.json).
type NATSSyncer struct {
	Conn     *nats.Conn
	Subjects natsx.Subjects
}

// Sync implements Syncer.
func (s *NATSSyncer) Sync(ctx context.Context, shard int, req *syncproto.SyncRequest) (*syncproto.SyncReply, error) {
	data, err := syncproto.MarshalRequest(req)
	if err != nil {
		return nil, fmt.Errorf("encode sync request: %w", err)
	}
	subj := s.Subjects.Sync(shard)
	msg, err := s.Conn.RequestWithContext(ctx, subj, data)
	if err != nil {
		return nil, fmt.Errorf("sync request on %s: %w", subj, err)
	}
	rep, err := syncproto.UnmarshalReply(msg.Data)
	if err != nil {
		return nil, fmt.Errorf("decode sync reply from %s: %w", subj, err)
	}
	return rep, nil
}
