package chrome

import (
	"strings"
	"testing"
)

func TestParseEvent(t *testing.T) {
	cases := []struct {
		name, in string
		check    func(e event) bool
		err      string
	}{
		{"plain", `{"ph":"X","name":"a","pid":1,"tid":"t","ts":1.5,"dur":2,"args":{"correlation":7,"stream":3}}`,
			func(e event) bool {
				return e.Ph == "X" && e.Name == "a" && string(e.Pid) == "1" && string(e.Tid) == `"t"` && e.Ts == 1.5 && e.Dur == 2 && string(e.Args.Correlation) == "7" && string(e.Args.Stream) == "3"
			}, ""},
		{"escapes and nesting", `{ "n\u0061me" : "a\"b" , "args" : {"x":{"correlation":1},"y":[1,{"z":"}"}],"device":0} , "ph":"B" }`,
			func(e event) bool {
				return e.Name == `a"b` && e.Ph == "B" && string(e.Args.Device) == "0" && e.Args.Correlation == nil
			}, ""},
		{"nulls", `{"name":null,"ts":null,"args":null}`, func(e event) bool { return e.Name == "" && e.Ts == 0 }, ""},
		{"empty", `{}`, func(e event) bool { return e.Ph == "" }, ""},
		{"name not a string", `{"name":5}`, nil, `field "name": want a string`},
		{"ts not a number", `{"ts":"soon"}`, func(e event) bool { return e.badTime != "" }, ""},
		{"ts as a string", `{"ts":"42.500000","dur":" 1e3 "}`, func(e event) bool { return e.Ts == 42.5 && e.Dur == 1000 && e.badTime == "" }, ""},
		{"id2", `{"ph":"b","id2":{"local":"0x1"}}`, func(e event) bool { return string(e.ID) == `"0x1"` }, ""},
		{"not an object", `[1]`, nil, "malformed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var e event
			err := parseEvent([]byte(tc.in), &e)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(e) {
				t.Errorf("parsed %+v", e)
			}
		})
	}
}
