package syncproto

import (
	json "github.com/go-json-experiment/json"
)

// The wire form of the sync messages is JSON (schemas/sync.schema.json),
// written and read on both ends by these functions, with one JSON library
// (go-json-experiment/json, the faster of the two in the pserver's
// profile), so that the detector's encoder and the pserver's decoder never
// disagree on what a value means.

// MarshalRequest encodes a sync request.
func MarshalRequest(req *SyncRequest) ([]byte, error) { return json.Marshal(req) }

// UnmarshalRequest decodes a sync request. It does not validate it (see
// SyncRequest.Validate).
func UnmarshalRequest(data []byte) (*SyncRequest, error) {
	var req SyncRequest
	if err := json.Unmarshal(data, &req); err != nil {
		return nil, err
	}
	return &req, nil
}

// MarshalReply encodes a sync reply.
func MarshalReply(rep *SyncReply) ([]byte, error) { return json.Marshal(rep) }

// UnmarshalReply decodes a sync reply.
func UnmarshalReply(data []byte) (*SyncReply, error) {
	var rep SyncReply
	if err := json.Unmarshal(data, &rep); err != nil {
		return nil, err
	}
	return &rep, nil
}
