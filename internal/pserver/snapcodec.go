package pserver

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"maps"
	"math"
	"slices"

	"github.com/kipimo-hpc/kipimo/internal/stats"
)

// The snapshot's binary form (format "kpss-v1"): the magic "KPSS", a uvarint
// version, the State field by field, then a CRC-32C (Castagnoli) of all
// that, little-endian. Integers are uvarints (signed ones zigzag), floats
// their IEEE 754 bits, strings a uvarint length and their bytes; Moments,
// Histogram and TailHist use their own binary forms (package stats); maps
// are a count and their entries in key order, so the same State always
// gives the same bytes. Every field is written by name in this file: a
// field added to a saved type fails TestSnapshotCoversEveryField until it
// is written here, and a renamed one fails to compile, so no state is
// dropped silently across an upgrade (as gob would).
const (
	snapMagic   = "KPSS"
	snapVersion = 1
	// maxSnapshotEntries bounds every count read from a snapshot.
	maxSnapshotEntries = 1 << 28
)

var snapCRC = crc32.MakeTable(crc32.Castagnoli)

type snapWriter struct {
	b   []byte
	err error
}

func (w *snapWriter) u(v uint64)  { w.b = binary.AppendUvarint(w.b, v) }
func (w *snapWriter) i(v int64)   { w.b = binary.AppendVarint(w.b, v) }
func (w *snapWriter) f(v float64) { w.b = binary.LittleEndian.AppendUint64(w.b, math.Float64bits(v)) }
func (w *snapWriter) s(v string)  { w.u(uint64(len(v))); w.b = append(w.b, v...) }
func (w *snapWriter) bool(v bool) {
	if v {
		w.b = append(w.b, 1)
	} else {
		w.b = append(w.b, 0)
	}
}

// bin appends a value's own binary form.
func (w *snapWriter) bin(v interface{ AppendBinary([]byte) ([]byte, error) }) {
	if w.err != nil {
		return
	}
	w.b, w.err = v.AppendBinary(w.b)
}

func (w *snapWriter) id(d DetectorID) { w.u(uint64(d.PID)); w.u(uint64(d.Rank)) }

func (w *snapWriter) totals(t *Totals) {
	for _, v := range []uint64{t.Anomalies, t.Executions, t.Events, t.BadFrames, t.Missing, t.Frames, t.Steps} {
		w.u(v)
	}
}

func (w *snapWriter) metrics(m *AnomalyMetrics) {
	for _, v := range []uint64{m.Count, m.FirstStep, m.LastStep, m.MinTS, m.MaxTS} {
		w.u(v)
	}
	w.bin(&m.PerStep)
	w.bin(&m.Score)
	w.bin(&m.Severity)
}

func byID(a, b DetectorID) int {
	return cmp.Or(cmp.Compare(a.PID, b.PID), cmp.Compare(a.Rank, b.Rank))
}

