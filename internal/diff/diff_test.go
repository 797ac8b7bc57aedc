package diff

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"flag"
	"image/png"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

func load(t *testing.T, path string) *Side {
	t.Helper()
	s, err := LoadPath(context.Background(), path, "")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// want is one row's expectation.
type want struct {
	name           string
	a, b           float64
	totalA, totalB float64
	nA, nB         int
	p              float64 // < 0: no test
	change         string
}

func checkRows(t *testing.T, got []Row, wants []want) {
	t.Helper()
	if len(got) < len(wants) {
		t.Fatalf("%d rows, want at least %d", len(got), len(wants))
	}
	for i, w := range wants {
		r := got[i]
		if r.Name != w.name {
			t.Errorf("row %d is %q, want %q", i, r.Name, w.name)
			continue
		}
		if !approx(r.A, w.a, 1e-9) || !approx(r.B, w.b, 1e-9) {
			t.Errorf("%s: A %v, B %v; want %v, %v", w.name, r.A, r.B, w.a, w.b)
		}
		if !approx(r.TotalA, w.totalA, 1e-12) || !approx(r.TotalB, w.totalB, 1e-12) {
			t.Errorf("%s: totals %v, %v; want %v, %v", w.name, r.TotalA, r.TotalB, w.totalA, w.totalB)
		}
		if r.ThreadsA != w.nA || r.ThreadsB != w.nB {
			t.Errorf("%s: threads %d, %d; want %d, %d", w.name, r.ThreadsA, r.ThreadsB, w.nA, w.nB)
		}
		if w.a != 0 && (r.Ratio == nil || !approx(*r.Ratio, w.b/w.a, 1e-9)) {
			t.Errorf("%s: ratio %v, want %v", w.name, r.Ratio, w.b/w.a)
		}
		switch {
		case w.p < 0 && r.Test != nil:
			t.Errorf("%s: tested (%+v), want no test", w.name, *r.Test)
		case w.p >= 0 && r.Test == nil:
			t.Errorf("%s: not tested, want p %v", w.name, w.p)
		case w.p >= 0 && !approx(r.Test.P, w.p, 1e-6):
			t.Errorf("%s: p %.10g, want %.10g", w.name, r.Test.P, w.p)
		}
		if r.Change != w.change {
			t.Errorf("%s: change %q, want %q", w.name, r.Change, w.change)
		}
	}
}

// TAU's LoadImbalance example at 16 and 32 ranks. The expected numbers were
// computed from the .ppk files by a separate decoder written in Python from
// the layout in TAU-FORMATS.md 3.2 (gzip, big-endian Java data stream): per
// function the mean over the threads with an entry, the sums, and Welch's
// p by numerical integration of Student's t density.
func TestLoadImbalancePPK(t *testing.T) {
	a, b := load(t, "testdata/loadimbalance/16.ppk"), load(t, "testdata/loadimbalance/32.ppk")
	if a.Kind != "ppk" || b.Kind != "ppk" {
		t.Errorf("kinds %q, %q; want ppk", a.Kind, b.Kind)
	}
	cases := []struct {
		name string
		opt  Options
		rows []want
	}{
		{"exclusive time", Options{}, []want{
			{"MPI_Sendrecv()", 35227067.62, 22694146.53, 563633082, 726212689, 16, 32, 0.1421271167, ChangeSame},
			{"MPI_Waitall()", 24474396.94, 15193218.66, 391590351, 486182997, 16, 32, 0.237444562, ChangeSame},
			{"MPI_Bcast()", 3068727.5, 3338044.906, 49099640, 106817437, 16, 32, 0.1998503297, ChangeSame},
			{"MPI_Recv()", 5078096.062, 4173994.281, 81249537, 133567817, 16, 32, 0.594578656, ChangeSame},
			{"MPI_Allreduce()", 753444.5625, 1226227.25, 12055113, 39239272, 16, 32, 0.1446911232, ChangeSame},
			{"MPI_Alltoallv()", 11992071.33, 8244850, 71952428, 98938200, 6, 12, 1.064495614e-05, ChangeDown},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Compare(a, b, tc.opt)
			if err != nil {
				t.Fatal(err)
			}
			if r.Count != 645 {
				t.Errorf("%d functions, want 645 (the distinct flat names of the two files)", r.Count)
			}
			checkRows(t, r.Functions, tc.rows)
		})
	}
	// Single functions under the other quantities (same decoder).
	one := []struct {
		name string
		opt  Options
		w    want
	}{
		{"inclusive", Options{Quantity: Inclusive}, want{"MPI_Finalize()", 351520.25, 519991.1562, 5624324, 16639717, 16, 32, -1, ""}},
		{"calls", Options{Quantity: Calls}, want{"MPI_Sendrecv()", 12760.9375, 13120.25, 204175, 419848, 16, 32, -1, ""}},
		{"calls without spread", Options{Quantity: Calls}, want{"MPI_Alltoallv()", 2002, 2002, 12012, 24024, 6, 12, 1, ChangeSame}},
	}
	for _, tc := range one {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Compare(a, b, tc.opt)
			if err != nil {
				t.Fatal(err)
			}
			row := find(t, r, tc.w.name)
			w := tc.w
			if w.p < 0 { // the test itself is checked elsewhere
				if row.Test == nil {
					t.Errorf("%s not tested", w.name)
				}
				w.p, w.change = row.Test.P, row.Change
			}
			checkRows(t, []Row{row}, []want{w})
		})
	}
	t.Run("gone", func(t *testing.T) {
		r, err := Compare(a, b, Options{})
		if err != nil {
			t.Fatal(err)
		}
		const gone = "real dd_dist2(t_pbc *, rvec *, const int *, int, int) C [{domdec_top.c} {896,1}-{910,1}]"
		if row := find(t, r, gone); row.Change != ChangeGone || row.ThreadsB != 0 || row.B != 0 {
			t.Errorf("%+v: want gone", row)
		}
	})
}

