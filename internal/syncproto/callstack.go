package syncproto

// CallstackRequest asks detectors for their open call stacks right now
// (the live probe on kipimo.<run>.ad.<pid>.<rank>.callstack, or the
// scatter-gather subject kipimo.<run>.ad.callstack that every detector answers).
type CallstackRequest struct {
	Rank *uint32 `json:"rank,omitempty"` // only this rank answers, when set
}

// OpenFrame is one execution that has entered and not yet exited.
type OpenFrame struct {
	FID     uint32 `json:"fid"`
	Func    string `json:"func"`
	Entry   uint64 `json:"entry"`
	EventID string `json:"event_id"`
}

// ThreadStack is one thread's open frames, outermost first.
type ThreadStack struct {
	TID    uint32      `json:"tid"`
	GPU    bool        `json:"gpu,omitempty"`
	Frames []OpenFrame `json:"frames"`
}

// CallstackReply is one detector's answer: every thread of one rank.
type CallstackReply struct {
	PID     uint32        `json:"pid"`
	Rank    uint32        `json:"rank"`
	IOStep  uint64        `json:"io_step"` // last step processed
	Threads []ThreadStack `json:"threads"`
}
