package provdb

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/docblock"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provstream"
	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
)

// The ingest pipeline. One goroutine fetches messages and hands each, in
// fetch order, to a pool of decoders and to the writer's queue; the
// decoders decode the messages (and, for a store that can, prepare their
// write: for executions in the block encoding, checking the producer's
// compressed blocks, which are stored as they came; for a JSON batch,
// encoding and compressing documents) several at once; the writer
// takes the messages in fetch order as they become ready and writes those
// ready together in one transaction, then acknowledges them. So the single
// writer does only the inserts, records are written in the order they were
// fetched, and a message is acknowledged only once its records are
// committed.
//
// At most pipelineDepth(Fetch) = 4*Fetch messages, the consumer's
// MaxAckPending, are between fetch and acknowledgement (the fetcher reserves a slot for
// each before it asks the server for them, and the writer frees it):
// enough for the decoders to work on the next fetches while the writer
// writes, so that when the writer is the slower stage each of its
// transactions takes up to two fetches' worth of messages. A
// transaction's cost is mostly per record, but the index pages it changes
// are written to SQLite's log once per commit however many of its records
// share them, so larger transactions write fewer bytes per record
// (BenchmarkProvdbIngest's written-B/record: about a fifth fewer than with
// 2*Fetch). A message the server has delivered
// is therefore always in the pipeline, never waiting unseen in the
// fetch's buffer, and one held longer than a third of AckWait (a slow
// write, a queue behind it) is told to the server as in progress every
// third of AckWait, so that it is not delivered again while it is being
// worked on. AckWait can thus be short (10 s by default): it is how long
// the messages a killed provdb held wait before the server delivers them
// again. Stopping (the service's context cancelled) ends the fetch loop,
// which hands the messages still arriving back for redelivery; the
// decoders finish what they hold; the writer finishes the write under way
// and hands back the messages it had not started to write.

// maxTxRecords bounds the records of one write: enough to share a
// transaction's commit (its fsync, and the index pages it writes) among
// the two fetches' worth of messages a slow writer finds ready (32 batches
// of a few hundred records at the default Fetch), few enough that a write
// stays well under AckWait.
const maxTxRecords = 16384

// pipelineDepth is the most messages the pipeline holds for fetches of
// fetch messages: the consumer's MaxAckPending.
func pipelineDepth(fetch int) int { return 4 * fetch }

// preparer is a store whose write can be split: Prepare (or PrepareBlocks,
// for executions in the block encoding), the CPU work of a batch, runs on
// the decoders; WritePrepared writes several prepared batches in one
// transaction.
type preparer interface {
	Prepare(provenance.Batch) (*sqlitestore.Prepared, error)
	PrepareBlocks(provenance.Kind, *docblock.Message) (*sqlitestore.Prepared, error)
	WritePrepared(context.Context, []*sqlitestore.Prepared) error
}

var _ preparer = (*sqlitestore.Store)(nil)

// job is one fetched message on its way through the pipeline. The decoder
// fills it and closes ready; the writer reads it after ready is closed.
type job struct {
	msg   jetstream.Msg
	ready chan struct{}
	// touched is when the server last heard of msg (its delivery, or the
	// last in-progress acknowledgement); guarded by pipeline.mu.
	touched time.Time

	bad   bool             // undecodable, terminated
	n     int              // the message's records
	batch provenance.Batch // its kind, and its records unless prep holds them
	prep  *sqlitestore.Prepared
	err   error // Prepare failed: handled as a failed write
}

// pipeline is the state of one Start: its queues and goroutines.
type pipeline struct {
	slots chan struct{} // a token per message between fetch and acknowledgement
	work  chan *job     // to the decoders
	order chan *job     // to the writer, in fetch order
	wg    sync.WaitGroup

	mu   sync.Mutex
	held map[*job]struct{} // the jobs holding a slot
}

func newPipeline(depth int) *pipeline {
	return &pipeline{slots: make(chan struct{}, depth), work: make(chan *job, depth), order: make(chan *job, depth),
		held: map[*job]struct{}{}}
}

// reserve takes n slots, waiting for the writer to free them; it reports
// false (holding none) when ctx ends first.
func (p *pipeline) reserve(ctx context.Context, n int) bool {
	for i := range n {
		select {
		case p.slots <- struct{}{}:
		case <-ctx.Done():
			p.unreserve(i)
			return false
		}
	}
	return true
}

// unreserve frees n slots taken by reserve and not used.
func (p *pipeline) unreserve(n int) {
	for range n {
		<-p.slots
	}
}

// done frees j's slot: its message is acknowledged, terminated or handed
// back.
func (p *pipeline) done(j *job) {
	p.mu.Lock()
	delete(p.held, j)
	p.mu.Unlock()
	<-p.slots
}

