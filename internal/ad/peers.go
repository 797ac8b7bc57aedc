package ad

import (
	"cmp"
	"slices"
	"strings"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// Kinds of function for the peer comparison, by fid (peerKinds).
const (
	peerUnknown int8 = iota // not classified yet
	peerWork
	peerP2P
	peerColl
)

// collTag is the tag of the communication events of a collective (the
// event library's KP_TAG_COLLECTIVE): they name no partner to wait on.
const collTag = 0xFFFFFFFF

// peerAcc accumulates what one rank did in the current io_step: the
// exclusive time and calls of each function whose executions completed in
// the step, and the time of its point-to-point waits by partner (from the
// communication events attached to the wait). Reported in the step summary
// (syncproto.PeerStep) for the parameter server's comparison of ranks and its
// tracing of waits (internal/culprit). Owned by the detector's goroutine.
type peerAcc struct {
	fids     []peerFunc // by fid
	touched  []uint32   // fids with executions in the step
	waits    map[uint32]uint64
	partners []uint32 // scratch: the partners of one wait
}

// peerFunc is one function's exclusive time, calls and longest exclusive
// time in the step, and its kind: kept together, each execution touches
// one cache line.
type peerFunc struct {
	us, calls, maxUs uint64
	kind             int8
}

// peerKind classifies a function by name: an MPI point-to-point wait
// (receives, waits and tests on requests, synchronous sends, probes; a
// standard send returns once its buffer is free, so it is work), an MPI
// collective (whose ranks all wait for the last to arrive), or work.
// Fortran names (mpi_waitall_) and profiling names (PMPI_) count the same.
func peerKind(name string) int8 {
	n := strings.ToLower(strings.TrimRight(name, "_"))
	n = strings.TrimPrefix(n, "p")
	if !strings.HasPrefix(n, "mpi_") {
		return peerWork
	}
	n = n[len("mpi_"):]
	switch n {
	case "recv", "wait", "waitall", "waitany", "waitsome", "test", "testall", "testany", "testsome",
		"ssend", "sendrecv", "sendrecv_replace", "probe", "mprobe", "mrecv":
		return peerP2P
	case "barrier", "bcast", "reduce", "allreduce", "gather", "gatherv", "scatter", "scatterv",
		"allgather", "allgatherv", "alltoall", "alltoallv", "alltoallw", "reduce_scatter",
		"reduce_scatter_block", "scan", "exscan":
		return peerColl
	}
	if strings.HasPrefix(n, "neighbor_") {
		// among neighbours only: not a wait for every rank
		return peerP2P
	}
	return peerWork
}

// observe adds a completed execution of t to the step: its exclusive time
// to its function and, for a point-to-point wait, its time to each partner
// whose message it completed or sent. Called as the execution completes,
// before any later entry on t, so a leaf's communication events are the
// last attached on its thread.
func (p *peerAcc) observe(cs *callStacks, t *thread, e *execRec) {
	if e.flags&(flagLost|flagRepaired) != 0 {
		return
	}
	fid := e.fid
	if int(fid) >= len(p.fids) {
		n := max(int(fid)+1, 2*len(p.fids))
		p.fids = slices.Grow(p.fids, n-len(p.fids))[:n]
	}
	pf := &p.fids[fid]
	if pf.kind == peerUnknown {
		pf.kind = peerKind(cs.funcName(fid))
	}
	if pf.calls == 0 {
		p.touched = append(p.touched, fid)
	}
	x := e.excl()
	pf.us += x
	pf.calls++
	pf.maxUs = max(pf.maxUs, x)
	if pf.kind != peerP2P || e.nchild != 0 || len(t.comms) == 0 {
		return
	}
	seq := t.next() - 1 // a leaf: the thread's latest execution
	p.partners = p.partners[:0]
	for i := len(t.comms) - 1; i >= 0 && t.comms[i].seq == seq; i-- {
		c := &t.comms[i].ev
		if c.Tag == collTag || (c.Kind != frame.Recv && c.Kind != frame.Send) || slices.Contains(p.partners, c.Partner) {
			continue
		}
		p.partners = append(p.partners, c.Partner)
	}
	if len(p.partners) == 0 {
		return
	}
	if p.waits == nil {
		p.waits = map[uint32]uint64{}
	}
	for _, r := range p.partners {
		p.waits[r] += e.incl()
	}
}

// step returns the step's peer data and starts the next step: the
// costliest work functions (syncproto.PeerWorkFuncs), every wait and collective
// (within syncproto.MaxPeerFuncs), and the partners waited on longest
// (syncproto.MaxPeerWaits). Nil when no execution completed in the step.
func (p *peerAcc) step(cs *callStacks) *syncproto.PeerStep {
	if len(p.touched) == 0 {
		return nil
	}
	ps := &syncproto.PeerStep{Funcs: make([]syncproto.PeerFunc, 0, min(len(p.touched), syncproto.MaxPeerFuncs))}
	slices.SortFunc(p.touched, func(a, b uint32) int {
		if c := cmp.Compare(p.fids[b].us, p.fids[a].us); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	work := 0
	for _, fid := range p.touched {
		pf := &p.fids[fid]
		k := pf.kind
		if k == peerWork {
			if work == syncproto.PeerWorkFuncs {
				continue
			}
			work++
		}
		if len(ps.Funcs) == syncproto.MaxPeerFuncs {
			break
		}
		f := syncproto.PeerFunc{Func: cs.funcName(fid), Us: pf.us, Calls: pf.calls, MaxUs: pf.maxUs}
		switch k {
		case peerP2P:
			f.Kind = syncproto.PeerP2P
		case peerColl:
			f.Kind = syncproto.PeerCollective
		}
		ps.Funcs = append(ps.Funcs, f)
	}
	// Two fids may carry one name (a name declared twice): merge them.
	slices.SortStableFunc(ps.Funcs, func(a, b syncproto.PeerFunc) int { return strings.Compare(a.Func, b.Func) })
	ps.Funcs = mergePeerFuncs(ps.Funcs)
	for _, fid := range p.touched {
		pf := &p.fids[fid]
		pf.us, pf.calls, pf.maxUs = 0, 0, 0
	}
	p.touched = p.touched[:0]
	if len(p.waits) > 0 {
		ps.Waits = make([]syncproto.PeerWait, 0, len(p.waits))
		for r, us := range p.waits {
			ps.Waits = append(ps.Waits, syncproto.PeerWait{Partner: r, Us: us})
		}
		slices.SortFunc(ps.Waits, func(a, b syncproto.PeerWait) int {
			if c := cmp.Compare(b.Us, a.Us); c != 0 {
				return c
			}
			return cmp.Compare(a.Partner, b.Partner)
		})
		if len(ps.Waits) > syncproto.MaxPeerWaits {
			ps.Waits = ps.Waits[:syncproto.MaxPeerWaits]
		}
		clear(p.waits)
	}
	return ps
}

// mergePeerFuncs merges adjacent entries of one name in fs (sorted by name).
func mergePeerFuncs(fs []syncproto.PeerFunc) []syncproto.PeerFunc {
	out := fs[:0]
	for _, f := range fs {
		if n := len(out); n > 0 && out[n-1].Func == f.Func {
			out[n-1].Us += f.Us
			out[n-1].Calls += f.Calls
			out[n-1].MaxUs = max(out[n-1].MaxUs, f.MaxUs)
			continue
		}
		out = append(out, f)
	}
	return out
}