// appendState appends st's binary form to b; the caller holds its lock.
func appendState(b []byte, st *State) ([]byte, error) {
	start := len(b) + len(snapMagic) // the CRC covers what follows the magic
	w := &snapWriter{b: append(b, snapMagic...)}
	w.u(snapVersion)

	w.u(uint64(len(st.Models)))
	for _, k := range slices.Sorted(maps.Keys(st.Models)) {
		m := st.Models[k]
		w.s(m.Key)
		w.u(uint64(m.PID))
		w.bin(&m.Moments)
		w.bool(m.Histogram != nil)
		if m.Histogram != nil {
			w.bin(m.Histogram)
		}
		w.bool(m.Tail != nil)
		if m.Tail != nil {
			w.bin(m.Tail)
		}
		w.u(m.Anomalies)
		w.u(m.Merges)
	}
	for _, seqs := range []map[DetectorID]uint64{st.LastSeq, st.Incarnation} {
		w.u(uint64(len(seqs)))
		for _, id := range slices.SortedFunc(maps.Keys(seqs), byID) {
			w.id(id)
			w.u(seqs[id])
		}
	}
	w.u(uint64(len(st.Past)))
	for _, id := range slices.SortedFunc(maps.Keys(st.Past), byID) {
		w.id(id)
		w.u(uint64(len(st.Past[id])))
		for _, p := range st.Past[id] {
			w.u(p.ID)
			w.u(p.LastSeq)
		}
	}
	w.u(uint64(len(st.Counters)))
	for _, k := range slices.Sorted(maps.Keys(st.Counters)) {
		w.s(k)
		m := st.Counters[k]
		if m == nil {
			m = &stats.Moments{}
		}
		w.bin(m)
	}
	// The rule's own JSON, read back strictly: a field added to it is
	// kept, one the reader does not know is refused.
	w.bool(st.TailRule != nil)
	if st.TailRule != nil {
		rb, err := json.Marshal(st.TailRule)
		if err != nil {
			return nil, fmt.Errorf("encode state snapshot: tail rule: %w", err)
		}
		w.s(string(rb))
	}
	w.u(uint64(len(st.Seen)))
	for _, k := range slices.Sorted(maps.Keys(st.Seen)) {
		w.s(k)
		bins := st.Seen[k]
		w.u(uint64(len(bins)))
		for _, bin := range slices.Sorted(maps.Keys(bins)) {
			w.i(int64(bin))
			s := bins[bin]
			w.u(s.First)
			w.u(uint64(len(s.Ranks)))
			for _, r := range s.Ranks {
				w.u(uint64(r))
			}
		}
	}
	for _, v := range []uint64{st.Applied, st.Duplicates, st.Merges, st.WALSeq, st.Incarnations} {
		w.u(v)
	}

	a := st.Agg
	w.bool(a != nil)
	if a != nil {
		w.u(uint64(a.Window))
		w.u(a.MaxStep)
		w.bool(a.HaveStep)
		w.totals(&a.Folded)
		w.u(a.Late)
		w.u(a.StartTS)
		w.u(uint64(len(a.Steps)))
		for _, k := range slices.Sorted(maps.Keys(a.Steps)) {
			s := a.Steps[k]
			for _, v := range []uint64{s.Step, s.Anomalies, s.Executions, s.Events, s.BadFrames, s.Missing, s.Frames, s.MinTS, s.MaxTS} {
				w.u(v)
			}
			w.u(uint64(len(s.Ranks)))
			for _, id := range slices.SortedFunc(maps.Keys(s.Ranks), byID) {
				w.id(id)
				w.u(s.Ranks[id].Anomalies)
				w.u(s.Ranks[id].Executions)
			}
		}
		w.u(uint64(len(a.Ranks)))
		for _, id := range slices.SortedFunc(maps.Keys(a.Ranks), byID) {
			r := a.Ranks[id]
			w.id(id)
			w.totals(&r.Totals)
			w.u(r.FirstStep)
			w.u(r.LastStep)
			w.bin(&r.PerStep)
			w.bin(&r.Scores)
			w.bin(&r.Severity)
		}
		w.u(uint64(len(a.RankFunc)))
		for _, k := range slices.SortedFunc(maps.Keys(a.RankFunc), func(x, y RankFunc) int {
			return cmp.Or(byID(x.DetectorID, y.DetectorID), cmp.Compare(x.Func, y.Func))
		}) {
			w.id(k.DetectorID)
			w.s(k.Func)
			w.metrics(a.RankFunc[k])
		}
		w.u(uint64(len(a.Funcs)))
		for _, k := range slices.Sorted(maps.Keys(a.Funcs)) {
			w.s(k)
			w.metrics(a.Funcs[k])
		}
	}
	if w.err != nil {
		return nil, fmt.Errorf("encode state snapshot: %w", w.err)
	}
	w.b = binary.LittleEndian.AppendUint32(w.b, crc32.Checksum(w.b[start:], snapCRC))
	return w.b, nil
}

