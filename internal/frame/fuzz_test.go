package frame

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// fuzzSeeds are the inputs both fuzz targets start from: the golden frames in
// both encodings, and the malformed inputs of the table tests.
func fuzzSeeds() (bins, jsons [][]byte) {
	for _, tc := range testFrames() {
		bin := AppendBinary(nil, tc.f)
		js, _ := AppendJSON(nil, tc.f)
		if len(bin) < 4096 {
			bins = append(bins, bin, bin[:len(bin)/2])
		}
		if len(js) < 4096 {
			jsons = append(jsons, js)
		}
	}
	bins = append(bins,
		framed(okFull),
		framed(cat(okHead3, body(2, 0b1001, 4, 0b110, 9, 1, 0b10, 7, 100, 1, 0b11, 3, 4, 5))),
		framed(cat(okHead, body(1, 2), []byte{0x80})),
		cat(framed(okFull), framed(okFull)),
	)
	jsons = append(jsons,
		[]byte(`{"pid":1,"rank":2,"io_step":0,"t_start":0,"t_end":0,"funcs":[{"id":0,"name":"\u00e9\ud83d\ude80\n"}]}`),
		[]byte(` {"t_end":5,"t_start":1,"io_step":0,"rank":2,"pid":1} `),
		[]byte(`{"pid":1,"events":[{"tid":0,"kind":2,"fid":1,"ts":5}]}`),
	)
	return bins, jsons
}

// checkDecodeError asserts err is a *DecodeError pointing inside the input.
func checkDecodeError(t *testing.T, err error, in []byte) {
	t.Helper()
	var de *DecodeError
	if !errors.As(err, &de) {
		t.Fatalf("error %T %v is not a *DecodeError", err, err)
	}
	if de.Offset < 0 || de.Offset > len(in) {
		t.Fatalf("error offset %d outside the %d byte input: %v", de.Offset, len(in), err)
	}
}

// checkReencodes asserts a decoded frame is valid and survives both
// encodings unchanged.
func checkReencodes(t *testing.T, f *Frame) {
	t.Helper()
	if err := f.Validate(); err != nil {
		t.Fatalf("decoder produced an invalid frame: %v", err)
	}
	bin := AppendBinary(nil, f)
	var g Frame
	if n, err := DecodeBinary(bin, &g); err != nil || n != len(bin) {
		t.Fatalf("re-encoded frame does not decode: n=%d err=%v", n, err)
	}
	if !equalFrames(f, &g) {
		t.Fatalf("binary re-encoding changed the frame")
	}
	js, err := AppendJSON(nil, f)
	if err != nil {
		t.Fatalf("AppendJSON: %v", err)
	}
	var h Frame
	if err := DecodeJSON(js, &h); err != nil {
		t.Fatalf("JSON form does not decode: %v\n%s", err, js)
	}
	if !equalFrames(f, &h) {
		t.Fatalf("JSON re-encoding changed the frame")
	}
	if !bytes.Equal(AppendBinary(nil, &h), bin) {
		t.Fatalf("binary -> JSON -> binary is not byte-identical")
	}
}

func FuzzDecodeBinary(f *testing.F) {
	bins, _ := fuzzSeeds()
	for _, b := range bins {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var fr, pre Frame
		// DecodePrelude never panics, on the whole input or its start.
		size, perr := DecodePrelude(data, &pre)
		n, err := DecodeBinary(data, &fr)
		if err != nil {
			checkDecodeError(t, err, data)
			if perr != nil {
				checkDecodeError(t, perr, data)
			}
			return
		}
		if n < HeaderSize || n > len(data) {
			t.Fatalf("DecodeBinary used %d bytes of %d", n, len(data))
		}
		// On a frame DecodeBinary accepts, the prelude read from the
		// frame's first PreludeSize bytes agrees with it.
		size, perr = DecodePrelude(data[:min(len(data), PreludeSize)], &pre)
		if perr != nil || size != n || pre.PID != fr.PID || pre.Rank != fr.Rank || pre.Step != fr.Step ||
			pre.TStart != fr.TStart || pre.TEnd != fr.TEnd || len(pre.Events) != 0 {
			t.Fatalf("DecodePrelude = %d, %+v, %v; DecodeBinary read %d bytes of pid %d rank %d step %d [%d, %d]",
				size, pre, perr, n, fr.PID, fr.Rank, fr.Step, fr.TStart, fr.TEnd)
		}
		checkReencodes(t, &fr)
		// The stream reader agrees with DecodeBinary on the first frame.
		var g Frame
		if err := NewReader(bytes.NewReader(data)).Next(&g); err != nil || !equalFrames(&fr, &g) {
			t.Fatalf("Reader disagrees with DecodeBinary: %v", err)
		}
	})
}

func FuzzDecodeJSON(f *testing.F) {
	_, jsons := fuzzSeeds()
	for _, b := range jsons {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var fr Frame
		if err := DecodeJSON(data, &fr); err != nil {
			checkDecodeError(t, err, data)
			return
		}
		checkReencodes(t, &fr)
		// Anything the strict decoder accepts, encoding/json reads the same.
		var std Frame
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&std); err != nil {
			t.Fatalf("encoding/json rejects an accepted frame: %v", err)
		}
		if !equalFrames(&fr, &std) {
			t.Fatalf("encoding/json reads a different frame")
		}
	})
}

// TestWriteFuzzSeeds keeps the committed corpus under testdata/fuzz in step
// with fuzzSeeds when run with -update, and checks it exists otherwise.
func TestWriteFuzzSeeds(t *testing.T) {
	bins, jsons := fuzzSeeds()
	for target, seeds := range map[string][][]byte{"FuzzDecodeBinary": bins, "FuzzDecodeJSON": jsons} {
		dir := filepath.Join("testdata", "fuzz", target)
		for i, s := range seeds {
			path := filepath.Join(dir, fmt.Sprintf("seed-%02d", i))
			want := fmt.Appendf(nil, "go test fuzz v1\n[]byte(%q)\n", s)
			if *update {
				writeFile(t, path, want)
				continue
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s is stale (run go test -update)", path)
			}
		}
	}
}
