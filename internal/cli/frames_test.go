package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// runKipimo runs the kipimo command tree with args and stdin, returning
// stdout, stderr and the error.
func runKipimo(t *testing.T, stdin []byte, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	root := NewRoot(&out, &errOut)
	root.SetIn(bytes.NewReader(stdin))
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), errOut.String(), err
}

// goldenFrameFiles returns the binary golden frame files of internal/frame.
func goldenFrameFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "frame", "testdata", "*.bin"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden frame files (%v)", err)
	}
	return files
}

func TestFramesDumpEncodeRoundTrip(t *testing.T) {
	files := goldenFrameFiles(t)
	var all []byte
	for _, path := range files {
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, raw...)
		t.Run(filepath.Base(path), func(t *testing.T) {
			dumped, _, err := runKipimo(t, nil, "frames", "dump", path)
			if err != nil {
				t.Fatalf("dump: %v", err)
			}
			if n := strings.Count(dumped, "\n"); n != 1 {
				t.Fatalf("dump printed %d lines for one frame", n)
			}
			// The JSON golden file next to it is what dump prints.
			wantJSON, err := os.ReadFile(strings.TrimSuffix(path, ".bin") + ".json")
			if err != nil {
				t.Fatal(err)
			}
			if dumped != string(wantJSON) {
				t.Fatalf("dump output differs from the JSON golden file:\n got %s\nwant %s", dumped, wantJSON)
			}
			encoded, _, err := runKipimo(t, []byte(dumped), "frames", "encode")
			if err != nil {
				t.Fatalf("encode: %v", err)
			}
			if !bytes.Equal([]byte(encoded), raw) {
				t.Fatalf("dump | encode is not byte-identical")
			}
		})
	}

	// A multi-frame file, dumped from several files at once and encoded to
	// --out (flag after the positional argument).
	dir := t.TempDir()
	multi := filepath.Join(dir, "all.frames")
	if err := os.WriteFile(multi, all, 0o644); err != nil {
		t.Fatal(err)
	}
	dumped, _, err := runKipimo(t, nil, "frames", "dump", multi)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(dumped, "\n"); n != len(files) {
		t.Fatalf("dump printed %d lines for %d frames", n, len(files))
	}
	dumpedMany, _, err := runKipimo(t, nil, "frames", "dump", files[0], files[1])
	if err != nil || strings.Count(dumpedMany, "\n") != 2 {
		t.Fatalf("dump of two files: %d lines, err %v", strings.Count(dumpedMany, "\n"), err)
	}
	out := filepath.Join(dir, "copy.frames")
	stdout, _, err := runKipimo(t, []byte(dumped), "frames", "encode", "-", "--out", out)
	if err != nil {
		t.Fatal(err)
	}
	if stdout != "" {
		t.Fatalf("encode --out wrote %d bytes to stdout", len(stdout))
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, all) {
		t.Fatalf("dump | encode --out is not byte-identical on a %d frame file", len(files))
	}
}

func TestFramesErrors(t *testing.T) {
	files := goldenFrameFiles(t)
	first, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	damaged := filepath.Join(dir, "damaged.frames")
	// Two good frames, then one whose version byte is wrong.
	bad := append(append(append([]byte(nil), first...), first...), first...)
	bad[2*len(first)+4] = 99
	if err := os.WriteFile(damaged, bad, 0o644); err != nil {
		t.Fatal(err)
	}
	good := strings.TrimSpace(mustRunFramesCmd(t, nil, "frames", "dump", files[0]))
	cases := []struct {
		name  string
		stdin string
		args  []string
		want  []string // substrings of the error
	}{
		{"dump damaged file", "", []string{"frames", "dump", damaged},
			[]string{damaged, "frame 3", "byte " + strconv.Itoa(2*len(first)), "byte offset " + strconv.Itoa(2*len(first)+4), "version"}},
		{"dump missing file", "", []string{"frames", "dump", filepath.Join(dir, "nope")},
			[]string{"nope", "no such file"}},
		{"dump without file", "", []string{"frames", "dump"}, []string{"requires at least 1 arg"}},
		{"encode bad line", good + "\n\n" + `{"pid":1,"rank":2,"io_step":3,"t_start":4,"t_end":x}` + "\n", []string{"frames", "encode"},
			[]string{"stdin", "line 3", "frame 2", "byte " + strconv.Itoa(len(good)+2+50), "t_end"}},
		{"encode unknown field", `{"pid":1,"rank":2,"io_step":3,"t_start":4,"t_end":5,"bogus":1}`, []string{"frames", "encode"},
			[]string{"line 1", "unknown field \"bogus\""}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := runKipimo(t, []byte(tc.stdin), tc.args...)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}

	// A failed encode to --out leaves no partial file behind.
	out := filepath.Join(dir, "partial.frames")
	if _, _, err := runKipimo(t, []byte(good+"\n{\n"), "frames", "encode", "--out", out); err == nil {
		t.Fatal("encode of a bad line succeeded")
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatalf("partial output left behind: %v", err)
	}
}

func mustRunFramesCmd(t *testing.T, stdin []byte, args ...string) string {
	t.Helper()
	out, _, err := runKipimo(t, stdin, args...)
	if err != nil {
		t.Fatalf("kipimo %s: %v", strings.Join(args, " "), err)
	}
	return out
}
