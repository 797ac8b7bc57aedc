package taudb

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
)

// Format names accepted by LoadPath.
const (
	FormatTAU         = "tau"          // a directory of profile.N.C.T files or MULTI__<metric> directories
	FormatPPK         = "ppk"          // ParaProf packed profile, gzip-compressed or not
	FormatXML         = "xml"          // TAU snapshot (snapshot.N.C.T) or merged (tauprofile.xml) XML
	FormatCaliper     = "caliper"      // Caliper .cali written with the aggregate service
	FormatCaliperJSON = "caliper-json" // Caliper's json-split region profile
)

// Formats lists the format names LoadPath accepts, in the order they are
// documented.
var Formats = []string{FormatTAU, FormatPPK, FormatXML, FormatCaliper, FormatCaliperJSON}

// LoadPath reads the profile at path into a trial named after the path, with
// the derived threads -1..-7 and metadata rows computed as ReadDir computes
// them. format is one of Formats, or "" to detect it from the content: a
// directory is read as TAU profiles; a file by its first bytes.
func LoadPath(path, format string) (*Trial, error) {
	return LoadPathContext(context.Background(), path, format)
}

// LoadPathContext is LoadPath with a context checked between files.
func LoadPathContext(ctx context.Context, path, format string) (*Trial, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("load profile: %w", err)
	}
	name := filepath.Base(filepath.Clean(path))
	if format == "" {
		if fi.IsDir() {
			format = FormatTAU
		} else {
			return nil, fmt.Errorf("load profile %s: cannot tell its format; pass one of %v", path, Formats)
		}
	}
	switch format {
	case FormatTAU:
		return ReadDir(path, name)
	default:
		return nil, fmt.Errorf("load profile %s: unknown format %q; want one of %v", path, format, Formats)
	}
}
