package frame

import (
	"bytes"
	"encoding/hex"
	"os"
	"strings"
	"testing"
)

// TestSpecExample checks the worked example of schemas/frame-binary.md: the
// hex dump in its code block is the encoding of the frame the text shows.
func TestSpecExample(t *testing.T) {
	doc, err := os.ReadFile("../../schemas/frame-binary.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "## Worked example")
	if !ok {
		t.Fatal("no worked example in the spec")
	}
	_, rest, _ = strings.Cut(rest, "```\n")
	block, _, _ := strings.Cut(rest, "```")
	var want []byte
	for _, line := range strings.Split(block, "\n") {
		// Hex pairs come first on each line, the explanation after two or
		// more spaces of a non-hex word.
		for _, w := range strings.Fields(line) {
			b, err := hex.DecodeString(w)
			if err != nil || len(w) != 2 {
				break
			}
			want = append(want, b...)
		}
	}
	f := &Frame{PID: 1, Rank: 0, Step: 3, TStart: 100, TEnd: 900,
		Funcs: []Name{{0, "main"}},
		Events: []FuncEvent{
			{0, Entry, 0, 110}, {4, Entry, 0, 111}, {0, Exit, 0, 800},
		}}
	got := AppendBinary(nil, f)
	if !bytes.Equal(got, want) {
		t.Fatalf("spec example:\n doc  % x\n code % x", want, got)
	}
}
