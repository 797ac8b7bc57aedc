// Package tautrace reads TAU's binary traces (tautrace.<node>.<ctx>.<thread>.trc
// with events.<node>.edf, or the merged tau.trc with tau.edf) as a stream of
// frames.
//
// A .trc file is a sequence of 24-byte records in the writer's byte order:
// int32 event id, uint16 node, uint16 thread, int64 parameter, uint64 time in
// microseconds. The byte order is detected from the first record (EV_INIT, par
// 3). Files of several threads and nodes are merged in timestamp order, so the
// whole run is read in one pass with one buffer per file. Nodes become ranks,
// threads keep their TAU thread number.
//
// Mapping to frames:
//   - EntryExit events: par > 0 entry, par < 0 exit.
//   - user events (three records: 0, value, 0) become counter samples; those
//     named "key | value" (TAU's metadata) become metadata. A lone record
//     (TAU writes TauTraceClockOffsetStart/End as one record with value 0)
//     is a sample of its value.
//   - MESSAGE_SEND/RECV become comm events with the packed parameter decoded
//     (length, tag, partner; see DecodeMessage).
//   - one-sided GPU transfers (70000 send, 70001 receive, and the reciprocal
//     pair) become comm events with the transfer size (0 when unknown) and the
//     rank itself as partner; their id records (70002/70003) are skipped, as
//     are EV_INIT, flush, close, wall clock and continuation records.
//   - a thread other than 0 that carries the "Correlation ID" user event is a
//     GPU queue/stream thread (TAU puts the device side of CUDA and OpenCL
//     activity on such virtual threads); it is given "<API> Context" = "0",
//     "<API> Device" = "0" and "<API> Stream" = its thread number, where API is
//     OpenCL, ROCm or CUDA after the calls the definitions name. Metadata the
//     trace carries itself ("CUDA Device | 0" user events) is kept as is and
//     also marks the thread.
package tautrace

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/replay/kmerge"
	"github.com/kipimo-hpc/kipimo/internal/replay/steps"
)

// RecordSize is the size of one trace record.
const RecordSize = 24

// EVInit is the id of the first record of every per-thread trace.
const EVInit = 60000

// Message is a decoded MESSAGE_SEND/RECV parameter.
type Message struct {
	Bytes   uint32
	Tag     uint32
	Partner uint32
	Comm    uint32
}

// DecodeMessage unpacks TAU's message parameter: length in bits 0-15 and
// 32-41, tag in bits 16-23 (low byte) and 48-55 (high byte), partner rank in
// bits 24-31 and 56-63, communicator in bits 42-47.
func DecodeMessage(par int64) Message {
	p := uint64(par)
	return Message{
		Bytes:   uint32(p&0xFFFF) | uint32((p>>32)&0x3FF)<<16,
		Tag:     uint32((p>>16)&0xFF) | uint32((p>>48)&0xFF)<<8,
		Partner: uint32((p>>24)&0xFF) | uint32((p>>56)&0xFF)<<8,
		Comm:    uint32((p >> 42) & 0x3F),
	}
}

// EncodeMessage packs m as DecodeMessage unpacks it (for tests and tools).
func EncodeMessage(m Message) int64 {
	p := uint64(m.Bytes&0xFFFF) | uint64((m.Bytes>>16)&0x3FF)<<32 |
		uint64(m.Tag&0xFF)<<16 | uint64((m.Tag>>8)&0xFF)<<48 |
		uint64(m.Partner&0xFF)<<24 | uint64((m.Partner>>8)&0xFF)<<56 |
		uint64(m.Comm&0x3F)<<42
	return int64(p)
}

// Input is one trace stream and the definitions that go with it.
type Input struct {
	Name string // for messages
	R    io.Reader
	EDF  *EDF
}

