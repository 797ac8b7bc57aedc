package taudb

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/format/tauprofile"
)

// TestCaliperErrors damages the real lulesh .cali and a json-split form of
// it and checks the error names the file and line.
func TestCaliperErrors(t *testing.T) {
	good, err := os.ReadFile(formatPath("caliper/lulesh-annotation-profile.cali"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(good), "\n"), "\n")
	with := func(line int, text string) []byte {
		l := append([]string(nil), lines...)
		l[line-1] = text
		return []byte(strings.Join(l, "\n"))
	}
	cases := []struct {
		name string
		data []byte
		line int
		want string
	}{
		{"empty", nil, 1, "empty file"},
		{"no value", with(3, "__rec=node,id=25,attr"), 3, "has no '=value'"},
		{"dangling escape", with(3, `__rec=node,id=25,attr=8,data=x\`), 3, "escape character"},
		{"undefined ref", with(17, "__rec=ctx,ref=4242,attr=97,data=1"), 17, "undefined node 4242"},
		{"unpaired data", with(17, "__rec=ctx,ref=155,attr=97=105,data=1"), 17, "2 attr= values but 1 data= values"},
		{"bad number", with(17, "__rec=ctx,ref=155,attr=111,data=fast"), 17, `sum#time.duration="fast" is not a number`},
		{"parent after child", with(16, "__rec=node,id=155,attr=20,data=main,parent=900"), 16, "not an earlier node"},
		{"unknown record", with(1, "__rec=frob,id=1"), 1, "unknown record type"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadCaliper(bytes.NewReader(tc.data), "bad.cali", "bad")
			var pe *tauprofile.ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("err = %v, want a *tauprofile.ParseError", err)
			}
			if pe.File != "bad.cali" || pe.Line != tc.line || !strings.Contains(pe.Msg, tc.want) {
				t.Errorf("err = %q (line %d); want line %d mentioning %q", err, pe.Line, tc.line, tc.want)
			}
		})
	}

	js := string(luleshJSONSplit(t, scanLulesh(t)))
	lineOf := func(sub string) int { return strings.Count(js[:strings.Index(js, sub)], "\n") + 1 }
	firstRow := "[\n      0,\n      0,"
	jcases := []struct {
		name string
		data string
		line int
		want string
	}{
		{"not an object", "[1, 2]", 1, "expected a json-split object"},
		{"syntax", strings.Replace(js, `"columns": [`, `"columns": [,`, 1), lineOf(`"columns": [`), "invalid character"},
		{"missing nodes", `{"data": [], "columns": [], "column_metadata": []}`, 1, `no "nodes" key`},
		{"bad path index", strings.Replace(js, firstRow, "[\n      77,\n      0,", 1), lineOf(firstRow), "path 77 is not a node index"},
		{"short row", strings.Replace(js, firstRow, "[\n      0,", 1), lineOf(firstRow), "has 3 cells, want 4"},
		{"trailing data", js + "{}", strings.Count(js, "\n") + 1, "unexpected data after"},
	}
	for _, tc := range jcases {
		t.Run("json "+tc.name, func(t *testing.T) {
			_, err := ReadCaliperJSON(strings.NewReader(tc.data), "bad.json", "bad")
			var pe *tauprofile.ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("err = %v, want a *tauprofile.ParseError", err)
			}
			if pe.File != "bad.json" || pe.Line != tc.line || !strings.Contains(pe.Msg, tc.want) {
				t.Errorf("err = %q (line %d); want line %d mentioning %q", err, pe.Line, tc.line, tc.want)
			}
		})
	}
}

func TestLoadPathErrors(t *testing.T) {
	cases := []struct {
		name, path, format, want string
	}{
		{"unknown format", formatPath("ppk/phases.ppk"), "gprof", `unknown format "gprof"`},
		{"tau for a file", formatPath("ppk/phases.ppk"), FormatTAU, "reads a directory"},
		{"ppk for a directory", formatPath("ppk"), FormatPPK, "a directory is read as"},
		{"missing", formatPath("nope.ppk"), "", "no such file"},
		{"wrong forced format", formatPath("ppk/phases.ppk"), FormatCaliper, "phases.ppk"},
		{"undetectable", formatPath("../formats/SOURCES.txt"), "", "cannot tell the profile format"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadPath(tc.path, tc.format)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}
