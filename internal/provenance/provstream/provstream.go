// Package provstream is the NATS JetStream transport of provenance records:
// the stream that holds a run's records (EnsureStream), the publisher
// producers batch them with, and the decoding of a message (Decode).
// Subjects and the stream's name come from natsx; the records and their
// kinds from package provenance, which, like the stores, knows nothing of
// NATS.
//
// A message holds a batch of records of one kind, in one of two encodings
// its EncodingHeader names: none, a JSON array of records (any kind); or
// EncodingBlocks, the block encoding of executions (package docblock,
// schemas/prov-blocks.md): their indexed columns, then their documents
// compressed in blocks of the form the SQLite store keeps, so that the
// compression is done by the producers and provdb stores the blocks as
// they came. Publishers send executions in the block encoding and other
// kinds as JSON.
package provstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/docblock"
)

// EncodingHeader is the message header naming the encoding of its body;
// a message without it holds a JSON array of records.
const EncodingHeader = "Kipimo-Prov-Encoding"

// EncodingBlocks is the block encoding of executions (anomalies and
// normalexecs), version 1, as EncodingHeader names it.
const EncodingBlocks = "blocks-v1"

// Encoding returns the encoding a message of kind with header h holds: ""
// (a JSON array) or EncodingBlocks. An encoding this package does not know,
// or the block encoding for a kind other than executions, is an error.
func Encoding(kind provenance.Kind, h nats.Header) (string, error) {
	enc := h.Get(EncodingHeader)
	switch {
	case enc == "":
		return "", nil
	case enc != EncodingBlocks:
		return "", fmt.Errorf("decode %s batch: unknown encoding %q", kind, enc)
	case !kind.IsExec():
		return "", fmt.Errorf("decode %s batch: encoding %s holds executions only", kind, enc)
	}
	return enc, nil
}

// Decode decodes a message of kind with header h and body data, in either
// encoding, into its records, checked and normalized as
// provenance.DecodeBatch leaves them. It is what anything reading the
// stream other than provdb's SQLite writer uses.
func Decode(kind provenance.Kind, h nats.Header, data []byte) (provenance.Batch, error) {
	enc, err := Encoding(kind, h)
	if err != nil {
		return provenance.Batch{Kind: kind}, err
	}
	if enc == "" {
		return provenance.DecodeBatch(kind, data)
	}
	m, err := docblock.DecodeMessage(data)
	if err != nil {
		return provenance.Batch{Kind: kind}, fmt.Errorf("decode %s batch: %w", kind, err)
	}
	execs, err := m.Execs()
	if err != nil {
		return provenance.Batch{Kind: kind}, fmt.Errorf("decode %s batch: %w", kind, err)
	}
	return provenance.Batch{Kind: kind, Execs: execs}, nil
}

// Subject is the subject run's records of kind are published on.
func Subject(run string, kind provenance.Kind) string {
	return natsx.Subjects{Run: run}.Prov(string(kind))
}

// DuplicateWindow is how long JetStream remembers a batch's Nats-Msg-Id, so
// that a producer re-publishing a batch within it stores it once.
const DuplicateWindow = 10 * time.Minute

// MaxBatchBytes is the largest batch a producer should publish (the body of
// one message, in either encoding).
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
	return publishRaw(ctx, js, subject, msgID, "", data)
}

// PublishExecBlocks publishes execs as one message in the block encoding,
// as a Publisher of their kind would, on subject with msgID (see
// PublishBatch). Encoded batches larger than MaxBatchBytes are refused:
// split them. Tests and tools that feed provdb given batches use it.
func PublishExecBlocks(ctx context.Context, js jetstream.JetStream, subject, msgID string, execs []provenance.Exec) error {
	data, err := EncodeExecBlocks(nil, execs)
	if err != nil {
		return fmt.Errorf("encode provenance batch %s: %w", msgID, err)
	}
	return publishRaw(ctx, js, subject, msgID, EncodingBlocks, data)
}

// EncodeExecBlocks appends the body of a message of the block encoding
// holding execs to dst, failing if it would exceed MaxBatchBytes.
func EncodeExecBlocks(dst []byte, execs []provenance.Exec) ([]byte, error) {
	if len(execs) == 0 {
		return dst, errors.New("no executions to encode")
	}
	var enc docblock.Encoder
	for i := range execs {
		ok, err := enc.Add(&execs[i], MaxBatchBytes)
		if err != nil {
			return dst, err
		}
		if !ok {
			return dst, fmt.Errorf("%d executions exceed %d bytes encoded: split them", len(execs), MaxBatchBytes)
		}
	}
	return enc.Finish(dst), nil
}

func publishRaw(ctx context.Context, js jetstream.JetStream, subject, msgID, encoding string, data []byte) error {
	if msgID == "" {
		return errors.New("publish provenance batch: empty message id")
	}
	msg := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}}
	msg.Header.Set(jetstream.MsgIDHeader, msgID)
	if encoding != "" {
		msg.Header.Set(EncodingHeader, encoding)
	}
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		return fmt.Errorf("publish provenance batch %s on %s: %w", msgID, subject, err)
	}
	return nil
}

