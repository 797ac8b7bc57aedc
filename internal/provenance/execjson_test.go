package provenance_test

import (
	"bytes"
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/storetest"
)

func generated(n int) []provenance.Exec {
	return storetest.Generate(storetest.GenConfig{Seed: 3, N: n, Ranks: 16, Steps: 40, Window: 5, Anomaly: true})
}

// TestAppendExecJSONIsMarshal checks the codec's encoder writes exactly the
// bytes of json.Marshal, for generated records and for the values where
// encoding/json has special rules (HTML escaping, invalid UTF-8, line
// separators, exponent forms, omitted empty fields, nil slices).
func TestAppendExecJSONIsMarshal(t *testing.T) {
	cases := map[string]provenance.Exec{"zero": {}}
	for i, e := range generated(40) {
		cases["generated-"+string(rune('a'+i%26))+string(rune('a'+i/26))] = e
	}
	e := generated(1)[0]
	e.Func = "Kokkos::parallel_for<Functor> [a&b] \"q\" \\ \t\n\r\b\f\x01\x1f \u2028\u2029 é 日本 \xff\xfe"
	e.Hostname = "</script>"
	e.EventWindow.CommWindow = nil
	e.CounterEvents = nil
	e.OutlierScore = 1e-7
	e.OutlierSeverity = 1e21
	e.FuncStats = provenance.FuncStats{Accumulate: math.Copysign(0, -1), Count: 5e-324, Kurtosis: math.MaxFloat64,
		Maximum: 999999999999999999999, Mean: 123456.789, Minimum: -1e-6, Skewness: 1e-6, Stddev: 0.1}
	cases["special values"] = e
	x := generated(1)[0]
	x.Explanation = &provenance.Explanation{Key: "a => b", Value: 2100.5, NaturalMin: 12, NaturalMax: 700, LowThreshold: 8.5, Threshold: 980,
		Ratio: 3.0007, P99: 310, LogSigmas: 41.2, Excess: 1400.5, Text: "3.0× the natural maximum <700 µs>"}
	cases["explained"] = x
	y := x
	yx := *x.Explanation
	yx.Baseline = &provenance.BaselineEvidence{Source: "kipimo-out/clean", Bound: 1165.5, BaselineCalls: 16210, BaselineBeyond: 11, Calls: 2400, Beyond: 17, PValue: 3.5e-9}
	y.Explanation = &yx
	cases["explained against a baseline"] = y
	for name, e := range cases {
		t.Run(name, func(t *testing.T) {
			want, err := json.Marshal(&e)
			if err != nil {
				t.Fatal(err)
			}
			got, err := provenance.AppendExecJSON(nil, &e)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("AppendExecJSON differs from json.Marshal:\n got %s\nwant %s", got, want)
			}
		})
	}
}

func TestAppendExecJSONRefusesNonFinite(t *testing.T) {
	for name, v := range map[string]float64{"NaN": math.NaN(), "+Inf": math.Inf(1), "-Inf": math.Inf(-1)} {
		t.Run(name, func(t *testing.T) {
			e := generated(1)[0]
			e.FuncStats.Kurtosis = v
			out, err := provenance.AppendExecJSON([]byte("prefix"), &e)
			if err == nil {
				t.Fatal("encoded a non-finite number")
			}
			if string(out) != "prefix" {
				t.Fatalf("dst changed on error: %q", out)
			}
		})
	}
}