type snapReader struct {
	b   []byte
	off int
	err error
}

func (r *snapReader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("byte %d: %s", r.off, fmt.Sprintf(format, args...))
	}
}

func (r *snapReader) u() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b[r.off:])
	if n <= 0 {
		r.fail("bad uvarint")
		return 0
	}
	r.off += n
	return v
}

func (r *snapReader) i() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b[r.off:])
	if n <= 0 {
		r.fail("bad varint")
		return 0
	}
	r.off += n
	return v
}

func (r *snapReader) u32() uint32 {
	v := r.u()
	if v > math.MaxUint32 {
		r.fail("%d does not fit 32 bits", v)
	}
	return uint32(v)
}

func (r *snapReader) bool() bool {
	if r.err != nil {
		return false
	}
	if r.off >= len(r.b) || r.b[r.off] > 1 {
		r.fail("bad bool")
		return false
	}
	r.off++
	return r.b[r.off-1] == 1
}

func (r *snapReader) s() string {
	n := r.u()
	if r.err == nil && n > uint64(len(r.b)-r.off) {
		r.fail("string of %d bytes with %d left", n, len(r.b)-r.off)
	}
	if r.err != nil {
		return ""
	}
	s := string(r.b[r.off : r.off+int(n)])
	r.off += int(n)
	return s
}

// count reads a count of entries that take at least one byte each.
func (r *snapReader) count() int {
	n := r.u()
	if r.err == nil && (n > maxSnapshotEntries || n > uint64(len(r.b)-r.off)) {
		r.fail("count %d beyond what is left", n)
	}
	if r.err != nil {
		return 0
	}
	return int(n)
}

func (r *snapReader) bin(v interface{ DecodeBinary([]byte) (int, error) }) {
	if r.err != nil {
		return
	}
	n, err := v.DecodeBinary(r.b[r.off:])
	if err != nil {
		r.fail("%v", err)
		return
	}
	r.off += n
}

func (r *snapReader) id() DetectorID { return DetectorID{PID: r.u32(), Rank: r.u32()} }

func (r *snapReader) totals(t *Totals) {
	for _, p := range []*uint64{&t.Anomalies, &t.Executions, &t.Events, &t.BadFrames, &t.Missing, &t.Frames, &t.Steps} {
		*p = r.u()
	}
}

func (r *snapReader) metrics() *AnomalyMetrics {
	m := &AnomalyMetrics{}
	for _, p := range []*uint64{&m.Count, &m.FirstStep, &m.LastStep, &m.MinTS, &m.MaxTS} {
		*p = r.u()
	}
	r.bin(&m.PerStep)
	r.bin(&m.Score)
	r.bin(&m.Severity)
	return m
}

