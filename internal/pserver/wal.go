package pserver

import (
	"context"
	"errors"
	"fmt"
	"runtime/pprof"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// Headers of a write-ahead-log entry.
const (
	hdrReply  = "Kipimo-Reply"  // inbox of the detector waiting for the answer
	hdrOrigin = "Kipimo-Origin" // instance that received the request and answers it
	hdrT0     = "Kipimo-T0"     // receipt time, unix nanoseconds
	hdrID     = "Kipimo-Id"     // key of the request decoded by the receiving handler
)

// walDurability appends every sync request to the shard's JetStream log
// before applying and answering it, in log order (DurabilityWAL); the state
// is rebuilt from the last snapshot plus the log, so nothing answered is ever
// lost, even on a crash. Every instance serving the shard applies the same
// log in the same order and so holds the same state. Snapshots are those of
// snapshotDurability, kept only when they cover more of the log, and trim
// the log they cover.
type walDurability struct {
	*snapshotDurability

	id      string // instance id, unique per process start (hdrOrigin)
	subject string // the shard's log subject
	wal     jetstream.Stream
	cons    jetstream.ConsumeContext

	decoded sync.Map      // hdrID -> *syncproto.SyncRequest decoded by handle
	replies chan replyJob // answers for the reply workers
	workers sync.WaitGroup
	done    chan struct{} // closed by stop: reply workers drain and end
	once    sync.Once
}

func newWALDurability(s *Server) *walDurability {
	d := &walDurability{
		snapshotDurability: newSnapshotDurability(s, true),
		id:                 nuid.Next(),
		subject:            s.subj.PSWAL(s.cfg.Shard),
		replies:            make(chan replyJob, 4096),
		done:               make(chan struct{}),
	}
	d.afterSave = d.trim
	return d
}

type replyJob struct {
	to  string
	rep *syncproto.SyncReply
	t0  time.Time
}

func (d *walDurability) start(ctx context.Context) error {
	s := d.s
	err := d.open(ctx,
		jetstream.WithPublishAsyncMaxPending(8192),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, err error) {
			s.metrics.walErrors.Inc()
			d.decoded.Delete(m.Header.Get(hdrID))
			if r := m.Header.Get(hdrReply); r != "" {
				s.replyError(r, fmt.Errorf("append to sync log: %w", err))
			}
		}))
	if err != nil {
		return err
	}
	for range s.cfg.SyncWorkers {
		d.workers.Add(1)
		go pprof.Do(context.Background(), pprof.Labels("pserver", "replies"), func(context.Context) { d.replyWorker() })
	}
	if err := d.consume(ctx); err != nil {
		d.stop()
		return err
	}
	d.startLoop()
	return nil
}

