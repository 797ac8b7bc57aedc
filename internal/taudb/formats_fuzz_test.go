package taudb

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/format/ppk"
	"github.com/kipimo-hpc/kipimo/internal/format/tauprofile"
)

// addSeeds adds every real file matching pattern under testdata/formats.
func addSeeds(f *testing.F, pattern string, transform func([]byte) []byte) {
	files, err := filepath.Glob(formatPath(pattern))
	if err != nil || len(files) == 0 {
		f.Fatalf("no seed files for %s: %v", pattern, err)
	}
	for _, p := range files {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		if transform != nil {
			data = transform(data)
		}
		f.Add(data)
	}
}

func gunzipBytes(t testing.TB, b []byte) []byte {
	t.Helper()
	p := filepath.Join(t.TempDir(), "seed.gz")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return gunzip(t, p)
}

// checkLoaded is what every reader promises: an error that names the file,
// or a trial with its derived threads that writes TAU profiles.
func checkLoaded(t *testing.T, tr *Trial, err error) {
	t.Helper()
	if err != nil {
		if !strings.Contains(err.Error(), "fuzz-input") {
			t.Fatalf("error does not name the file: %v", err)
		}
		var pe *tauprofile.ParseError
		var oe *ppk.OffsetError
		if errors.As(err, &pe) && pe.Line < 1 {
			t.Fatalf("line %d in %v", pe.Line, err)
		}
		if errors.As(err, &oe) && oe.Offset < 0 {
			t.Fatalf("offset %d in %v", oe.Offset, err)
		}
		return
	}
	if tr.Thread(Total) == nil || len(tr.RealThreads()) == 0 || len(tr.Metrics) == 0 {
		t.Fatalf("trial without threads, metrics or derived threads: %d threads, %d metrics", len(tr.RealThreads()), len(tr.Metrics))
	}
	for _, th := range tr.RealThreads()[:1] {
		for _, m := range tr.Metrics {
			AppendProfile(nil, tr, th, m)
		}
	}
}

// FuzzReadPPK feeds bytes to the ppk reader, seeded with the real files
// compressed and uncompressed.
func FuzzReadPPK(f *testing.F) {
	addSeeds(f, "ppk/DrawGraph-4.ppk", nil)
	addSeeds(f, "ppk/*.ppk", func(b []byte) []byte { return gunzipBytes(f, b) })
	f.Fuzz(func(t *testing.T, data []byte) {
		tr, err := ReadPPK(bytes.NewReader(data), "fuzz-input", "fuzz")
		checkLoaded(t, tr, err)
	})
}

// FuzzReadSnapshotXML feeds bytes to the snapshot/merged XML reader, seeded
// with the real merged profile.
func FuzzReadSnapshotXML(f *testing.F) {
	addSeeds(f, "xml/*.xml", nil)
	f.Fuzz(func(t *testing.T, data []byte) {
		tr, err := ReadSnapshotXML(bytes.NewReader(data), "fuzz-input", "fuzz")
		checkLoaded(t, tr, err)
	})
}

// FuzzReadCaliper feeds bytes to the .cali reader, seeded with the real
// region profile and event trace.
func FuzzReadCaliper(f *testing.F) {
	addSeeds(f, "caliper/*.cali", nil)
	f.Fuzz(func(t *testing.T, data []byte) {
		tr, err := ReadCaliper(bytes.NewReader(data), "fuzz-input", "fuzz")
		checkLoaded(t, tr, err)
	})
}

// FuzzReadCaliperJSON feeds bytes to the json-split reader, seeded with the
// real lulesh profile in json-split form.
func FuzzReadCaliperJSON(f *testing.F) {
	f.Add(luleshJSONSplit(f, scanLulesh(f)))
	f.Fuzz(func(t *testing.T, data []byte) {
		tr, err := ReadCaliperJSON(bytes.NewReader(data), "fuzz-input", "fuzz")
		checkLoaded(t, tr, err)
	})
}
