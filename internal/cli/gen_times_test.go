package cli

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

// TestGenTimes: --times recorded is the default of a replay, --times draw
// gives another replay of the same trace, and the flag is refused where it
// means nothing.
func TestGenTimes(t *testing.T) {
	trace := evalTrace("opencl_course_L5")
	gen := func(t *testing.T, extra ...string) map[string][]byte {
		t.Helper()
		dir := t.TempDir()
		args := append([]string{"--out", dir, "--from", trace, "--ranks", "2", "--steps", "3", "--beyond-max", "0"}, extra...)
		if _, err := genCmd(t, args...); err != nil {
			t.Fatal(err)
		}
		return readDir(t, dir)
	}
	def := gen(t)
	rec := gen(t, "--times", "recorded")
	draw := gen(t, "--times", "draw")
	for _, name := range []string{"rank-0.frames", "rank-1.frames"} {
		if len(def[name]) == 0 {
			t.Fatalf("%s missing or empty", name)
		}
		if !bytes.Equal(def[name], rec[name]) {
			t.Errorf("%s: the default differs from --times recorded", name)
		}
		if bytes.Equal(def[name], draw[name]) {
			t.Errorf("%s: --times draw gives the same frames as --times recorded", name)
		}
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown mode", []string{"--from", trace, "--times", "shuffled"}, "times must be one of recorded, draw"},
		{"synthetic run", []string{"--profile", "realistic", "--times", "draw"}, "--times applies to --from"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := genCmd(t, append([]string{"--out", filepath.Join(t.TempDir(), "x"), "--steps", "2"}, tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}