func find(t *testing.T, r *Result, name string) Row {
	t.Helper()
	for _, row := range r.Functions {
		if row.Name == name {
			return row
		}
	}
	t.Fatalf("no row %q", name)
	return Row{}
}

// Ranks 0-1 and ranks 2-3 of Hatchet's 4-rank cpi TAU profile, as two
// profile directories. Expected values by hand from the files' lines.
func TestTAUDirectories(t *testing.T) {
	a, b := load(t, "testdata/cpi-ranks01"), load(t, "testdata/cpi-ranks23")
	cases := []struct {
		name string
		opt  Options
		rows []want
	}{
		{"exclusive", Options{}, []want{
			{"MPI_Finalize()", 4676, 4904.5, 9352, 9809, 2, 2, 0.4850263565, ChangeSame},
			{"MPI_Reduce()", 258.5, 42.5, 517, 85, 2, 2, 0.4977347205, ChangeSame},
			{"MPI_Init()", 19712, 19525, 39424, 39050, 2, 2, 0.9323262127, ChangeSame},
			{"MPI_Info_create()", 599, 758.5, 1198, 1517, 2, 2, 0.6915176059, ChangeSame},
			{"MPI_File_open()", 27197, 27040, 54394, 54080, 2, 2, 0.6868296059, ChangeSame},
			{"MPI_Bcast()", 275.5, 412, 551, 824, 2, 2, 0.2507718026, ChangeSame},
		}},
		{"call paths", Options{CallPaths: true}, []want{
			{".TAU application => MPI_Finalize()", 4676, 4904.5, 9352, 9809, 2, 2, 0.4850263565, ChangeSame},
			{".TAU application => MPI_Reduce()", 258.5, 42.5, 517, 85, 2, 2, 0.4977347205, ChangeSame},
			{".TAU application => MPI_Init()", 19712, 19525, 39424, 39050, 2, 2, 0.9323262127, ChangeSame},
		}},
		{"Bcast beyond the spread at a loose level", Options{Alpha: 0.3}, []want{
			{"MPI_Finalize()", 4676, 4904.5, 9352, 9809, 2, 2, 0.4850263565, ChangeSame},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Compare(a, b, tc.opt)
			if err != nil {
				t.Fatal(err)
			}
			checkRows(t, r.Functions, tc.rows)
			if tc.opt.Alpha == 0.3 {
				if row := find(t, r, "MPI_Bcast()"); row.Change != ChangeUp {
					t.Errorf("MPI_Bcast() at alpha 0.3: %q, want up (p 0.25)", row.Change)
				}
			}
		})
	}
	// .TAU application's inclusive time: 51781, 55329 against 54029, 52908.
	r, err := Compare(a, b, Options{Quantity: Inclusive})
	if err != nil {
		t.Fatal(err)
	}
	row := find(t, r, ".TAU application")
	if row.A != 53555 || row.B != 53468.5 || row.Impact != 173 {
		t.Errorf(".TAU application inclusive: A %v B %v impact %v; want 53555, 53468.5, 173", row.A, row.B, row.Impact)
	}
}

