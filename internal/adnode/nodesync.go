package adnode

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/ad"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// NodeSyncer is the Syncer of the detectors of one node (one ad process
// serving several ranks). It gathers the requests its detectors make to a
// shard and sends them to the pserver as one request (syncproto.SyncRequest
// with Ranks) instead of one per rank: the syncs per step are nodes ×
// shards, not ranks × shards.
//
// A batch of a shard is sent as soon as every member detector has a request
// in it, or Linger after its first request (members with nothing to send
// in a step do not hold the others back for longer). Reads (Seq 0) and
// writes batch separately. In a batch the ranks are ordered by (pid, rank)
// and each rank's moments and histograms stay separate parts that the
// pserver merges in that order, so the global model is the same to the bit
// as when the ranks sync one after the other in rank order; tail histograms,
// anomaly counts and counters' sums are merged here (their merge is exact).
// Deduplication stays per rank: a rank resending a request that a lost
// reply had answered is told so by the pserver (Stale) and gets the models
// back without anything being applied twice.
//
// The request the pserver answers is sent by the goroutine whose call
// completed the batch, or by the linger timer's; timeout bounds each round
// trip to the pserver, while callers wait for their batch until their
// context is cancelled (waiting for the node's other detectors is not a
// failure). A batch larger than MaxParts deltas goes as several requests,
// in rank order. A NodeSyncer is safe for concurrent use; Join and Leave
// keep the member count, and Close fails the calls still waiting (and any
// later call).
type NodeSyncer struct {
	// MaxParts bounds the deltas (model, counter and step summary
	// entries) of one request (default maxNodeParts); set it before use.
	MaxParts int

	next   ad.Syncer
	node   string
	linger time.Duration
	// timeout bounds each round trip to the pserver.
	timeout time.Duration

	mu      sync.Mutex
	members int
	shards  map[int]*nodeShard
	closed  bool

	syncs   atomic.Uint64 // requests answered by the pserver
	parts   atomic.Uint64 // ranks' requests in them
	retries atomic.Uint64 // requests of complete batches sent again
}

var _ ad.SharedSyncer = (*NodeSyncer)(nil)

type nodeShard struct {
	open [2]*nodeBatch // writes, reads
}

type nodeBatch struct {
	calls []*nodeCall
	timer *time.Timer
}

// nodeResult is the answer a member's call gets: the pserver's reply, or
// why there is none.
type nodeResult struct {
	rep *syncproto.SyncReply
	err error
}

type nodeCall struct {
	req  *syncproto.SyncRequest
	done chan nodeResult // buffered: a sender never blocks on it
}

// NewNodeSyncer returns a NodeSyncer sending through next on behalf of the
// node named node (informative, sent in each request). With linger 0 a
// batch waits for every member: detectors in lockstep send a request per
// shard every step, so their batches are complete and reproducible.
func NewNodeSyncer(next ad.Syncer, node string, linger, timeout time.Duration) *NodeSyncer {
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	return &NodeSyncer{next: next, node: node, linger: linger, timeout: timeout, shards: map[int]*nodeShard{}}
}

// Join adds a member detector.
func (ns *NodeSyncer) Join() {
	ns.mu.Lock()
	ns.members++
	ns.mu.Unlock()
}

// Leave removes a member detector, sending the batches that were waiting
// only for it.
func (ns *NodeSyncer) Leave() {
	ns.mu.Lock()
	ns.members--
	var ready []pendingSend
	for shard, sh := range ns.shards {
		for kind, b := range sh.open {
			if b != nil && len(b.calls) >= ns.members {
				ready = append(ready, pendingSend{shard, ns.take(sh, kind)})
			}
		}
	}
	ns.mu.Unlock()
	for _, p := range ready {
		go ns.sendTimed(p.shard, p.calls)
	}
}

type pendingSend struct {
	shard int
	calls []*nodeCall
}

// Close fails the requests still waiting and stops the timers.
func (ns *NodeSyncer) Close() {
	ns.mu.Lock()
	ns.closed = true
	var failed []*nodeCall
	for _, sh := range ns.shards {
		for kind, b := range sh.open {
			if b != nil {
				failed = append(failed, ns.take(sh, kind)...)
			}
		}
	}
	ns.mu.Unlock()
	for _, c := range failed {
		c.done <- nodeResult{err: errors.New("node syncer closed")}
	}
}

