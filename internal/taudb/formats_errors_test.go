package taudb

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"strings"
	"testing"
)

// TestPPKErrors damages the real DrawGraph-4.ppk (uncompressed) and checks
// that each error names the file and the byte offset of the damage.
func TestPPKErrors(t *testing.T) {
	good := gunzip(t, formatPath("ppk/DrawGraph-4.ppk"))
	put32 := func(off int, v uint32) []byte {
		b := bytes.Clone(good)
		binary.BigEndian.PutUint32(b[off:], v)
		return b
	}
	hsize := int(binary.BigEndian.Uint32(good[14:]))
	metricsAt := 18 + hsize // int32 metric count after the header
	cases := []struct {
		name   string
		data   []byte
		offset int64
		want   string
	}{
		{"empty", nil, 0, "unexpected end of data"},
		{"bad magic", append([]byte("PPK..."), good[6:]...), 0, `expected "PPK"`},
		{"bad version", put32(6, 9), 6, "ppk version 9"},
		{"newer compatibility", put32(10, 3), 10, "compatibility level 3"},
		{"header size", put32(14, uint32(hsize+4)), 18, "header size field says"},
		{"negative metric count", put32(metricsAt, 0xffffffff), int64(metricsAt), "metric count is -1"},
		{"truncated", good[:len(good)-3], int64(len(good) - 8), "unexpected end of data"},
		{"trailing byte", append(bytes.Clone(good), 0), int64(len(good)), "unexpected data after the last thread"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadPPK(bytes.NewReader(tc.data), "bad.ppk", "bad")
			var oe *OffsetError
			if !errors.As(err, &oe) {
				t.Fatalf("err = %v, want an *OffsetError", err)
			}
			if oe.File != "bad.ppk" || oe.Offset != tc.offset || !strings.Contains(oe.Msg, tc.want) {
				t.Errorf("err = %q; want offset %d mentioning %q", err, tc.offset, tc.want)
			}
			if !strings.Contains(err.Error(), "bad.ppk") {
				t.Errorf("err %q does not name the file", err)
			}
		})
	}
	t.Run("compressed offsets are uncompressed", func(t *testing.T) {
		data, err := os.ReadFile(formatPath("ppk/DrawGraph-4.ppk"))
		if err != nil {
			t.Fatal(err)
		}
		_, err = ReadPPK(bytes.NewReader(data[:len(data)-20]), "cut.ppk", "cut")
		if err == nil || !strings.Contains(err.Error(), "cut.ppk") {
			t.Fatalf("err = %v, want one naming cut.ppk", err)
		}
	})
}

// TestSnapshotXMLErrors damages lines of the real merged XML and checks the
// error names the file and line.
func TestSnapshotXMLErrors(t *testing.T) {
	good, err := os.ReadFile(formatPath("xml/tauprofile-weighted.xml"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(good), "\n")
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
		{"not xml", []byte("hello\n"), 1, "no <profile_xml>"},
		{"short interval line", with(346, "0 1 241 1620"), 346, "want 5 fields"},
		{"bad number", with(347, "1 266 0 x 48773"), 347, `"x" is not a number`},
		{"undefined event", with(348, "999 29 0 345 345"), 348, "event 999 is not defined"},
		{"bad atomic line", with(424, "0 62 920640 0"), 424, "want 6 fields"},
		{"unclosed element", []byte(strings.Join(lines[:400], "\n")), 400, "unexpected EOF"},
		{"thread without node", with(308, `<thread id="1.0.0.7935" context="0" thread="0">`), 308, "no node attribute"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadSnapshotXML(bytes.NewReader(tc.data), "bad.xml", "bad")
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("err = %v, want a *ParseError", err)
			}
			if pe.File != "bad.xml" || pe.Line != tc.line || !strings.Contains(pe.Msg, tc.want) {
				t.Errorf("err = %q (line %d); want line %d mentioning %q", err, pe.Line, tc.line, tc.want)
			}
		})
	}
}

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
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("err = %v, want a *ParseError", err)
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
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("err = %v, want a *ParseError", err)
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
