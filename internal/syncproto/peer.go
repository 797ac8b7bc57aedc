package syncproto

import "fmt"

// Bounds on a step summary's peer data.
const (
	// MaxPeerFuncs bounds PeerStep.Funcs: the rank's costliest functions
	// by exclusive time, and every MPI wait and collective.
	MaxPeerFuncs = 64
	// MaxPeerWaits bounds PeerStep.Waits: the partners waited on longest.
	MaxPeerWaits = 64
	// PeerWorkFuncs is how many of its costliest work functions a rank
	// reports: a rank that reports fewer reports all it ran in the step.
	PeerWorkFuncs = 16
)

// PeerStep is one rank's time per function and its waits in one io_step:
// the executions that completed in the step.
type PeerStep struct {
	// Start and End are the step's start and end on the rank (µs, the
	// trace's clock): ranks cut their io_steps on their own clocks, so the
	// pserver compares the ranks' steps that cover the same time.
	Start uint64 `json:"start"`
	End   uint64 `json:"end"`
	// Funcs are the rank's costliest functions by exclusive time (at most
	// MaxPeerFuncs, every MPI wait and collective among them), by name.
	Funcs []PeerFunc `json:"funcs,omitempty"`
	// Waits are the rank's point-to-point waits by partner (at most
	// MaxPeerWaits, longest first).
	Waits []PeerWait `json:"waits,omitempty"`
}

// Kinds of PeerFunc: work, a point-to-point wait (receives, waits and
// tests on requests, blocking sends) or a collective.
const (
	PeerWork       = ""
	PeerP2P        = "p2p"
	PeerCollective = "coll"
)

// PeerFunc is one function's exclusive time and calls in one rank's step.
type PeerFunc struct {
	Func  string `json:"func"`
	Kind  string `json:"kind,omitempty"`
	Us    uint64 `json:"us"`
	Calls uint64 `json:"calls"`
	// MaxUs is the longest of the calls (exclusive time): one stalled call
	// stands out in it when spread over many it would not.
	MaxUs uint64 `json:"max_us,omitempty"`
}

// PeerWait is the time a rank spent in point-to-point waits that completed
// a message from, or sent one to, Partner (a wait completing messages of
// several partners counts whole for each).
type PeerWait struct {
	Partner uint32 `json:"partner"`
	Us      uint64 `json:"us"`
}

// Parts is how many entries p adds to a request (its functions and
// partners), for bounding a request's size; 0 for nil.
func (p *PeerStep) Parts() int {
	if p == nil {
		return 0
	}
	return len(p.Funcs) + len(p.Waits)
}

// Validate checks p's bounds: at most MaxPeerFuncs functions and
// MaxPeerWaits partners, names within MaxKeyLen, known kinds, each
// function and partner once, and times and calls within MaxCount.
func (p *PeerStep) Validate() error {
	switch {
	case p.Start > MaxTimestamp || p.End > MaxTimestamp || p.End < p.Start:
		return fmt.Errorf("peer: step from %d to %d µs (want start <= end <= %d)", p.Start, p.End, uint64(MaxTimestamp))
	case len(p.Funcs) > MaxPeerFuncs:
		return fmt.Errorf("peer: %d functions, more than %d", len(p.Funcs), MaxPeerFuncs)
	case len(p.Waits) > MaxPeerWaits:
		return fmt.Errorf("peer: %d partners, more than %d", len(p.Waits), MaxPeerWaits)
	}
	seen := make(map[string]bool, len(p.Funcs))
	for i := range p.Funcs {
		f := &p.Funcs[i]
		switch {
		case len(f.Func) > MaxKeyLen:
			return fmt.Errorf("peer: function name of %d bytes, more than %d", len(f.Func), MaxKeyLen)
		case f.Kind != PeerWork && f.Kind != PeerP2P && f.Kind != PeerCollective:
			return fmt.Errorf("peer: function %q has kind %q (want \"\", %q or %q)", f.Func, f.Kind, PeerP2P, PeerCollective)
		case f.Us > MaxCount || f.Calls > MaxCount || f.MaxUs > f.Us:
			return fmt.Errorf("peer: function %q: %d µs in %d calls, beyond %d", f.Func, f.Us, f.Calls, uint64(MaxCount))
		case seen[f.Func]:
			return fmt.Errorf("peer: function %q twice", f.Func)
		}
		seen[f.Func] = true
	}
	partners := make(map[uint32]bool, len(p.Waits))
	for _, w := range p.Waits {
		switch {
		case w.Us > MaxCount:
			return fmt.Errorf("peer: wait on rank %d of %d µs, beyond %d", w.Partner, w.Us, uint64(MaxCount))
		case partners[w.Partner]:
			return fmt.Errorf("peer: partner rank %d twice", w.Partner)
		}
		partners[w.Partner] = true
	}
	return nil
}