// WaitsForAll implements ad.SharedSyncer: with no linger a batch waits
// for every member.
func (ns *NodeSyncer) WaitsForAll() bool { return ns.linger == 0 }

// Direct implements ad.SharedSyncer: the Syncer the batches go through.
func (ns *NodeSyncer) Direct() ad.Syncer { return ns.next }

// Syncs returns the requests the pserver answered and the ranks' requests
// they carried.
func (ns *NodeSyncer) Syncs() (requests, ranks uint64) {
	return ns.syncs.Load(), ns.parts.Load()
}

// Retries returns how many times a request of a batch that waited for
// every member was sent again after a failed round trip.
func (ns *NodeSyncer) Retries() uint64 { return ns.retries.Load() }

// Sync implements Syncer: it adds req to the shard's open batch and waits
// for the batch's answer.
func (ns *NodeSyncer) Sync(ctx context.Context, shard int, req *syncproto.SyncRequest) (*syncproto.SyncReply, error) {
	c := &nodeCall{req: req, done: make(chan nodeResult, 1)}
	kind := 0
	if req.Reads() {
		kind = 1
	}
	ns.mu.Lock()
	if ns.closed {
		ns.mu.Unlock()
		return nil, errors.New("node syncer closed")
	}
	sh := ns.shards[shard]
	if sh == nil {
		sh = &nodeShard{}
		ns.shards[shard] = sh
	}
	b := sh.open[kind]
	if b == nil {
		b = &nodeBatch{}
		sh.open[kind] = b
		if ns.linger > 0 {
			b.timer = time.AfterFunc(ns.linger, func() { ns.flush(shard, kind, b) })
		}
	}
	b.calls = append(b.calls, c)
	var calls []*nodeCall
	if len(b.calls) >= ns.members {
		calls = ns.take(sh, kind)
	}
	ns.mu.Unlock()
	if calls != nil {
		ns.send(ctx, shard, calls)
	}
	select {
	case r := <-c.done:
		return r.rep, r.err
	case <-ctx.Done():
		ns.abandon(shard, kind, c)
		return nil, ctx.Err()
	}
}

// take closes the open batch of kind and returns its calls; ns.mu is held.
func (ns *NodeSyncer) take(sh *nodeShard, kind int) []*nodeCall {
	b := sh.open[kind]
	sh.open[kind] = nil
	if b.timer != nil {
		b.timer.Stop()
	}
	return b.calls
}

// flush sends batch b when its linger has passed, unless it was sent.
func (ns *NodeSyncer) flush(shard, kind int, b *nodeBatch) {
	ns.mu.Lock()
	sh := ns.shards[shard]
	if sh == nil || sh.open[kind] != b {
		ns.mu.Unlock()
		return
	}
	calls := ns.take(sh, kind)
	ns.mu.Unlock()
	ns.sendTimed(shard, calls)
}

func (ns *NodeSyncer) sendTimed(shard int, calls []*nodeCall) {
	ns.send(context.Background(), shard, calls)
}

// abandon removes c from its batch if the batch has not been sent.
func (ns *NodeSyncer) abandon(shard, kind int, c *nodeCall) {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	sh := ns.shards[shard]
	if sh == nil || sh.open[kind] == nil {
		return
	}
	b := sh.open[kind]
	if i := slices.Index(b.calls, c); i >= 0 {
		b.calls = slices.Delete(b.calls, i, i+1)
		if len(b.calls) == 0 {
			ns.take(sh, kind)
		}
	}
}

// maxNodeParts bounds the deltas (model, counter and step summary entries)
// of one node request, so that it stays well under NATS's payload limit
// (about 150 bytes each in JSON: some 3 MB); a larger batch goes as several
// requests, in rank order.
const maxNodeParts = 20000

