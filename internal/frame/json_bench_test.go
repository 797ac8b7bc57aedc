package frame

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	jsonexp "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/kipimo-hpc/kipimo/internal/procstat"
)

// The benchmarks below compare the hand-written JSON codec (AppendJSON,
// DecodeJSON) with github.com/go-json-experiment/json (and, in
// json_jsonv2_test.go, encoding/json/v2 when built with GOEXPERIMENT=jsonv2)
// on the same frame: benchFrame, 100,000 events on 4 threads. encoding/json
// is there for reference. An op is the whole frame; events/s is the
// comparable figure, B/event the size of the JSON per event; on a shared
// machine events/cpu-s (per second of CPU time the process used) is the
// steadier one, with -cpu 1. Run them with
//
//	go test -run '^$' -bench 'FrameJSON' -count 6 ./internal/frame/ | tee new.txt
//	benchstat new.txt

// libFrameEncodeOpts makes the library write AppendJSON's bytes for the
// frames it writes: no HTML escapes, U+2028 and U+2029 escaped. (It writes
// \b and \f where AppendJSON writes \u0008 and \u000c.)
var libFrameEncodeOpts = jsontext.EscapeForJS(true)

// libFrameDecodeOpts is the library's nearest to DecodeJSON's strictness:
// unknown fields, and so case-folded keys, are errors, as are duplicate
// names and invalid UTF-8 (the library's defaults). It still accepts null
// and missing required fields, which DecodeJSON rejects: the library does
// less than the codec here, so its figures are an upper bound of what it
// would do at the codec's strictness.
var libFrameDecodeOpts = jsonexp.RejectUnknownMembers(true)

type frameEncoder struct {
	name string
	enc  func(buf []byte, f *Frame) ([]byte, error)
}

type frameDecoder struct {
	name string
	dec  func(b []byte, f *Frame) error
}

// stdV2FrameEncoders and stdV2FrameDecoders give the encoding/json/v2 codecs
// when the test is built with GOEXPERIMENT=jsonv2.
var (
	stdV2FrameEncoders = func() []frameEncoder { return nil }
	stdV2FrameDecoders = func() []frameDecoder { return nil }
)

func frameEncoders() []frameEncoder {
	var out bytes.Buffer
	enc := jsontext.NewEncoder(&out, libFrameEncodeOpts)
	return append([]frameEncoder{
		{"hand-written", AppendJSON},
		{"go-json-experiment", func(buf []byte, f *Frame) ([]byte, error) {
			// AppendJSON refuses invalid frames; so does this.
			if err := f.Validate(); err != nil {
				return buf, err
			}
			out.Reset()
			enc.Reset(&out, libFrameEncodeOpts)
			if err := jsonexp.MarshalEncode(enc, f, libFrameEncodeOpts); err != nil {
				return buf, err
			}
			return append(buf[:0], bytes.TrimSuffix(out.Bytes(), []byte{'\n'})...), nil
		}},
		{"encoding-json", func(buf []byte, f *Frame) ([]byte, error) {
			if err := f.Validate(); err != nil {
				return buf, err
			}
			return json.Marshal(f)
		}},
	}, stdV2FrameEncoders()...)
}

func frameDecoders() []frameDecoder {
	return append([]frameDecoder{
		{"hand-written", DecodeJSON},
		{"go-json-experiment", func(b []byte, f *Frame) error {
			f.Reset()
			if err := jsonexp.Unmarshal(b, f, libFrameDecodeOpts); err != nil {
				return err
			}
			return f.Validate() // event and comm kinds
		}},
		{"encoding-json", func(b []byte, f *Frame) error {
			f.Reset()
			d := json.NewDecoder(bytes.NewReader(b))
			d.DisallowUnknownFields()
			if err := d.Decode(f); err != nil {
				return err
			}
			return f.Validate()
		}},
	}, stdV2FrameDecoders()...)
}

// TestFrameBenchCodecsAgree checks that the codecs the benchmarks compare
// write the same bytes and read them back to the same frame, so that the
// benchmarks time the same work.
func TestFrameBenchCodecsAgree(t *testing.T) {
	f := genFrame(genConfig{Seed: 42, Threads: 4, Funcs: 50, MaxDepth: 6, Events: 5_000})
	want, err := AppendJSON(nil, f)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range frameEncoders() {
		got, err := c.enc(nil, f)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s writes different bytes from AppendJSON", c.name)
		}
	}
	for _, c := range frameDecoders() {
		var g Frame
		for range 2 { // the second time into a used frame
			if err := c.dec(want, &g); err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			if !equalFrames(&g, f) {
				t.Fatalf("%s reads a different frame", c.name)
			}
		}
		for _, bad := range []string{`{"pid":1,"pid":2}`, `{"PID":1}`, `{"pid":1,"Rank":2}`} {
			if err := c.dec([]byte(bad), &g); err == nil && c.name != "encoding-json" {
				t.Errorf("%s accepts %s", c.name, bad)
			}
		}
	}
}

func BenchmarkFrameJSONEncode(b *testing.B) {
	f := benchFrame()
	for _, c := range frameEncoders() {
		b.Run(c.name, func(b *testing.B) {
			buf, err := c.enc(nil, f)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(buf)))
			b.ReportAllocs()
			cpu0 := procstat.CPUTime()
			for b.Loop() {
				if buf, err = c.enc(buf[:0], f); err != nil {
					b.Fatal(err)
				}
			}
			reportFrameEvents(b, f, len(buf), cpu0)
		})
	}
}

func BenchmarkFrameJSONDecode(b *testing.B) {
	f := benchFrame()
	buf, err := AppendJSON(nil, f)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range frameDecoders() {
		b.Run(c.name, func(b *testing.B) {
			var g Frame
			if err := c.dec(buf, &g); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(buf)))
			b.ReportAllocs()
			cpu0 := procstat.CPUTime()
			for b.Loop() {
				if err := c.dec(buf, &g); err != nil {
					b.Fatal(err)
				}
			}
			reportFrameEvents(b, f, len(buf), cpu0)
		})
	}
}

func reportFrameEvents(b *testing.B, f *Frame, size int, cpu0 time.Duration) {
	n := float64(f.NumEvents())
	b.ReportMetric(n*float64(b.N)/b.Elapsed().Seconds(), "events/s")
	if cpu := procstat.CPUTime() - cpu0; cpu0 > 0 && cpu > 0 {
		b.ReportMetric(n*float64(b.N)/cpu.Seconds(), "events/cpu-s")
	}
	b.ReportMetric(float64(size)/n, "B/event")
}
