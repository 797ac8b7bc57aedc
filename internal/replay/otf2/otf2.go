// Package otf2 reads OTF2 trace archives (what Score-P writes: the anchor
// file traces.otf2, the global definitions traces.def and, per location,
// traces/<id>.def and traces/<id>.evt) as frames.
//
// The reader is written from the OTF2 format: every file is a sequence of
// chunks (the sizes the anchor file gives), each opening with a header that
// says the byte order; records are a one-byte id, a length (one byte, or 0xff
// and eight bytes; Enter, Leave and the other single-field events have
// none) and fields, integers written compressed (a byte count, then the
// value's low-order bytes). Event records follow a timestamp record when the
// time changes. The locations' event files are merged in time order with one
// small buffer per location, so an archive is read in one pass.
//
// Mapping to frames:
//   - location groups are ranks (the group id; a group created by another,
//     such as an accelerator group, counts as its creator's rank); locations
//     are the threads of their rank, numbered in location id order, with the
//     location's name as "Thread Name" and the group's as "Process Name";
//   - Enter and Leave become function entry and exit, the function named by
//     the region's name;
//   - MpiSend and MpiIsend become sends, MpiRecv and MpiIrecv receives, with
//     the message's tag and length; the partner is the peer's rank,
//     translated from its rank in the communicator through the
//     communicator's group (the rank in the communicator when the group is
//     not defined);
//   - each value of a Metric event (a PAPI counter, resource usage...)
//     becomes a sample of the counter named by its metric member, with the
//     value as written (no scaling by the member's base and exponent);
//     doubles are rounded; negative values are counted as losses;
//   - timestamps are corrected by the location's clock offsets (linear
//     interpolation, as OTF2's own readers do) and converted to microseconds
//     from the clock properties' global offset, with its timer resolution.
//
// Every other event (collectives, OpenMP and thread events, RMA, I/O,
// parameters, calling-context samples, program begin/end, buffer flushes...)
// is counted as an unsupported loss. SIONlib containers and compressed
// archives are rejected.
package otf2

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/replay/kmerge"
	"github.com/kipimo-hpc/kipimo/internal/replay/steps"
)

// Event record ids this reader turns into frame events, and the ones it
// names in loss reports.
const (
	evEnter  = 12
	evLeave  = 13
	evSend   = 14
	evIsend  = 15
	evRecv   = 18
	evIrecv  = 19
	evMetric = 31
)

// singleton reports whether event id is written without a record length
// (one compressed field): the events defined by OTF2 1.1 with one field.
func singleton(id byte) bool {
	switch id {
	case 12, 13, 16, 17, 20, 21, 24, 28, 29, 30:
		return true
	}
	return false
}

var eventNames = map[byte]string{
	10: "BufferFlush", 11: "MeasurementOnOff", 16: "MpiIsendComplete", 17: "MpiIrecvRequest",
	20: "MpiRequestTest", 21: "MpiRequestCancelled", 22: "MpiCollectiveBegin", 23: "MpiCollectiveEnd",
	24: "OmpFork", 25: "OmpJoin", 26: "OmpAcquireLock", 27: "OmpReleaseLock", 28: "OmpTaskCreate",
	29: "OmpTaskSwitch", 30: "OmpTaskComplete", 32: "ParameterString", 33: "ParameterInt",
	34: "ParameterUnsignedInt", 53: "ThreadFork", 54: "ThreadJoin", 55: "ThreadTeamBegin",
	56: "ThreadTeamEnd", 62: "ThreadCreate", 63: "ThreadBegin", 64: "ThreadWait", 65: "ThreadEnd",
	66: "CallingContextEnter", 67: "CallingContextLeave", 68: "CallingContextSample",
	83: "ProgramBegin", 84: "ProgramEnd",
}

func eventName(id byte) string {
	if n, ok := eventNames[id]; ok {
		return n
	}
	switch {
	case id >= 35 && id <= 52:
		return fmt.Sprintf("RMA event %d", id)
	case id >= 57 && id <= 61:
		return fmt.Sprintf("thread event %d", id)
	case id >= 69 && id <= 82:
		return fmt.Sprintf("I/O event %d", id)
	}
	return fmt.Sprintf("event %d", id)
}

// Archive is an opened OTF2 archive: its anchor, global definitions and the
// paths of its per-location files.
type Archive struct {
	Anchor *Anchor
	Defs   *Defs
	// AnchorPath is the anchor file; Dir the directory of the location
	// files.
	AnchorPath, DefsPath, Dir string
	// open opens the archive's files (os.Open unless a test says).
	open func(string) (io.ReadCloser, error)
}

