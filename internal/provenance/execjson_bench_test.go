package provenance_test

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	jsonexp "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	jsonv1 "github.com/go-json-experiment/json/v1"

	"github.com/kipimo-hpc/kipimo/internal/procstat"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/storetest"
)

// The benchmarks below compare the hand-written codec with
// github.com/go-json-experiment/json (and, in execjson_jsonv2_test.go,
// encoding/json/v2 when built with GOEXPERIMENT=jsonv2) on the same input:
// 500 anomaly records with a 5+5 event window, as the detectors write them.
// encoding/json is there for reference. Run them with
//
//	go test -run '^$' -bench 'ExecJSON' -count 6 ./internal/provenance/ | tee new.txt
//	benchstat new.txt
//
// Encoding is per record (an op is one record); decoding is per batch (an
// op is the 500-record array). records/s is the comparable figure, B/record
// the size of the JSON per record. On a shared machine records/cpu-s (per
// second of CPU time the process used, garbage collection included) is the
// steadier one; run with -cpu 1 for a one-core figure.

func benchExecs(b *testing.B) []provenance.Exec {
	return storetest.Generate(storetest.GenConfig{Seed: 42, N: 500, Ranks: 64, Steps: 400, Window: 5, Anomaly: true})
}

// libEncodeOpts makes go-json-experiment/json write the bytes json.Marshal
// writes (HTML and JS escapes, \ufffd for invalid UTF-8, nil slices as null).
var libEncodeOpts = jsonv1.DefaultOptionsV1()

// libDecodeOpts reads as encoding/json does (null leaves a field as it is,
// invalid UTF-8 becomes U+FFFD, unknown fields are skipped) but rejects
// duplicate names and matches names case-sensitively. A case-folded key is
// then an unknown field and skipped, where the hand-written decoder rejects
// it: the library does less than the codec here, so its figures are an
// upper bound of what it would do at the codec's strictness.
var libDecodeOpts = jsonexp.JoinOptions(
	jsonv1.DefaultOptionsV1(),
	jsonexp.MatchCaseInsensitiveNames(false),
	jsontext.AllowDuplicateNames(false),
)

// execEncoder encodes one record into buf; buf is reused.
type execEncoder struct {
	name string
	enc  func(buf []byte, e *provenance.Exec) ([]byte, error)
}

func execEncoders() []execEncoder {
	var out bytes.Buffer
	enc := jsontext.NewEncoder(&out, libEncodeOpts)
	return append([]execEncoder{
		{"hand-written", provenance.AppendExecJSON},
		{"go-json-experiment", func(buf []byte, e *provenance.Exec) ([]byte, error) {
			out.Reset()
			enc.Reset(&out, libEncodeOpts)
			if err := jsonexp.MarshalEncode(enc, e, libEncodeOpts); err != nil {
				return buf, err
			}
			// The encoder ends each value with a newline.
			return append(buf[:0], bytes.TrimSuffix(out.Bytes(), []byte{'\n'})...), nil
		}},
		{"encoding-json", func(buf []byte, e *provenance.Exec) ([]byte, error) { return json.Marshal(e) }},
	}, stdV2Encoders()...)
}

// execDecoder decodes a JSON array of records.
type execDecoder struct {
	name string
	dec  func(data []byte) ([]provenance.Exec, error)
}

func execDecoders() []execDecoder {
	return append([]execDecoder{
		{"hand-written", provenance.DecodeExecs},
		{"go-json-experiment", func(data []byte) (out []provenance.Exec, err error) {
			return out, jsonexp.Unmarshal(data, &out, libDecodeOpts)
		}},
		{"encoding-json", func(data []byte) (out []provenance.Exec, err error) {
			return out, json.Unmarshal(data, &out)
		}},
	}, stdV2Decoders()...)
}

// stdV2Encoders and stdV2Decoders give the encoding/json/v2 codecs when the
// test is built with GOEXPERIMENT=jsonv2 (execjson_jsonv2_test.go).
var (
	stdV2Encoders = func() []execEncoder { return nil }
	stdV2Decoders = func() []execDecoder { return nil }
)

// TestBenchCodecsAgree checks that every codec the benchmarks compare
// writes json.Marshal's bytes and reads them back to the same records, so
// that the benchmarks time the same work.
func TestBenchCodecsAgree(t *testing.T) {
	execs := generated(50)
	for _, c := range execEncoders() {
		for i := range execs {
			got, err := c.enc(nil, &execs[i])
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			want, _ := json.Marshal(&execs[i])
			if !bytes.Equal(got, want) {
				t.Fatalf("%s writes\n%s\njson.Marshal\n%s", c.name, got, want)
			}
		}
	}
	data, _ := json.Marshal(execs)
	want, err := provenance.DecodeExecs(data)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range execDecoders() {
		got, err := c.dec(data)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !equalExecs(got, want) {
			t.Fatalf("%s reads different records", c.name)
		}
		if _, err := c.dec([]byte(`[{"entry":1,"entry":2}]`)); err == nil && c.name != "encoding-json" {
			t.Errorf("%s accepts a duplicate key", c.name)
		}
	}
}

func equalExecs(a, b []provenance.Exec) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}

func BenchmarkExecJSONEncode(b *testing.B) {
	execs := benchExecs(b)
	for _, c := range execEncoders() {
		b.Run(c.name, func(b *testing.B) {
			var buf []byte
			size := 0
			b.ReportAllocs()
			cpu0 := procstat.CPUTime()
			for i := 0; b.Loop(); i++ {
				var err error
				if buf, err = c.enc(buf[:0], &execs[i%len(execs)]); err != nil {
					b.Fatal(err)
				}
				size += len(buf)
			}
			reportRecords(b, b.N, cpu0)
			b.ReportMetric(float64(size)/float64(b.N), "B/record")
		})
	}
}

func BenchmarkExecJSONDecode(b *testing.B) {
	execs := benchExecs(b)
	data, err := json.Marshal(execs)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range execDecoders() {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			cpu0 := procstat.CPUTime()
			for b.Loop() {
				if _, err := c.dec(data); err != nil {
					b.Fatal(err)
				}
			}
			reportRecords(b, len(execs)*b.N, cpu0)
			b.ReportMetric(float64(len(data))/float64(len(execs)), "B/record")
		})
	}
}

// reportRecords reports n records in records per wall-clock second and per
// second of CPU time used since cpu0.
func reportRecords(b *testing.B, n int, cpu0 time.Duration) {
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "records/s")
	if cpu := procstat.CPUTime() - cpu0; cpu0 > 0 && cpu > 0 {
		b.ReportMetric(float64(n)/cpu.Seconds(), "records/cpu-s")
	}
}
