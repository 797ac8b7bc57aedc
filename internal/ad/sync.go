package ad

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/stats"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// Syncer sends one sync request to a pserver shard and returns its reply. It
// must be safe for concurrent use (a detector syncs its shards in parallel,
// and the detectors of a node may share one Syncer). The request must not be
// modified by the Syncer. The histograms of a reply may share memory with
// other replies (a node's syncer hands every rank the same global models):
// the detector only reads them.
type Syncer interface {
	Sync(ctx context.Context, shard int, req *syncproto.SyncRequest) (*syncproto.SyncReply, error)
}

// SharedSyncer is a Syncer the detectors of a node share, merging their
// requests (adnode's NodeSyncer): every detector made with one in its
// Config joins it, and leaves it once, when it closes or is suspended, so
// that its batches never wait for a detector that has gone.
type SharedSyncer interface {
	Syncer
	// Join adds a member detector.
	Join()
	// Leave removes a member detector, sending the batches that were
	// waiting only for it.
	Leave()
	// WaitsForAll reports whether a batch waits for every member (no
	// linger: detectors in lockstep).
	WaitsForAll() bool
	// Direct is the Syncer the shared one sends through: a closing
	// detector that has left sends what is left straight through it.
	Direct() Syncer
}

type syncResult struct {
	rep *syncproto.SyncReply
	err error
	// refused: the pserver refused the request as invalid (rep.Invalid);
	// sent again it would be refused again.
	refused bool
}

type shardState struct {
	seq      uint64
	inflight *syncproto.SyncRequest
	keys     []int32
	done     chan syncResult
	healthy  atomic.Bool
}

