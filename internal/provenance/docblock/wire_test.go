package docblock

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// encode encodes execs as one message with no size limit.
func encode(t testing.TB, execs []provenance.Exec) []byte {
	t.Helper()
	var e Encoder
	for i := range execs {
		if ok, err := e.Add(&execs[i], 0); err != nil || !ok {
			t.Fatalf("add record %d: %v, %v", i, ok, err)
		}
	}
	return e.Finish(nil)
}

// jsonPath is what provdb reads from execs sent as a JSON batch: the
// records and their stored documents.
func jsonPath(t *testing.T, execs []provenance.Exec) ([]provenance.Exec, [][]byte) {
	t.Helper()
	data, err := json.Marshal(execs)
	if err != nil {
		t.Fatal(err)
	}
	b, err := provenance.DecodeBatch(provenance.KindAnomalies, data)
	if err != nil {
		t.Fatal(err)
	}
	var docs [][]byte
	for i := range b.Execs {
		d, err := provenance.AppendExecJSON(nil, &b.Execs[i])
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, d)
	}
	return b.Execs, docs
}

// TestMessageRoundTrip encodes records, decodes the message and checks its
// rows, its blocks and their documents against what the JSON path reads
// and stores for the same records.
func TestMessageRoundTrip(t *testing.T) {
	gen := testExecs(300)
	odd := gen[0]
	odd.CallStack, odd.CounterEvents, odd.EventWindow = nil, nil, provenance.EventWindow{}
	odd.Exit = 0
	odd.OutlierScore = math.Copysign(0, -1)
	bad := gen[1]
	bad.Func = "solver\xffiterate\xc3"
	bad.EventWindow.ExecWindow = append([]provenance.WindowExec(nil), bad.EventWindow.ExecWindow...)
	bad.EventWindow.ExecWindow[0].Func = "\xfe"
	gpu := gen[2]
	gpu.IsGPUEvent = true
	gpu.GPULocation = &provenance.GPULocation{Device: 3}
	gpu.GPUParent = &provenance.GPUParent{EventID: "1:2:3"}
	for _, tc := range []struct {
		name   string
		execs  []provenance.Exec
		blocks []int
	}{
		{"one record", gen[:1], []int{1}},
		{"one full block", gen[:64], []int{64}},
		{"a block and one", gen[:65], []int{64, 1}},
		{"250 records", gen[:250], []int{64, 64, 64, 58}},
		{"nil arrays, no exit, negative zero", []provenance.Exec{odd}, []int{1}},
		{"strings not UTF-8", []provenance.Exec{bad, gen[3]}, []int{2}},
		{"GPU parent without a call stack", []provenance.Exec{gpu}, []int{1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := make([]provenance.Exec, len(tc.execs))
			copy(before, tc.execs)
			data := encode(t, tc.execs)
			if !reflect.DeepEqual(before, tc.execs) {
				t.Fatal("encoding changed the records")
			}
			if again := encode(t, tc.execs); !bytes.Equal(again, data) {
				t.Fatal("the same records encoded twice differ")
			}
			m, err := DecodeMessage(data)
			if err != nil {
				t.Fatal(err)
			}
			want, wantDocs := jsonPath(t, tc.execs)
			if len(m.Rows) != len(want) {
				t.Fatalf("%d rows, want %d", len(m.Rows), len(want))
			}
			for i := range want {
				if f := RowDiff(m.Rows[i], RowOf(&want[i])); f != "" {
					t.Fatalf("row %d: %+v, want %+v", i, m.Rows[i], RowOf(&want[i]))
				}
			}
			var counts []int
			var docs [][]byte
			for _, b := range m.Blocks {
				counts = append(counts, b.N)
				d, err := Decode(b.Data)
				if err != nil {
					t.Fatal(err)
				}
				docs = append(docs, d...)
			}
			if !reflect.DeepEqual(counts, tc.blocks) {
				t.Errorf("blocks of %v documents, want %v", counts, tc.blocks)
			}
			if m.Checked() {
				t.Fatal("checked before Check")
			}
			if err := m.Check(); err != nil || !m.Checked() {
				t.Fatalf("Check: %v", err)
			}
			for i := range wantDocs {
				if !bytes.Equal(docs[i], wantDocs[i]) {
					t.Fatalf("document %d differs from the JSON path's:\n%s\n%s", i, docs[i], wantDocs[i])
				}
			}
			got, err := m.Execs()
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatal("decoded records differ from the JSON path's")
			}
		})
	}
}