// touch tells the server that the messages held since before now-every
// are still being worked on (an in-progress acknowledgement resets their
// AckWait).
func (p *pipeline) touch(now time.Time, every time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for j := range p.held {
		if now.Sub(j.touched) >= every {
			// Refused for a message already acknowledged or terminated;
			// one lost only risks a redelivery, which the store ignores.
			_ = j.msg.InProgress()
			j.touched = now
		}
	}
}

// keepAlive calls touch every third of ackWait until stop is closed.
func (p *pipeline) keepAlive(stop <-chan struct{}, ackWait time.Duration) {
	every := max(ackWait/3, 10*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			p.touch(now, every)
		}
	}
}

// run starts the decoders, the writer and the in-progress acknowledgements
// and runs the fetch loop until ctx ends, then waits for the others to
// finish.
func (s *Service) run(ctx context.Context, cons jetstream.Consumer) {
	p := newPipeline(pipelineDepth(s.cfg.Fetch))
	for range max(1, runtime.GOMAXPROCS(0)) {
		p.wg.Go(func() { s.decodeLoop(p) })
	}
	p.wg.Go(func() { s.writeLoop(ctx, p) })
	stopKeep := make(chan struct{})
	var keep sync.WaitGroup
	keep.Go(func() { p.keepAlive(stopKeep, s.cfg.AckWait) })
	s.loop(ctx, cons, p)
	close(p.work)
	close(p.order)
	p.wg.Wait()
	close(stopKeep)
	keep.Wait()
}

// enqueue hands msg to the pipeline in a slot the fetch loop reserved, or
// back to the server when stopping; it reports whether the slot was used.
func (s *Service) enqueue(ctx context.Context, p *pipeline, msg jetstream.Msg) bool {
	if ctx.Err() != nil {
		// Stopping: hand it back for immediate redelivery.
		_ = msg.Nak()
		return false
	}
	j := &job{msg: msg, ready: make(chan struct{}), touched: time.Now()}
	p.mu.Lock()
	p.held[j] = struct{}{}
	p.mu.Unlock()
	// Neither send blocks: each queue holds as many jobs as there are slots.
	p.work <- j
	p.order <- j
	return true
}

// decodeLoop decodes (and prepares) jobs until the work queue is closed.
func (s *Service) decodeLoop(p *pipeline) {
	pr, _ := s.store.(preparer)
	for j := range p.work {
		s.decode(j, pr)
		close(j.ready)
	}
}

// decode decodes j's message, terminating it if it is bad, and prepares its
// write when the store can.
func (s *Service) decode(j *job, pr preparer) {
	subj := j.msg.Subject()
	kind := provenance.Kind(subj[strings.LastIndexByte(subj, '.')+1:])
	j.batch.Kind = kind
	if err := s.decodeMsg(j, kind, pr); err != nil {
		s.refuse(kind, err)
		_ = j.msg.TermWithReason("bad provenance batch: " + rejectReason(err))
		j.bad = true
	}
}

// decodeMsg decodes j's message of kind into j; an error means the message
// is bad.
func (s *Service) decodeMsg(j *job, kind provenance.Kind, pr preparer) error {
	enc, err := provstream.Encoding(kind, j.msg.Headers())
	if err != nil {
		return err
	}
	if enc == provstream.EncodingBlocks && pr != nil {
		m, err := docblock.DecodeMessage(j.msg.Data())
		if err == nil {
			err = m.Check()
		}
		if err != nil {
			return fmt.Errorf("decode %s batch: %w", kind, err)
		}
		j.n = len(m.Rows)
		j.prep, j.err = pr.PrepareBlocks(kind, m)
		return nil
	}
	b, err := provstream.Decode(kind, j.msg.Headers(), j.msg.Data())
	if err != nil {
		return err
	}
	j.batch, j.n = b, b.Len()
	if pr != nil {
		j.prep, j.err = pr.Prepare(b)
		if errors.Is(j.err, docblock.ErrTooLarge) {
			return fmt.Errorf("decode %s batch: %w", kind, j.err)
		}
		return nil
	}
	if enc == "" && kind.IsExec() {
		return checkDocSizes(kind, len(j.msg.Data()), b.Execs)
	}
	return nil
}

