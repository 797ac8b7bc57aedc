package otf2

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Field kinds of the records the archive generator writes, for swapping an
// archive's byte order: c a compressed integer, b a byte (B one that is not
// a count), f an eight-byte integer or double, s a string; "n(...)" repeats
// the fields in parentheses as often as the last c or b read says. Fields
// are in the order they are written: those a later OTF2 version added come
// after the original ones.
var (
	swapEvents = map[byte]string{
		12: "c", 13: "c", 16: "c", 17: "c", // singletons: no record length
		14: "cccc", 15: "ccccc", 19: "ccccc", 22: "", 23: "bcccc", 31: "cbn(bc)",
	}
	swapGlobal = map[byte]string{
		5: "cccc", 10: "cs", 12: "cccc", 13: "ccbcc", 14: "ccbcc", 15: "cccbccccbbc",
		18: "ccbcn(c)bbc", 19: "cccbbbbcc", 20: "cbn(c)bb", 21: "cccbc", 22: "ccccc",
	}
	swapLocal = map[byte]string{5: "bcBn(c)", 6: "fcf"} // dense id maps
)

// swapFile rewrites an OTF2 chunked file (chunk size chunk) from little- to
// big-endian in place: every multi-byte value keeps its size, so records and
// chunks stay where they are.
func swapFile(t *testing.T, path string, chunk int, schema map[byte]string, events bool) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	rev := func(i, n int) { slices.Reverse(b[i : i+n]) }
	i := 0
	field := func(kind byte, lastVal *uint64) {
		switch kind {
		case 'b':
			*lastVal = uint64(b[i])
			i++
		case 'B':
			i++
		case 'f':
			rev(i, 8)
			i += 8
		case 's':
			for b[i] != 0 {
				i++
			}
			i++
		case 'c':
			l := int(b[i])
			i++
			*lastVal = 0
			if l == 0 || l == 0xff {
				if l == 0xff {
					*lastVal = 1 << 63
				}
				return
			}
			for k := l - 1; k >= 0; k-- {
				*lastVal = *lastVal<<8 | uint64(b[i+k])
			}
			rev(i, l)
			i += l
		}
	}
	var fields func(spec string)
	fields = func(spec string) {
		var last uint64
		for k := 0; k < len(spec); k++ {
			if spec[k] == 'n' {
				end := strings.IndexByte(spec[k:], ')') + k
				inner := spec[k+2 : end]
				for range last {
					fields(inner)
				}
				k = end
				continue
			}
			field(spec[k], &last)
		}
	}
	for start := 0; start < len(b); start += chunk {
		if b[start] != recChunkHeader || b[start+1] != littleEndian {
			t.Fatalf("%s: chunk at %d is not a little-endian chunk", path, start)
		}
		b[start+1] = bigEndian
		rev(start+2, 8)
		rev(start+10, 8)
		i = start + chunkHeaderSize
	records:
		for i < min(start+chunk, len(b)) {
			id := b[i]
			i++
			switch {
			case id == recEndOfChunk || id == recEndOfFile:
				break records
			case id == recTimestamp && events:
				rev(i, 8)
				i += 8
				continue
			}
			spec, ok := schema[id]
			if !ok {
				t.Fatalf("%s: byte offset %d: record %d has no schema here", path, i-1, id)
			}
			if events && singleton(id) {
				fields(spec)
				continue
			}
			n := int(b[i])
			i++
			end := i + n
			fields(spec)
			if i > end {
				t.Fatalf("%s: record %d at %d: fields run past its length", path, id, end-n-2)
			}
			i = end // fields added by later versions
		}
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// swapAnchor rewrites the anchor file's header fields big-endian.
func swapAnchor(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[1] = bigEndian
	i := 2 + len("OTF2") + 1 + 5 // magic, formats and version
	for range 2 {
		slices.Reverse(b[i : i+8]) // chunk sizes
		i += 8
	}
	i += 2 // substrate, compression
	for range 2 {
		slices.Reverse(b[i : i+8]) // locations, definitions
		i += 8
	}
	for range 3 { // machine, creator, description
		i += strings.IndexByte(string(b[i:]), 0) + 1
	}
	slices.Reverse(b[i : i+4]) // number of properties
	n := int(b[i+3]) | int(b[i+2])<<8 | int(b[i+1])<<16 | int(b[i])<<24
	i += 4
	for range 2 * n {
		i += strings.IndexByte(string(b[i:]), 0) + 1
	}
	slices.Reverse(b[i : i+8]) // trace id
	i += 8
	for range 2 { // snapshots, thumbnails
		if i+4 <= len(b)-1 {
			slices.Reverse(b[i : i+4])
			i += 4
		}
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestBigEndianArchive turns an archive from OTF2's writer big-endian (as a
// big-endian machine would have written it) and reads it: the frames match
// what otf2-print shows of the big-endian archive.
func TestBigEndianArchive(t *testing.T) {
	otf2Print(t)
	gen := buildGen(t)
	dir := filepath.Join(t.TempDir(), "archive")
	if out, err := exec.Command(gen, dir, "3", "2", "30").CombinedOutput(); err != nil {
		t.Fatalf("gen: %v: %s", err, out)
	}
	le := printed(t, filepath.Join(dir, "traces.otf2"))
	a, err := ReadAnchor(filepath.Join(dir, "traces.otf2"))
	if err != nil {
		t.Fatal(err)
	}
	swapAnchor(t, filepath.Join(dir, "traces.otf2"))
	swapFile(t, filepath.Join(dir, "traces.def"), int(a.ChunkDefs), swapGlobal, false)
	evts, _ := filepath.Glob(filepath.Join(dir, "traces", "*.evt"))
	defs, _ := filepath.Glob(filepath.Join(dir, "traces", "*.def"))
	for _, p := range evts {
		swapFile(t, p, int(a.ChunkEvents), swapEvents, true)
	}
	for _, p := range defs {
		swapFile(t, p, int(a.ChunkDefs), swapLocal, false)
	}
	be := printed(t, filepath.Join(dir, "traces.otf2"))
	if fmt.Sprint(total(be.entries), total(be.msgs), total(be.samples), be.events) != fmt.Sprint(total(le.entries), total(le.msgs), total(le.samples), le.events) {
		t.Fatalf("otf2-print shows the swapped archive differently: the swap is wrong")
	}
	compare(t, le, be)
	got, _, _ := read(t, dir)
	compare(t, be, got)
	t.Logf("big-endian archive: %d event records, %d entries, %d messages, %d metric values", got.events, total(got.entries), total(got.msgs), total(got.samples))
}