// TestEncoderLimit adds records to messages of bounded size: each message
// stays within the limit, holds what was added to it, and a record that
// cannot fit an empty message is refused.
func TestEncoderLimit(t *testing.T) {
	execs := testExecs(400)
	for _, tc := range []struct {
		name  string
		limit int
	}{
		{"a few records a message", 4000},
		{"tens of records a message", 40000},
		{"the default batch size", 1 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var e Encoder
			var msgs [][]byte
			added := 0
			for i := range execs {
				ok, err := e.Add(&execs[i], tc.limit)
				if err != nil {
					t.Fatal(err)
				}
				if !ok {
					msgs = append(msgs, e.Finish(nil))
					added += e.Len()
					e.Reset()
					if ok, err = e.Add(&execs[i], tc.limit); err != nil || !ok {
						t.Fatalf("record %d in an empty message: %v, %v", i, ok, err)
					}
				}
			}
			msgs = append(msgs, e.Finish(nil))
			added += e.Len()
			if added != len(execs) {
				t.Fatalf("%d records in the messages, want %d", added, len(execs))
			}
			n := 0
			for i, msg := range msgs {
				if len(msg) > tc.limit {
					t.Errorf("message %d: %d bytes, more than %d", i, len(msg), tc.limit)
				}
				m, err := DecodeMessage(msg)
				if err != nil {
					t.Fatal(err)
				}
				for j, r := range m.Rows {
					if RowDiff(r, RowOf(&execs[n+j])) != "" {
						t.Fatalf("message %d, row %d is not record %d", i, j, n+j)
					}
				}
				n += len(m.Rows)
			}
			if tc.limit == 1<<20 && len(msgs) != 1 {
				t.Errorf("%d messages for %d records under 1 MiB", len(msgs), len(execs))
			}
		})
	}
	var e Encoder
	if _, err := e.Add(&execs[0], 1000); err == nil || !strings.Contains(err.Error(), "exceed the batch limit") {
		t.Errorf("a record larger than the limit: %v", err)
	}
}

func TestEncoderRefusesBadRecords(t *testing.T) {
	good := testExecs(1)[0]
	for _, tc := range []struct {
		name string
		edit func(e *provenance.Exec)
		err  string
	}{
		{"bad event id", func(e *provenance.Exec) { e.EventID = "7" }, "event_id"},
		{"exit before entry", func(e *provenance.Exec) { e.Exit = e.Entry - 1 }, "before entry"},
		{"NaN score", func(e *provenance.Exec) { e.OutlierScore = math.NaN() }, "NaN"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := good
			tc.edit(&e)
			var enc Encoder
			if _, err := enc.Add(&e, 0); err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("error %v, want one containing %q", err, tc.err)
			}
			if enc.Len() != 0 {
				t.Fatal("a refused record was kept")
			}
		})
	}
}

// message builds a message by hand: rows encoded by row, the function
// names, then blocks.
type message struct {
	n      int
	funcs  []string
	rows   []byte
	blocks [][2]any // count uint64, data []byte
	tail   []byte
}

func (m message) bytes() []byte {
	b := append([]byte(nil), magic[:]...)
	b = binary.AppendUvarint(b, uint64(m.n))
	b = binary.AppendUvarint(b, uint64(len(m.funcs)))
	for _, f := range m.funcs {
		b = appendString(b, f)
	}
	b = append(b, m.rows...)
	b = binary.AppendUvarint(b, uint64(len(m.blocks)))
	for _, bl := range m.blocks {
		b = binary.AppendUvarint(b, bl[0].(uint64))
		b = appendString(b, string(bl[1].([]byte)))
	}
	return append(b, m.tail...)
}

// row encodes a row as the encoder does, with the given function index.
func row(e provenance.Exec, fn int) []byte { return appendRow(nil, &e, e.Func, fn) }

func block(docs ...string) []byte {
	var b Builder
	for _, d := range docs {
		b.Add([]byte(d))
	}
	return b.AppendCompressed(nil)
}

