package taudb

import (
	"bytes"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/format/tauprofile"
)

// goodHead is lines 1 and 2 of a one-function profile file.
const goodHead = "1 templated_functions_MULTI_TIME\n# Name Calls Subrs Excl Incl ProfileCalls # <metadata><attribute><name>Metric Name</name><value>TIME</value></attribute></metadata>\n"

// FuzzParseProfile feeds arbitrary bytes to the profile parser. Bad input
// must give an error, never a panic; good input, once written, must parse
// again and write the same bytes (writing is a fixed point after one pass).
func FuzzParseProfile(f *testing.F) {
	f.Add([]byte(goodHead + "\"main\" 1 0 1 1 0 GROUP=\"X\" \n0 aggregates\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := tauprofile.Parse(bytes.NewReader(data), "fuzz")
		if err != nil {
			return
		}
		first := writeOne(t, p)
		p2, err := tauprofile.Parse(bytes.NewReader(first), "written")
		if err != nil {
			t.Fatalf("written profile does not parse: %v\n%s", err, first)
		}
		if second := writeOne(t, p2); !bytes.Equal(first, second) {
			t.Fatalf("writing is not stable:\nfirst  %q\nsecond %q", first, second)
		}
	})
}

func writeOne(t *testing.T, p *tauprofile.File) []byte {
	t.Helper()
	tr, err := BuildTrial("fuzz", [][]*tauprofile.File{{p}})
	if err != nil {
		t.Fatalf("BuildTrial: %v", err)
	}
	return AppendProfile(nil, tr, tr.RealThreads()[0], tr.Metrics[0])
}

// FuzzJSONMetadata feeds arbitrary bytes to the --metadata JSON flattener:
// an error or rows whose parents all precede them, never a panic.
func FuzzJSONMetadata(f *testing.F) {
	f.Add([]byte(`{"Machine": "x", "nodes": [1, {"a": null}], "n": 1.5e3}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		tr := NewTrial("fuzz")
		if err := tr.AddJSONMetadata(data); err != nil {
			return
		}
		if _, err := tr.validate(); err != nil {
			t.Fatal(err)
		}
	})
}