func osOpen(p string) (io.ReadCloser, error) { return os.Open(p) }

// FindAnchor turns the command-line inputs into the archive's anchor file.
// An input is the anchor file, or a directory holding one (traces.otf2, or
// the only *.otf2 in it); other files are accepted when they lie in the
// archive's directory (traces.def, traces/*.evt, Score-P's MANIFEST.md...,
// as a shell glob or a listing of the directory gives them). A lone file is
// taken as the anchor whatever its name.
func FindAnchor(paths []string) (string, error) {
	if len(paths) == 0 {
		return "", errors.New("otf2: no input: give an archive's anchor file traces.otf2, or its directory")
	}
	var anchors, others []string
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return "", fmt.Errorf("otf2: %w", err)
		}
		switch {
		case st.IsDir():
			a, err := dirAnchor(p)
			if err != nil {
				return "", err
			}
			anchors = append(anchors, filepath.Clean(a))
		case strings.EqualFold(filepath.Ext(p), ".otf2") || len(paths) == 1:
			anchors = append(anchors, filepath.Clean(p))
		default:
			others = append(others, p)
		}
	}
	slices.Sort(anchors)
	anchors = slices.CompactFunc(anchors, func(a, b string) bool { return sameFile(a, b) })
	if len(anchors) != 1 {
		return "", fmt.Errorf("otf2: give one archive (its anchor file traces.otf2, or its directory); the inputs name %d anchor files (%s)", len(anchors), strings.Join(anchors, ", "))
	}
	dir := filepath.Dir(anchors[0])
	base := strings.TrimSuffix(anchors[0], filepath.Ext(anchors[0]))
	for _, o := range others {
		if d := filepath.Dir(o); !sameFile(d, dir) && !sameFile(d, base) {
			return "", fmt.Errorf("otf2: input %s is not a file of the archive %s (give the anchor file or its directory)", o, anchors[0])
		}
	}
	return anchors[0], nil
}

func sameFile(a, b string) bool {
	if filepath.Clean(a) == filepath.Clean(b) {
		return true
	}
	x, err1 := os.Stat(a)
	y, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(x, y)
}

// dirAnchor is the anchor file of the archive in directory p.
func dirAnchor(p string) (string, error) {
	if _, err := os.Stat(filepath.Join(p, "traces.otf2")); err == nil {
		return filepath.Join(p, "traces.otf2"), nil
	}
	m, _ := filepath.Glob(filepath.Join(p, "*.otf2"))
	switch len(m) {
	case 1:
		return m[0], nil
	case 0:
		return "", fmt.Errorf("otf2: no anchor file (*.otf2) in directory %s", p)
	}
	return "", fmt.Errorf("otf2: directory %s holds %d anchor files (%s); give one", p, len(m), strings.Join(m, ", "))
}

// Open reads the anchor file and the global definitions of the archive
// whose anchor file is path.
func Open(path string) (*Archive, error) { return openWith(path, osOpen) }

func openWith(path string, open func(string) (io.ReadCloser, error)) (*Archive, error) {
	fh, err := open(path)
	if err != nil {
		return nil, fmt.Errorf("otf2 anchor: %w", err)
	}
	data, err := io.ReadAll(io.LimitReader(fh, maxAnchor+1))
	fh.Close()
	if err != nil {
		return nil, fmt.Errorf("otf2 anchor %s: %w", path, err)
	}
	if len(data) > maxAnchor {
		return nil, &Error{File: path, Offset: maxAnchor, Err: errors.New("anchor file larger than 16 MiB: not an OTF2 anchor file")}
	}
	a, err := ParseAnchor(data, path)
	if err != nil {
		return nil, err
	}
	base := strings.TrimSuffix(path, filepath.Ext(path))
	ar := &Archive{Anchor: a, AnchorPath: path, DefsPath: base + ".def", Dir: base, open: open}
	df, err := open(ar.DefsPath)
	if err != nil {
		return nil, fmt.Errorf("otf2 global definitions: %w", err)
	}
	defer df.Close()
	if ar.Defs, err = ParseDefs(df, ar.DefsPath, int64(a.ChunkDefs)); err != nil {
		return nil, err
	}
	return ar, nil
}

// EventsPath is the event file of location id.
func (ar *Archive) EventsPath(id uint64) string {
	return filepath.Join(ar.Dir, strconv.FormatUint(id, 10)+".evt")
}

