// Package version describes a Kipimo binary from the build information Go
// embeds in it: the module's version, the VCS revision and time it was built
// from, whether the checkout had uncommitted changes, and the Go version.
// Every binary prints it with --version, for bug reports.
package version

import (
	"runtime"
	"runtime/debug"
	"strings"
)

// String describes the running binary, called name, on one line.
func String(name string) string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return name + " (no build information), " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH
	}
	return describe(name, bi)
}

// Requested reports whether a daemon's arguments ask for its version and
// nothing else: --version alone.
func Requested(args []string) bool {
	return len(args) == 1 && args[0] == "--version"
}

// describe is String for given build information.
func describe(name string, bi *debug.BuildInfo) string {
	set := map[string]string{}
	for _, s := range bi.Settings {
		set[s.Key] = s.Value
	}
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	parts := []string{name + " " + v}
	if bi.Main.Path != "" {
		parts[0] += " (" + bi.Main.Path + ")"
	}
	if rev := set["vcs.revision"]; rev != "" {
		r := "revision " + rev
		if t := set["vcs.time"]; t != "" {
			r += " of " + t
		}
		if set["vcs.modified"] == "true" {
			r += ", with uncommitted changes"
		}
		parts = append(parts, r)
	} else {
		parts = append(parts, "revision unknown (built without VCS information)")
	}
	goos, goarch := set["GOOS"], set["GOARCH"]
	if goos == "" || goarch == "" {
		goos, goarch = runtime.GOOS, runtime.GOARCH
	}
	gv := bi.GoVersion
	if gv == "" {
		gv = runtime.Version()
	}
	parts = append(parts, "built with "+gv+" "+goos+"/"+goarch)
	return strings.Join(parts, "; ")
}
