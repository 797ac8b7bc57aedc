package frame

import (
	"encoding/json"
	"testing"
)

// TestDecodeJSONOtherWriters decodes the JSON that encoding/json writes for
// every test frame, compact and indented: other writers' white space, HTML
// escapes and empty lists must read as the same frame.
func TestDecodeJSONOtherWriters(t *testing.T) {
	for _, tc := range testFrames() {
		t.Run(tc.name, func(t *testing.T) {
			compact, err := json.Marshal(tc.f)
			if err != nil {
				t.Fatal(err)
			}
			indented, err := json.MarshalIndent(tc.f, "", "\t")
			if err != nil {
				t.Fatal(err)
			}
			for _, in := range [][]byte{compact, indented} {
				var g Frame
				if err := DecodeJSON(in, &g); err != nil {
					t.Fatalf("DecodeJSON: %v\n%s", err, in)
				}
				if !equalFrames(&g, tc.f) {
					t.Fatalf("decoded frame differs:\n%s", in)
				}
			}
		})
	}
}

func TestDecodeJSONEscapesAndOrder(t *testing.T) {
	in := `
	{ "t_end" : 9 , "funcs" : [ { "name" : "\u00e9\ud83d\ude80\n\/\"\\\b\f\r\t\u0041" , "id" : 7 } ],
	  "\u0070id" : 1, "rank": 2, "io_step": 3, "t_start": 4,
	  "events": [ {"ts": 5, "fid": 7, "kind": 1, "tid": 3} ] }
	`
	var f Frame
	if err := DecodeJSON([]byte(in), &f); err != nil {
		t.Fatal(err)
	}
	want := &Frame{PID: 1, Rank: 2, Step: 3, TStart: 4, TEnd: 9,
		Funcs:  []Name{{7, "é🚀\n/\"\\\b\f\r\tA"}},
		Events: []FuncEvent{{3, Exit, 7, 5}}}
	if !equalFrames(&f, want) {
		t.Fatalf("got %+v, want %+v", f, *want)
	}
}
