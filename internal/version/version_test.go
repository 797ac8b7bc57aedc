package version

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestDescribe(t *testing.T) {
	for _, tc := range []struct {
		name string
		bi   debug.BuildInfo
		want string
	}{
		{
			name: "release",
			bi: debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/kipimo-hpc/kipimo", Version: "v1.4.0"},
				Settings: []debug.BuildSetting{{Key: "GOOS", Value: "linux"}, {Key: "GOARCH", Value: "arm64"},
					{Key: "vcs.revision", Value: "0123456789abcdef"}, {Key: "vcs.time", Value: "2026-11-28T01:00:00Z"}, {Key: "vcs.modified", Value: "false"}}},
			want: "ad v1.4.0 (github.com/kipimo-hpc/kipimo); revision 0123456789abcdef of 2026-11-28T01:00:00Z; built with go1.26.8 linux/arm64",
		},
		{
			name: "modified checkout",
			bi: debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/kipimo-hpc/kipimo", Version: "v0.0.0-20261128010000-0123456789ab+dirty"},
				Settings: []debug.BuildSetting{{Key: "GOOS", Value: "linux"}, {Key: "GOARCH", Value: "amd64"},
					{Key: "vcs.revision", Value: "0123456789ab"}, {Key: "vcs.modified", Value: "true"}}},
			want: "ad v0.0.0-20261128010000-0123456789ab+dirty (github.com/kipimo-hpc/kipimo); revision 0123456789ab, with uncommitted changes; built with go1.26.8 linux/amd64",
		},
		{
			name: "no VCS information",
			bi:   debug.BuildInfo{Main: debug.Module{Path: "github.com/kipimo-hpc/kipimo"}},
			want: "ad (devel) (github.com/kipimo-hpc/kipimo); revision unknown (built without VCS information); built with " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := describe("ad", &tc.bi); got != tc.want {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestString(t *testing.T) {
	if s := String("kipimo"); !strings.HasPrefix(s, "kipimo ") || !strings.Contains(s, runtime.Version()) {
		t.Errorf("%q: want the name and the Go version", s)
	}
}

func TestRequested(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"--version"}, true},
		{nil, false},
		{[]string{"--run", "x"}, false},
		{[]string{"--version", "--run", "x"}, false},
		{[]string{"-version"}, false},
	} {
		if got := Requested(tc.args); got != tc.want {
			t.Errorf("Requested(%q) = %v", tc.args, got)
		}
	}
}