// TestDecodeMessageRejects checks that malformed messages are refused by
// DecodeMessage, Check or Execs, each with an error naming the fault.
func TestDecodeMessageRejects(t *testing.T) {
	e := testExecs(2)
	doc0, err := provenance.AppendExecJSON(nil, &e[0])
	if err != nil {
		t.Fatal(err)
	}
	doc1, err := provenance.AppendExecJSON(nil, &e[1])
	if err != nil {
		t.Fatal(err)
	}
	one := func(edit func(*provenance.Exec)) []byte {
		x := e[0]
		edit(&x)
		return row(x, 0)
	}
	good := message{n: 1, funcs: []string{e[0].Func}, rows: row(e[0], 0), blocks: [][2]any{{uint64(1), block(string(doc0))}}}
	with := func(f func(m *message)) []byte {
		m := good
		m.blocks = append([][2]any(nil), good.blocks...)
		f(&m)
		return m.bytes()
	}
	valid := good.bytes()
	if _, err := DecodeMessage(valid); err != nil {
		t.Fatalf("the hand-built message: %v", err)
	}
	other := e[0]
	other.Func = e[1].Func
	for _, tc := range []struct {
		name  string
		data  []byte
		stage string // "decode", "check" or "execs": where it must fail
		err   string
	}{
		{"empty", nil, "decode", "magic"},
		{"JSON", []byte(`[{"event_id":"1:2:3"}]`), "decode", "magic"},
		{"unknown version", append([]byte("KPEB\x02"), valid[5:]...), "decode", "unknown version 2"},
		{"truncated", valid[:len(valid)-5], "decode", "past the message"},
		{"truncated in the rows", valid[:30], "decode", "cannot fit"},
		{"no records", with(func(m *message) { m.n, m.rows, m.blocks = 0, nil, nil }), "decode", "no records"},
		{"records beyond the message", with(func(m *message) { m.n = 1000 }), "decode", "cannot fit"},
		{"function index beyond the names", with(func(m *message) { m.rows = row(e[0], 1) }), "decode", "index 1 beyond"},
		{"function name not UTF-8", with(func(m *message) { m.funcs = []string{"\xff"} }), "decode", "not UTF-8"},
		{"pid beyond 32 bits", with(func(m *message) {
			m.rows = append(binary.AppendUvarint(nil, 1<<32), row(e[0], 0)[1:]...)
		}), "decode", "32 bits"},
		{"bad event id", with(func(m *message) { m.rows = one(func(x *provenance.Exec) { x.EventID = "x" }) }), "decode", "event_id"},
		{"exit before entry", with(func(m *message) { m.rows = one(func(x *provenance.Exec) { x.Exit = x.Entry - 5 }) }), "decode", "before entry"},
		{"infinite score", with(func(m *message) { m.rows = one(func(x *provenance.Exec) { x.OutlierScore = math.Inf(1) }) }), "decode", "finite"},
		{"GPU flag neither 0 nor 1", with(func(m *message) { r := row(e[0], 0); r[len(r)-1] = 2; m.rows = r }), "decode", "neither 0 nor 1"},
		{"no blocks", with(func(m *message) { m.blocks = nil }), "decode", "0 documents for 1 records"},
		{"block of no documents", with(func(m *message) { m.blocks[0][0] = uint64(0) }), "decode", "0 documents in a block"},
		{"block of more documents than records", with(func(m *message) { m.blocks = [][2]any{{uint64(2), block(string(doc0))}} }), "decode", "2 documents in a block"},
		{"block of more than MaxDocs", with(func(m *message) {
			m.n = 65
			m.rows = bytes.Repeat(row(e[0], 0), 65)
			m.blocks = [][2]any{{uint64(65), block(string(doc0))}}
		}), "decode", "65 documents in a block"},
		{"empty block", with(func(m *message) { m.blocks, m.tail = [][2]any{{uint64(1), []byte{}}}, []byte{0, 0} }), "decode", "empty block"},
		{"bytes after the blocks", with(func(m *message) { m.tail = []byte{0} }), "decode", "1 bytes after the last block"},
		{"block not zstd", with(func(m *message) { m.blocks = [][2]any{{uint64(1), []byte("not zstd")}} }), "check", "block 0: document block"},
		{"block holding fewer documents", with(func(m *message) { m.blocks = [][2]any{{uint64(1), block()}} }), "check", "0 documents, want 1"},
		{"block holding more documents", with(func(m *message) { m.blocks = [][2]any{{uint64(1), block(string(doc0), string(doc1))}} }), "check", "2 documents, want 1"},
		{"document not an object", with(func(m *message) { m.blocks = [][2]any{{uint64(1), block(`["x"]`)}} }), "check", "not a JSON object"},
		{"block lengths not framing", with(func(m *message) {
			m.blocks = [][2]any{{uint64(1), Compress([]byte("\x01\x02{}x"), nil)}}
		}), "check", "bytes after the last document"},
		{"document not JSON", with(func(m *message) { m.blocks = [][2]any{{uint64(1), block(`{"entry":}`)}} }), "check", "invalid JSON"},
		{"document braced but not JSON", with(func(m *message) { m.blocks = [][2]any{{uint64(1), block(`{not json at all}`)}} }), "check", "not an execution document"},
		{"document of another record", with(func(m *message) { m.blocks = [][2]any{{uint64(1), block(string(doc1))}} }), "check", "disagrees with its indexed columns: event_id"},
		{"document with another function", with(func(m *message) {
			d, _ := provenance.AppendExecJSON(nil, &other)
			m.blocks = [][2]any{{uint64(1), block(string(d))}}
		}), "check", "disagrees with its indexed columns: func"},
		{"document with a bad event id", with(func(m *message) {
			x := e[0]
			x.EventID = "not an id"
			d, _ := provenance.AppendExecJSON(nil, &x)
			m.blocks = [][2]any{{uint64(1), block(string(d))}}
		}), "check", "not an execution document"},
		{"document over MaxDocLen", with(func(m *message) {
			x := e[0]
			x.Hostname = strings.Repeat("h", MaxDocLen)
			d, _ := provenance.AppendExecJSON(nil, &x)
			m.blocks = [][2]any{{uint64(1), block(string(d))}}
		}), "check", "over the size bound"},
		{"block decompressing past MaxWireLen", with(func(m *message) {
			raw := binary.AppendUvarint([]byte{1}, MaxWireLen)
			raw = append(raw, '{')
			raw = append(raw, bytes.Repeat([]byte{' '}, MaxWireLen-2)...)
			raw = append(raw, '}')
			m.blocks = [][2]any{{uint64(1), Compress(raw, nil)}}
		}), "check", "over the size bound"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := DecodeMessage(tc.data)
			if tc.stage == "decode" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("DecodeMessage: error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("DecodeMessage: %v", err)
			}
			err = m.Check()
			if tc.stage == "check" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || m.Checked() {
					t.Fatalf("Check: error %v (checked %v), want one containing %q", err, m.Checked(), tc.err)
				}
			} else if err != nil {
				t.Fatalf("Check: %v", err)
			}
			if _, err := m.Execs(); err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("Execs: error %v, want one containing %q", err, tc.err)
			}
		})
	}
}

