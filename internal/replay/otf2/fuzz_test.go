package otf2

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/replay/steps"
)

// FuzzOTF2 reads an archive whose anchor file, global definitions and first
// location's events are arbitrary bytes (seeded from the Score-P ping-pong;
// the second location's files are the real ones): it must return frames that
// validate and encode, or an error naming a file, never panic.
func FuzzOTF2(f *testing.F) {
	dir := filepath.Dir(pingPong)
	real := map[string][]byte{}
	for _, name := range []string{"traces.otf2", "traces.def", "traces/0.evt", "traces/0.def", "traces/1.evt", "traces/1.def"} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			f.Fatal(err)
		}
		real[name] = data
	}
	f.Add(real["traces.otf2"], real["traces.def"], real["traces/0.evt"])
	f.Add(real["traces.otf2"], real["traces.def"], real["traces/1.evt"])
	f.Add(real["traces.otf2"], real["traces.def"][:4000], real["traces/0.evt"][:300])
	f.Fuzz(func(t *testing.T, anchor, defs, evt []byte) {
		files := map[string][]byte{
			"fuzz/traces.otf2": anchor, "fuzz/traces.def": defs, "fuzz/traces/0.evt": evt,
			"fuzz/traces/0.def": real["traces/0.def"], "fuzz/traces/1.evt": real["traces/1.evt"], "fuzz/traces/1.def": real["traces/1.def"],
		}
		open := func(p string) (io.ReadCloser, error) {
			data, ok := files[p]
			if !ok {
				return nil, &os.PathError{Op: "open", Path: p, Err: os.ErrNotExist}
			}
			return io.NopCloser(bytes.NewReader(data)), nil
		}
		cfg := steps.Config{Step: time.Millisecond, MaxGap: 1000}
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		var buf []byte
		b := steps.New(cfg, func(fr *frame.Frame) error {
			if err := fr.Validate(); err != nil {
				t.Fatalf("invalid frame: %v", err)
			}
			buf = frame.AppendBinary(buf[:0], fr)
			return nil
		})
		ar, err := openWith("fuzz/traces.otf2", open)
		if err == nil {
			err = ReadArchive(context.Background(), ar, b)
		}
		if err != nil && !strings.Contains(err.Error(), "fuzz/") {
			t.Fatalf("error does not name the file: %v", err)
		}
	})
}