func TestCompareErrors(t *testing.T) {
	a, b := load(t, "testdata/cpi-ranks01"), load(t, "testdata/cpi-ranks23")
	cases := []struct {
		name string
		opt  Options
		want string
	}{
		{"anomalies of TAU profiles", Options{Quantity: Anomalies}, "has no anomaly counts"},
		{"unknown metric", Options{Metric: "PAPI_TOT_CYC"}, `metric "PAPI_TOT_CYC"`},
		{"unknown quantity", Options{Quantity: "median"}, `unknown quantity "median"`},
		{"bad alpha", Options{Alpha: 2}, "between 0 and 1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Compare(a, b, tc.opt)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestParseOperand(t *testing.T) {
	cases := []struct {
		name, in string
		want     Operand
		err      string
	}{
		{"existing path", "testdata/cpi-ranks01", Operand{Path: "testdata/cpi-ranks01"}, ""},
		{"trial id", "taudb:42", Operand{Trial: "42"}, ""},
		{"trial name", "taudb:nightly 4", Operand{Trial: "nightly 4"}, ""},
		{"forced format", "ppk:run1.dat", Operand{Path: "run1.dat", Format: "ppk"}, ""},
		{"forced run", "run:out/r1", Operand{Path: "out/r1", Format: "run"}, ""},
		{"unknown prefix is a path", "c:/x", Operand{Path: "c:/x"}, ""},
		{"empty", "", Operand{}, "empty operand"},
		{"taudb without trial", "taudb:", Operand{}, "name the trial"},
		{"format without path", "xml:", Operand{}, "a path must follow"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseOperand(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("ParseOperand(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			}
		})
	}
}

func FuzzParseOperand(f *testing.F) {
	for _, s := range []string{"testdata/loadimbalance/16.ppk", "taudb:7", "taudb:name", "xml:tauprofile.xml", "run:kipimo-out/run-1", ":", "caliper-json:"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		op, err := ParseOperand(s)
		if err != nil {
			return
		}
		if (op.Trial == "") == (op.Path == "") {
			t.Fatalf("%q: %+v names neither or both a trial and a path", s, op)
		}
		if op.Trial != "" && s != TAUdbPrefix+op.Trial && op.Path == "" {
			t.Fatalf("%q: trial %q is not the text after %s", s, op.Trial, TAUdbPrefix)
		}
		if op.Format != "" && s != op.Format+":"+op.Path {
			t.Fatalf("%q: format %q and path %q do not make the operand", s, op.Format, op.Path)
		}
	})
}

// golden compares got with testdata/<name>, or rewrites it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s (run with -update after checking):\n%s", path, got)
	}
}

func TestGoldenOutput(t *testing.T) {
	a, b := load(t, "testdata/loadimbalance/16.ppk"), load(t, "testdata/loadimbalance/32.ppk")
	cases := []struct {
		name string
		opt  Options
		top  int
	}{
		{"loadimbalance-exclusive", Options{}, 10},
		{"loadimbalance-calls", Options{Quantity: Calls}, 5},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Compare(a, b, tc.opt)
			if err != nil {
				t.Fatal(err)
			}
			r.Top(tc.top)
			var txt, js bytes.Buffer
			if err := WriteText(&txt, r); err != nil {
				t.Fatal(err)
			}
			if err := WriteJSON(&js, r); err != nil {
				t.Fatal(err)
			}
			golden(t, tc.name+".txt", txt.Bytes())
			golden(t, tc.name+".json", js.Bytes())
			// The JSON document has the promised shape.
			var doc struct {
				Functions []map[string]any `json:"functions"`
			}
			if err := json.Unmarshal(js.Bytes(), &doc); err != nil {
				t.Fatal(err)
			}
			if len(doc.Functions) != tc.top {
				t.Fatalf("%d functions in the JSON, want %d", len(doc.Functions), tc.top)
			}
			for _, f := range doc.Functions {
				for _, k := range []string{"name", "a", "b", "ratio"} {
					if _, ok := f[k]; !ok {
						t.Errorf("function %v has no %q", f["name"], k)
					}
				}
			}
		})
	}
}

