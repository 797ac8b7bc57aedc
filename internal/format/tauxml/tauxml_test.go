package tauxml

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/format/tauprofile"
)

// TestSnapshotXMLErrors damages lines of the real merged XML and checks the
// error names the file and line.
func TestSnapshotXMLErrors(t *testing.T) {
	good, err := os.ReadFile(filepath.Join("testdata", "tauprofile-weighted.xml"))
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
			_, err := Read(bytes.NewReader(tc.data), "bad.xml")
			var pe *tauprofile.ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("err = %v, want a *ParseError", err)
			}
			if pe.File != "bad.xml" || pe.Line != tc.line || !strings.Contains(pe.Msg, tc.want) {
				t.Errorf("err = %q (line %d); want line %d mentioning %q", err, pe.Line, tc.line, tc.want)
			}
		})
	}
}

// TestReadMerged reads TAU's real merged profile: 8 threads of one metric,
// each with its 79 events' lines in file order, thread 1.0.0's first line as
// written.
func TestReadMerged(t *testing.T) {
	path := filepath.Join("testdata", "tauprofile-weighted.xml")
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sets, err := Read(f, path)
	if err != nil {
		t.Fatal(err)
	}
	if len(sets) != 1 || len(sets[0]) != 8 {
		t.Fatalf("got %d metrics (first with %d threads), want 1 with 8", len(sets), len(sets[0]))
	}
	var rank1 *tauprofile.File
	for _, p := range sets[0] {
		if p.MetricName() != "TIME" || len(p.Functions) == 0 || len(p.Functions) > 79 {
			t.Errorf("thread %d: metric %q, %d function lines", p.Node, p.MetricName(), len(p.Functions))
		}
		if p.Node == 1 {
			rank1 = p
		}
	}
	if rank1 == nil {
		t.Fatal("no thread of node 1")
	}
	want := tauprofile.FunctionLine{Name: ".TAU application", Groups: "TAU_USER", Calls: 1, Subrs: 241, Exclusive: 1620, Inclusive: 13332019}
	if rank1.Functions[0] != want {
		t.Errorf("node 1 first line = %+v, want %+v", rank1.Functions[0], want)
	}
}

// snapshotDoc is one snapshot.0.0.0 with per-thread definitions, two
// snapshots of which the second must win, two metrics, a user event and a NUL
// between documents as in merged files.
const snapshotDoc = `<profile_xml>
<thread id="0.0.0.1" node="0" context="0" thread="0">
<metadata><attribute><name>Host</name><value>a</value></attribute></metadata>
</thread>
<definitions thread="0.0.0.1">
<metric id="0"><name>TIME</name></metric>
<metric id="1"><name>PAPI_FP_OPS</name></metric>
<event id="0"><name>main</name><group>TAU_USER</group></event>
</definitions>
<profile thread="0.0.0.1"><name>first</name>
<interval_data metrics="0 1">
0 1 0 5 5 50 50
</interval_data>
</profile>
</profile_xml>` + "\x00" + `<profile_xml>
<definitions thread="0.0.0.1">
<event id="1"><name>main =&gt; f</name><group>TAU_CALLPATH</group></event>
<userevent id="0"><name>bytes</name></userevent>
</definitions>
<profile thread="0.0.0.1"><name>final</name>
<interval_data metrics="0 1">
0 1 1 10 20 100 200
1 2 0 -3 10 100 100
</interval_data>
<atomic_data>
0 2 8 4 6 80
</atomic_data>
</profile>
</profile_xml>
`

func TestReadSnapshots(t *testing.T) {
	sets, err := Read(strings.NewReader(snapshotDoc), "snapshot.0.0.0")
	if err != nil {
		t.Fatal(err)
	}
	ev := []tauprofile.UserEventLine{{Name: "bytes", NumEvents: 2, Max: 8, Min: 4, Mean: 6, SumSquare: 80}}
	file := func(metric string, fs ...tauprofile.FunctionLine) []*tauprofile.File {
		return []*tauprofile.File{{Header: "templated_functions_MULTI_" + metric,
			Metadata:  []tauprofile.Attribute{{Name: tauprofile.MetricNameKey, Value: metric}, {Name: "Host", Value: "a"}},
			Functions: fs, UserEvents: ev}}
	}
	want := [][]*tauprofile.File{
		file("TIME", tauprofile.FunctionLine{Name: "main", Groups: "TAU_USER", Calls: 1, Subrs: 1, Exclusive: 10, Inclusive: 20},
			tauprofile.FunctionLine{Name: "main => f", Groups: "TAU_CALLPATH", Calls: 2, Exclusive: 0, Inclusive: 10}),
		file("PAPI_FP_OPS", tauprofile.FunctionLine{Name: "main", Groups: "TAU_USER", Calls: 1, Subrs: 1, Exclusive: 100, Inclusive: 200},
			tauprofile.FunctionLine{Name: "main => f", Groups: "TAU_CALLPATH", Calls: 2, Exclusive: 100, Inclusive: 100}),
	}
	if !reflect.DeepEqual(sets, want) {
		for m := range sets {
			for _, p := range sets[m] {
				t.Logf("metric %d: %+v", m, *p)
			}
		}
		t.Fatal("the last snapshot was not read as written")
	}
}

func TestReadDir(t *testing.T) {
	dir := t.TempDir()
	if _, err := ReadDir(dir); err == nil || !strings.Contains(err.Error(), "holds no snapshot.N.C.T files") {
		t.Fatalf("empty directory: err = %v", err)
	}
	for _, name := range []string{"snapshot.0.0.0", "profile.0.0.0", "snapshot.x"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(snapshotDoc), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	files, err := SnapshotFiles(dir)
	if err != nil || !reflect.DeepEqual(files, []string{filepath.Join(dir, "snapshot.0.0.0")}) {
		t.Fatalf("SnapshotFiles = %v, %v; want only snapshot.0.0.0", files, err)
	}
	sets, err := ReadDir(dir)
	if err != nil || len(sets) != 2 || len(sets[0]) != 1 {
		t.Fatalf("ReadDir = %d metrics, %v; want 2 of one thread", len(sets), err)
	}
}

// FuzzRead feeds bytes to Read, seeded with the real merged profile and a
// snapshot file: an error is a *ParseError naming the file and a line, or
// every file starts its metadata with its metric's name and has no negative
// time.
func FuzzRead(f *testing.F) {
	data, err := os.ReadFile(filepath.Join("testdata", "tauprofile-weighted.xml"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	f.Add([]byte(snapshotDoc))
	f.Fuzz(func(t *testing.T, data []byte) {
		sets, err := Read(bytes.NewReader(data), "fuzz-input")
		if err != nil {
			var pe *tauprofile.ParseError
			if errors.As(err, &pe) && pe.Line < 1 {
				t.Fatalf("line %d in %v", pe.Line, err)
			}
			if !strings.Contains(err.Error(), "fuzz-input") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		if len(sets) == 0 || len(sets[0]) == 0 {
			t.Fatalf("read without metrics or threads: %d metrics", len(sets))
		}
		for m, set := range sets {
			for _, p := range set {
				if len(p.Metadata) == 0 || p.Metadata[0].Name != tauprofile.MetricNameKey {
					t.Fatalf("metric %d: file without its metric name: %+v", m, p.Metadata)
				}
				for _, fl := range p.Functions {
					if fl.Exclusive < 0 || fl.Inclusive < 0 {
						t.Fatalf("negative time kept: %+v", fl)
					}
				}
			}
		}
	})
}