// send delivers calls, in rank order, as requests of at most maxNodeParts
// deltas (more when the pserver reports some ranks stale), each attempt
// bounded by the syncer's timeout, and hands every call its answer.
func (ns *NodeSyncer) send(ctx context.Context, shard int, calls []*nodeCall) {
	slices.SortStableFunc(calls, func(a, b *nodeCall) int {
		return cmp.Or(cmp.Compare(a.req.PID, b.req.PID), cmp.Compare(a.req.Rank, b.req.Rank))
	})
	limit := ns.MaxParts
	if limit <= 0 {
		limit = maxNodeParts
	}
	for len(calls) > 0 {
		n, parts := 0, 0
		for n < len(calls) && (n == 0 || parts+requestParts(calls[n].req) <= limit) {
			parts += requestParts(calls[n].req)
			n++
		}
		ns.sendChunk(ctx, shard, calls[:n])
		calls = calls[n:]
	}
}

// Waits between a complete batch's attempts.
const (
	retryBackoff    = 50 * time.Millisecond
	maxRetryBackoff = 2 * time.Second
)

// roundTrip sends req to shard, each attempt bounded by the syncer's
// timeout. Batches that wait for every member (linger 0, detectors in
// lockstep) are sent again here, whole, until answered, ctx is done or the
// syncer closes: their calls retried one by one would each wait in a new
// batch for members that another request of the same batch answered, and
// never be sent. The pserver's per-rank sequence numbers make a repeat
// apply once.
func (ns *NodeSyncer) roundTrip(ctx context.Context, shard int, req *syncproto.SyncRequest) (*syncproto.SyncReply, error) {
	backoff := retryBackoff
	for {
		actx, cancel := context.WithTimeout(ctx, ns.timeout)
		rep, err := ns.next.Sync(actx, shard, req)
		cancel()
		if err == nil || ns.linger > 0 || !ns.pause(ctx, backoff) {
			return rep, err
		}
		ns.retries.Add(1)
		backoff = min(2*backoff, maxRetryBackoff)
	}
}

// pause waits d and reports whether to try again: not once ctx is done or
// the syncer closed.
func (ns *NodeSyncer) pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	}
	ns.mu.Lock()
	defer ns.mu.Unlock()
	return !ns.closed
}

func requestParts(r *syncproto.SyncRequest) int {
	n := 1 + len(r.Models) + len(r.Counters) + len(r.Steps)
	for i := range r.Steps {
		n += r.Steps[i].Peer.Parts() // each smaller than a delta
	}
	return n
}

// sendChunk delivers calls as one request (as several when the pserver
// reports some ranks stale) and hands every call its answer.
func (ns *NodeSyncer) sendChunk(ctx context.Context, shard int, calls []*nodeCall) {
	for len(calls) > 0 {
		req, err := mergeRequests(ns.node, calls)
		var rep *syncproto.SyncReply
		if err == nil {
			rep, err = ns.roundTrip(ctx, shard, req)
		}
		if err == nil && rep == nil {
			err = fmt.Errorf("pserver shard %d: empty reply", shard)
		}
		if err != nil || rep.Error != "" {
			for _, c := range calls {
				c.done <- nodeResult{rep: rep, err: err}
			}
			return
		}
		ns.syncs.Add(1)
		ns.parts.Add(uint64(len(calls)))
		if len(rep.Stale) == 0 {
			deliver(calls, rep, rep.Applied)
			return
		}
		// Nothing was applied: answer the stale ranks (their request had
		// been applied before) and send the others again.
		stale := map[syncproto.RankSeq]bool{}
		for _, s := range rep.Stale {
			stale[s] = true
		}
		var done, rest []*nodeCall
		for _, c := range calls {
			k := syncproto.RankSeq{PID: c.req.PID, Rank: c.req.Rank, Seq: c.req.Seq, Incarnation: c.req.Incarnation}
			legacy := k
			legacy.Incarnation = 0 // a pserver that names no incarnation
			if stale[k] || stale[legacy] {
				done = append(done, c)
			} else {
				rest = append(rest, c)
			}
		}
		if len(done) == 0 {
			err := fmt.Errorf("pserver shard %d: stale ranks not in the request", shard)
			for _, c := range calls {
				c.done <- nodeResult{err: err}
			}
			return
		}
		deliver(done, rep, false)
		calls = rest
	}
}