// TestDecodeExecAgreesWithUnmarshal runs documents through both decoders:
// what the codec accepts, encoding/json reads the same way; what it rejects
// is either invalid or one of its two documented refusals.
func TestDecodeExecAgreesWithUnmarshal(t *testing.T) {
	doc, err := json.Marshal(generated(1)[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, doc string
		ok        bool
	}{
		{"generated", string(doc), true},
		{"empty object", `{}`, true},
		{"white space", " {\n\t\"event_id\" :\r \"1:2:3\" , \"entry\": 5 }\n", true},
		{"escapes", `{"func":"a\"b\\c\/d\b\f\n\r\t\u00e9\ud83d\ude00\ud800x\u0041","event_id":"\u0031:2:3"}`, true},
		{"escaped key", `{"\u0065ntry":7}`, true},
		{"invalid UTF-8 kept as U+FFFD", "{\"func\":\"a\xffb\xed\xa0\x80\"}", true},
		{"unknown fields skipped", `{"extra":{"a":[1,2,{"b":null}],"c":"d"},"more":[true,false,null,-1.5e3],"entry":1}`, true},
		{"nulls", `{"call_stack":null,"gpu_location":null,"gpu_parent":null,"func_stats":null,"entry":null,"func":null,"is_gpu_event":null,"event_window":{"exec_window":null,"comm_window":[]}}`, true},
		{"empty arrays", `{"call_stack":[],"counter_events":[],"gpu_parent":{"call_stack":[]}}`, true},
		{"null array elements", `{"call_stack":[null,{"fid":2}]}`, true},
		{"floats", `{"outlier_score":-0,"outlier_severity":1.5E+300,"func_stats":{"mean":0.000001,"count":12e-2}}`, true},
		{"largest uint64", `{"entry":18446744073709551615,"fid":4294967295}`, true},
		{"explanation", `{"explanation":{"key":"f","value":30,"natural_min":2,"natural_max":10,"low_threshold":1,"threshold":14,"ratio":3,"p99":8,"log_sigmas":9.5,"excess":20,"text":"3.0× the natural maximum"}}`, true},
		{"null explanation", `{"explanation":null}`, true},
		{"baseline evidence", `{"explanation":{"key":"f","value":30,"text":"t","baseline":{"source":"run","bound":14,"baseline_calls":100,"baseline_beyond":0,"calls":50,"beyond":9,"p_value":1e-9}}}`, true},
		{"null baseline evidence", `{"explanation":{"baseline":null}}`, true},
		{"case-folded key", `{"Entry":5}`, false},
		{"kelvin-folded key", "{\"\u212aurtosis\":1}", true}, // unknown at the top level: no field folds to it
		{"case-folded nested key", `{"func_stats":{"MEAN":1}}`, false},
		{"duplicate key", `{"entry":1,"entry":2}`, false},
		{"trailing data", `{"entry":1} x`, false},
		{"negative unsigned", `{"entry":-1}`, false},
		{"fractional unsigned", `{"entry":1.5}`, false},
		{"exponent unsigned", `{"entry":1e3}`, false},
		{"uint32 overflow", `{"fid":4294967296}`, false},
		{"uint64 overflow", `{"entry":18446744073709551616}`, false},
		{"float overflow", `{"outlier_score":1e400}`, false},
		{"leading zero", `{"entry":01}`, false},
		{"string for number", `{"entry":"1"}`, false},
		{"number for string", `{"func":1}`, false},
		{"bad literal", `{"is_gpu_event":tru}`, false},
		{"control character", "{\"func\":\"a\x01\"}", false},
		{"bad escape", `{"func":"\x"}`, false},
		{"short unicode escape", `{"func":"\u12"}`, false},
		{"unterminated", `{"func":"abc`, false},
		{"missing comma", `{"entry":1 "exit":2}`, false},
		{"trailing comma", `{"entry":1,}`, false},
		{"array", `[]`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got provenance.Exec
			err := provenance.DecodeExec([]byte(tc.doc), &got)
			if (err == nil) != tc.ok {
				t.Fatalf("DecodeExec error = %v, want ok=%v", err, tc.ok)
			}
			if err != nil {
				return
			}
			var want provenance.Exec
			if err := json.Unmarshal([]byte(tc.doc), &want); err != nil {
				t.Fatalf("codec accepted what encoding/json refuses: %v", err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("codec read\n%+v\nencoding/json read\n%+v", got, want)
			}
		})
	}
}

func TestDecodeBatchIsUnmarshal(t *testing.T) {
	execs := generated(200)
	data, err := json.Marshal(execs)
	if err != nil {
		t.Fatal(err)
	}
	b, err := provenance.DecodeBatch("anomalies", data)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(b.Execs, execs) {
		t.Fatal("decoded batch differs from the records encoded")
	}
	for name, doc := range map[string]string{"empty": `[]`, "spaced": " [ ] "} {
		b, err := provenance.DecodeBatch("normalexecs", []byte(doc))
		if err != nil || b.Execs == nil || len(b.Execs) != 0 {
			t.Errorf("%s: got %v, %v; want an empty batch", name, b.Execs, err)
		}
	}
	if _, err := provenance.DecodeBatch("anomalies", []byte(`[{"event_id":"1:2:3"}] [`)); err == nil || !strings.Contains(err.Error(), "after the array") {
		t.Errorf("trailing data: got %v", err)
	}
}

// FuzzDecodeExec checks that the codec never reads a document differently
// from encoding/json, and that its encoder agrees with json.Marshal on
// whatever it decoded.
func FuzzDecodeExec(f *testing.F) {
	for _, e := range generated(4) {
		d, _ := json.Marshal(e)
		f.Add(d)
	}
	f.Add([]byte(`{"func":"a\u00e9\ud800","call_stack":[null],"extra":[{"x":1e5}]}`))
	f.Add([]byte(`{"gpu_parent":{"event_id":"1:2:3","call_stack":null},"gpu_location":{"device":3}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var got provenance.Exec
		if err := provenance.DecodeExec(data, &got); err != nil {
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			return
		}
		var want provenance.Exec
		if err := json.Unmarshal(data, &want); err != nil {
			t.Fatalf("codec accepted %q, encoding/json refused it: %v", data, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("codec read %q as\n%+v\nencoding/json as\n%+v", data, got, want)
		}
		enc, err := provenance.AppendExecJSON(nil, &got)
		if err != nil {
			t.Fatal(err)
		}
		want2, _ := json.Marshal(&got)
		if !bytes.Equal(enc, want2) {
			t.Fatalf("encoder:\n got %s\nwant %s", enc, want2)
		}
	})
}

// FuzzExecChecker checks that the reusing decoder reads every document as
// DecodeExec does, accepting and refusing the same ones, also after it
// has read another (whose memory it reuses).
func FuzzExecChecker(f *testing.F) {
	docs := generated(3)
	a, _ := json.Marshal(docs[0])
	b, _ := json.Marshal(docs[1])
	f.Add(a, b)
	f.Add(b, []byte(`{"call_stack":[{"func":"x"}],"event_window":{"exec_window":[{}]}}`))
	f.Add([]byte(`{not json}`), a)
	f.Fuzz(func(t *testing.T, first, second []byte) {
		var c provenance.ExecChecker
		for _, data := range [][]byte{first, second} {
			got, err := c.Check(data)
			var want provenance.Exec
			wantErr := provenance.DecodeExec(data, &want)
			if (err == nil) != (wantErr == nil) {
				t.Fatalf("%q: checker says %v, DecodeExec %v", data, err, wantErr)
			}
			if err == nil && !reflect.DeepEqual(*got, want) {
				t.Fatalf("%q: checker read\n%+v\nDecodeExec\n%+v", data, *got, want)
			}
		}
	})
}
