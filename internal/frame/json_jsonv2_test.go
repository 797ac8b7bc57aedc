//go:build goexperiment.jsonv2

package frame

import (
	"bytes"
	"encoding/json/jsontext"
	jsonv2 "encoding/json/v2"
)

// With GOEXPERIMENT=jsonv2 (Go 1.25 and 1.26), the benchmarks also time
// encoding/json/v2, with the options they give go-json-experiment/json.
func init() {
	encOpts := jsontext.EscapeForJS(true)
	decOpts := jsonv2.RejectUnknownMembers(true)
	stdV2FrameEncoders = func() []frameEncoder {
		var out bytes.Buffer
		enc := jsontext.NewEncoder(&out, encOpts)
		return []frameEncoder{{"encoding-json-v2", func(buf []byte, f *Frame) ([]byte, error) {
			if err := f.Validate(); err != nil {
				return buf, err
			}
			out.Reset()
			enc.Reset(&out, encOpts)
			if err := jsonv2.MarshalEncode(enc, f, encOpts); err != nil {
				return buf, err
			}
			return append(buf[:0], bytes.TrimSuffix(out.Bytes(), []byte{'\n'})...), nil
		}}}
	}
	stdV2FrameDecoders = func() []frameDecoder {
		return []frameDecoder{{"encoding-json-v2", func(b []byte, f *Frame) error {
			f.Reset()
			if err := jsonv2.Unmarshal(b, f, decOpts); err != nil {
				return err
			}
			return f.Validate()
		}}}
	}
}