// deliver answers each call with the global models of its own keys. The
// histograms are shared by every call's reply: detectors only read them
// (see Syncer).
func deliver(calls []*nodeCall, rep *syncproto.SyncReply, applied bool) {
	byKey := make(map[string]*syncproto.GlobalModel, len(rep.Models))
	for i := range rep.Models {
		byKey[rep.Models[i].Key] = &rep.Models[i]
	}
	for _, c := range calls {
		out := &syncproto.SyncReply{Applied: applied, LastSeq: c.req.Seq, Models: make([]syncproto.GlobalModel, 0, len(c.req.Models))}
		for i := range c.req.Models {
			g, ok := byKey[c.req.Models[i].Key]
			if !ok {
				continue
			}
			out.Models = append(out.Models, *g)
		}
		c.done <- nodeResult{rep: out}
	}
}

// mergeRequests builds a node's request from its ranks' requests, ordered
// by rank. The ranks' requests are not modified.
func mergeRequests(node string, calls []*nodeCall) (*syncproto.SyncRequest, error) {
	first := calls[0].req
	out := &syncproto.SyncRequest{
		PID: first.PID, Rank: first.Rank, Algorithm: first.Algorithm, Hostname: first.Hostname,
		Node: node, Ranks: make([]syncproto.RankPart, 0, len(calls)),
	}
	keys := map[string]int{}
	ctrs := map[string]int{}
	for _, c := range calls {
		r := c.req
		out.Step = max(out.Step, r.Step)
		if out.TailRule == nil && r.TailRule != nil {
			rule := *r.TailRule
			out.TailRule = &rule
		}
		out.Ranks = append(out.Ranks, syncproto.RankPart{PID: r.PID, Rank: r.Rank, Seq: r.Seq, Incarnation: r.Incarnation, Steps: r.Steps})
		for i := range r.Models {
			d := &r.Models[i]
			j, ok := keys[d.Key]
			if !ok {
				keys[d.Key] = len(out.Models)
				nd := syncproto.ModelDelta{Key: d.Key, Moments: d.Moments, Histogram: d.Histogram, Anomalies: d.Anomalies}
				if d.Tail != nil {
					t := d.Tail.Clone()
					nd.Tail = &t
				}
				out.Models = append(out.Models, nd)
				continue
			}
			md := &out.Models[j]
			if r.Reads() {
				continue
			}
			md.More = append(md.More, syncproto.ModelPart{Moments: d.Moments, Histogram: d.Histogram})
			md.Anomalies += d.Anomalies
			if d.Tail != nil {
				if md.Tail == nil {
					t := d.Tail.Clone()
					md.Tail = &t
				} else if err := md.Tail.Merge(*d.Tail); err != nil {
					return nil, fmt.Errorf("merge the tail of %q from rank %d: %w", d.Key, r.Rank, err)
				}
			}
		}
		for i := range r.Counters {
			cd := &r.Counters[i]
			j, ok := ctrs[cd.Name]
			if !ok {
				ctrs[cd.Name] = len(out.Counters)
				out.Counters = append(out.Counters, syncproto.CounterDelta{Name: cd.Name, Moments: cd.Moments})
				continue
			}
			out.Counters[j].More = append(out.Counters[j].More, cd.Moments)
		}
	}
	return out, nil
}

var _ ad.Syncer = (*NodeSyncer)(nil)

var (
	nodeSyncsDesc       = prometheus.NewDesc("kipimo_ad_node_syncs_total", "Sync requests the node's syncer sent for all its ranks and the pserver answered (per step: shards, when every rank syncs).", nil, nil)
	nodeSyncRanksDesc   = prometheus.NewDesc("kipimo_ad_node_sync_ranks_total", "Ranks' sync requests merged into the node's requests.", nil, nil)
	nodeSyncRetriesDesc = prometheus.NewDesc("kipimo_ad_node_sync_retries_total", "Node requests sent again after a failed round trip to the pserver (detectors in lockstep, whose batches wait for every rank).", nil, nil)
)

// SetNode makes the collector report the node syncer's counts.
func (c *Collector) SetNode(ns *NodeSyncer) { c.node.Store(ns) }

// nodeName names this process in node requests: host and process id.
func nodeName() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown-host"
	}
	return host + ":" + strconv.Itoa(os.Getpid())
}