// syncState is a detector's side of the pserver protocol: at most one
// request outstanding per shard, resent unchanged (same Seq) until answered,
// new deltas accumulating meanwhile. The detector's goroutine owns every
// field but the shards' done channels and health flags, which the senders
// write.
type syncState struct {
	// the detector's configuration, counters, models and current step,
	// which the detector's goroutine shares with this stage
	cfg    *Config
	stats  *counters
	models *modelSet
	cur    *stepInfo
	// syncer is the detector's Syncer; a detector closing leaves its node's
	// SharedSyncer (whose batches would otherwise wait for it) and sends its
	// last deltas straight through the node's own Syncer.
	syncer    Syncer
	node      SharedSyncer // the node's syncer, when there is one
	left      bool         // the detector has left node
	shards    []*shardState
	summaries []syncproto.StepSummary
	// held, with ExactSync, are the step summaries since the last
	// ReleaseOutputs (checkpoint): they are sent after it.
	held     []syncproto.StepSummary
	counters map[string]*stats.Moments
	// incarnation names this sync state in every request (a random
	// non-zero number drawn by newSyncState, kept in checkpoints): the
	// pserver deduplicates a rank's Seq per incarnation, so a detector
	// restarted without its checkpoint, numbering from 1 again, is not
	// taken for retries of its previous process.
	incarnation uint64
	// refused counts the requests the pserver refused as invalid (for
	// logging the 1st, 2nd, 4th, ... only).
	refused uint64
	lag     atomic.Uint64
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

func newSyncState(cfg *Config, st *counters, models *modelSet, cur *stepInfo) *syncState {
	s := &syncState{cfg: cfg, stats: st, models: models, cur: cur, syncer: cfg.Syncer, counters: map[string]*stats.Moments{}, incarnation: newIncarnation()}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	for range cfg.Shards {
		sh := &shardState{done: make(chan syncResult, 1)}
		sh.healthy.Store(true)
		s.shards = append(s.shards, sh)
	}
	if ns, ok := cfg.Syncer.(SharedSyncer); ok {
		ns.Join()
		s.node = ns
	}
	return s
}

// newIncarnation draws a random non-zero incarnation.
func newIncarnation() uint64 {
	for {
		if v := rand.Uint64(); v != 0 {
			return v
		}
	}
}

func (s *syncState) addSummary(sum syncproto.StepSummary) {
	if s.cfg.Syncer == nil {
		return
	}
	if s.cfg.ExactSync {
		s.held = append(s.held, sum)
		return
	}
	s.queueSummary(sum)
}

// queueSummary adds sum to the summaries the next request of shard 0
// carries, dropping (and counting) the oldest beyond MaxStepSummaries.
func (s *syncState) queueSummary(sum syncproto.StepSummary) {
	if len(s.summaries) >= s.cfg.MaxStepSummaries {
		n := len(s.summaries) - s.cfg.MaxStepSummaries + 1
		s.summaries = append(s.summaries[:0], s.summaries[n:]...)
		s.stats.droppedSummaries.Add(uint64(n))
	}
	s.summaries = append(s.summaries, sum)
}

func (s *syncState) addCounters(step map[string]*stats.Moments) {
	for name, m := range step {
		if m.N == 0 {
			continue
		}
		if s.cfg.Syncer != nil {
			a := s.counters[name]
			if a == nil {
				a = &stats.Moments{}
				s.counters[name] = a
			}
			a.Merge(*m)
		}
		*m = stats.Moments{}
	}
}

// step collects answered requests, sends the accumulated deltas of idle
// shards and waits (at most SyncWait, and only on shards that have been
// answering) for their replies. Without a Syncer it merges the local deltas
// into the global model.
func (s *syncState) step(ctx context.Context, final bool) {
	if s.cfg.Syncer == nil {
		for _, m := range s.models.list {
			if m.accum.Moments.N == 0 {
				continue
			}
			s.stats.mergeErrors(m.global.Merge(m.accum))
			m.accum.Reset()
		}
		return
	}
	defer s.updateLag()
	s.collect(false, nil)
	var sent []int
	for i, sh := range s.shards {
		if sh.inflight != nil {
			continue
		}
		if s.send(i, false) && sh.healthy.Load() {
			sent = append(sent, i)
		}
	}
	if len(sent) > 0 {
		t := time.NewTimer(s.cfg.SyncWait)
		defer t.Stop()
		for _, i := range sent {
			sh := s.shards[i]
			select {
			case r := <-sh.done:
				s.apply(i, r)
			case <-t.C:
				return
			case <-ctx.Done():
				return
			}
		}
	}
}

// lockstep sends every accumulated delta in its turn and waits for the
// answers, waits at the barrier for the other detectors to have done the
// same, then reads the global models of all its keys back (pull) and waits
// for the others to have read theirs: the detection models of this step
// hold every rank's data up to it, and nothing of the next.
func (s *syncState) lockstep(ctx context.Context) {
	defer s.updateLag()
	b := s.cfg.Barrier
	s.collect(true, ctx)
	// A node's syncer merges the detectors' requests in rank order itself,
	// once every detector has sent one to the shard: each sends, even empty.
	node := s.viaNode()
	if !node {
		if err := b.Turn(ctx, s.cfg.Rank); err != nil {
			return
		}
	}
	for i, sh := range s.shards {
		if sh.inflight == nil {
			s.send(i, node)
		}
	}
	s.collect(true, ctx)
	if !node {
		b.Next()
	}
	if err := b.Wait(ctx); err != nil {
		return
	}
	s.pull(ctx)
	// Nobody sends the next step's deltas before everyone has read this
	// step's models.
	_ = b.Wait(ctx)
}

// exact waits for what is in flight, sends every accumulated delta and
// waits for the answers (until ctx is done): each request holds exactly
// the steps since the previous one (Config.ExactSync).
func (s *syncState) exact(ctx context.Context) {
	defer s.updateLag()
	s.collect(true, ctx)
	for i, sh := range s.shards {
		if sh.inflight == nil {
			s.send(i, false)
		}
	}
	s.collect(true, ctx)
}

// pull reads the global model of every key of the detector, each shard's
// keys in one request with no deltas (Seq 0: the pserver answers without
// applying anything). Nothing is in flight when it is called.
func (s *syncState) pull(ctx context.Context) {
	reps := make([]*syncproto.SyncReply, len(s.shards))
	var wg sync.WaitGroup
	for i := range s.shards {
		req := &syncproto.SyncRequest{PID: s.cfg.PID, Rank: s.cfg.Rank, Incarnation: s.incarnation, Step: s.cur.step, Algorithm: s.cfg.Algorithm, Hostname: s.cfg.Hostname}
		for _, m := range s.models.list {
			if m.shard == i {
				req.Models = append(req.Models, syncproto.ModelDelta{Key: m.name})
			}
		}
		if len(req.Models) == 0 && !s.viaNode() {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			actx, cancel := s.attempt(ctx)
			defer cancel()
			rep, err := s.syncer.Sync(actx, i, req)
			if err != nil || rep == nil || rep.Error != "" {
				s.stats.syncFailures.Add(1)
				return
			}
			reps[i] = rep
		}()
	}
	wg.Wait()
	for _, rep := range reps {
		if rep == nil {
			continue
		}
		for j := range rep.Models {
			g := &rep.Models[j]
			k, ok := s.models.keyByName[g.Key]
			if !ok {
				continue
			}
			m := s.models.list[k]
			if m.inFlight {
				continue
			}
			g.Into(&m.global)
		}
	}
}

func (s *syncState) updateLag() {
	var lag uint64
	for _, sh := range s.shards {
		if sh.inflight != nil && s.cur.step >= sh.inflight.Step {
			lag = max(lag, s.cur.step-sh.inflight.Step+1)
		}
	}
	s.lag.Store(lag)
}

// collect applies every reply that has arrived; with wait it waits for all
// outstanding requests until ctx is done.
func (s *syncState) collect(wait bool, ctx context.Context) {
	for i, sh := range s.shards {
		if sh.inflight == nil {
			continue
		}
		if wait {
			select {
			case r := <-sh.done:
				s.apply(i, r)
			case <-ctx.Done():
			}
			continue
		}
		select {
		case r := <-sh.done:
			s.apply(i, r)
		default:
		}
	}
}

// attempt bounds one sync attempt by SyncTimeout. Through the node's
// syncer only the pserver's round trip is bounded (the node's syncer does
// it): waiting for the node's other detectors is not a failure, and a
// request given up for it would be sent again in a batch of its own.
func (s *syncState) attempt(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.node != nil && s.syncer == Syncer(s.node) {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, s.cfg.SyncTimeout)
}

// viaNode reports whether the detector syncs through its node's SharedSyncer.
func (s *syncState) viaNode() bool { return s.node != nil }

// send builds shard i's next request from the accumulated deltas and starts
// its sender; it reports whether there was anything to send. With force it
// sends a request also when there is nothing in it.
func (s *syncState) send(i int, force bool) bool {
	sh := s.shards[i]
	req := &syncproto.SyncRequest{PID: s.cfg.PID, Rank: s.cfg.Rank, Incarnation: s.incarnation, Step: s.cur.step, Algorithm: s.cfg.Algorithm, Hostname: s.cfg.Hostname}
	if s.models.gated {
		rule := s.models.rule
		req.TailRule = &rule
	}
	sh.keys = sh.keys[:0]
	for k, m := range s.models.list {
		if m.shard != i || m.accum.Empty() {
			continue
		}
		req.Models = append(req.Models, syncproto.NewModelDelta(m.name, &m.accum, s.cfg.Algorithm != SSTD))
		m.inflight, m.accum = m.accum, stats.Summary{}
		m.inFlight = true
		sh.keys = append(sh.keys, int32(k))
	}
	if i == 0 {
		req.Steps, s.summaries = s.summaries, nil
		for name, m := range s.counters {
			req.Counters = append(req.Counters, syncproto.CounterDelta{Name: name, Moments: *m})
			delete(s.counters, name)
		}
	}
	if len(req.Models) == 0 && len(req.Steps) == 0 && len(req.Counters) == 0 && !force {
		return false
	}
	sh.seq++
	req.Seq = sh.seq
	sh.inflight = req
	s.wg.Add(1)
	go s.sender(i, sh, req)
	return true
}

// sender delivers req to shard i, retrying with exponential backoff until it
// is answered or the detector closes.
func (s *syncState) sender(i int, sh *shardState, req *syncproto.SyncRequest) {
	defer s.wg.Done()
	backoff := 50 * time.Millisecond
	for {
		actx, cancel := s.attempt(s.ctx)
		rep, err := s.syncer.Sync(actx, i, req)
		cancel()
		if err == nil && rep != nil && rep.Error != "" && rep.Invalid {
			// Refused for what it holds: resent it would be refused
			// again, and hold every later delta of the shard back.
			sh.healthy.Store(true)
			sh.done <- syncResult{rep: rep, refused: true}
			return
		}
		if err == nil && rep != nil && rep.Error != "" {
			err = fmt.Errorf("pserver shard %d refused sync %d: %s", i, req.Seq, rep.Error)
		}
		if err == nil && rep != nil {
			sh.healthy.Store(true)
			sh.done <- syncResult{rep: rep}
			return
		}
		s.stats.syncFailures.Add(1)
		if sh.healthy.Swap(false) {
			s.cfg.Logger.Warn().Err(err).Int("shard", i).Uint64("seq", req.Seq).Msg("pserver sync failed; detecting on the local model and retrying")
		}
		select {
		case <-s.ctx.Done():
			sh.done <- syncResult{err: s.ctx.Err()}
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, s.cfg.SyncBackoffMax)
	}
}

// apply installs shard i's reply: the global models replace the AD's copies
// and the in-flight deltas are dropped (the reply includes them).
func (s *syncState) apply(i int, r syncResult) {
	sh := s.shards[i]
	req := sh.inflight
	sh.inflight = nil
	if r.refused {
		s.drop(i, req, r.rep.Error)
		return
	}
	if r.err != nil || r.rep == nil {
		// Never answered (closing): keep the deltas locally.
		for _, k := range sh.keys {
			m := s.models.list[k]
			s.stats.mergeErrors(m.accum.Merge(m.inflight))
			m.inflight, m.inFlight = stats.Summary{}, false
		}
		if i == 0 && req != nil {
			s.summaries = append(req.Steps, s.summaries...)
		}
		return
	}
	s.stats.syncs.Add(1)
	got := make(map[string]*syncproto.GlobalModel, len(r.rep.Models))
	for j := range r.rep.Models {
		got[r.rep.Models[j].Key] = &r.rep.Models[j]
	}
	for _, k := range sh.keys {
		m := s.models.list[k]
		if g, ok := got[m.name]; ok {
			g.Into(&m.global)
		} else {
			// The global histograms may share memory with other
			// detectors' (a node's reply is shared): merge into a copy.
			gl := m.global.Clone()
			s.stats.mergeErrors(gl.Merge(m.inflight))
			m.global = gl
		}
		m.inflight, m.inFlight = stats.Summary{}, false
	}
	// Models of keys this request did not carry may come too: take them when
	// nothing of ours is in flight for them.
	for name, g := range got {
		k, ok := s.models.keyByName[name]
		if !ok {
			continue
		}
		m := s.models.list[k]
		if m.inFlight || m.shard != i {
			continue
		}
		if g.Moments.N >= m.global.Moments.N {
			g.Into(&m.global)
		}
	}
}

// drop forgets shard i's request req, which the pserver refused as invalid
// (reason): its deltas are not kept for the next request (they would be
// refused with it), its step summaries are counted as dropped and the
// refusal as a sync failure, logged the 1st, 2nd, 4th, 8th... time.
func (s *syncState) drop(i int, req *syncproto.SyncRequest, reason string) {
	for _, k := range s.shards[i].keys {
		m := s.models.list[k]
		m.inflight, m.inFlight = stats.Summary{}, false
	}
	s.stats.syncFailures.Add(1)
	if req != nil {
		s.stats.droppedSummaries.Add(uint64(len(req.Steps)))
	}
	s.refused++
	if s.refused&(s.refused-1) == 0 {
		var seq uint64
		if req != nil {
			seq = req.Seq
		}
		s.cfg.Logger.Error().Int("shard", i).Uint64("seq", seq).Uint64("refused", s.refused).Str("reason", reason).
			Msg("the pserver refused a sync request as invalid; its deltas and step summaries are dropped (a detector bug or corrupted input: please report it)")
	}
}

// close waits for outstanding requests, sends what is left once more, and
// stops the senders when ctx is done.
func (s *syncState) close(ctx context.Context) error {
	defer func() {
		s.cancel()
		s.wg.Wait()
		s.leaveNode()
	}()
	if s.cfg.Syncer == nil {
		return nil
	}
	if s.node != nil && s.node.WaitsForAll() {
		// In lockstep (a node syncer without linger) the node's batches
		// wait for every detector: a closing one sends exactly one request
		// per shard through the node (the others, closing too or still
		// stepping, send theirs in the same batches), then leaves the node
		// before the others read models it will not read; anything left
		// goes straight. With a linger the last deltas go through the node
		// like any others.
		s.collect(true, ctx)
		for i, sh := range s.shards {
			if sh.inflight == nil {
				s.send(i, true)
			}
		}
		s.collect(true, ctx)
		if !s.anyInflight() {
			s.leaveNode()
			s.syncer = s.node.Direct()
		}
	}
	for round := 0; round < 2; round++ {
		s.collect(true, ctx)
		if ctx.Err() != nil {
			break
		}
		any := false
		for i, sh := range s.shards {
			if sh.inflight == nil && s.send(i, false) {
				any = true
			}
		}
		if !any {
			break
		}
	}
	s.collect(true, ctx)
	s.updateLag()
	if s.anyInflight() {
		return errors.New("final sync with the pserver did not complete before the deadline")
	}
	return nil
}

func (s *syncState) anyInflight() bool {
	for _, sh := range s.shards {
		if sh.inflight != nil {
			return true
		}
	}
	return false
}

// leaveNode leaves the node's syncer, once.
func (s *syncState) leaveNode() {
	if s.node != nil && !s.left {
		s.left = true
		s.node.Leave()
	}
}
