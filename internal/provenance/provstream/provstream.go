// Package provstream is the NATS JetStream transport of provenance records:
// the stream that holds a run's records (EnsureStream) and the publisher
// producers batch them with. Subjects and the stream's name come from natsx;
// the records and their kinds from package provenance, which, like the
// stores, knows nothing of NATS.
package provstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// Subject is the subject run's records of kind are published on.
func Subject(run string, kind provenance.Kind) string {
	return natsx.Subjects{Run: run}.Prov(string(kind))
}

// DuplicateWindow is how long JetStream remembers a batch's Nats-Msg-Id, so
// that a producer re-publishing a batch within it stores it once.
const DuplicateWindow = 10 * time.Minute

// MaxBatchBytes is the largest batch a producer should publish (the JSON
// array of records of one message).
const MaxBatchBytes = 1 << 20

// EnsureStream creates, or updates to the current configuration, the stream
// natsx.ProvStream(run) that holds kipimo.<run>.prov.>: file storage, limits
// retention, and a duplicate window of DuplicateWindow. Producers (detector,
// parameter server) call it before publishing; provdb calls it before
// consuming. It is safe to call concurrently from several processes.
func EnsureStream(ctx context.Context, js jetstream.JetStream, run string) (jetstream.Stream, error) {
	if err := natsx.ValidRun(run); err != nil {
		return nil, fmt.Errorf("provenance stream: %w", err)
	}
	cfg := jetstream.StreamConfig{
		Name:        natsx.ProvStream(run),
		Description: "Kipimo provenance records of run " + run,
		Subjects:    []string{natsx.Subjects{Run: run}.AllProv()},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Duplicates:  DuplicateWindow,
		MaxMsgSize:  -1,
	}
	s, err := js.CreateOrUpdateStream(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("create provenance stream %s: %w", cfg.Name, err)
	}
	return s, nil
}

// PublishBatch publishes records (a slice of one kind's records) as one JSON
// array on subject, with msgID as its Nats-Msg-Id so that JetStream stores a
// re-published batch once. msgID must be deterministic for the batch's
// content, e.g. "<kind>:<pid>:<rank>:<io_step>:<seq>". It waits for the
// stream's acknowledgement. Batches larger than MaxBatchBytes are refused:
// split them. Producers batch their records with a Publisher; PublishBatch
// publishes one batch prepared as it is (tests and tools that feed provdb
// given batches).
func PublishBatch(ctx context.Context, js jetstream.JetStream, subject, msgID string, records any) error {
	data, err := json.Marshal(records)
	if err != nil {
		return fmt.Errorf("encode provenance batch %s: %w", msgID, err)
	}
	if len(data) == 0 || data[0] != '[' {
		return fmt.Errorf("encode provenance batch %s: records must be a slice", msgID)
	}
	if len(data) > MaxBatchBytes {
		return fmt.Errorf("provenance batch %s is %d bytes, more than %d: split it", msgID, len(data), MaxBatchBytes)
	}
	return publishRaw(ctx, js, subject, msgID, data)
}

func publishRaw(ctx context.Context, js jetstream.JetStream, subject, msgID string, data []byte) error {
	if msgID == "" {
		return errors.New("publish provenance batch: empty message id")
	}
	msg := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}}
	msg.Header.Set(jetstream.MsgIDHeader, msgID)
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		return fmt.Errorf("publish provenance batch %s on %s: %w", msgID, subject, err)
	}
	return nil
}

// Publisher splits the records of one kind into batches of at most
// MaxBatchBytes and publishes each with a deterministic message id
// "<prefix>.<n>" (n counts batches from 0). It is not safe for concurrent
// use; use one per producing goroutine.
type Publisher struct {
	js      jetstream.JetStream
	subject string
	prefix  string
	n       uint64
	buf     []byte
	rec     []byte // the record being added
	count   int
	// MaxBytes bounds one batch; default MaxBatchBytes.
	MaxBytes int
}

// NewPublisher returns a Publisher of run's records of kind. prefix must be
// unique and stable for the producer (e.g. "ad.<pid>.<rank>") so that a
// restarted producer re-publishing the same records yields the same ids.
func NewPublisher(js jetstream.JetStream, run string, kind provenance.Kind, prefix string) (*Publisher, error) {
	if !kind.Valid() {
		return nil, fmt.Errorf("provenance publisher: unknown kind %q", kind)
	}
	if err := natsx.ValidRun(run); err != nil {
		return nil, fmt.Errorf("provenance publisher: %w", err)
	}
	return &Publisher{js: js, subject: Subject(run, kind), prefix: prefix + "." + string(kind)}, nil
}

// Add appends one record to the pending batch, publishing the batch first if
// the record would make it exceed MaxBytes.
func (p *Publisher) Add(ctx context.Context, record any) error {
	var err error
	if e, ok := record.(*provenance.Exec); ok {
		p.rec, err = provenance.AppendExecJSON(p.rec[:0], e)
	} else {
		p.rec, err = json.Marshal(record)
	}
	if err != nil {
		return fmt.Errorf("encode provenance record: %w", err)
	}
	b := p.rec
	limit := p.MaxBytes
	if limit <= 0 {
		limit = MaxBatchBytes
	}
	if len(b)+2 > limit {
		return fmt.Errorf("provenance record of %d bytes exceeds the batch limit %d", len(b), limit)
	}
	if p.count > 0 && len(p.buf)+1+len(b)+1 > limit {
		if err := p.Flush(ctx); err != nil {
			return err
		}
	}
	if p.count == 0 {
		p.buf = append(p.buf[:0], '[')
	} else {
		p.buf = append(p.buf, ',')
	}
	p.buf = append(p.buf, b...)
	p.count++
	return nil
}

// Flush publishes the pending batch, if any.
func (p *Publisher) Flush(ctx context.Context) error {
	if p.count == 0 {
		return nil
	}
	data := append(p.buf, ']')
	id := fmt.Sprintf("%s.%d", p.prefix, p.n)
	if err := publishRaw(ctx, p.js, p.subject, id, data); err != nil {
		p.buf = data[:len(data)-1]
		return err
	}
	p.n++
	p.count = 0
	p.buf = p.buf[:0]
	return nil
}

// Published is the number of batches published so far.
func (p *Publisher) Published() uint64 { return p.n }

// WaitConsumed waits until the durable consumer of run's provenance stream
// (provdb's, named durable) has acknowledged every message in the stream,
// polling every 20 ms, or until ctx is done.
func WaitConsumed(ctx context.Context, js jetstream.JetStream, run, durable string) error {
	stream, err := js.Stream(ctx, natsx.ProvStream(run))
	if err != nil {
		return fmt.Errorf("provenance stream: %w", err)
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		info, err := stream.Info(ctx)
		if err != nil {
			return fmt.Errorf("provenance stream: %w", err)
		}
		cons, err := stream.Consumer(ctx, durable)
		if err == nil {
			ci, err := cons.Info(ctx)
			if err == nil && ci.NumPending == 0 && ci.NumAckPending == 0 && ci.AckFloor.Stream >= info.State.LastSeq {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for consumer %s of the provenance stream: %w", durable, ctx.Err())
		case <-tick.C:
		}
	}
}