// Error is a problem at a place in a trace file.
type Error struct {
	File   string
	Offset int64 // byte offset of the record
	Record int64 // record index
	Err    error
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s: record %d at byte offset %d: %v", e.File, e.Record, e.Offset, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// ErrTruncated is wrapped when a file ends inside a record.
var ErrTruncated = errors.New("file ends inside a record (truncated)")

type cursor struct {
	in    Input
	order binary.ByteOrder
	buf   []byte
	pos   int
	end   int
	base  int64 // file offset of buf[0]
	rec   int64
	eof   bool
	// current record
	ev   int32
	nid  uint16
	tid  uint16
	par  int64
	ts   uint64
	regd map[uint16]bool // ranks whose names were given to the builder
	// the last rank registered, to skip the map on the common path
	hasLast bool
	lastNid uint16
	little  bool
}

const bufSize = 256 << 10

// fill makes a whole record available at c.pos, or reports io.EOF / a
// truncation.
func (c *cursor) fill() error {
	if c.end-c.pos >= RecordSize {
		return nil
	}
	if c.eof {
		if c.end > c.pos {
			return &Error{c.in.Name, c.base + int64(c.pos), c.rec, fmt.Errorf("%w: %d of %d bytes", ErrTruncated, c.end-c.pos, RecordSize)}
		}
		return io.EOF
	}
	n := copy(c.buf, c.buf[c.pos:c.end])
	c.base += int64(c.pos)
	c.pos, c.end = 0, n
	for c.end < RecordSize && !c.eof {
		m, err := c.in.R.Read(c.buf[c.end:])
		c.end += m
		if err == io.EOF {
			c.eof = true
		} else if err != nil {
			return &Error{c.in.Name, c.base + int64(c.end), c.rec, err}
		}
		if m == 0 && err == nil {
			continue
		}
	}
	return c.fill()
}

// next decodes the next record into c.
func (c *cursor) next() error {
	if err := c.fill(); err != nil {
		return err
	}
	b := c.buf[c.pos : c.pos+RecordSize]
	if c.order == nil {
		switch {
		case int64(binary.LittleEndian.Uint64(b[8:])) == 3:
			c.order = binary.LittleEndian
			c.little = true
		case int64(binary.BigEndian.Uint64(b[8:])) == 3:
			c.order = binary.BigEndian
		default:
			return &Error{c.in.Name, c.base + int64(c.pos), c.rec, errors.New("first record is not EV_INIT (parameter 3 in either byte order): cannot tell the byte order")}
		}
	}
	if c.little {
		c.ev = int32(binary.LittleEndian.Uint32(b))
		c.nid = binary.LittleEndian.Uint16(b[4:])
		c.tid = binary.LittleEndian.Uint16(b[6:])
		c.par = int64(binary.LittleEndian.Uint64(b[8:]))
		c.ts = binary.LittleEndian.Uint64(b[16:])
	} else {
		c.ev = int32(binary.BigEndian.Uint32(b))
		c.nid = binary.BigEndian.Uint16(b[4:])
		c.tid = binary.BigEndian.Uint16(b[6:])
		c.par = int64(binary.BigEndian.Uint64(b[8:]))
		c.ts = binary.BigEndian.Uint64(b[16:])
	}
	c.pos += RecordSize
	c.rec++
	return nil
}

type thKey struct{ nid, tid uint16 }

type thState struct {
	pending int32 // user event id awaiting its value
	phase   uint8 // 0 idle, 1 got leading 0, 2 got value
	gpu     bool
	// The leading 0 of phase 1, a sample of 0 if no value follows.
	pdef *Def
	pcur *cursor
	pts  uint64
}

type reader struct {
	b     *steps.Builder
	th    map[thKey]*thState
	lastK thKey
	lastS *thState
	// threads in phase 1, whose leading 0 may be a lone record
	npending int
}

func (r *reader) state(nid, tid uint16) *thState {
	k := thKey{nid, tid}
	if r.lastS != nil && r.lastK == k {
		return r.lastS
	}
	s, ok := r.th[k]
	if !ok {
		s = &thState{}
		r.th[k] = s
	}
	r.lastK, r.lastS = k, s
	return s
}

func (r *reader) register(c *cursor) { r.registerNode(c, c.nid) }

// registerNode names the functions and counters of c's definitions on node
// nid, once.
func (r *reader) registerNode(c *cursor, nid uint16) {
	if c.hasLast && c.lastNid == nid {
		return
	}
	c.hasLast, c.lastNid = true, nid
	if c.regd[nid] {
		return
	}
	c.regd[nid] = true
	rank := uint32(nid)
	for _, d := range c.in.EDF.Defs() {
		switch d.Kind {
		case KindEntryExit:
			r.b.FuncName(rank, uint32(d.ID), d.Name)
		case KindTrigger:
			r.b.CounterName(rank, uint32(d.ID), d.Name)
		}
	}
}

// lone emits the pending leading 0 of s as a sample of 0: no value came.
func (r *reader) lone(s *thState, nid, tid uint16) error {
	s.phase = 0
	r.npending--
	return r.trigger(s.pcur, s.pdef, s, uint32(nid), uint32(tid), 0, s.pts)
}

// flushLone emits every pending leading 0, in thread order (at the end).
func (r *reader) flushLone() error {
	if r.npending == 0 {
		return nil
	}
	keys := make([]thKey, 0, len(r.th))
	for k, s := range r.th {
		if s.phase == 1 {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].nid != keys[j].nid {
			return keys[i].nid < keys[j].nid
		}
		return keys[i].tid < keys[j].tid
	})
	for _, k := range keys {
		if err := r.lone(r.th[k], k.nid, k.tid); err != nil {
			return err
		}
	}
	return nil
}

