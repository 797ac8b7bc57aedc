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
	"slices"

	"github.com/kipimo-hpc/kipimo/internal/binio"
	"github.com/kipimo-hpc/kipimo/internal/stats"
)

// The snapshot's binary form (format "kpss-v3"): the magic "KPSS", a uvarint
// version, the State field by field, then a CRC-32C (Castagnoli) of all
// that, little-endian. Integers are uvarints (signed ones zigzag), floats
// their IEEE 754 bits, strings a uvarint length and their bytes; a model's
// statistics are a stats.Summary in its own binary form, counters Moments
// in theirs (package stats); maps
// are a count and their entries in key order, so the same State always
// gives the same bytes. Every field is written by name in this file: a
// field added to a saved type fails TestSnapshotCoversEveryField until it
// is written here, and a renamed one fails to compile, so no state is
// dropped silently across an upgrade (as gob would).
//
// Version 1 (format "kpss-v1") differs in the models: each histogram
// behind a presence byte (stats.Summary.DecodeOptionalBinary reads it).
// Versions 1 and 2 have no counts of the event library's summarised and
// dropped calls and dropped events in the totals and steps (they read as
// zero). readState reads them all.
const (
	snapMagic   = "KPSS"
	snapVersion = 3
	// snapVersionMin is the oldest version readState reads.
	snapVersionMin = 1
)

var snapCRC = crc32.MakeTable(crc32.Castagnoli)

// snapWriter writes a snapshot: binio's values and the state's parts.
type snapWriter struct {
	binio.Writer
	err error
}

// bin appends a value's own binary form.
func (w *snapWriter) bin(v interface{ AppendBinary([]byte) ([]byte, error) }) {
	if w.err != nil {
		return
	}
	w.B, w.err = v.AppendBinary(w.B)
}

func (w *snapWriter) id(d DetectorID) { w.Uvarint(uint64(d.PID)); w.Uvarint(uint64(d.Rank)) }

func (w *snapWriter) totals(t *Totals) {
	for _, v := range []uint64{t.Anomalies, t.Executions, t.Events, t.BadFrames, t.Missing, t.Frames, t.Steps, t.SummarisedCalls, t.DroppedCalls, t.DroppedEvents} {
		w.Uvarint(v)
	}
}

