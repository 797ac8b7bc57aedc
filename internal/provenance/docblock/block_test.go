package docblock

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/storetest"
)

// testExecs are typical anomaly records: a 5+5 event window, call stacks of
// two to four frames, a few counters and messages, one in ten on a GPU.
func testExecs(n int) []provenance.Exec {
	return storetest.Generate(storetest.GenConfig{Seed: 42, N: n, Ranks: 64, Steps: 400, Window: 5, Anomaly: true})
}

func TestBlockRoundTrip(t *testing.T) {
	execs := testExecs(150)
	for _, n := range []int{1, 2, 64, 150} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			var b Builder
			var want [][]byte
			raw := 0
			for i := range execs[:n] {
				js, err := provenance.AppendExecJSON(nil, &execs[i])
				if err != nil {
					t.Fatal(err)
				}
				if slot := b.Add(js); slot != i {
					t.Fatalf("slot %d for document %d", slot, i)
				}
				want = append(want, js)
				raw += len(js)
			}
			z := b.AppendCompressed([]byte("keep"))
			if !bytes.HasPrefix(z, []byte("keep")) {
				t.Fatal("appendCompressed overwrote dst")
			}
			z = z[4:]
			if n >= 64 && len(z)*4 > raw {
				t.Errorf("%d documents of %d B in all compressed to %d B", n, raw, len(z))
			}
			got, err := Decode(z)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != n {
				t.Fatalf("%d documents back, want %d", len(got), n)
			}
			for i := range want {
				if !bytes.Equal(got[i], want[i]) {
					t.Fatalf("document %d differs", i)
				}
			}
			b.Reset()
			b.Add([]byte(`{}`))
			if again, err := Decode(b.AppendCompressed(nil)); err != nil || len(again) != 1 || string(again[0]) != "{}" {
				t.Fatalf("after reset: %q, %v", again, err)
			}
		})
	}
}

// TestBlockBuild checks build, which encodes documents in place, against
// documents encoded one by one, and a block whose header does not fit the
// room left for it (more documents than a write puts in one block).
func TestBlockBuild(t *testing.T) {
	execs := testExecs(MaxDocs)
	var b Builder
	z, err := b.Build([]byte("keep"), execs)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(z, []byte("keep")) {
		t.Fatal("build overwrote dst")
	}
	for round := range 2 { // the second time on the builder's reused memory
		got, err := Decode(z[4:])
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(execs) {
			t.Fatalf("round %d: %d documents back, want %d", round, len(got), len(execs))
		}
		for i := range execs {
			want, err := json.Marshal(&execs[i])
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got[i], want) {
				t.Fatalf("round %d: document %d differs from json.Marshal's", round, i)
			}
		}
		if z, err = b.Build(z[:4], execs); err != nil {
			t.Fatal(err)
		}
	}
	// 1,000 documents: a header of 1,002 bytes, beyond headerRoom.
	b.Reset()
	var want [][]byte
	for i := range 1000 {
		d := []byte(fmt.Sprint(i))
		b.Add(d)
		want = append(want, d)
	}
	got, err := Decode(b.AppendCompressed(nil))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%d documents back, want %d", len(got), len(want))
	}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("document %d: %q, want %q", i, got[i], want[i])
		}
	}
}

func TestDecodeBlockRejectsCorruption(t *testing.T) {
	var b Builder
	b.Add([]byte(`{"event_id":"1:2:3"}`))
	b.Add([]byte(`{"event_id":"1:2:4"}`))
	good := b.AppendCompressed(nil)
	compress := func(raw []byte) []byte { return Compress(raw, nil) }
	for _, tc := range []struct {
		name, err string
		data      []byte
	}{
		{"not zstd", "stored document block", []byte("plain bytes")},
		{"truncated", "stored document block", good[:len(good)-3]},
		{"empty block", "bad document count", compress(nil)},
		{"count beyond the block", "bad document count", compress([]byte{0x7f})},
		{"length beyond the block", "bad length of document 0", compress([]byte{1, 0xff, 0x7f})},
		{"document past the end", "runs past the block", compress([]byte{1, 3, '{', '}'})},
		{"bytes after the documents", "bytes after the last document", compress([]byte{1, 2, '{', '}', 'x'})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Decode(tc.data); err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("error %v, want one containing %q", err, tc.err)
			}
		})
	}
}

func FuzzDecodeBlock(f *testing.F) {
	var b Builder
	b.Add([]byte(`{"event_id":"1:2:3","func":"main"}`))
	b.Add([]byte(`{}`))
	f.Add(b.AppendCompressed(nil))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		docs, err := Decode(data)
		if err != nil {
			return
		}
		var again Builder
		for _, d := range docs {
			again.Add(d)
		}
		back, err := Decode(again.AppendCompressed(nil))
		if err != nil || len(back) != len(docs) {
			t.Fatalf("re-encoded block: %d documents, %v", len(back), err)
		}
	})
}
