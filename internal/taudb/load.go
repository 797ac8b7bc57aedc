package taudb

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/kipimo-hpc/kipimo/internal/format/ppk"
	"github.com/kipimo-hpc/kipimo/internal/format/tauprofile"
	"github.com/kipimo-hpc/kipimo/internal/format/tauxml"
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
// directory is read as TAU profiles (or, when it holds snapshot.N.C.T files
// and no profiles, as TAU snapshot XML); a file by its first bytes.
func LoadPath(path, format string) (*Trial, error) {
	return LoadPathContext(context.Background(), path, format)
}

// LoadPathContext is LoadPath with a context checked before reading.
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
		if format, err = DetectFormat(path); err != nil {
			return nil, err
		}
	}
	if fi.IsDir() {
		switch format {
		case FormatTAU:
			return ReadDir(path, name)
		case FormatXML:
			return ReadSnapshotDir(path, name)
		default:
			return nil, fmt.Errorf("load profile %s: a directory is read as %q or %q (snapshot.N.C.T files) profiles, not %q", path, FormatTAU, FormatXML, format)
		}
	}
	switch format {
	case FormatTAU:
		return nil, fmt.Errorf("load profile %s: format %q reads a directory of profile.N.C.T files, not a file; pass the directory", path, format)
	case FormatPPK:
		return readFile(path, name, ReadPPK)
	case FormatXML:
		return readFile(path, name, ReadSnapshotXML)
	case FormatCaliper:
		return readFile(path, name, ReadCaliper)
	case FormatCaliperJSON:
		return readFile(path, name, ReadCaliperJSON)
	default:
		return nil, fmt.Errorf("load profile %s: unknown format %q; want one of %s", path, format, strings.Join(Formats, ", "))
	}
}

func readFile(path, name string, read func(io.Reader, string, string) (*Trial, error)) (*Trial, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("load profile: %w", err)
	}
	defer f.Close()
	return read(f, path, name)
}

// ErrUnknownFormat is DetectFormat's error for content of no format it knows.
var ErrUnknownFormat = errors.New("cannot tell the profile format")

// DetectFormat names the format of the profile at path from its content: a
// directory of TAU profiles is "tau", one of snapshot.N.C.T files "xml"; a file starting with the gzip magic or
// ParaProf's "PPK" is "ppk"; an XML document whose root is profile_xml is
// "xml"; Caliper's "__rec=" records are "caliper"; a JSON object is
// "caliper-json".
func DetectFormat(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("detect profile format: %w", err)
	}
	if fi.IsDir() {
		if _, err := tauprofile.MetricDirs(path); err == nil {
			return FormatTAU, nil
		}
		if snaps, err := tauxml.SnapshotFiles(path); err == nil && len(snaps) > 0 {
			return FormatXML, nil
		}
		return "", fmt.Errorf("%s holds no profile.N.C.T files, MULTI__<metric> directories or snapshot.N.C.T files", path)
	}
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("detect profile format: %w", err)
	}
	defer f.Close()
	head := make([]byte, 4096)
	n, err := io.ReadFull(f, head)
	if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
		return "", fmt.Errorf("detect profile format of %s: %w", path, err)
	}
	head = head[:n]
	if len(head) >= 2 && head[0] == 0x1f && head[1] == 0x8b {
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return "", fmt.Errorf("detect profile format of %s: %w", path, err)
		}
		zr, err := gzip.NewReader(f)
		if err != nil {
			return "", fmt.Errorf("%s: gzip header: %w", path, err)
		}
		inner := make([]byte, len(ppk.Magic))
		_, err = io.ReadFull(zr, inner)
		zr.Close()
		if err != nil || string(inner) != ppk.Magic {
			return "", fmt.Errorf("%s is gzip-compressed and does not hold a ParaProf packed profile; decompress it and pass the result", path)
		}
		return FormatPPK, nil
	}
	if format := detectBytes(head); format != "" {
		return format, nil
	}
	if _, _, _, ok := tauprofile.NCT(filepath.Base(path)); ok && bytes.Contains(head, []byte("templated_functions")) {
		return "", fmt.Errorf("%s is one TAU profile file; pass its directory to read all threads", path)
	}
	return "", fmt.Errorf("%s: %w from its first %d bytes (formats: %s)", path, ErrUnknownFormat, n, strings.Join(Formats, ", "))
}

// detectBytes names the format of a file starting with head, or "".
func detectBytes(head []byte) string {
	if len(head) >= 2 && head[0] == 0x1f && head[1] == 0x8b {
		return FormatPPK
	}
	if bytes.HasPrefix(head, []byte(ppk.Magic)) {
		return FormatPPK
	}
	t := bytes.TrimLeft(bytes.TrimPrefix(head, []byte("\xef\xbb\xbf")), " \t\r\n\x00")
	switch {
	case bytes.HasPrefix(t, []byte("<")):
		if bytes.Contains(head, []byte("<profile_xml")) {
			return FormatXML
		}
	case bytes.HasPrefix(t, []byte("__rec=")):
		return FormatCaliper
	case bytes.HasPrefix(t, []byte("{")):
		return FormatCaliperJSON
	}
	return ""
}