// consume creates the log stream, replays it from the snapshot and keeps
// consuming it.
func (d *walDurability) consume(ctx context.Context) error {
	s := d.s
	st, err := d.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        WALStreamName(s.cfg.Run),
		Description: "Kipimo parameter-server sync log of run " + s.cfg.Run,
		Subjects:    []string{s.subj.AllPSWAL()},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		MaxMsgSize:  -1,
	})
	if err != nil {
		return fmt.Errorf("pserver: sync log stream: %w", err)
	}
	d.wal = st
	var target uint64
	last, err := st.GetLastMsgForSubject(ctx, d.subject)
	switch {
	case err == nil:
		target = last.Sequence
	case errors.Is(err, jetstream.ErrMsgNotFound):
	default:
		return fmt.Errorf("pserver: read sync log end: %w", err)
	}
	cc := jetstream.OrderedConsumerConfig{FilterSubjects: []string{d.subject}, DeliverPolicy: jetstream.DeliverAllPolicy}
	if from := s.walSeq() + 1; from > 1 {
		cc.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		cc.OptStartSeq = from
	}
	cons, err := st.OrderedConsumer(ctx, cc)
	if err != nil {
		return fmt.Errorf("pserver: sync log consumer: %w", err)
	}
	d.cons, err = cons.Consume(d.onEntry, jetstream.PullMaxMessages(1024))
	if err != nil {
		return fmt.Errorf("pserver: consume sync log: %w", err)
	}
	replayed := time.Now()
	for s.walSeq() < target {
		select {
		case <-ctx.Done():
			return fmt.Errorf("pserver: replay sync log to %d (at %d): %w", target, s.walSeq(), ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	if target > 0 {
		s.log.Info().Uint64("to", target).Dur("took", time.Since(replayed)).Msg("replayed sync log")
	}
	return nil
}

// handle decodes a request and appends it to the log; onEntry applies and
// answers it. The handler never blocks on I/O: the append is asynchronous.
// Decoding happens here, in the parallel subscription goroutines, and the
// decoded request is handed to the apply loop, which only decodes entries
// that other instances appended (or that it replays).
func (d *walDurability) handle(m *nats.Msg) {
	s := d.s
	t0 := time.Now()
	req, err := decodeRequest(m.Data)
	if err != nil {
		s.metrics.syncRequests.WithLabelValues("bad").Inc()
		s.respond(m.Reply, &syncproto.SyncReply{Error: err.Error()}, t0)
		return
	}
	if err := s.check(req); err != nil {
		// Refused before the log: nothing invalid is ever appended.
		s.refuse(req, err)
		s.respond(m.Reply, &syncproto.SyncReply{Error: err.Error(), Invalid: true}, t0)
		return
	}
	id := nuid.Next()
	d.decoded.Store(id, req)
	h := nats.Header{}
	h.Set(hdrReply, m.Reply)
	h.Set(hdrOrigin, d.id)
	h.Set(hdrID, id)
	h.Set(hdrT0, strconv.FormatInt(t0.UnixNano(), 10))
	if _, err := d.js.PublishMsgAsync(&nats.Msg{Subject: d.subject, Data: m.Data, Header: h}); err != nil {
		d.decoded.Delete(id)
		s.metrics.walErrors.Inc()
		s.replyError(m.Reply, fmt.Errorf("append to sync log: %w", err))
	}
}

// onEntry applies one log entry, in log order, and hands the answer to the
// reply workers when this instance received the request.
func (d *walDurability) onEntry(m jetstream.Msg) {
	s := d.s
	md, err := m.Metadata()
	if err != nil {
		s.metrics.walErrors.Inc()
		return
	}
	hdr := m.Headers()
	mine := hdr.Get(hdrOrigin) == d.id
	var req *syncproto.SyncRequest
	if mine {
		if v, ok := d.decoded.LoadAndDelete(hdr.Get(hdrID)); ok {
			req = v.(*syncproto.SyncRequest)
		}
	}
	var rep *syncproto.SyncReply
	if req == nil {
		// Appended by another instance, or by an earlier process (a
		// replay): validated again, since a log written before requests
		// were validated may hold anything.
		req, err = decodeRequest(m.Data())
		if err == nil {
			err = req.Validate()
		}
		if err != nil {
			s.metrics.walErrors.Inc()
			s.skip("wal", fmt.Sprintf("sync-log entry %d not applied: %v", md.Sequence.Stream, err))
			s.setWALSeq(md.Sequence.Stream)
			rep = &syncproto.SyncReply{Error: err.Error(), Invalid: true}
		}
	}
	if rep == nil {
		rep = s.apply(req, md.Sequence.Stream)
	}
	if !mine {
		return
	}
	var t0 time.Time
	if v, err := strconv.ParseInt(hdr.Get(hdrT0), 10, 64); err == nil {
		t0 = time.Unix(0, v)
	}
	select {
	case d.replies <- replyJob{hdr.Get(hdrReply), rep, t0}:
	case <-d.done:
	}
}

// replyWorker encodes and publishes answers for the apply loop until stop,
// then publishes those still queued.
func (d *walDurability) replyWorker() {
	defer d.workers.Done()
	for {
		select {
		case j := <-d.replies:
			d.s.respond(j.to, j.rep, j.t0)
		case <-d.done:
			for {
				select {
				case j := <-d.replies:
					d.s.respond(j.to, j.rep, j.t0)
				default:
					return
				}
			}
		}
	}
}

// trim deletes the log below a snapshot covering it up to seq, keeping a
// margin of SnapshotEvery entries for other instances of the shard that may
// still be applying entries just below it.
func (d *walDurability) trim(ctx context.Context, seq uint64) error {
	keep := uint64(d.s.cfg.SnapshotEvery)
	if d.wal == nil || seq <= keep {
		return nil
	}
	if err := d.wal.Purge(ctx, jetstream.WithPurgeSubject(d.subject), jetstream.WithPurgeSequence(seq-keep)); err != nil {
		return fmt.Errorf("trim sync log below %d: %w", seq-keep, err)
	}
	return nil
}

// settle waits for the log appends under way and until every entry
// appended so far is applied, then stops consuming.
func (d *walDurability) settle(ctx context.Context) error {
	if d.cons == nil {
		return nil
	}
	var err error
	select {
	case <-d.js.PublishAsyncComplete():
	case <-ctx.Done():
		err = fmt.Errorf("wait for sync log appends: %w", ctx.Err())
	}
	if last, lerr := d.wal.GetLastMsgForSubject(ctx, d.subject); lerr == nil {
		for d.s.walSeq() < last.Sequence && ctx.Err() == nil {
			time.Sleep(2 * time.Millisecond)
		}
	}
	d.cons.Stop()
	return err
}

func (d *walDurability) stop() {
	d.once.Do(func() {
		if d.cons != nil {
			d.cons.Stop()
		}
		close(d.done)
		d.workers.Wait()
		d.snapshotDurability.stop()
	})
}