// checkDocSizes refuses a JSON batch of executions, data bytes long, one of
// whose documents as stored would exceed docblock.MaxDocLen. A document is
// at most six times the JSON it was read from (a byte that is not UTF-8
// becomes \ufffd), so only batches that large are encoded to be measured.
func checkDocSizes(kind provenance.Kind, data int, execs []provenance.Exec) error {
	if data <= docblock.MaxDocLen/6 {
		return nil
	}
	var buf []byte
	for i := range execs {
		var err error
		if buf, err = provenance.AppendExecJSON(buf[:0], &execs[i]); err != nil {
			return fmt.Errorf("decode %s batch: record %d: %w", kind, i, err)
		}
		if len(buf) > docblock.MaxDocLen {
			return fmt.Errorf("decode %s batch: record %d (event %s): its document of %d bytes exceeds %d: %w", kind, i, execs[i].EventID, len(buf), docblock.MaxDocLen, docblock.ErrTooLarge)
		}
	}
	return nil
}

// writeLoop writes the jobs in fetch order until the order queue is closed:
// the first one waiting (once ready) and the ones after it that are already
// ready, up to maxTxRecords records, in one write.
func (s *Service) writeLoop(ctx context.Context, p *pipeline) {
	var group []*job
	var next *job // taken from the queue but not ready yet
	for {
		j := next
		next = nil
		if j == nil {
			var ok bool
			if j, ok = <-p.order; !ok {
				return
			}
		}
		<-j.ready
		group = append(group[:0], j)
		n := j.n
	more:
		for n < maxTxRecords {
			select {
			case k, ok := <-p.order:
				if !ok {
					break more
				}
				select {
				case <-k.ready:
					group = append(group, k)
					n += k.n
				default:
					next = k
					break more
				}
			default:
				break more
			}
		}
		if ctx.Err() != nil {
			// Stopping: hand back what was not written yet.
			for _, j := range append(group, next) {
				if j != nil {
					<-j.ready
					if !j.bad {
						_ = j.msg.Nak()
					}
					p.done(j)
				}
			}
			next = nil
			continue
		}
		s.write(group)
		for _, j := range group {
			p.done(j)
		}
	}
}

// write writes the decoded jobs of group and acknowledges each message whose
// records are committed (or asks for its redelivery).
func (s *Service) write(group []*job) {
	var ok []*job
	for _, j := range group {
		switch {
		case j.bad:
		case j.err != nil:
			s.writeFailed(j.err, []*job{j})
		default:
			ok = append(ok, j)
		}
	}
	if len(ok) == 0 {
		return
	}
	// Not cancelled with the service's context, so that a write under way
	// when Shutdown is called completes and is acknowledged; bounded so
	// that a stuck store cannot hold Shutdown for ever. A write slower
	// than AckWait only causes a redelivery the store ignores.
	wctx, cancel := context.WithTimeout(context.Background(), max(s.cfg.AckWait, 30*time.Second))
	defer cancel()
	if pr, isPreparer := s.store.(preparer); isPreparer {
		ps := make([]*sqlitestore.Prepared, len(ok))
		for i, j := range ok {
			ps[i] = j.prep
		}
		if err := pr.WritePrepared(wctx, ps); err != nil {
			s.writeFailed(err, ok)
			return
		}
		s.written(ok)
		return
	}
	// Any other store: one write per kind.
	for _, kind := range provenance.Kinds {
		var merged provenance.Batch
		var jobs []*job
		for _, j := range ok {
			if j.batch.Kind != kind {
				continue
			}
			jobs = append(jobs, j)
			if merged.Kind == "" {
				merged = j.batch
				continue
			}
			merged.Execs = append(merged.Execs, j.batch.Execs...)
			merged.Metadata = append(merged.Metadata, j.batch.Metadata...)
			merged.FuncStats = append(merged.FuncStats, j.batch.FuncStats...)
			merged.CounterStats = append(merged.CounterStats, j.batch.CounterStats...)
			merged.Profiles = append(merged.Profiles, j.batch.Profiles...)
		}
		if len(jobs) == 0 {
			continue
		}
		if err := s.store.Write(wctx, merged); err != nil {
			s.writeFailed(err, jobs)
			continue
		}
		s.written(jobs)
	}
}

// written acknowledges the jobs whose records are committed and counts them.
func (s *Service) written(jobs []*job) {
	for _, j := range jobs {
		// An acknowledgement lost here only means the batch comes again
		// and is written again, which the store ignores.
		_ = j.msg.Ack()
		s.counts[j.batch.Kind].Add(int64(j.n))
	}
	s.batches.Add(int64(len(jobs)))
}

// writeFailed asks for the jobs' redelivery after RetryDelay.
func (s *Service) writeFailed(err error, jobs []*job) {
	if n := s.writeErrors.Add(1); n == 1 || n%100 == 0 {
		s.log.Error().Err(err).Int64("write_errors", n).Msg("store write failed; the batches will be redelivered")
	}
	for _, j := range jobs {
		_ = j.msg.NakWithDelay(s.cfg.RetryDelay)
	}
}