// svgDoc is what the chart test reads of an SVG file.
type svgNode struct {
	XMLName xml.Name
	Style   string    `xml:"style,attr"`
	Text    string    `xml:",chardata"`
	Nodes   []svgNode `xml:",any"`
}

func (n *svgNode) walk(fn func(*svgNode)) {
	fn(n)
	for i := range n.Nodes {
		n.Nodes[i].walk(fn)
	}
}

func TestChart(t *testing.T) {
	a, b := load(t, "testdata/loadimbalance/16.ppk"), load(t, "testdata/loadimbalance/32.ppk")
	r, err := Compare(a, b, Options{})
	if err != nil {
		t.Fatal(err)
	}
	r.Top(8)
	var buf bytes.Buffer
	if err := WriteChart(&buf, r, "svg"); err != nil {
		t.Fatal(err)
	}
	var doc svgNode
	if err := xml.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatalf("the SVG does not parse as XML: %v", err)
	}
	if doc.XMLName.Local != "svg" {
		t.Fatalf("root element %q, want svg", doc.XMLName.Local)
	}
	fillA, fillB := "fill:#4C72B0", "fill:#DD8452"
	var barsA, barsB int
	var texts []string
	doc.walk(func(n *svgNode) {
		switch n.XMLName.Local {
		case "path":
			if strings.Contains(n.Style, fillA) {
				barsA++
			}
			if strings.Contains(n.Style, fillB) {
				barsB++
			}
		case "text":
			texts = append(texts, strings.TrimSpace(n.Text))
		}
	})
	// One bar per function and side, plus each side's legend swatch.
	if barsA != 8+1 || barsB != 8+1 {
		t.Errorf("%d A and %d B filled paths, want 9 each (8 bars and a legend swatch)", barsA, barsB)
	}
	labels := strings.Join(texts, "\n")
	for _, l := range []string{"MPI_Sendrecv()", "MPI_Alltoallv()", "int nsgrid_core()", "A", "B", "mean exclusive TIME per thread (s)"} {
		if !strings.Contains(labels, l) {
			t.Errorf("no text %q in the chart; texts:\n%s", l, labels)
		}
	}

	buf.Reset()
	if err := WriteChart(&buf, r, "png"); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&buf)
	if err != nil {
		t.Fatalf("the PNG does not decode: %v", err)
	}
	if w := img.Bounds().Dx(); w < 600 {
		t.Errorf("PNG width %d, want a readable chart", w)
	}
	if err := WriteChart(io.Discard, &Result{}, "svg"); err == nil {
		t.Error("an empty result drew a chart")
	}
}

// Every file format reads through LoadPath and compares equal with itself;
// a .ppk under another name reads with the ppk: prefix. The XML file
// defines 79 events (grep '<event id=' on it), all flat.
func TestFormats(t *testing.T) {
	renamed := filepath.Join(t.TempDir(), "16.dat")
	data, err := os.ReadFile("testdata/loadimbalance/16.ppk")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(renamed, data, 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, operand, kind string
		count               int // 0: not checked
	}{
		{"merged XML", "testdata/formats/tauprofile-weighted.xml", "xml", 79},
		{"Caliper region profile", "testdata/formats/lulesh-annotation-profile.cali", "caliper", 0},
		{"ppk under another name", "ppk:" + renamed, "ppk", 645},
		{"TAU directory", "tau:testdata/cpi-ranks01", "tau", 12},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			op, err := ParseOperand(tc.operand)
			if err != nil {
				t.Fatal(err)
			}
			s, err := LoadPath(context.Background(), op.Path, op.Format)
			if err != nil {
				t.Fatal(err)
			}
			if s.Kind != tc.kind {
				t.Errorf("kind %q, want %q", s.Kind, tc.kind)
			}
			r, err := Compare(s, s, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if tc.count != 0 && r.Count != tc.count {
				t.Errorf("%d functions, want %d", r.Count, tc.count)
			}
			if r.Count == 0 {
				t.Fatal("no functions")
			}
			for _, row := range r.Functions {
				if row.A != row.B || row.Impact != 0 || (row.Change != ChangeSame && row.Change != ChangeUntested) {
					t.Errorf("%s: %+v, want no change against itself", row.Name, row)
				}
			}
		})
	}
	if _, err := LoadPath(context.Background(), "testdata/cpi-ranks01/profile.0.0.0", ""); err == nil || !strings.Contains(err.Error(), "FORMAT:PATH") {
		t.Errorf("a single profile file: error %v, want one naming FORMAT:PATH", err)
	}
}