// record handles the current record of c.
func (r *reader) record(c *cursor) error {
	if r.npending > 0 {
		if s := r.th[thKey{c.nid, c.tid}]; s != nil && s.phase == 1 && s.pending != c.ev {
			if err := r.lone(s, c.nid, c.tid); err != nil {
				return err
			}
		}
	}
	if c.in.EDF.KindOf(c.ev) == KindEntryExit {
		r.register(c)
		switch {
		case c.par > 0:
			return r.b.Enter(uint32(c.nid), uint32(c.tid), uint32(c.ev), c.ts)
		case c.par < 0:
			return r.b.Exit(uint32(c.nid), uint32(c.tid), uint32(c.ev), c.ts)
		}
	}
	d := c.in.EDF.Lookup(c.ev)
	if d == nil {
		return fmt.Errorf("event id %d is not defined in %s", c.ev, c.in.EDF.Name)
	}
	rank, tid := uint32(c.nid), uint32(c.tid)
	switch d.Kind {
	case KindEntryExit:
		r.register(c)
		switch {
		case c.par > 0:
			return r.b.Enter(rank, tid, uint32(c.ev), c.ts)
		case c.par < 0:
			return r.b.Exit(rank, tid, uint32(c.ev), c.ts)
		}
		return fmt.Errorf("event %d (%q): entry/exit parameter is 0", c.ev, d.Name)
	case KindTrigger, KindMeta:
		s := r.state(c.nid, c.tid)
		if s.phase != 0 && s.pending != c.ev {
			s.phase = 0 // an interrupted triple: start over
		}
		switch s.phase {
		case 0:
			s.pending = c.ev
			if c.par == 0 {
				s.phase = 1
				s.pdef, s.pcur, s.pts = d, c, c.ts
				r.npending++
				return nil
			}
			s.phase = 2 // a lone value record
		case 1:
			s.phase = 2
			r.npending--
		case 2:
			if c.par == 0 {
				s.phase = 0
				return nil
			}
			// a new event with the same id
			s.phase = 2
		}
		return r.trigger(c, d, s, rank, tid, uint64(c.par), c.ts)
	case KindSend, KindRecv:
		m := DecodeMessage(c.par)
		kind := frame.Send
		if d.Kind == KindRecv {
			kind = frame.Recv
		}
		return r.b.Comm(rank, tid, kind, m.Tag, m.Partner, uint64(m.Bytes), c.ts)
	case KindOneSend, KindOneRecv:
		kind := frame.Send
		if d.Kind == KindOneRecv {
			kind = frame.Recv
		}
		bytes := uint64(0)
		if c.par > 0 {
			bytes = uint64(c.par)
		}
		return r.b.Comm(rank, tid, kind, 0, rank, bytes, c.ts)
	}
	return nil // KindIgnore
}

func (r *reader) trigger(c *cursor, d *Def, s *thState, rank, tid uint32, value, ts uint64) error {
	if d.Kind == KindMeta {
		r.b.Meta(rank, tid, d.Key, d.Value)
		if !s.gpu && isGPUKey(d.Key) {
			s.gpu = true
			return r.b.MarkGPU(rank, tid)
		}
		return nil
	}
	r.registerNode(c, uint16(rank))
	if d.Correlation && tid != 0 && !s.gpu {
		s.gpu = true
		api := c.in.EDF.API
		if err := r.b.GPU(rank, tid, api, "0", "0", strconv.FormatUint(uint64(tid), 10)); err != nil {
			return err
		}
	}
	return r.b.Counter(rank, tid, uint32(d.ID), value, ts)
}

func isGPUKey(k string) bool {
	for _, api := range []string{"CUDA", "ROCm", "OpenCL", "SYCL", "GPU"} {
		if k == api+steps.KeyStream {
			return true
		}
	}
	return false
}

// ReadInputs merges the inputs in timestamp order into b and finishes b. On
// an error it stops: b has emitted the steps completed before the damage, and
// the error says the file, record and byte offset.
func ReadInputs(ctx context.Context, ins []Input, b *steps.Builder) error {
	r := &reader{b: b, th: map[thKey]*thState{}}
	cs := make([]*cursor, 0, len(ins))
	for _, in := range ins {
		c := &cursor{in: in, buf: make([]byte, bufSize), regd: map[uint16]bool{}}
		if err := c.next(); err != nil {
			if err == io.EOF {
				continue // an empty file
			}
			return err
		}
		cs = append(cs, c)
	}
	if len(cs) == 0 {
		return b.Finish()
	}
	origin := cs[0].ts
	for _, c := range cs {
		origin = min(origin, c.ts)
	}
	b.SetOrigin(origin)
	h := kmerge.New(slices.Clone(cs), byTS) // cs keeps every cursor, for the record count
	n := 0
	for h.Len() > 0 {
		c := h.Top()
		if err := r.record(c); err != nil {
			return wrap(c, err, b)
		}
		if n++; n&0xFFFF == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		err := c.next()
		switch {
		case err == io.EOF:
			h.Pop()
		case err != nil:
			return stopped(err, b)
		default:
			if h.Len() > 1 {
				h.Fix()
				if err := b.Advance(h.Top().ts); err != nil {
					return err
				}
			}
		}
	}
	if err := r.flushLone(); err != nil {
		return stopped(err, b)
	}
	var recs int64
	for _, c := range cs {
		recs += c.rec
	}
	b.Read(int(recs))
	return b.Finish()
}

