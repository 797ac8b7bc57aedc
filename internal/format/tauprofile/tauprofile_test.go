package tauprofile

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// profilesDir holds real TAU profile directories (see the TAUdb reference
// rows in internal/taudb/testdata/taudb-ref for where they come from).
var profilesDir = filepath.Join("testdata", "profiles")

const goodHead = "1 templated_functions_MULTI_TIME\n# Name Calls Subrs Excl Incl ProfileCalls # <metadata><attribute><name>Metric Name</name><value>TIME</value></attribute></metadata>\n"

func TestParseErrors(t *testing.T) {
	cases := []struct {
		name  string
		input string
		line  int
		want  string
	}{
		{"empty", "", 1, "unexpected end of file"},
		{"bad count", "x templated_functions_MULTI_TIME\n", 1, "<nfuncs> templated_functions"},
		{"not templated", "1 something\n", 1, "templated_functions"},
		{"bad line 2", "1 templated_functions_MULTI_TIME\n# Foo\n", 2, "# Name Calls Subrs Excl Incl ProfileCalls"},
		{"bad metadata", "1 templated_functions_MULTI_TIME\n# Name Calls Subrs Excl Incl ProfileCalls # <metadata><attribute><name>a</name></metadata>\n", 2, "metadata XML"},
		{"missing function", goodHead, 3, "function line 1 of 1"},
		{"unquoted name", goodHead + "main 1 0 1 1 0 GROUP=\"X\" \n", 3, "quoted name"},
		{"bad number", goodHead + "\"main\" 1 0 x 1 0 GROUP=\"X\" \n", 3, "number for excl"},
		{"too few numbers", goodHead + "\"main\" 1 0 GROUP=\"X\" \n", 3, "calls, subrs, excl, incl"},
		{"open group", goodHead + "\"main\" 1 0 1 1 0 GROUP=\"X \n", 3, "closing quote"},
		{"no aggregates", goodHead + "\"main\" 1 0 1 1 0 GROUP=\"X\" \n", 4, "aggregates"},
		{"bad aggregates", goodHead + "\"main\" 1 0 1 1 0 GROUP=\"X\" \nzero aggregates\n", 4, `count before "aggregates"`},
		{"bad userevents", goodHead + "\"main\" 1 0 1 1 0 GROUP=\"X\" \n0 aggregates\n1 events\n", 5, "<n> userevents"},
		{"missing event", goodHead + "\"main\" 1 0 1 1 0 GROUP=\"X\" \n0 aggregates\n1 userevents\n# eventname numevents max min mean sumsqr\n", 7, "user event line 1 of 1"},
		{"short event", goodHead + "\"main\" 1 0 1 1 0 GROUP=\"X\" \n0 aggregates\n1 userevents\n# eventname numevents max min mean sumsqr\n\"e\" 1 2 3\n", 7, "numevents max min mean sumsqr"},
		{"trailing text", goodHead + "\"main\" 1 0 1 1 0 GROUP=\"X\" \n0 aggregates\n0 userevents\n# eventname numevents max min mean sumsqr\nmore\n", 7, "end of file"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(strings.NewReader(tc.input), "profile.0.0.0")
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("err = %v, want a *ParseError", err)
			}
			if pe.File != "profile.0.0.0" || pe.Line != tc.line || !strings.Contains(pe.Msg, tc.want) {
				t.Errorf("err = %q (line %d), want line %d mentioning %q", err, pe.Line, tc.line, tc.want)
			}
		})
	}
}

func TestNoProfiles(t *testing.T) {
	_, err := ReadDir(t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "no profile.N.C.T files") {
		t.Errorf("err = %v", err)
	}
}