// readState decodes a snapshot's binary form into a State for window
// steps. It checks the framing (magic, version, CRC) first and every count
// against the bytes left, so a damaged snapshot is refused, never trusted.
func readState(data []byte, window int) (*State, error) {
	if len(data) < len(snapMagic)+1+4 || string(data[:len(snapMagic)]) != snapMagic {
		return nil, errors.New("decode state snapshot: not a Kipimo pserver snapshot (no KPSS header)")
	}
	body := data[:len(data)-4]
	if got, want := crc32.Checksum(body[len(snapMagic):], snapCRC), binary.LittleEndian.Uint32(data[len(data)-4:]); got != want {
		return nil, fmt.Errorf("decode state snapshot: CRC %08x, want %08x (damaged)", got, want)
	}
	r := &snapReader{b: body, off: len(snapMagic)}
	if v := r.u(); r.err == nil && v != snapVersion {
		return nil, fmt.Errorf("decode state snapshot: version %d; this pserver reads version %d", v, snapVersion)
	}
	st := NewState(window)
	for range r.count() {
		m := &Model{Key: r.s(), PID: r.u32()}
		r.bin(&m.Moments)
		if r.bool() {
			m.Histogram = &stats.Histogram{}
			r.bin(m.Histogram)
		}
		if r.bool() {
			m.Tail = &stats.TailHist{}
			r.bin(m.Tail)
		}
		m.Anomalies = r.u()
		m.Merges = r.u()
		if r.err == nil {
			st.Models[m.Key] = m
		}
	}
	for _, seqs := range []map[DetectorID]uint64{st.LastSeq, st.Incarnation} {
		for range r.count() {
			id := r.id()
			seqs[id] = r.u()
		}
	}
	for range r.count() {
		id := r.id()
		n := r.count()
		past := make([]PastIncarnation, 0, n)
		for range n {
			past = append(past, PastIncarnation{ID: r.u(), LastSeq: r.u()})
		}
		st.Past[id] = past
	}
	for range r.count() {
		k := r.s()
		m := &stats.Moments{}
		r.bin(m)
		st.Counters[k] = m
	}
	if r.bool() {
		rule := &stats.TailRule{}
		dec := json.NewDecoder(bytes.NewReader([]byte(r.s())))
		dec.DisallowUnknownFields()
		if err := dec.Decode(rule); err != nil && r.err == nil {
			r.fail("tail rule: %v", err)
		}
		st.TailRule = rule
	}
	if n := r.count(); n > 0 {
		st.Seen = make(map[string]BinsSeen, n)
		for range n {
			k := r.s()
			bins := BinsSeen{}
			for range r.count() {
				bin := r.i()
				s := &BinSeen{First: r.u()}
				nr := r.count()
				if nr > MaxSeenRanks {
					r.fail("%d ranks seen in one bin, at most %d", nr, MaxSeenRanks)
				}
				for range nr {
					s.Ranks = append(s.Ranks, r.u32())
				}
				bins[int(bin)] = s
			}
			st.Seen[k] = bins
		}
	}
	for _, p := range []*uint64{&st.Applied, &st.Duplicates, &st.Merges, &st.WALSeq, &st.Incarnations} {
		*p = r.u()
	}
	if r.bool() {
		a := NewAggregates(window)
		r.u() // the window it was saved with; the reader's wins
		a.MaxStep = r.u()
		a.HaveStep = r.bool()
		r.totals(&a.Folded)
		a.Late = r.u()
		a.StartTS = r.u()
		for range r.count() {
			s := &StepAgg{}
			for _, p := range []*uint64{&s.Step, &s.Anomalies, &s.Executions, &s.Events, &s.BadFrames, &s.Missing, &s.Frames, &s.MinTS, &s.MaxTS} {
				*p = r.u()
			}
			n := r.count()
			s.Ranks = make(map[DetectorID]Cell, n)
			for range n {
				id := r.id()
				s.Ranks[id] = Cell{Anomalies: r.u(), Executions: r.u()}
			}
			a.Steps[s.Step] = s
		}
		for range r.count() {
			id := r.id()
			t := &RankTotals{}
			r.totals(&t.Totals)
			t.FirstStep = r.u()
			t.LastStep = r.u()
			r.bin(&t.PerStep)
			r.bin(&t.Scores)
			r.bin(&t.Severity)
			a.Ranks[id] = t
		}
		for range r.count() {
			k := RankFunc{DetectorID: r.id(), Func: r.s()}
			a.RankFunc[k] = r.metrics()
		}
		for range r.count() {
			k := r.s()
			a.Funcs[k] = r.metrics()
		}
		st.Agg = a
	}
	if r.err == nil && r.off != len(body) {
		r.fail("%d bytes after the state", len(body)-r.off)
	}
	if r.err != nil {
		return nil, fmt.Errorf("decode state snapshot: %w", r.err)
	}
	st.Agg.Window = window
	st.Agg.fill()
	return st, nil
}