func (w *snapWriter) metrics(m *AnomalyMetrics) {
	for _, v := range []uint64{m.Count, m.FirstStep, m.LastStep, m.MinTS, m.MaxTS} {
		w.Uvarint(v)
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
	w := &snapWriter{Writer: binio.Writer{B: append(b, snapMagic...)}}
	w.Uvarint(snapVersion)

	w.Uvarint(uint64(len(st.Models)))
	for _, k := range slices.Sorted(maps.Keys(st.Models)) {
		m := st.Models[k]
		w.Str(m.Key)
		w.Uvarint(uint64(m.PID))
		w.bin(&m.Summary)
		w.Uvarint(m.Merges)
	}
	for _, seqs := range []map[DetectorID]uint64{st.LastSeq, st.Incarnation} {
		w.Uvarint(uint64(len(seqs)))
		for _, id := range slices.SortedFunc(maps.Keys(seqs), byID) {
			w.id(id)
			w.Uvarint(seqs[id])
		}
	}
	w.Uvarint(uint64(len(st.Past)))
	for _, id := range slices.SortedFunc(maps.Keys(st.Past), byID) {
		w.id(id)
		w.Uvarint(uint64(len(st.Past[id])))
		for _, p := range st.Past[id] {
			w.Uvarint(p.ID)
			w.Uvarint(p.LastSeq)
		}
	}
	w.Uvarint(uint64(len(st.Counters)))
	for _, k := range slices.Sorted(maps.Keys(st.Counters)) {
		w.Str(k)
		m := st.Counters[k]
		if m == nil {
			m = &stats.Moments{}
		}
		w.bin(m)
	}
	// The rule's own JSON, read back strictly: a field added to it is
	// kept, one the reader does not know is refused.
	w.Bool(st.TailRule != nil)
	if st.TailRule != nil {
		rb, err := json.Marshal(st.TailRule)
		if err != nil {
			return nil, fmt.Errorf("encode state snapshot: tail rule: %w", err)
		}
		w.Str(string(rb))
	}
	w.Uvarint(uint64(len(st.Seen)))
	for _, k := range slices.Sorted(maps.Keys(st.Seen)) {
		w.Str(k)
		bins := st.Seen[k]
		w.Uvarint(uint64(len(bins)))
		for _, bin := range slices.Sorted(maps.Keys(bins)) {
			w.Varint(int64(bin))
			s := bins[bin]
			w.Uvarint(s.First)
			w.Uvarint(uint64(len(s.Ranks)))
			for _, r := range s.Ranks {
				w.Uvarint(uint64(r))
			}
		}
	}
	for _, v := range []uint64{st.Applied, st.Duplicates, st.Merges, st.WALSeq, st.Incarnations} {
		w.Uvarint(v)
	}

	a := st.Agg
	w.Bool(a != nil)
	if a != nil {
		w.Uvarint(uint64(a.Window))
		w.Uvarint(a.MaxStep)
		w.Bool(a.HaveStep)
		w.totals(&a.Folded)
		w.Uvarint(a.Late)
		w.Uvarint(a.StartTS)
		w.Uvarint(uint64(len(a.Steps)))
		for _, k := range slices.Sorted(maps.Keys(a.Steps)) {
			s := a.Steps[k]
			for _, v := range []uint64{s.Step, s.Anomalies, s.Executions, s.Events, s.BadFrames, s.Missing, s.Frames, s.MinTS, s.MaxTS, s.SummarisedCalls, s.DroppedCalls, s.DroppedEvents} {
				w.Uvarint(v)
			}
			w.Uvarint(uint64(len(s.Ranks)))
			for _, id := range slices.SortedFunc(maps.Keys(s.Ranks), byID) {
				w.id(id)
				w.Uvarint(s.Ranks[id].Anomalies)
				w.Uvarint(s.Ranks[id].Executions)
			}
		}
		w.Uvarint(uint64(len(a.Ranks)))
		for _, id := range slices.SortedFunc(maps.Keys(a.Ranks), byID) {
			r := a.Ranks[id]
			w.id(id)
			w.totals(&r.Totals)
			w.Uvarint(r.FirstStep)
			w.Uvarint(r.LastStep)
			w.bin(&r.PerStep)
			w.bin(&r.Scores)
			w.bin(&r.Severity)
		}
		w.Uvarint(uint64(len(a.RankFunc)))
		for _, k := range slices.SortedFunc(maps.Keys(a.RankFunc), func(x, y RankFunc) int {
			return cmp.Or(byID(x.DetectorID, y.DetectorID), cmp.Compare(x.Func, y.Func))
		}) {
			w.id(k.DetectorID)
			w.Str(k.Func)
			w.metrics(a.RankFunc[k])
		}
		w.Uvarint(uint64(len(a.Funcs)))
		for _, k := range slices.Sorted(maps.Keys(a.Funcs)) {
			w.Str(k)
			w.metrics(a.Funcs[k])
		}
	}
	if w.err != nil {
		return nil, fmt.Errorf("encode state snapshot: %w", w.err)
	}
	w.B = binary.LittleEndian.AppendUint32(w.B, crc32.Checksum(w.B[start:], snapCRC))
	return w.B, nil
}

// snapReader reads a snapshot: binio's values and the state's parts.
type snapReader struct {
	binio.Reader
	version uint64 // the snapshot's format version
}

// count reads a count of entries that take at least one byte each.
func (r *snapReader) count() int { return r.Count(1) }

// bin reads a value in its own binary form.
func (r *snapReader) bin(v interface{ DecodeBinary([]byte) (int, error) }) { r.Decode(v.DecodeBinary) }

func (r *snapReader) id() DetectorID { return DetectorID{PID: r.U32(), Rank: r.U32()} }

func (r *snapReader) totals(t *Totals) {
	for _, p := range []*uint64{&t.Anomalies, &t.Executions, &t.Events, &t.BadFrames, &t.Missing, &t.Frames, &t.Steps} {
		*p = r.Uvarint()
	}
	if r.version >= 3 {
		for _, p := range []*uint64{&t.SummarisedCalls, &t.DroppedCalls, &t.DroppedEvents} {
			*p = r.Uvarint()
		}
	}
}

func (r *snapReader) metrics() *AnomalyMetrics {
	m := &AnomalyMetrics{}
	for _, p := range []*uint64{&m.Count, &m.FirstStep, &m.LastStep, &m.MinTS, &m.MaxTS} {
		*p = r.Uvarint()
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
	r := &snapReader{Reader: binio.Reader{B: body, Off: len(snapMagic)}}
	version := r.Uvarint()
	r.version = version
	if r.Err == nil && (version < snapVersionMin || version > snapVersion) {
		return nil, fmt.Errorf("decode state snapshot: version %d; this pserver reads version %d and the earlier ones down to %d", version, snapVersion, snapVersionMin)
	}
	st := NewState(window)
	for range r.count() {
		m := &Model{Key: r.Str(), PID: r.U32()}
		if version == 1 {
			r.Decode(m.DecodeOptionalBinary)
		} else {
			r.bin(&m.Summary)
		}
		m.Merges = r.Uvarint()
		if r.Err == nil {
			st.Models[m.Key] = m
		}
	}
	for _, seqs := range []map[DetectorID]uint64{st.LastSeq, st.Incarnation} {
		for range r.count() {
			id := r.id()
			seqs[id] = r.Uvarint()
		}
	}
	for range r.count() {
		id := r.id()
		n := r.count()
		past := make([]PastIncarnation, 0, n)
		for range n {
			past = append(past, PastIncarnation{ID: r.Uvarint(), LastSeq: r.Uvarint()})
		}
		st.Past[id] = past
	}
	for range r.count() {
		k := r.Str()
		m := &stats.Moments{}
		r.bin(m)
		st.Counters[k] = m
	}
	if r.Bool() {
		rule := &stats.TailRule{}
		dec := json.NewDecoder(bytes.NewReader([]byte(r.Str())))
		dec.DisallowUnknownFields()
		if err := dec.Decode(rule); err != nil && r.Err == nil {
			r.Fail("tail rule: %v", err)
		}
		st.TailRule = rule
	}
	if n := r.count(); n > 0 {
		st.Seen = make(map[string]BinsSeen, n)
		for range n {
			k := r.Str()
			bins := BinsSeen{}
			for range r.count() {
				bin := r.Varint()
				s := &BinSeen{First: r.Uvarint()}
				nr := r.count()
				if nr > MaxSeenRanks {
					r.Fail("%d ranks seen in one bin, at most %d", nr, MaxSeenRanks)
				}
				for range nr {
					s.Ranks = append(s.Ranks, r.U32())
				}
				bins[int(bin)] = s
			}
			st.Seen[k] = bins
		}
	}
	for _, p := range []*uint64{&st.Applied, &st.Duplicates, &st.Merges, &st.WALSeq, &st.Incarnations} {
		*p = r.Uvarint()
	}
	if r.Bool() {
		a := NewAggregates(window)
		r.Uvarint() // the window it was saved with; the reader's wins
		a.MaxStep = r.Uvarint()
		a.HaveStep = r.Bool()
		r.totals(&a.Folded)
		a.Late = r.Uvarint()
		a.StartTS = r.Uvarint()
		for range r.count() {
			s := &StepAgg{}
			for _, p := range []*uint64{&s.Step, &s.Anomalies, &s.Executions, &s.Events, &s.BadFrames, &s.Missing, &s.Frames, &s.MinTS, &s.MaxTS} {
				*p = r.Uvarint()
			}
			if r.version >= 3 {
				for _, p := range []*uint64{&s.SummarisedCalls, &s.DroppedCalls, &s.DroppedEvents} {
					*p = r.Uvarint()
				}
			}
			n := r.count()
			s.Ranks = make(map[DetectorID]Cell, n)
			for range n {
				id := r.id()
				s.Ranks[id] = Cell{Anomalies: r.Uvarint(), Executions: r.Uvarint()}
			}
			a.Steps[s.Step] = s
		}
		for range r.count() {
			id := r.id()
			t := &RankTotals{}
			r.totals(&t.Totals)
			t.FirstStep = r.Uvarint()
			t.LastStep = r.Uvarint()
			r.bin(&t.PerStep)
			r.bin(&t.Scores)
			r.bin(&t.Severity)
			a.Ranks[id] = t
		}
		for range r.count() {
			k := RankFunc{DetectorID: r.id(), Func: r.Str()}
			a.RankFunc[k] = r.metrics()
		}
		for range r.count() {
			k := r.Str()
			a.Funcs[k] = r.metrics()
		}
		st.Agg = a
	}
	if r.Err == nil && r.Off != len(body) {
		r.Fail("%d bytes after the state", len(body)-r.Off)
	}
	if r.Err != nil {
		return nil, fmt.Errorf("decode state snapshot: %w", r.Err)
	}
	st.Agg.Window = window
	st.Agg.fill()
	return st, nil
}