// LocalDefsPath is the local definitions file of location id.
func (ar *Archive) LocalDefsPath(id uint64) string {
	return filepath.Join(ar.Dir, strconv.FormatUint(id, 10)+".def")
}

// Event is one decoded event record of a location.
type Event struct {
	ID   byte   // record id
	Time uint64 // timestamp in ticks, clock-corrected
	// Payload is the record's fields (valid until the next event).
	Payload []byte
	Offset  int64 // byte offset of the record in its file
}

// Events reads the event records of one location in order.
type Events struct {
	c     *chunkReader
	local *Local
	raw   uint64
	ev    Event
	// Records counts the event records read (attribute lists and
	// timestamps not included).
	Records int64
}

func newEvents(r io.Reader, name string, chunkSize int64, local *Local, buf int) *Events {
	return &Events{c: newChunkReader(name, r, chunkSize, buf), local: local}
}

// bufFor is the read buffer of each of n locations' event files: 32 KiB,
// less for archives of many locations (4 KiB from 8,192 on).
func bufFor(n int) int {
	return max(4<<10, min(32<<10, (32<<20)/max(n, 1)))
}

// Next returns the next event, or io.EOF after the last.
func (e *Events) Next() (*Event, error) {
	for {
		id, err := e.c.next(true, &e.raw)
		if err != nil {
			return nil, err
		}
		var p []byte
		if singleton(id) {
			p, err = e.c.compressed()
		} else {
			p, err = e.c.payload()
		}
		if err != nil {
			return nil, err
		}
		if id == recAttributes {
			continue // attributes of the next event: not read
		}
		e.Records++
		e.ev = Event{ID: id, Time: e.local.Correct(e.raw), Payload: p, Offset: e.c.recOff}
		return &e.ev, nil
	}
}

func (e *Events) decoder() dec { return dec{b: e.ev.Payload, little: e.c.little} }

// cursor is one location being merged.
type cursor struct {
	loc   *Location
	rank  uint32
	tid   uint32
	order int
	fh    io.Closer
	ev    *Events
	cur   *Event
	us    uint64 // time of cur, µs from the global offset
	bad   bool   // cur's time is out of range
}

type reader struct {
	ar      *Archive
	b       *steps.Builder
	rankOf  map[uint64]uint32 // location → rank
	commLoc map[uint8]*Group  // paradigm → its COMM_LOCATIONS group
	named   map[[2]uint32]bool
}

// rankOfGroup follows creating location groups to the process rank.
func (r *reader) rankOfGroup(id uint32) uint32 {
	for range 64 {
		g := r.ar.Defs.Groups[id]
		if g == nil || g.Creator == undefined32 || g.Creator == id {
			return id
		}
		id = g.Creator
	}
	return id
}

// toUS converts a corrected timestamp to µs from the global offset.
func (r *reader) toUS(t uint64) (uint64, bool) {
	c := r.ar.Defs.Clock
	d := t - min(t, c.Offset)
	hi, lo := bits.Mul64(d, 1_000_000)
	if hi >= c.Resolution {
		return 0, false
	}
	q, rem := bits.Div64(hi, lo, c.Resolution)
	if rem >= c.Resolution-rem {
		q++
	}
	return q, true
}

// partner translates peer, a rank in communicator comm, to a frame rank.
func (r *reader) partner(comm, peer, self uint32) uint32 {
	d := r.ar.Defs
	cm, ok := d.Comms[comm]
	if !ok {
		return peer
	}
	g := d.Sets[cm.Group]
	if g == nil {
		return peer
	}
	locRank := func(locs *Group, i uint64) (uint32, bool) {
		if locs == nil || i >= uint64(len(locs.Members)) {
			return 0, false
		}
		rk, ok := r.rankOf[locs.Members[i]]
		return rk, ok
	}
	switch g.Type {
	case groupCommSelf:
		return self
	case groupCommLocations:
		if rk, ok := locRank(g, uint64(peer)); ok {
			return rk
		}
	case groupCommGroup:
		if uint64(peer) >= uint64(len(g.Members)) {
			return peer
		}
		world := g.Members[peer]
		if rk, ok := locRank(r.commLoc[g.Paradigm], world); ok {
			return rk
		}
		if world <= math.MaxUint32 {
			return uint32(world)
		}
	}
	return peer
}