// FuzzDecodeMessage checks that no input crashes the decoder, that Check
// and Execs accept the same messages, and that a message whose records
// decode encodes back to a message of the same records.
func FuzzDecodeMessage(f *testing.F) {
	execs := testExecs(3)
	f.Add(encode(f, execs))
	f.Add(encode(f, execs[:1]))
	f.Add([]byte("KPEB\x01"))
	bad := message{n: 1, funcs: []string{execs[0].Func}, rows: row(execs[0], 0), blocks: [][2]any{{uint64(1), block(`{not json}`)}}}
	f.Add(bad.bytes())
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := DecodeMessage(data)
		if err != nil {
			return
		}
		checkErr := m.Check()
		execs, err := m.Execs()
		if (err == nil) != (checkErr == nil) {
			t.Fatalf("Check says %v, Execs %v", checkErr, err)
		}
		if err != nil {
			if !errors.Is(err, ErrDocument) && !errors.Is(err, ErrColumns) && !errors.Is(err, ErrTooLarge) && !strings.Contains(err.Error(), "document block") {
				t.Fatalf("refused for no named reason: %v", err)
			}
			return
		}
		for i := range execs {
			if f := RowDiff(RowOf(&execs[i]), m.Rows[i]); f != "" {
				t.Fatalf("record %d accepted with its %s differing from its row", i, f)
			}
		}
		again, err := DecodeMessage(encode(t, execs))
		if err != nil {
			t.Fatalf("re-encoded message: %v", err)
		}
		back, err := again.Execs()
		if err != nil {
			t.Fatalf("re-encoded message: %v", err)
		}
		if !reflect.DeepEqual(back, execs) {
			t.Fatal("records changed on the way back")
		}
	})
}

// TestCheckBoundsDecompressedBytes checks the size bounds: the encoder
// refuses a document over MaxDocLen, and Check refuses a message whose
// blocks, each within MaxWireLen and of documents within MaxDocLen,
// decompress past MaxMessageRawLen together.
func TestCheckBoundsDecompressedBytes(t *testing.T) {
	base := testExecs(1)[0]
	huge := base
	huge.Hostname = strings.Repeat("h", MaxDocLen)
	var enc Encoder
	if _, err := enc.Add(&huge, 0); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a document over MaxDocLen: error %v, want ErrTooLarge", err)
	}
	big := base
	big.Hostname = strings.Repeat("h", 3<<20)
	n := MaxMessageRawLen/(3<<20) + 1
	enc.Reset()
	for i := range n {
		x := big
		x.EventID = fmt.Sprintf("0:1:%d", i)
		if ok, err := enc.Add(&x, 0); err != nil || !ok {
			t.Fatalf("add record %d: %v, %v", i, ok, err)
		}
	}
	m, err := DecodeMessage(enc.Finish(nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Check(); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "the blocks decompress past") {
		t.Fatalf("%d documents of 3 MiB: error %v, want the message bound", n, err)
	}
	if m.Checked() {
		t.Fatal("a refused message is marked checked")
	}
	if _, err := m.Execs(); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Execs: error %v, want ErrTooLarge", err)
	}
	// Within the bound, the same documents pass.
	m, err = DecodeMessage(encode(t, []provenance.Exec{big}))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Check(); err != nil {
		t.Fatalf("one document of 3 MiB: %v", err)
	}
}