// Publisher splits the records of one kind into batches of at most
// MaxBatchBytes (encoded) and publishes each with a deterministic message
// id "<prefix>.<n>" (n counts batches from 0). Executions (*provenance.Exec
// or provenance.Exec) go in the block encoding unless JSON is set; other
// kinds as JSON arrays. The same records added in the same order give the
// same messages. It is not safe for concurrent use; use one per producing
// goroutine.
type Publisher struct {
	js      jetstream.JetStream
	kind    provenance.Kind
	subject string
	prefix  string
	n       uint64
	buf     []byte
	rec     []byte // the record being added
	count   int
	blocks  *docblock.Encoder // the pending batch of executions in the block encoding; nil when none
	// MaxBytes bounds one batch; default MaxBatchBytes. Batches are never
	// larger than the server's maximum payload allows either.
	MaxBytes int
	// JSON publishes executions as JSON arrays, for a provdb that does not
	// read the block encoding. Set it before the first Add.
	JSON bool
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
	return &Publisher{js: js, kind: kind, subject: Subject(run, kind), prefix: prefix + "." + string(kind)}, nil
}

// payloadHeadroom is what a batch leaves of the server's maximum payload
// for the message's subject and headers.
const payloadHeadroom = 4 << 10

// limit is the largest batch: MaxBytes (default MaxBatchBytes), and never
// more than the connected server's maximum payload less payloadHeadroom (a
// default nats-server takes 1,000,000 bytes, less than MaxBatchBytes).
func (p *Publisher) limit() int {
	n := p.MaxBytes
	if n <= 0 {
		n = MaxBatchBytes
	}
	if c := p.js.Conn(); c != nil {
		if m := int(c.MaxPayload()) - payloadHeadroom; m > 0 && m < n {
			n = m
		}
	}
	return n
}

// Add appends one record to the pending batch, publishing the batch first if
// the record would make it exceed MaxBytes.
func (p *Publisher) Add(ctx context.Context, record any) error {
	if p.kind.IsExec() && !p.JSON {
		return p.addBlocks(ctx, record)
	}
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
	limit := p.limit()
	if len(b)+2 > limit {
		return fmt.Errorf("provenance record of %d bytes exceeds the batch limit %d", len(b), limit)
	}
	if p.count > 0 && len(p.buf)+1+len(b)+1 > limit {
		if err := p.Flush(ctx); err != nil {
			return err
		}
	}
	if p.count == 0 {
		p.buf = append(p.takeBuf(), '[')
	} else {
		p.buf = append(p.buf, ',')
	}
	p.buf = append(p.buf, b...)
	p.count++
	return nil
}

// addBlocks adds an execution to the pending batch of the block encoding.
func (p *Publisher) addBlocks(ctx context.Context, record any) error {
	var e *provenance.Exec
	switch r := record.(type) {
	case *provenance.Exec:
		e = r
	case provenance.Exec:
		e = &r
	default:
		return fmt.Errorf("encode provenance record: a %s record is a provenance.Exec, not %T", p.kind, record)
	}
	if p.blocks == nil {
		p.blocks = encoders.Get().(*docblock.Encoder)
	}
	ok, err := p.blocks.Add(e, p.limit())
	if err != nil {
		return fmt.Errorf("encode provenance record: %w", err)
	}
	if ok {
		return nil
	}
	if err := p.Flush(ctx); err != nil {
		return err
	}
	if p.blocks == nil {
		p.blocks = encoders.Get().(*docblock.Encoder)
	}
	if ok, err = p.blocks.Add(e, p.limit()); err == nil && !ok {
		err = errors.New("does not fit an empty batch")
	}
	if err != nil {
		return fmt.Errorf("encode provenance record: %w", err)
	}
	return nil
}

// Flush publishes the pending batch, if any.
func (p *Publisher) Flush(ctx context.Context) error {
	if p.Pending() == 0 {
		return nil
	}
	id := p.prefix + "." + strconv.FormatUint(p.n, 10)
	if p.blocks != nil && p.blocks.Len() > 0 {
		p.buf = p.blocks.Finish(p.takeBuf())
		if len(p.buf) > p.limit() {
			return fmt.Errorf("provenance batch %s is %d bytes, more than %d", id, len(p.buf), p.limit())
		}
		if err := publishRaw(ctx, p.js, p.subject, id, EncodingBlocks, p.buf); err != nil {
			return err
		}
		p.n++
		p.release()
		return nil
	}
	if p.count == 0 {
		return nil
	}
	data := append(p.buf, ']')
	if err := publishRaw(ctx, p.js, p.subject, id, "", data); err != nil {
		p.buf = data[:len(data)-1]
		return err
	}
	p.n++
	p.count = 0
	p.buf = data
	p.release()
	return nil
}

// A producer keeps a Publisher per rank and kind for the whole run, and
// flushes it every io_step: the buffers of a batch are taken from these
// pools when it starts and given back once it is published, so that what
// a node of thousands of ranks holds between steps is the batches not yet
// published, not a batch's worth of room per rank and kind.
var (
	encoders = sync.Pool{New: func() any { return new(docblock.Encoder) }}
	buffers  = sync.Pool{New: func() any { return new([]byte) }}
)

// takeBuf returns p.buf emptied, taking one from the pool if p has none.
func (p *Publisher) takeBuf() []byte {
	if p.buf == nil {
		p.buf = *buffers.Get().(*[]byte)
	}
	return p.buf[:0]
}

// release gives p's batch buffers back to the pools once its batch is
// published.
func (p *Publisher) release() {
	if p.blocks != nil {
		p.blocks.Reset()
		encoders.Put(p.blocks)
		p.blocks = nil
	}
	if p.buf != nil {
		b := p.buf[:0]
		buffers.Put(&b)
		p.buf = nil
	}
}

// Pending is the number of records added and not yet published.
func (p *Publisher) Pending() int {
	if p.blocks != nil && p.blocks.Len() > 0 {
		return p.blocks.Len()
	}
	return p.count
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
