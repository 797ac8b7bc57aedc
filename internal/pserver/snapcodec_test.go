package pserver

import (
	"bytes"
	"encoding/binary"
	"encoding/gob"
	"hash/crc32"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/stats"
)

// fullState is a state with every saved field set: a generated run's
// requests, plus what they leave empty.
func fullState(t testing.TB) *State {
	st := reference(t, newGenRun(5, 12, 7, 3, 5).all(), 8)
	st.WALSeq, st.Duplicates, st.Incarnations = 1234, 3, 2
	st.Past[DetectorID{PID: 0, Rank: 2}] = []PastIncarnation{{ID: 7, LastSeq: 9}, {ID: 8, LastSeq: 1}}
	st.TailRule = &stats.TailRule{Ratio: 1.5, Recur: 4, RecurFrac: 0.005, Resolution: 1, Alpha: 1e-4}
	if len(st.Seen) == 0 {
		st.Seen = map[string]BinsSeen{"f0": {-3: {First: 2, Ranks: []uint32{0, 4}}, 17: {First: 0, Ranks: []uint32{1}}}}
	}
	if len(st.Counters) == 0 {
		m := stats.Moments{}
		m.Push(3)
		st.Counters["cycles"] = &m
	}
	st.Agg.Late, st.Agg.StartTS = 4, 1_000_000
	return st
}

// TestSnapshotBinaryRoundTrip decodes a snapshot and encodes it again: the
// same bytes, and the same saved fields.
func TestSnapshotBinaryRoundTrip(t *testing.T) {
	st := fullState(t)
	// the event library's counts (not in the fixtures of earlier versions)
	st.Agg.Folded.SummarisedCalls, st.Agg.Folded.DroppedCalls, st.Agg.Folded.DroppedEvents = 11, 12, 13
	for _, s := range st.Agg.Steps {
		s.SummarisedCalls, s.DroppedCalls, s.DroppedEvents = s.Step+1, s.Step+2, s.Step+3
	}
	for id, r := range st.Agg.Ranks {
		r.SummarisedCalls, r.DroppedCalls, r.DroppedEvents = uint64(id.Rank)+5, uint64(id.Rank)+6, uint64(id.Rank)+7
	}
	data, _, err := encodeState(st)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeState(data, 8)
	if err != nil {
		t.Fatal(err)
	}
	again, _, err := encodeState(got)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(data, again) {
		t.Fatalf("re-encoded snapshot differs (%d vs %d bytes)", len(data), len(again))
	}
	compareModels(t, "decoded", st, got)
	compareAggregates(t, "decoded", st, got)
	for _, c := range []struct {
		name      string
		want, got any
	}{
		{"LastSeq", st.LastSeq, got.LastSeq},
		{"Incarnation", st.Incarnation, got.Incarnation},
		{"Past", st.Past, got.Past},
		{"TailRule", st.TailRule, got.TailRule},
		{"Seen", st.Seen, got.Seen},
		{"counts", []uint64{st.Applied, st.Duplicates, st.Merges, st.WALSeq, st.Incarnations}, []uint64{got.Applied, got.Duplicates, got.Merges, got.WALSeq, got.Incarnations}},
		{"Agg.Ranks", st.Agg.Ranks, got.Agg.Ranks},
		{"Agg.RankFunc", st.Agg.RankFunc, got.Agg.RankFunc},
		{"Agg.Funcs", st.Agg.Funcs, got.Agg.Funcs},
		{"Agg.Folded", st.Agg.Folded, got.Agg.Folded},
		{"Agg start and late", []uint64{st.Agg.StartTS, st.Agg.Late, st.Agg.MaxStep}, []uint64{got.Agg.StartTS, got.Agg.Late, got.Agg.MaxStep}},
	} {
		if !reflect.DeepEqual(c.want, c.got) {
			t.Errorf("%s: decoded %+v, want %+v", c.name, c.got, c.want)
		}
	}
	for k, s := range st.Agg.Steps {
		g := got.Agg.Steps[k]
		if g == nil || !reflect.DeepEqual(g.Ranks, s.Ranks) || g.Anomalies != s.Anomalies || g.Frames != s.Frames || g.MinTS != s.MinTS || g.MaxTS != s.MaxTS ||
			g.SummarisedCalls != s.SummarisedCalls || g.DroppedCalls != s.DroppedCalls || g.DroppedEvents != s.DroppedEvents {
			t.Errorf("step %d: decoded %+v, want %+v", k, g, s)
		}
	}
	// Two encodings of one state are the same bytes (maps in key order).
	if d2, _, _ := encodeState(st); !bytes.Equal(d2, data) {
		t.Error("two encodings of one state differ")
	}
}

// TestSnapshotReadsGobV1 reads a snapshot in the gob form pservers wrote
// before the binary form: a pserver upgraded in the middle of a run
// resumes from it.
func TestSnapshotReadsGobV1(t *testing.T) {
	st := fullState(t)
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(st); err != nil {
		t.Fatal(err)
	}
	got, err := decodeState(buf.Bytes(), 8)
	if err != nil {
		t.Fatal(err)
	}
	compareModels(t, "from gob", st, got)
	compareAggregates(t, "from gob", st, got)
	if !reflect.DeepEqual(got.Past, st.Past) || got.WALSeq != st.WALSeq {
		t.Errorf("from gob: past %v WAL %d, want %v %d", got.Past, got.WALSeq, st.Past, st.WALSeq)
	}
}