// TestReadDirFixture reads a real four-rank directory: one metric, the files
// in name order with their ranks from the names, each file's lines as written.
func TestReadDirFixture(t *testing.T) {
	sets, err := ReadDir(filepath.Join(profilesDir, "hatchet-tau-cpi-mpi"))
	if err != nil {
		t.Fatal(err)
	}
	if len(sets) != 1 || len(sets[0]) != 4 {
		t.Fatalf("got %d metric sets (first with %d files), want 1 set of 4", len(sets), len(sets[0]))
	}
	for i, p := range sets[0] {
		if p.Node != i || p.Context != 0 || p.Thread != 0 {
			t.Errorf("file %d is %d,%d,%d; want %d,0,0", i, p.Node, p.Context, p.Thread, i)
		}
		if p.MetricName() != "TIME" || p.Count != len(p.Functions) || p.NoMetadata {
			t.Errorf("file %d: metric %q, count %d for %d lines, no metadata %v", i, p.MetricName(), p.Count, len(p.Functions), p.NoMetadata)
		}
		if len(p.Metadata) == 0 || p.Metadata[0].Name != MetricNameKey {
			t.Errorf("file %d: first attribute %+v, want %q first", i, p.Metadata, MetricNameKey)
		}
	}
	if n := len(sets[0][0].Functions); n != 23 {
		t.Errorf("rank 0 has %d function lines, want 23", n)
	}
}

// TestParseKeepsSpelling checks that names keep TAU's blanks, the GROUP text
// is kept as written, and user events are read, on a real file.
func TestParseKeepsSpelling(t *testing.T) {
	path := filepath.Join(profilesDir, "tau2-examples-wrap", "profile.0.0.0")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Parse(bytes.NewReader(data), path)
	if err != nil {
		t.Fatal(err)
	}
	want := FunctionLine{Name: "int main(int, char **) C [{main.c} {5,1}-{17,1}]  ", Calls: 1, Subrs: 6, Exclusive: 51, Inclusive: 1049725, Groups: "TAU_DEFAULT"}
	if !reflect.DeepEqual(p.Functions[0], want) {
		t.Errorf("first function = %+v, want %+v", p.Functions[0], want)
	}
	if len(p.UserEvents) != 0 {
		t.Errorf("user events = %+v, want none", p.UserEvents)
	}

	path = filepath.Join(profilesDir, "hatchet-tau-cpi-mpi", "profile.0.0.0")
	if data, err = os.ReadFile(path); err != nil {
		t.Fatal(err)
	}
	if p, err = Parse(bytes.NewReader(data), path); err != nil {
		t.Fatal(err)
	}
	wantEv := UserEventLine{Name: "Message size for reduce", NumEvents: 1, Max: 8, Min: 8, Mean: 8, SumSquare: 64}
	if len(p.UserEvents) != 2 || p.UserEvents[1] != wantEv {
		t.Errorf("user events = %+v, want 2 ending with %+v", p.UserEvents, wantEv)
	}
}

func TestParseColumns(t *testing.T) {
	cases := []struct {
		name, line2, function string
		want                  FunctionLine
	}{
		{"negative times read as 0", ColumnsLine, `"f" 2 1 -5 -1E+03 0 GROUP="A | B" `,
			FunctionLine{Name: "f", Calls: 2, Subrs: 1, Groups: "A | B"}},
		{"no GROUP", ColumnsLine, `"f g" 1 0 1.5 2.5 0`,
			FunctionLine{Name: "f g", Calls: 1, Exclusive: 1.5, Inclusive: 2.5}},
		{"quote in name", ColumnsLine, `"a "b" c" 1 0 1 1 0 GROUP="X" `,
			FunctionLine{Name: `a "b" c`, Calls: 1, Exclusive: 1, Inclusive: 1, Groups: "X"}},
		{"SumExclSqr column", ColumnsLine + " SumExclSqr", `"f" 1 0 3 4 9 0 GROUP="X" `,
			FunctionLine{Name: "f", Calls: 1, Exclusive: 3, Inclusive: 4, SumExclSqr: ptr(9), Groups: "X"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := "1 templated_functions\n" + tc.line2 + "\n" + tc.function + "\n0 aggregates\n"
			p, err := Parse(strings.NewReader(in), "p")
			if err != nil {
				t.Fatal(err)
			}
			if !p.NoMetadata || len(p.Functions) != 1 || !reflect.DeepEqual(p.Functions[0], tc.want) {
				t.Errorf("got %+v (no metadata %v), want %+v", p.Functions, p.NoMetadata, tc.want)
			}
		})
	}
}

