package sqlitestore

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// TestDictionaryUnchanged pins dictionary v1: documents stored with it
// cannot be read without the same bytes, so it may never change (a new
// dictionary needs a new format byte).
func TestDictionaryUnchanged(t *testing.T) {
	const want = "bdc1b0fb4769131f9e3e085f1ae6ced4a9081bafd47934bb5ec9f0f638a976fa"
	sum := sha256.Sum256(dictV1Text)
	if got := hex.EncodeToString(sum[:]); got != want {
		t.Fatalf("docdict-v1.json has SHA-256 %s, want %s: stored documents depend on it", got, want)
	}
}

func TestDocRoundTrip(t *testing.T) {
	execs := benchExecs(50)
	for i := range execs {
		js, err := provenance.AppendExecJSON(nil, &execs[i])
		if err != nil {
			t.Fatal(err)
		}
		doc := encodeDoc([]byte("keep"), js)
		if !bytes.HasPrefix(doc, []byte("keep")) {
			t.Fatal("encodeDoc overwrote dst")
		}
		doc = doc[4:]
		if len(doc) >= len(js)/2 {
			t.Errorf("record %d: stored %d B of %d B of JSON", i, len(doc), len(js))
		}
		back, err := decodeDoc(nil, doc)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(back, js) {
			t.Fatalf("record %d: decoded document differs", i)
		}
	}
}

func TestDecodeDocFormats(t *testing.T) {
	for _, tc := range []struct {
		name, doc, want, err string
	}{
		{name: "plain JSON of older stores", doc: `{"event_id":"1:2:3"}`, want: `{"event_id":"1:2:3"}`},
		{name: "empty", doc: "", err: "empty stored document"},
		{name: "unknown format", doc: "\x07abc", err: "unknown format byte 0x07"},
		{name: "corrupt S2 block", doc: "\x01\xff\xff\xff\xff\x0f", err: "stored document"},
		{name: "truncated S2 block", doc: string(encodeDoc(nil, []byte(strings.Repeat(`{"a":1}`, 20))))[:9], err: "stored document"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeDoc(nil, []byte(tc.doc))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil || string(got) != tc.want {
				t.Fatalf("got %q, %v", got, err)
			}
		})
	}
}

func FuzzDecodeDoc(f *testing.F) {
	f.Add(encodeDoc(nil, []byte(`{"event_id":"1:2:3","func":"main"}`)))
	f.Add([]byte(`{}`))
	f.Add([]byte{docS2DictV1, 0})
	f.Fuzz(func(t *testing.T, doc []byte) {
		js, err := decodeDoc(nil, doc)
		if err != nil {
			return
		}
		if len(doc) > 0 && doc[0] == docS2DictV1 {
			if again := encodeDoc(nil, js); len(again) == 0 {
				t.Fatal("empty re-encoding")
			}
		}
	})
}
