package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

// genCmd runs `kipimo gen` with args and returns stdout and the error.
func genCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	root := NewRoot(&out, &errOut)
	root.SetArgs(append([]string{"gen"}, args...))
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

// readDir returns the contents of every file in dir by name.
func readDir(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		files[e.Name()] = b
	}
	return files
}

func TestGenDeterministicFiles(t *testing.T) {
	small := []string{"--ranks", "3", "--steps", "4", "--events-per-step", "4000", "--gpu", "--anomaly-scale", "5"}
	for _, tc := range []struct {
		name string
		a, b []string
		same bool
	}{
		{"same seed", []string{"--seed", "7"}, []string{"--seed", "7", "--json"}, true},
		{"flags in another order", []string{"--seed", "7"}, []string{"--json", "--seed=7"}, true},
		{"other seed", []string{"--seed", "7"}, []string{"--seed", "8"}, false},
		{"cpu only", []string{"--seed", "7"}, []string{"--seed", "7", "--gpu=false"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			da, db := t.TempDir(), t.TempDir()
			if _, err := genCmd(t, append(append(small, "--out", da), tc.a...)...); err != nil {
				t.Fatal(err)
			}
			if _, err := genCmd(t, append(append(small, "--out", db), tc.b...)...); err != nil {
				t.Fatal(err)
			}
			fa, fb := readDir(t, da), readDir(t, db)
			if len(fa) != 4 {
				t.Fatalf("wrote %d files, want 3 frame files and truth.jsonl", len(fa))
			}
			same := len(fa) == len(fb)
			for name, b := range fa {
				same = same && bytes.Equal(b, fb[name])
			}
			if same != tc.same {
				t.Errorf("outputs byte-identical = %v, want %v", same, tc.same)
			}
		})
	}
}

func TestGenSummaryMatchesFiles(t *testing.T) {
	dir := t.TempDir()
	out, err := genCmd(t, "--ranks", "2", "--steps", "5", "--seed", "3", "--events-per-step", "6000",
		"--threads", "3", "--gpu", "--pid", "4", "--slow-call", "0.01", "--out", dir, "--json")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(out, "\n") != 1 {
		t.Fatalf("--json printed %q, want one line", out)
	}
	var sum genSummary
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&sum); err != nil {
		t.Fatalf("summary %q: %v", out, err)
	}
	var frames int
	var events, size int64
	for r := range 2 {
		path := filepath.Join(dir, "rank-"+string(rune('0'+r))+".frames")
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		size += st.Size()
		fh, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		rd := frame.NewReader(bufio.NewReader(fh))
		var f frame.Frame
		for step := uint64(0); ; step++ {
			err := rd.Next(&f)
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			if f.Rank != uint32(r) || f.Step != step || f.PID != 4 {
				t.Fatalf("%s: frame %d is rank %d step %d pid %d", path, step, f.Rank, f.Step, f.PID)
			}
			frames++
			events += int64(f.NumEvents())
		}
		fh.Close()
	}
	fh, err := os.Open(filepath.Join(dir, "truth.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	truth, err := workload.ReadTruth(fh)
	if err != nil {
		t.Fatal(err)
	}
	want := genSummary{Frames: 10, Events: events, AnomaliesInjected: len(truth), Bytes: size}
	if sum.Frames != frames || frames != want.Frames || sum.Events != want.Events || sum.AnomaliesInjected != want.AnomaliesInjected || sum.Bytes != want.Bytes {
		t.Errorf("summary %+v; files hold %d frames, %d events, %d anomalies, %d bytes", sum, frames, events, len(truth), size)
	}
	if len(truth) == 0 {
		t.Error("no anomaly injected at --slow-call 0.01")
	}
	var byKind int
	for _, n := range sum.ByKind {
		byKind += n
	}
	if byKind != len(truth) {
		t.Errorf("anomalies by kind add up to %d, want %d", byKind, len(truth))
	}
	for _, tr := range truth {
		if tr.PID != 4 || tr.Rank > 1 || tr.Step > 4 {
			t.Fatalf("truth record %+v outside the run", tr)
		}
	}
}

func TestGenHumanSummary(t *testing.T) {
	dir := t.TempDir()
	out, err := genCmd(t, "--ranks", "1", "--steps", "2", "--events-per-step", "2000", "--out", dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"wrote 2 frames", "events", "anomalies injected", "truth.jsonl"} {
		if !strings.Contains(out, want) {
			t.Errorf("summary %q does not mention %q", out, want)
		}
	}
}

func TestGenErrors(t *testing.T) {
	dir := t.TempDir()
	blocker := filepath.Join(dir, "file")
	if err := os.WriteFile(blocker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no out", []string{"--ranks", "2"}, "--out is required"},
		{"zero ranks", []string{"--out", dir, "--ranks", "0"}, "ranks must be between"},
		{"few events", []string{"--out", dir, "--events-per-step", "3"}, "events per step"},
		{"bad rate", []string{"--out", dir, "--slow-call", "1.5"}, "rate slow_call"},
		{"negative scale", []string{"--out", dir, "--anomaly-scale", "-1"}, "--anomaly-scale"},
		{"not a number", []string{"--out", dir, "--steps", "many"}, "invalid argument"},
		{"positional argument", []string{"--out", dir, "extra"}, "unknown command"},
		{"out is a file", []string{"--out", blocker, "--steps", "1", "--ranks", "1"}, "gen"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := genCmd(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}