func wrap(c *cursor, err error, b *steps.Builder) error {
	var e *Error
	if !errors.As(err, &e) {
		err = &Error{c.in.Name, c.base + int64(c.pos) - RecordSize, c.rec - 1, err}
	}
	return stopped(err, b)
}

func stopped(err error, b *steps.Builder) error {
	return fmt.Errorf("%w (%w; steps before io_step %d were emitted)", err, steps.ErrStopped, b.CompleteSteps())
}

// byTS orders cursors by current timestamp.
func byTS(a, b *cursor) bool { return a.ts < b.ts }

var perThread = regexp.MustCompile(`^tautrace\.(\d+)\.(\d+)\.(\d+)\.trc$`)

// Expand turns the command-line paths into trace files: a directory stands for
// every tautrace.*.trc in it (or its tau.trc when there are none); .edf paths
// are dropped (each trace finds its own).
func Expand(paths []string) ([]string, error) {
	var out []string
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("TAU trace: %w", err)
		}
		if !st.IsDir() {
			if filepath.Ext(p) != ".edf" {
				out = append(out, p)
			}
			continue
		}
		m, _ := filepath.Glob(filepath.Join(p, "tautrace.*.trc"))
		if len(m) == 0 {
			m, _ = filepath.Glob(filepath.Join(p, "*.trc"))
		}
		if len(m) == 0 {
			return nil, fmt.Errorf("TAU trace: no .trc files in directory %s", p)
		}
		sort.Strings(m)
		out = append(out, m...)
	}
	if len(out) == 0 {
		return nil, errors.New("TAU trace: no .trc files given")
	}
	return out, nil
}

// dropMerged returns files without the merged traces when per-thread traces
// are among them, counting each one dropped as a loss.
func dropMerged(files []string, b *steps.Builder) []string {
	var per, merged []string
	for _, f := range files {
		if perThread.MatchString(filepath.Base(f)) {
			per = append(per, f)
		} else {
			merged = append(merged, f)
		}
	}
	if len(per) == 0 || len(merged) == 0 {
		return files
	}
	b.Lose(steps.LossDuplicateInput, len(merged), func() string {
		return fmt.Sprintf("%s: a merged trace given with %d per-thread traces (tautrace.<node>.<ctx>.<thread>.trc) that hold the same events; the per-thread ones are read", merged[0], len(per))
	})
	return per
}

// EDFPath is the definition file that goes with a trace file:
// events.<node>.edf for tautrace.<node>.<ctx>.<thread>.trc, else the trace's
// name with .edf (tau.trc -> tau.edf).
func EDFPath(trc string) string {
	dir, base := filepath.Split(trc)
	if m := perThread.FindStringSubmatch(base); m != nil {
		return filepath.Join(dir, "events."+m[1]+".edf")
	}
	return trc[:len(trc)-len(filepath.Ext(trc))] + ".edf"
}

// Read reads the given trace files (see Expand) into b and finishes it.
// Given both per-thread traces and merged ones (tau_merge's tau.trc holds
// the same events again, on another clock), it reads the per-thread ones and
// counts each merged file as a steps.LossDuplicateInput.
func Read(ctx context.Context, paths []string, b *steps.Builder) error {
	files, err := Expand(paths)
	if err != nil {
		return err
	}
	files = dropMerged(files, b)
	edfs := map[string]*EDF{}
	var ins []Input
	for _, f := range files {
		ep := EDFPath(f)
		e, ok := edfs[ep]
		if !ok {
			ef, err := os.Open(ep)
			if err != nil {
				return fmt.Errorf("TAU trace %s: its event definitions: %w", f, err)
			}
			e, err = ParseEDF(ef, ep)
			ef.Close()
			if err != nil {
				return err
			}
			edfs[ep] = e
		}
		fh, err := os.Open(f)
		if err != nil {
			return fmt.Errorf("TAU trace: %w", err)
		}
		defer fh.Close()
		ins = append(ins, Input{Name: f, R: fh, EDF: e})
	}
	return ReadInputs(ctx, ins, b)
}