func (r *reader) lose(kind string, c *cursor, why string) {
	r.b.Lose(kind, 1, func() string {
		return fmt.Sprintf("%s: byte offset %d: %s", c.ev.c.name, c.cur.Offset, why)
	})
}

// feed turns c's current event into frame events.
func (r *reader) feed(c *cursor) error {
	e := c.cur
	if c.bad {
		r.lose(steps.LossBadTime, c, fmt.Sprintf("%s at tick %d is beyond the range of the clock", eventName(e.ID), e.Time))
		return nil
	}
	fd := c.ev.decoder()
	f := &fd
	b := r.b
	var err error
	switch e.ID {
	case evEnter, evLeave:
		region := c.ev.local.Map(mapRegion, f.u32("region"))
		if f.err != nil {
			break
		}
		if !b.HasFunc(c.rank, region) {
			b.FuncName(c.rank, region, r.ar.Defs.RegionName(region))
		}
		if e.ID == evEnter {
			err = b.Enter(c.rank, c.tid, region, c.us)
		} else {
			err = b.Exit(c.rank, c.tid, region, c.us)
		}
	case evSend, evIsend, evRecv, evIrecv:
		peer := f.u32("peer")
		comm := c.ev.local.Map(mapComm, f.u32("communicator"))
		tag := f.u32("tag")
		n := f.u64("message length")
		if f.err != nil {
			break
		}
		kind := frame.Send
		if e.ID == evRecv || e.ID == evIrecv {
			kind = frame.Recv
		}
		err = b.Comm(c.rank, c.tid, kind, tag, r.partner(comm, peer, c.rank), n, c.us)
	case evMetric:
		metric := c.ev.local.Map(mapMetric, f.u32("metric"))
		n := int(f.u8("number of metrics"))
		members := r.ar.Defs.Metrics[metric].Members
		for i := 0; i < n && f.err == nil; i++ {
			typ := f.u8("metric value type")
			raw := f.u64("metric value")
			if f.err != nil {
				break
			}
			if i >= len(members) {
				r.lose(steps.LossUnknownEvent, c, fmt.Sprintf("value %d of metric %d, which defines %d members", i, metric, len(members)))
				continue
			}
			cid := members[i]
			if !r.named[[2]uint32{c.rank, cid}] {
				r.named[[2]uint32{c.rank, cid}] = true
				name := fmt.Sprintf("metric member %d", cid)
				if m, ok := r.ar.Defs.Members[cid]; ok {
					name = m.Name
				}
				b.CounterName(c.rank, cid, name)
			}
			v, ok, why := metricValue(typ, raw)
			if !ok {
				r.lose(steps.LossCounterValue, c, why)
				continue
			}
			if err = b.Counter(c.rank, c.tid, cid, v, c.us); err != nil {
				break
			}
		}
	default:
		r.lose(steps.LossUnsupported, c, eventName(e.ID)+" (no frame form, dropped)")
		return nil
	}
	if f.err != nil {
		return &Error{File: c.ev.c.name, Offset: e.Offset, Err: fmt.Errorf("%s record: %w", eventName(e.ID), f.err)}
	}
	if err != nil {
		return fmt.Errorf("%s: byte offset %d: %w", c.ev.c.name, e.Offset, err)
	}
	return nil
}

// metricValue converts a metric value of OTF2 type typ to a counter value.
func metricValue(typ uint8, raw uint64) (uint64, bool, string) {
	switch typ {
	case typeUint64:
		return raw, true, ""
	case typeInt64:
		if int64(raw) < 0 {
			return 0, false, fmt.Sprintf("negative value %d", int64(raw))
		}
		return raw, true, ""
	case typeDouble:
		x := math.Float64frombits(raw)
		if math.IsNaN(x) || x < 0 || x >= 1<<63 {
			return 0, false, fmt.Sprintf("value %g", x)
		}
		return uint64(math.Round(x)), true, ""
	}
	return 0, false, fmt.Sprintf("value of type %d (not an integer or double)", typ)
}

func (r *reader) advance(c *cursor) error {
	ev, err := c.ev.Next()
	if err != nil {
		return err
	}
	c.cur = ev
	c.us, c.bad = 0, false
	if us, ok := r.toUS(ev.Time); ok {
		c.us = us
	} else {
		c.bad = true
	}
	return nil
}

