//go:build goexperiment.jsonv2

package provenance_test

import (
	"bytes"
	jsonstd "encoding/json"
	"encoding/json/jsontext"
	jsonv2 "encoding/json/v2"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// With GOEXPERIMENT=jsonv2 (Go 1.25 and 1.26), the benchmarks also time
// encoding/json/v2, with the options they give go-json-experiment/json.
func init() {
	encOpts := jsonstd.DefaultOptionsV1()
	decOpts := jsonv2.JoinOptions(
		jsonstd.DefaultOptionsV1(),
		jsonv2.MatchCaseInsensitiveNames(false),
		jsontext.AllowDuplicateNames(false),
	)
	stdV2Encoders = func() []execEncoder {
		var out bytes.Buffer
		enc := jsontext.NewEncoder(&out, encOpts)
		return []execEncoder{{"encoding-json-v2", func(buf []byte, e *provenance.Exec) ([]byte, error) {
			out.Reset()
			enc.Reset(&out, encOpts)
			if err := jsonv2.MarshalEncode(enc, e, encOpts); err != nil {
				return buf, err
			}
			return append(buf[:0], bytes.TrimSuffix(out.Bytes(), []byte{'\n'})...), nil
		}}}
	}
	stdV2Decoders = func() []execDecoder {
		return []execDecoder{{"encoding-json-v2", func(data []byte) (out []provenance.Exec, err error) {
			return out, jsonv2.Unmarshal(data, &out, decOpts)
		}}}
	}
}
