package frame

import (
	"strings"
	"testing"
)

// A message body is one binary frame, or a JSON frame when it starts with
// '{'; bytes after a binary frame are refused.
func TestDecodeMessage(t *testing.T) {
	f := &Frame{Step: 3, Funcs: []Name{{ID: 1, Name: "f"}},
		Events: []FuncEvent{{Kind: Entry, FID: 1, TS: 5}, {Kind: Exit, FID: 1, TS: 9}}}
	bin := AppendBinary(nil, f)
	js, err := AppendJSON(nil, f)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		body []byte
		want string // "" for success, else part of the error
	}{
		{"binary", bin, ""},
		{"json", js, ""},
		{"binary with bytes after it", append(append([]byte(nil), bin...), 0, 0), "bytes after the frame"},
		{"garbage", []byte("garbage"), "?"},
		{"empty", nil, "?"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got Frame
			err := DecodeMessage(tc.body, &got)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("DecodeMessage: %v", err)
			case tc.want == "" && (got.Step != 3 || len(got.Events) != 2):
				t.Fatalf("decoded step %d with %d events, want 3 and 2", got.Step, len(got.Events))
			case tc.want != "" && err == nil:
				t.Fatal("DecodeMessage accepted it")
			case tc.want != "" && tc.want != "?" && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("DecodeMessage: %v, want an error saying %q", err, tc.want)
			}
		})
	}
}