func ptr(v float64) *float64 { return &v }

func TestMetricName(t *testing.T) {
	cases := []struct {
		header string
		meta   []Attribute
		want   string
	}{
		{"templated_functions_MULTI_PAPI_TOT_CYC", nil, "PAPI_TOT_CYC"},
		{"templated_functions_MULTI_TIME", []Attribute{{Name: MetricNameKey, Value: "WALL"}}, "WALL"},
		{"templated_functions_hw_counters", nil, "Hardware Counter"},
		{"templated_functions", nil, "Time"},
	}
	for _, tc := range cases {
		if got := (&File{Header: tc.header, Metadata: tc.meta}).MetricName(); got != tc.want {
			t.Errorf("MetricName(%q, %v) = %q, want %q", tc.header, tc.meta, got, tc.want)
		}
	}
}

func TestNCT(t *testing.T) {
	cases := []struct {
		base    string
		n, c, t int
		ok      bool
	}{
		{"profile.3.0.1", 3, 0, 1, true},
		{"snapshot.12.1.7", 12, 1, 7, true},
		{"profile.0.0", 0, 0, 0, false},
		{"profile.-1.0.0", 0, 0, 0, false},
		{"profile.a.0.0", 0, 0, 0, false},
	}
	for _, tc := range cases {
		n, c, th, ok := NCT(tc.base)
		if n != tc.n || c != tc.c || th != tc.t || ok != tc.ok {
			t.Errorf("NCT(%q) = %d,%d,%d,%v; want %d,%d,%d,%v", tc.base, n, c, th, ok, tc.n, tc.c, tc.t, tc.ok)
		}
	}
}

// TestMetricDirs checks TAU's rule: profile files in the directory win, else
// its MULTI_ subdirectories in name order.
func TestMetricDirs(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"MULTI__TIME", "MULTI__PAPI_FP_OPS", "other"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	got, err := MetricDirs(dir)
	want := []string{filepath.Join(dir, "MULTI__PAPI_FP_OPS"), filepath.Join(dir, "MULTI__TIME")}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("MetricDirs = %v, %v; want %v", got, err, want)
	}
	if err := os.WriteFile(filepath.Join(dir, "profile.0.0.0"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := MetricDirs(dir); err != nil || !reflect.DeepEqual(got, []string{dir}) {
		t.Fatalf("with a profile file: MetricDirs = %v, %v; want [%s]", got, err, dir)
	}
}

// FuzzParse feeds arbitrary bytes to Parse, seeded with the real files: an
// error is a *ParseError naming the file and a line, or the file holds as
// many function lines as line 1 says, with no negative time.
func FuzzParse(f *testing.F) {
	files, err := filepath.Glob(filepath.Join(profilesDir, "*", "profile.*"))
	if err != nil || len(files) == 0 {
		f.Fatalf("no seed files: %v", err)
	}
	for _, p := range files {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse(bytes.NewReader(data), "fuzz-input")
		if err != nil {
			var pe *ParseError
			if errors.As(err, &pe) && (pe.File != "fuzz-input" || pe.Line < 1) {
				t.Fatalf("error names %q line %d: %v", pe.File, pe.Line, err)
			}
			if !strings.Contains(err.Error(), "fuzz-input") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		if len(p.Functions) != p.Count {
			t.Fatalf("%d function lines, line 1 says %d", len(p.Functions), p.Count)
		}
		for _, fl := range p.Functions {
			if fl.Exclusive < 0 || fl.Inclusive < 0 {
				t.Fatalf("negative time kept: %+v", fl)
			}
		}
	})
}
