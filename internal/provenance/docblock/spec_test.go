package docblock

import (
	"bytes"
	"encoding/hex"
	"os"
	"strings"
	"testing"
)

// TestSpecExample checks the worked example of schemas/prov-blocks.md: the
// hex dump in its code block decodes to the record the text shows, passes
// Check, and its block is what a Builder makes of the document.
func TestSpecExample(t *testing.T) {
	doc, err := os.ReadFile("../../../schemas/prov-blocks.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "## Worked example")
	if !ok {
		t.Fatal("no worked example in the spec")
	}
	_, rest, _ = strings.Cut(rest, "```\n")
	code, _, _ := strings.Cut(rest, "```")
	var data []byte
	for _, line := range strings.Split(code, "\n") {
		// Hex pairs come first on each line, the explanation after.
		for _, w := range strings.Fields(line) {
			b, err := hex.DecodeString(w)
			if err != nil || len(w) != 2 {
				break
			}
			data = append(data, b...)
		}
	}
	m, err := DecodeMessage(data)
	if err != nil {
		t.Fatal(err)
	}
	want := Row{EventID: "0:3:7", FID: 2, Func: "main", IOStep: 3, Entry: 1000, Exit: 1150, RuntimeTotal: 150, RuntimeExclusive: 100, OutlierScore: 2.5}
	if len(m.Rows) != 1 || m.Rows[0] != want {
		t.Fatalf("rows %+v, want %+v", m.Rows, want)
	}
	if err := m.Check(); err != nil {
		t.Fatal(err)
	}
	var b Builder
	b.Add([]byte(`{"event_id":"0:3:7","fid":2,"func":"main","io_step":3,"entry":1000,"exit":1150,"runtime_total":150,"runtime_exclusive":100,"outlier_score":2.5}`))
	if z := b.AppendCompressed(nil); len(m.Blocks) != 1 || !bytes.Equal(m.Blocks[0].Data, z) {
		t.Fatalf("block % x, a Builder makes % x", m.Blocks[0].Data, z)
	}
}