func TestSnapshotRefusesDamage(t *testing.T) {
	data, _, err := encodeState(fullState(t))
	if err != nil {
		t.Fatal(err)
	}
	flip := slices.Clone(data)
	flip[len(flip)/2] ^= 0x10
	newer := slices.Clone(data[:len(data)-4])
	newer[len(snapMagic)] = snapVersion + 1
	newer = appendCRC(newer)
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"a flipped bit", flip, "CRC"},
		{"cut short", data[:len(data)-9], "CRC"},
		{"a newer version", newer, "version 3"},
		{"only the header", appendCRC([]byte(snapMagic + "\x01")), "bad or truncated integer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodeState(tc.data, 8)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

func appendCRC(b []byte) []byte {
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b[len(snapMagic):], snapCRC))
}

// TestSnapshotCoversEveryField lists the exported fields of every saved
// type: a field added to one fails here until snapcodec.go writes it (or it
// is listed as derived, with why).
func TestSnapshotCoversEveryField(t *testing.T) {
	for _, tc := range []struct {
		v      any
		fields string
	}{
		{State{}, "Models LastSeq Incarnation Past Counters Agg TailRule Seen Applied Duplicates Merges WALSeq Incarnations"},
		{Model{}, "Key PID Summary Merges"}, // Summary in its own binary form
		{PastIncarnation{}, "ID LastSeq"},
		{BinSeen{}, "First Ranks"},
		{Aggregates{}, "Window Steps MaxStep HaveStep Folded Late StartTS Ranks RankFunc Funcs"},
		{StepAgg{}, "Step Anomalies Executions Events BadFrames Missing Frames SummarisedCalls DroppedCalls DroppedEvents MinTS MaxTS Ranks"},
		{Cell{}, "Anomalies Executions"},
		{Totals{}, "Anomalies Executions Events BadFrames Missing Frames Steps SummarisedCalls DroppedCalls DroppedEvents"},
		{RankTotals{}, "Totals FirstStep LastStep PerStep Scores Severity"},
		{AnomalyMetrics{}, "Count FirstStep LastStep MinTS MaxTS PerStep Score Severity"},
		{RankFunc{}, "DetectorID Func"},
		{DetectorID{}, "PID Rank"},
	} {
		typ := reflect.TypeOf(tc.v)
		var got []string
		for i := range typ.NumField() {
			if f := typ.Field(i); f.IsExported() {
				got = append(got, f.Name)
			}
		}
		if strings.Join(got, " ") != tc.fields {
			t.Errorf("%s has exported fields %q; snapcodec.go writes %q: write the new ones (and update this list)", typ, strings.Join(got, " "), tc.fields)
		}
	}
}

// fixtureState is the state the snapshots under testdata hold: fullState
// with a natural-range histogram in one model.
func fixtureState(t *testing.T) *State {
	st := fullState(t)
	m := st.Models[funcName(1)]
	for _, x := range []float64{3, 3.5, 40, 41, 900} {
		m.Tail.Add(x)
	}
	return st
}

// TestSnapshotReadsEarlierForms reads snapshots written by the pserver
// before its models held a stats.Summary (testdata/snapshot-kpss-v1.bin,
// testdata/snapshot-gob-v1.bin) and before its totals held the event
// library's counts (testdata/snapshot-kpss-v2.bin): fixtureState in each
// form, models with and
// without a histogram and a tail among them: each holds the same state as
// today's form, which is what a pserver upgraded mid-run writes next.
func TestSnapshotReadsEarlierForms(t *testing.T) {
	want := fixtureState(t)
	wantData, _, err := encodeState(want)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ file, format string }{
		{"testdata/snapshot-kpss-v1.bin", kpssV1SnapshotFormat},
		{"testdata/snapshot-kpss-v2.bin", kpssV2SnapshotFormat},
		{"testdata/snapshot-gob-v1.bin", gobSnapshotFormat},
	} {
		t.Run(tc.format, func(t *testing.T) {
			data, err := os.ReadFile(tc.file)
			if err != nil {
				t.Fatal(err)
			}
			for format, version := range map[string]uint64{kpssV1SnapshotFormat: 1, kpssV2SnapshotFormat: 2} {
				if v, _ := binary.Uvarint(data[len(snapMagic):]); tc.format == format && v != version {
					t.Fatalf("the sample is version %d, want %d", v, version)
				}
			}
			got, err := decodeState(data, 8)
			if err != nil {
				t.Fatal(err)
			}
			compareModels(t, tc.format, want, got)
			compareAggregates(t, tc.format, want, got)
			for k, w := range want.Models {
				if g := got.Models[k]; g != nil && !reflect.DeepEqual(g.Summary, w.Summary) {
					t.Errorf("model %q: %+v, want %+v", k, g.Summary, w.Summary)
				}
			}
			if tc.format == gobSnapshotFormat {
				return
			}
			again, _, err := encodeState(got)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(again, wantData) {
				t.Errorf("today's form of the %s snapshot differs from that of the state it was taken of (%d vs %d bytes)", tc.format, len(again), len(wantData))
			}
		})
	}
}