// Read reads the archive given on the command line (its anchor file or its
// directory) into b and finishes b. A damaged file stops the read: b has
// emitted the steps completed before the damage, and the error names the
// file and byte offset.
func Read(ctx context.Context, paths []string, b *steps.Builder) error {
	anchor, err := FindAnchor(paths)
	if err != nil {
		return err
	}
	ar, err := Open(anchor)
	if err != nil {
		return err
	}
	return ReadArchive(ctx, ar, b)
}

// ReadArchive merges the events of every location of ar into b in time
// order and finishes b.
func ReadArchive(ctx context.Context, ar *Archive, b *steps.Builder) error {
	d := ar.Defs
	if ar.open == nil {
		ar.open = osOpen
	}
	r := &reader{ar: ar, b: b, rankOf: map[uint64]uint32{}, commLoc: map[uint8]*Group{}, named: map[[2]uint32]bool{}}
	locs := d.SortedLocations()
	tids := map[uint32]uint32{}
	pool := &filePool{open: ar.open, max: maxOpenFiles}
	var cs []*cursor
	defer func() {
		for _, c := range cs {
			c.fh.Close()
		}
	}()
	type placed struct{ rank, tid uint32 }
	place := map[uint64]placed{}
	for _, l := range locs {
		rk := r.rankOfGroup(l.Group)
		r.rankOf[l.ID] = rk
		place[l.ID] = placed{rk, tids[rk]}
		tids[rk]++
	}
	setIDs := make([]uint32, 0, len(d.Sets))
	for id := range d.Sets {
		setIDs = append(setIDs, id)
	}
	slices.Sort(setIDs)
	for _, id := range setIDs {
		if g := d.Sets[id]; g.Type == groupCommLocations && r.commLoc[g.Paradigm] == nil {
			r.commLoc[g.Paradigm] = g
		}
	}
	for i, l := range locs {
		if err := ctx.Err(); err != nil {
			return err
		}
		path := ar.EventsPath(l.ID)
		fh := pool.file(path)
		if _, err := fh.Read(nil); err != nil && err != io.EOF {
			if errors.Is(err, os.ErrNotExist) && l.Events == 0 {
				continue
			}
			return fmt.Errorf("otf2: events of location %d (%q, %d events): %w", l.ID, l.Name, l.Events, err)
		}
		var local *Local
		if lf, err := ar.open(ar.LocalDefsPath(l.ID)); err == nil {
			local, err = ParseLocal(lf, ar.LocalDefsPath(l.ID), int64(ar.Anchor.ChunkDefs))
			lf.Close()
			if err != nil {
				fh.Close()
				return err
			}
		} else if !errors.Is(err, os.ErrNotExist) {
			fh.Close()
			return fmt.Errorf("otf2: local definitions of location %d: %w", l.ID, err)
		}
		p := place[l.ID]
		c := &cursor{loc: l, rank: p.rank, tid: p.tid, order: i, fh: fh, ev: newEvents(fh, path, int64(ar.Anchor.ChunkEvents), local, bufFor(len(locs)))}
		if err := r.advance(c); err != nil {
			fh.Close()
			if err == io.EOF {
				continue
			}
			return err
		}
		cs = append(cs, c)
		if g := d.Groups[p.rank]; g != nil && g.Name != "" {
			b.Meta(p.rank, 0, "Process Name", g.Name)
		}
		if l.Name != "" {
			b.Meta(p.rank, p.tid, "Thread Name", l.Name)
		}
	}
	b.SetOrigin(0)
	h := kmerge.New(slices.Clone(cs), byTime)
	n := 0
	for h.Len() > 0 {
		c := h.Top()
		if err := r.feed(c); err != nil {
			return stopped(err, b)
		}
		if n++; n&0xFFFF == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		err := r.advance(c)
		switch {
		case err == io.EOF:
			h.Pop()
		case err != nil:
			return stopped(err, b)
		default:
			h.Fix()
		}
		if h.Len() > 0 {
			top := h.Top()
			if err := b.Advance(top.us); err != nil {
				return fmt.Errorf("%s: byte offset %d: %w", top.ev.c.name, top.cur.Offset, err)
			}
		}
	}
	var recs int64
	for _, c := range cs {
		recs += c.ev.Records
	}
	b.Read(int(recs))
	return b.Finish()
}

func stopped(err error, b *steps.Builder) error {
	return fmt.Errorf("%w (%w; steps before io_step %d were emitted)", err, steps.ErrStopped, b.CompleteSteps())
}

// byTime orders cursors by current time (ties: location order).
func byTime(a, b *cursor) bool {
	if a.us != b.us {
		return a.us < b.us
	}
	return a.order < b.order
}
