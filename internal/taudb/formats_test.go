package taudb

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"encoding/json"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// formatFixtures are the real files of each format under testdata/formats
// (SOURCES.txt says where each comes from).
var formatFixtures = []struct {
	name, path, format string
}{
	{"ppk-drawgraph-4", "ppk/DrawGraph-4.ppk", FormatPPK},
	{"ppk-wrf-callpath", "ppk/wrf-callpath.ppk", FormatPPK},
	{"ppk-matmult", "ppk/matmult.ppk", FormatPPK},
	{"ppk-loadimbalance-16", "ppk/LoadImbalance-16.ppk", FormatPPK},
	{"ppk-loadimbalance-32", "ppk/LoadImbalance-32.ppk", FormatPPK},
	{"ppk-phases", "ppk/phases.ppk", FormatPPK},
	{"xml-merged-weighted", "xml/tauprofile-weighted.xml", FormatXML},
	{"caliper-lulesh", "caliper/lulesh-annotation-profile.cali", FormatCaliper},
}

// formatDirs says where each format's real files are: the ppk and TAU XML
// ones next to their readers under internal/format.
var formatDirs = map[string]string{
	"ppk": filepath.Join("..", "format", "ppk", "testdata"),
	"xml": filepath.Join("..", "format", "tauxml", "testdata"),
}

// profilesDir holds the real TAU profile directories, next to their reader.
var profilesDir = filepath.Join("..", "format", "tauprofile", "testdata", "profiles")

// formatPath is the path of fixture p ("ppk/phases.ppk", "caliper/...").
func formatPath(p string) string {
	if kind, rest, _ := strings.Cut(p, "/"); formatDirs[kind] != "" {
		return filepath.Join(formatDirs[kind], rest)
	}
	return filepath.Join("testdata", "formats", p)
}

func loadFixture(t testing.TB, path, format string) *Trial {
	t.Helper()
	tr, err := LoadPath(formatPath(path), format)
	if err != nil {
		t.Fatalf("LoadPath(%s, %q): %v", path, format, err)
	}
	return tr
}

func TestDetectFormat(t *testing.T) {
	for _, fx := range formatFixtures {
		t.Run(fx.name, func(t *testing.T) {
			got, err := DetectFormat(formatPath(fx.path))
			if err != nil || got != fx.format {
				t.Fatalf("DetectFormat = %q, %v; want %q", got, err, fx.format)
			}
		})
	}
	t.Run("tau-directory", func(t *testing.T) {
		if got, err := DetectFormat(filepath.Join(profilesDir, "hatchet-tau-cpi-mpi")); err != nil || got != FormatTAU {
			t.Fatalf("DetectFormat = %q, %v; want tau", got, err)
		}
	})
	t.Run("uncompressed-ppk", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "plain.ppk")
		if err := os.WriteFile(p, gunzip(t, formatPath("ppk/DrawGraph-4.ppk")), 0o644); err != nil {
			t.Fatal(err)
		}
		if got, err := DetectFormat(p); err != nil || got != FormatPPK {
			t.Fatalf("DetectFormat = %q, %v; want ppk", got, err)
		}
	})
}

func gunzip(t testing.TB, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// handPPK is a ppk decoded in the test, field by field with encoding/binary,
// independently of ReadPPK.
type handPPK struct {
	headerThreads int
	metrics       []string
	funcs         []string
	funcGroups    [][]int
	groups        []string
	events        []string
	threads       []handPPKThread
}

type handPPKThread struct {
	n, c, t int32
	funcs   []handPPKFunc
	events  []handPPKEvent
}

type handPPKFunc struct {
	idx          int32
	calls, subrs float64
	vals         []float64 // excl, incl per metric
}

type handPPKEvent struct {
	idx                   int32
	n                     int32
	min, max, mean, sumsq float64
}

func decodePPKByHand(t *testing.T, data []byte) handPPK {
	t.Helper()
	r := bytes.NewReader(data)
	i32 := func() int32 {
		var v int32
		if err := binary.Read(r, binary.BigEndian, &v); err != nil {
			t.Fatalf("hand decode: %v", err)
		}
		return v
	}
	f64 := func() float64 {
		var v float64
		if err := binary.Read(r, binary.BigEndian, &v); err != nil {
			t.Fatalf("hand decode: %v", err)
		}
		return v
	}
	str := func() string {
		var n uint16
		if err := binary.Read(r, binary.BigEndian, &n); err != nil {
			t.Fatalf("hand decode: %v", err)
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(r, b); err != nil {
			t.Fatalf("hand decode: %v", err)
		}
		return string(b) // the fixtures' names are ASCII
	}
	var h handPPK
	r.Seek(6+4+4, io.SeekStart) // "PPK", version, compatibility
	hsize := i32()
	r.Seek(int64(hsize), io.SeekCurrent)
	// Back to read the header's thread count: skip field, trial metadata.
	r.Seek(6+4+4+4, io.SeekStart)
	i32()
	for n := i32(); n > 0; n-- {
		str()
		str()
	}
	h.headerThreads = int(i32())
	r.Seek(6+4+4+4+int64(hsize), io.SeekStart)
	for n := i32(); n > 0; n-- {
		h.metrics = append(h.metrics, str())
	}
	for n := i32(); n > 0; n-- {
		h.groups = append(h.groups, str())
	}
	for n := i32(); n > 0; n-- {
		h.funcs = append(h.funcs, str())
		var gs []int
		for g := i32(); g > 0; g-- {
			gs = append(gs, int(i32()))
		}
		h.funcGroups = append(h.funcGroups, gs)
	}
	for n := i32(); n > 0; n-- {
		h.events = append(h.events, str())
	}
	for n := i32(); n > 0; n-- {
		th := handPPKThread{n: i32(), c: i32(), t: i32()}
		for k := i32(); k > 0; k-- {
			f := handPPKFunc{idx: i32(), calls: f64(), subrs: f64()}
			for range h.metrics {
				f.vals = append(f.vals, f64(), f64())
			}
			th.funcs = append(th.funcs, f)
		}
		for k := i32(); k > 0; k-- {
			th.events = append(th.events, handPPKEvent{idx: i32(), n: i32(), min: f64(), max: f64(), mean: f64(), sumsq: f64()})
		}
		h.threads = append(h.threads, th)
	}
	if r.Len() != 0 {
		t.Fatalf("hand decode left %d bytes", r.Len())
	}
	return h
}

func relClose(a, b float64) bool {
	return a == b || math.Abs(a-b) <= 1e-12*math.Max(math.Abs(a), math.Abs(b))
}

// TestPPKAgainstHandDecode compares ReadPPK's trial with the file decoded by
// hand: thread count from the header, metric names, every function value of
// the first and last thread, every user event, and the TOTAL thread against
// sums over the hand-decoded threads.
func TestPPKAgainstHandDecode(t *testing.T) {
	for _, fx := range formatFixtures {
		if fx.format != FormatPPK {
			continue
		}
		t.Run(fx.name, func(t *testing.T) {
			h := decodePPKByHand(t, gunzip(t, formatPath(fx.path)))
			tr := loadFixture(t, fx.path, "")
			if tr.TotalThreads != h.headerThreads || len(h.threads) != h.headerThreads {
				t.Fatalf("threads: trial %d, header %d, data %d", tr.TotalThreads, h.headerThreads, len(h.threads))
			}
			if len(tr.Metrics) != len(h.metrics) {
				t.Fatalf("metrics: %d, file %d", len(tr.Metrics), len(h.metrics))
			}
			for i, m := range h.metrics {
				if tr.Metrics[i].Name != m {
					t.Errorf("metric %d = %q, file %q", i, tr.Metrics[i].Name, m)
				}
			}
			derivedGroup := func(fi int32) bool {
				for _, g := range h.funcGroups[fi] {
					if h.groups[g] == "TAU_CALLPATH_DERIVED" {
						return true
					}
				}
				return false
			}
			total := map[string][]float64{} // callpath -> calls, excl0, incl0
			for ti, th := range h.threads {
				got := tr.Thread(ti)
				if got == nil || got.NodeRank != int(th.n) || got.ContextRank != int(th.c) || got.ThreadRank != int(th.t) {
					t.Fatalf("thread %d: got %v, file %d,%d,%d", ti, got, th.n, th.c, th.t)
				}
				check := ti == 0 || ti == len(h.threads)-1
				for _, f := range th.funcs {
					if derivedGroup(f.idx) {
						continue
					}
					name := NormalizeName(h.funcs[f.idx])
					s := total[name]
					if s == nil {
						s = make([]float64, 3)
						total[name] = s
					}
					if f.calls > 0 {
						s[0] += f.calls
						s[1] += f.vals[0]
						s[2] += f.vals[1]
					}
					if !check {
						continue
					}
					c := tr.Callpath(name)
					if c == nil {
						t.Fatalf("function %q not in the trial", name)
					}
					d := got.CallDataFor(c)
					if d == nil || d.Calls != f.calls || d.Subroutines != f.subrs {
						t.Fatalf("thread %d %q: call data %+v, file calls %v subrs %v", ti, name, d, f.calls, f.subrs)
					}
					for mi, m := range tr.Metrics {
						v := d.Value(m)
						if v == nil || v.Exclusive != f.vals[2*mi] || v.Inclusive != f.vals[2*mi+1] {
							t.Errorf("thread %d %q %s: %+v, file excl %v incl %v", ti, name, m.Name, v, f.vals[2*mi], f.vals[2*mi+1])
						}
					}
				}
				if len(got.CounterValues) != len(th.events) {
					t.Errorf("thread %d: %d user events, file %d", ti, len(got.CounterValues), len(th.events))
				}
				for _, e := range th.events {
					v := got.CounterValueFor(tr.Counter(NormalizeName(h.events[e.idx])))
					if v == nil || v.SampleCount != float64(e.n) || v.Minimum != e.min || v.Maximum != e.max || v.Mean != e.mean || v.SumSquares != e.sumsq {
						t.Errorf("thread %d event %q: %+v, file %+v", ti, h.events[e.idx], v, e)
					}
				}
			}
			tot := tr.Thread(Total)
			for name, s := range total {
				d := tot.CallDataFor(tr.Callpath(name))
				if s[0] == 0 {
					continue
				}
				if d == nil || d.Calls != math.Trunc(s[0]) || !relClose(d.Values[0].Exclusive, s[1]) || !relClose(d.Values[0].Inclusive, s[2]) {
					t.Errorf("TOTAL %q: %+v, sums from the file calls %v excl %v incl %v", name, d, s[0], s[1], s[2])
				}
			}
		})
	}
}

// TestPPKShapes pins the shapes a reader of the PerfExplorer examples sees:
// the counts are those of the hand decode above (threads from the header).
func TestPPKShapes(t *testing.T) {
	cases := []struct {
		path             string
		threads, metrics int
	}{
		{"ppk/DrawGraph-4.ppk", 4, 1},
		{"ppk/LoadImbalance-16.ppk", 16, 1},
		{"ppk/LoadImbalance-32.ppk", 32, 1},
		{"ppk/matmult.ppk", 24, 1},
		{"ppk/phases.ppk", 1, 1},
		{"ppk/wrf-callpath.ppk", 16, 1},
	}
	for _, tc := range cases {
		t.Run(tc.path, func(t *testing.T) {
			h := decodePPKByHand(t, gunzip(t, formatPath(tc.path)))
			if h.headerThreads != tc.threads || len(h.metrics) != tc.metrics {
				t.Fatalf("hand decode: %d threads %d metrics, want %d %d", h.headerThreads, len(h.metrics), tc.threads, tc.metrics)
			}
			// Uncompressed, the same stream gives the same trial.
			plain, err := ReadPPK(bytes.NewReader(gunzip(t, formatPath(tc.path))), tc.path, "plain")
			if err != nil {
				t.Fatal(err)
			}
			gz := loadFixture(t, tc.path, FormatPPK)
			if plain.TotalThreads != gz.TotalThreads || len(plain.Callpaths) != len(gz.Callpaths) || len(plain.Counters) != len(gz.Counters) {
				t.Errorf("uncompressed read differs: %d/%d threads, %d/%d call paths", plain.TotalThreads, gz.TotalThreads, len(plain.Callpaths), len(gz.Callpaths))
			}
		})
	}
}

var (
	xmlThreadRe  = regexp.MustCompile(`<thread id="([^"]+)" node="(\d+)" context="(\d+)" thread="(\d+)">`)
	xmlEventRe   = regexp.MustCompile(`<event id="(\d+)"><name>(.*)</name><group>(.*)</group></event>`)
	xmlUserRe    = regexp.MustCompile(`<userevent id="(\d+)"><name>(.*)</name></userevent>`)
	xmlProfileRe = regexp.MustCompile(`<profile thread="([^"]+)">`)
	xmlDerivedRe = regexp.MustCompile(`<derivedprofile derivedentity="([^"]+)">`)
)

func xmlUnescape(s string) string {
	return strings.NewReplacer("&gt;", ">", "&lt;", "<", "&amp;", "&", "&quot;", `"`, "&apos;", "'").Replace(s)
}

// TestMergedXMLAgainstLineScan reads the merged XML line by line with
// regular expressions (not an XML parser) and checks thread, event and user
// event counts, each thread's interval lines, and every timer of the TOTAL
// and mean (nulls as 0) threads against the derived profiles TAU wrote into
// the same file ("total", "mean_all").
func TestMergedXMLAgainstLineScan(t *testing.T) {
	f, err := os.Open(formatPath("xml/tauprofile-weighted.xml"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	threads := map[string][3]int{}
	events := map[int]string{}
	userNames := map[string]bool{}
	lines := map[string]int{}   // thread id -> interval lines
	atomics := map[string]int{} // thread id -> atomic lines
	derived := map[string][][]float64{}
	var cur, section string
	for sc.Scan() {
		l := strings.Trim(sc.Text(), "\x00 ")
		switch {
		case xmlThreadRe.MatchString(l):
			m := xmlThreadRe.FindStringSubmatch(l)
			n, _ := strconv.Atoi(m[2])
			c, _ := strconv.Atoi(m[3])
			th, _ := strconv.Atoi(m[4])
			threads[m[1]] = [3]int{n, c, th}
		case xmlEventRe.MatchString(l):
			m := xmlEventRe.FindStringSubmatch(l)
			id, _ := strconv.Atoi(m[1])
			events[id] = xmlUnescape(m[2])
		case xmlUserRe.MatchString(l):
			userNames[NormalizeName(xmlUnescape(xmlUserRe.FindStringSubmatch(l)[2]))] = true
		case xmlProfileRe.MatchString(l):
			cur = xmlProfileRe.FindStringSubmatch(l)[1]
		case xmlDerivedRe.MatchString(l):
			cur = "derived:" + xmlDerivedRe.FindStringSubmatch(l)[1]
		case strings.HasPrefix(l, "<interval_data") || strings.HasPrefix(l, "<derivedinterval_data"):
			section = "interval"
		case strings.HasPrefix(l, "<atomic_data"):
			section = "atomic"
		case strings.HasPrefix(l, "</"):
			section = ""
		case section != "" && l != "":
			if section == "atomic" {
				atomics[cur]++
				continue
			}
			if strings.HasPrefix(cur, "derived:") {
				var row []float64
				for _, x := range strings.Fields(l) {
					v, _ := strconv.ParseFloat(x, 64)
					row = append(row, v)
				}
				derived[cur] = append(derived[cur], row)
				continue
			}
			lines[cur]++
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	tr := loadFixture(t, "xml/tauprofile-weighted.xml", "")
	if tr.TotalThreads != len(threads) || len(threads) != 8 {
		t.Fatalf("threads: trial %d, file %d (want 8)", tr.TotalThreads, len(threads))
	}
	if len(tr.Timers) != len(events) {
		t.Errorf("timers: %d, file defines %d events", len(tr.Timers), len(events))
	}
	if len(tr.Counters) != len(userNames) {
		t.Errorf("counters: %d, file defines %d distinct user event names", len(tr.Counters), len(userNames))
	}
	for id, nct := range threads {
		th := tr.Thread(nct[0]) // one context and thread per node in this file
		if th == nil {
			t.Fatalf("thread %s missing", id)
		}
		if len(th.CallData) != lines[id] {
			t.Errorf("thread %s: %d timers, file has %d interval lines", id, len(th.CallData), lines[id])
		}
		if atomics[id] == 0 {
			t.Errorf("thread %s: the file has no atomic data lines", id)
		}
	}
	check := func(entity string, idx int) {
		rows := derived["derived:"+entity]
		if len(rows) != len(events) {
			t.Fatalf("%s: %d derived lines, %d events", entity, len(rows), len(events))
		}
		th := tr.Thread(idx)
		for _, r := range rows {
			name := NormalizeName(events[int(r[0])])
			d := th.CallDataFor(tr.Callpath(name))
			if d == nil {
				t.Errorf("%s %q: no call data", entity, name)
				continue
			}
			v := d.Values[0]
			if !relClose(d.Calls, math.Trunc(r[1])) || !relClose(v.Exclusive, r[3]) || !relClose(v.Inclusive, r[4]) {
				t.Errorf("%s %q: calls %v excl %v incl %v; TAU wrote calls %v excl %v incl %v", entity, name, d.Calls, v.Exclusive, v.Inclusive, r[1], r[3], r[4])
			}
		}
	}
	check("total", Total)
	check("mean_all", MeanWithNulls)
	// nCells differs from rank to rank: one thread-level row per thread,
	// with the values of the file's <thread> blocks.
	nCells := map[int]string{}
	for _, m := range tr.SecondaryMetadata {
		if m.Name == "nCells" {
			nCells[m.Thread.Index] = m.Value
		}
	}
	if len(nCells) != 8 || nCells[1] != "371" || nCells[2] != "317" || nCells[3] != "289" {
		t.Errorf("nCells rows %v; want 8, with 371, 317, 289 on threads 1, 2, 3", nCells)
	}
}

// caliScan is the lulesh .cali read in the test with plain string splitting
// (the file has no escaped characters): per region path, the
// sum#time.duration and count of its snapshot record.
type caliScan struct {
	paths  [][]string
	sum    map[string]float64 // path joined by " => " -> seconds
	count  map[string]float64
	groups map[string]string // region name -> attribute
}

func scanLulesh(t testing.TB) caliScan {
	t.Helper()
	data, err := os.ReadFile(formatPath("caliper/lulesh-annotation-profile.cali"))
	if err != nil {
		t.Fatal(err)
	}
	type node struct{ attr, data, parent string }
	nodes := map[string]node{}
	attrName := map[string]string{}
	s := caliScan{sum: map[string]float64{}, count: map[string]float64{}, groups: map[string]string{}}
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		kv := map[string]string{}
		for _, f := range strings.Split(l, ",") {
			k, v, _ := strings.Cut(f, "=")
			kv[k] = v
		}
		switch kv["__rec"] {
		case "node":
			nodes[kv["id"]] = node{kv["attr"], kv["data"], kv["parent"]}
			if kv["attr"] == "8" {
				attrName[kv["id"]] = kv["data"]
			}
		case "ctx":
			var path []string
			for id := kv["ref"]; id != ""; id = nodes[id].parent {
				if a := attrName[nodes[id].attr]; a == "function" || a == "loop" {
					path = append([]string{nodes[id].data}, path...)
					s.groups[nodes[id].data] = a
				}
			}
			if len(path) == 0 {
				continue
			}
			attrs, vals := strings.Split(kv["attr"], "="), strings.Split(kv["data"], "=")
			key := strings.Join(path, " => ")
			s.paths = append(s.paths, path)
			for i, a := range attrs {
				v, _ := strconv.ParseFloat(vals[i], 64)
				switch attrName[a] {
				case "sum#time.duration":
					s.sum[key] += v
				case "count":
					s.count[key] += v
				}
			}
		}
	}
	return s
}

// TestCaliperAgainstScan checks every call path's exclusive time, inclusive
// time (summed over its subtree here) and calls against the scan, and the
// flat timers against sums over the paths ending in them.
func TestCaliperAgainstScan(t *testing.T) {
	s := scanLulesh(t)
	// 20 snapshot records, one of them (ref=28) outside any region.
	if len(s.paths) != 19 {
		t.Fatalf("scan found %d region records, want the file's 19", len(s.paths))
	}
	tr := loadFixture(t, "caliper/lulesh-annotation-profile.cali", "")
	checkCaliperTrial(t, tr, s)
}

func checkCaliperTrial(t *testing.T, tr *Trial, s caliScan) {
	t.Helper()
	if tr.TotalThreads != 1 || len(tr.Metrics) != 1 || tr.Metrics[0].Name != "TIME" {
		t.Fatalf("trial: %d threads, metrics %v; want 1 thread and TIME", tr.TotalThreads, tr.Metrics)
	}
	th := tr.Thread(0)
	incl := func(key string) float64 {
		var sum float64
		for k, v := range s.sum {
			if k == key || strings.HasPrefix(k, key+" => ") {
				sum += v
			}
		}
		return sum * 1e6
	}
	flatExcl := map[string]float64{}
	for _, p := range s.paths {
		key := strings.Join(p, " => ")
		leaf := p[len(p)-1]
		flatExcl[leaf] += s.sum[key] * 1e6
		if len(p) == 1 {
			continue
		}
		c := tr.Callpath(key)
		if c == nil {
			t.Fatalf("call path %q missing", key)
		}
		d := th.CallDataFor(c)
		if d == nil || d.Calls != s.count[key] || !relClose(d.Values[0].Exclusive, s.sum[key]*1e6) || !relClose(d.Values[0].Inclusive, incl(key)) {
			t.Errorf("%q: %+v %+v; scan calls %v excl %v incl %v", key, d, d.Values[0], s.count[key], s.sum[key]*1e6, incl(key))
		}
	}
	if len(tr.Timers) != len(flatExcl) {
		t.Errorf("timers: %d, regions in the file %d", len(tr.Timers), len(flatExcl))
	}
	for name, excl := range flatExcl {
		tm := tr.Timer(name)
		if tm == nil {
			t.Fatalf("timer %q missing", name)
		}
		if len(tm.Groups) != 1 || tm.Groups[0] != s.groups[name] {
			t.Errorf("timer %q groups %v, want [%s]", name, tm.Groups, s.groups[name])
		}
		d := th.CallDataFor(tm.Root())
		if d == nil || !relClose(d.Values[0].Exclusive, excl) {
			t.Errorf("flat %q: %+v, scan exclusive %v", name, d, excl)
		}
	}
	if d := th.CallDataFor(tr.Timer("main").Root()); !relClose(d.Values[0].Inclusive, incl("main")) {
		t.Errorf("main inclusive %v, scan %v", d.Values[0].Inclusive, incl("main"))
	}
	if v, ok := tr.Primary("cali.caliper.version"); !ok || v != "2.2.0-dev" {
		t.Errorf("cali.caliper.version = %q, %v; want the globals' 2.2.0-dev", v, ok)
	}
}

// luleshJSONSplit writes the scan as Caliper's json-split form (columns
// path, mpi.rank, time in seconds, count), the way cali-query lays it out:
// nodes parents first, one row per region path.
func luleshJSONSplit(t testing.TB, s caliScan) []byte {
	t.Helper()
	type jnode struct {
		Label  string `json:"label"`
		Column string `json:"column"`
		Parent *int   `json:"parent,omitempty"`
	}
	var nodes []jnode
	index := map[string]int{}
	var data [][]any
	for _, p := range s.paths {
		for i := range p {
			key := strings.Join(p[:i+1], " => ")
			if _, ok := index[key]; ok {
				continue
			}
			n := jnode{Label: p[i], Column: "path"}
			if i > 0 {
				parent := index[strings.Join(p[:i], " => ")]
				n.Parent = &parent
			}
			index[key] = len(nodes)
			nodes = append(nodes, n)
		}
		key := strings.Join(p, " => ")
		data = append(data, []any{index[key], 0, s.sum[key], s.count[key]})
	}
	data = append(data, []any{nil, 0, 0.001297, 1}) // a row outside any region, as Caliper writes
	doc := map[string]any{
		"data":    data,
		"columns": []string{"path", "mpi.rank", "time", "count"},
		"column_metadata": []map[string]any{{"is_value": false}, {"is_value": false},
			{"is_value": true, "attribute.alias": "time", "attribute.unit": "sec"}, {"is_value": true}},
		"nodes":                nodes,
		"cali.caliper.version": "2.2.0-dev",
		"cali.channel":         "default",
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestCaliperJSONSplit reads the lulesh profile written as json-split and
// checks it against the same scan as the .cali, so both Caliper routes map
// the same way.
func TestCaliperJSONSplit(t *testing.T) {
	s := scanLulesh(t)
	p := filepath.Join(t.TempDir(), "lulesh.json")
	if err := os.WriteFile(p, luleshJSONSplit(t, s), 0o644); err != nil {
		t.Fatal(err)
	}
	if f, err := DetectFormat(p); err != nil || f != FormatCaliperJSON {
		t.Fatalf("DetectFormat = %q, %v", f, err)
	}
	tr, err := LoadPath(p, "")
	if err != nil {
		t.Fatal(err)
	}
	// json-split keeps no region attribute; the group is the path column.
	for name := range s.groups {
		s.groups[name] = "path"
	}
	checkCaliperTrial(t, tr, s)
}

func TestCaliperTraceRefused(t *testing.T) {
	_, err := LoadPath(formatPath("caliper/160809-094411_72298_fuu1NeAHT2US.cali"), "")
	if err == nil || !strings.Contains(err.Error(), "event trace") || !strings.Contains(err.Error(), "160809-094411_72298_fuu1NeAHT2US.cali") {
		t.Fatalf("err = %v, want a refusal naming the file as an event trace", err)
	}
}

// TestFormatsRoundTrip writes each loaded trial as TAU profile files (the
// writer behind `kipimo taudb export`), reads them back with ReadDir, and
// compares every value of every real thread, the derived threads and the
// counters.
func TestFormatsRoundTrip(t *testing.T) {
	for _, fx := range formatFixtures {
		t.Run(fx.name, func(t *testing.T) {
			tr := loadFixture(t, fx.path, fx.format)
			dir := t.TempDir()
			if err := WriteDir(dir, tr); err != nil {
				t.Fatal(err)
			}
			back, err := ReadDir(dir, tr.Name)
			if err != nil {
				t.Fatalf("read written profiles: %v", err)
			}
			compareTrials(t, back, tr)
		})
	}
}

// writeClose allows the last digit %.16G (TAU's profile number format) may
// lose: values written and read back are equal to within 1e-15.
func writeClose(a, b float64) bool {
	return a == b || math.Abs(a-b) <= 1e-15*math.Max(math.Abs(a), math.Abs(b))
}

func compareTrials(t *testing.T, got, want *Trial) {
	t.Helper()
	if got.TotalThreads != want.TotalThreads || len(got.Metrics) != len(want.Metrics) || len(got.Callpaths) != len(want.Callpaths) ||
		len(got.Timers) != len(want.Timers) || len(got.Counters) != len(want.Counters) {
		t.Fatalf("shape: threads %d/%d metrics %d/%d call paths %d/%d timers %d/%d counters %d/%d", got.TotalThreads, want.TotalThreads,
			len(got.Metrics), len(want.Metrics), len(got.Callpaths), len(want.Callpaths), len(got.Timers), len(want.Timers), len(got.Counters), len(want.Counters))
	}
	for _, tm := range want.Timers {
		g := got.Timer(tm.Name)
		if g == nil || strings.Join(g.Groups, "|") != strings.Join(tm.Groups, "|") {
			t.Errorf("timer %q: got %+v", tm.Name, g)
		}
	}
	bad := 0
	for _, wth := range want.Threads {
		gth := got.Thread(wth.Index)
		if gth == nil {
			t.Fatalf("thread %d missing", wth.Index)
		}
		if len(gth.CallData) != len(wth.CallData) {
			t.Errorf("thread %s: %d call data, want %d", wth, len(gth.CallData), len(wth.CallData))
		}
		for _, wd := range wth.CallData {
			gd := gth.CallDataFor(got.Callpath(wd.Callpath.Name))
			if gd == nil || gd.Calls != wd.Calls || gd.Subroutines != wd.Subroutines {
				t.Errorf("thread %s %q: %+v, want calls %v subrs %v", wth, wd.Callpath.Name, gd, wd.Calls, wd.Subroutines)
				bad++
				continue
			}
			for _, m := range want.Metrics {
				wv, gv := wd.Value(m), gd.Value(got.Metric(m.Name))
				if (wv == nil) != (gv == nil) {
					t.Errorf("thread %s %q %s: value %v, want %v", wth, wd.Callpath.Name, m.Name, gv, wv)
					continue
				}
				if wv != nil && (!writeClose(gv.Inclusive, wv.Inclusive) || !writeClose(gv.Exclusive, wv.Exclusive) ||
					!writeClose(gv.InclusivePercent, wv.InclusivePercent) || !writeClose(gv.ExclusivePercent, wv.ExclusivePercent)) {
					t.Errorf("thread %s %q %s: %+v, want %+v", wth, wd.Callpath.Name, m.Name, gv, wv)
					bad++
				}
			}
			if bad > 10 {
				t.Fatal("too many differences")
			}
		}
		for _, wv := range wth.CounterValues {
			gv := gth.CounterValueFor(got.Counter(wv.Counter.Name))
			wantN := wv.SampleCount
			if !wth.IsDerived() {
				wantN = math.Trunc(wantN) // profile files hold whole counts
			}
			if gv == nil || !writeClose(gv.SampleCount, wantN) || !writeClose(gv.Maximum, wv.Maximum) || !writeClose(gv.Minimum, wv.Minimum) ||
				!writeClose(gv.Mean, wv.Mean) || !writeClose(gv.SumSquares, wv.SumSquares) {
				t.Errorf("thread %s counter %q: %+v, want %+v", wth, wv.Counter.Name, gv, wv)
			}
		}
	}
	wp, gp := map[string]string{}, map[string]string{}
	for _, a := range want.PrimaryMetadata {
		wp[a.Name] = a.Value
	}
	for _, a := range got.PrimaryMetadata {
		gp[a.Name] = a.Value
	}
	var missing []string
	for k, v := range wp {
		if k == "File Type Index" || k == "File Type Name" {
			continue
		}
		if gp[k] != v {
			missing = append(missing, k)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("trial metadata lost or changed in the round trip: %v", missing)
	}
}

// TestSnapshotLastProfileWins builds a snapshot-style stream from the real
// merged file: thread 1's <profile> block is repeated after the original
// with the first interval line changed (calls 1 -> 7, exclusive 1620 ->
// 1700), as a later snapshot would be. The later block must be the one
// read, and the earlier one must not leak into it.
func TestSnapshotLastProfileWins(t *testing.T) {
	good, err := os.ReadFile(formatPath("xml/tauprofile-weighted.xml"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(good)
	start := strings.Index(text, `<profile thread="1.0.0.7935">`)
	end := start + strings.Index(text[start:], "</profile>") + len("</profile>")
	block := text[start:end]
	if !strings.Contains(block, "\n0 1 241 1620 13332019 \n") {
		t.Fatal("thread 1's first interval line is not the expected one")
	}
	later := strings.Replace(block, "\n0 1 241 1620 13332019 \n", "\n0 7 241 1700 13332019 \n", 1)
	later = strings.Replace(later, "<timestamp>", "<name>final</name>\n<timestamp>", 1)
	data := []byte(text[:end] + "\n" + later + text[end:])
	tr, err := ReadSnapshotXML(bytes.NewReader(data), "snap.xml", "snap")
	if err != nil {
		t.Fatal(err)
	}
	orig := loadFixture(t, "xml/tauprofile-weighted.xml", "")
	app := tr.Callpath(".TAU application")
	d, o := tr.Thread(1).CallDataFor(app), orig.Thread(1).CallDataFor(orig.Callpath(".TAU application"))
	if d.Calls != 7 || d.Values[0].Exclusive != 1700 || o.Calls != 1 || o.Values[0].Exclusive != 1620 {
		t.Errorf("thread 1 .TAU application: calls %v excl %v (original %v, %v); want the later snapshot's 7 and 1700", d.Calls, d.Values[0].Exclusive, o.Calls, o.Values[0].Exclusive)
	}
	if len(tr.Thread(1).CallData) != len(orig.Thread(1).CallData) {
		t.Errorf("thread 1 has %d timers, the original %d: snapshots were added up", len(tr.Thread(1).CallData), len(orig.Thread(1).CallData))
	}
}

// TestSnapshotDirectory splits the real merged file into its <profile_xml>
// documents and writes one snapshot.N.0.0 file per thread (each with the
// shared definitions), and reads the directory: the trial must equal the
// merged file's.
func TestSnapshotDirectory(t *testing.T) {
	good, err := os.ReadFile(formatPath("xml/tauprofile-weighted.xml"))
	if err != nil {
		t.Fatal(err)
	}
	docs := strings.Split(strings.ReplaceAll(string(good), "\x00", ""), "<profile_xml>")
	for i := range docs {
		docs[i] = "<profile_xml>" + docs[i]
	}
	docs = docs[1:] // the text before the first document is empty
	defs := docs[0]
	dir := t.TempDir()
	perNode := map[string]string{}
	for _, d := range docs[1:] {
		m := xmlThreadRe.FindStringSubmatch(d)
		if m == nil {
			continue // TAU's derived profiles
		}
		perNode[m[2]] += d
	}
	if len(perNode) != 8 {
		t.Fatalf("split gives %d threads, want 8", len(perNode))
	}
	for node, d := range perNode {
		if err := os.WriteFile(filepath.Join(dir, "snapshot."+node+".0.0"), []byte(defs+d), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if f, err := DetectFormat(dir); err != nil || f != FormatXML {
		t.Fatalf("DetectFormat(dir) = %q, %v; want xml", f, err)
	}
	tr, err := LoadPath(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	compareTrials(t, tr, loadFixture(t, "xml/tauprofile-weighted.xml", ""))
}

// TestSnapshotXMLTwoMetrics gives the real merged file a second metric,
// PAPI_TOT_CYC, whose values are twice the TIME values on every interval
// line (metrics="0 1"), and checks that both metrics are read on every
// thread, that the TOTAL thread of the second is twice TAU's own total, and
// that the trial round-trips through MULTI__ directories.
func TestSnapshotXMLTwoMetrics(t *testing.T) {
	good, err := os.ReadFile(formatPath("xml/tauprofile-weighted.xml"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	section := ""
	for _, l := range strings.Split(string(good), "\n") {
		switch {
		case strings.HasPrefix(strings.Trim(l, "\x00 "), `<interval_data metrics="0 ">`):
			section = "interval"
			l = strings.Replace(l, `metrics="0 "`, `metrics="0 1 "`, 1)
		case strings.HasPrefix(l, "</interval_data>"):
			section = ""
		case l == "</definitions>" && len(out) < 400:
			out = append(out, `<metric id="1"><name>PAPI_TOT_CYC</name>`, "<units>unknown</units>", "</metric>")
		case section == "interval" && strings.TrimSpace(l) != "":
			f := strings.Fields(l)
			excl, _ := strconv.ParseFloat(f[3], 64)
			incl, _ := strconv.ParseFloat(f[4], 64)
			l += FormatG16(2*excl) + " " + FormatG16(2*incl) + " "
		}
		out = append(out, l)
	}
	tr, err := ReadSnapshotXML(strings.NewReader(strings.Join(out, "\n")), "two.xml", "two")
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Metrics) != 2 || tr.Metrics[1].Name != "PAPI_TOT_CYC" {
		t.Fatalf("metrics %v, want TIME and PAPI_TOT_CYC", tr.Metrics)
	}
	time, cyc := tr.Metrics[0], tr.Metrics[1]
	for _, th := range tr.Threads {
		for _, d := range th.CallData {
			a, b := d.Value(time), d.Value(cyc)
			if a == nil || b == nil || !relClose(b.Exclusive, 2*a.Exclusive) || !relClose(b.Inclusive, 2*a.Inclusive) {
				t.Fatalf("thread %s %q: TIME %+v, PAPI_TOT_CYC %+v; want twice", th, d.Callpath.Name, a, b)
			}
		}
	}
	app := tr.Thread(Total).CallDataFor(tr.Callpath(".TAU application")).Value(cyc)
	if app.Exclusive != 2*13131 || app.Inclusive != 2*106642526 {
		t.Errorf("TOTAL .TAU application PAPI_TOT_CYC = %v, %v; want twice TAU's total 13131, 106642526", app.Exclusive, app.Inclusive)
	}
	dir := t.TempDir()
	if err := WriteDir(dir, tr); err != nil {
		t.Fatal(err)
	}
	back, err := ReadDir(dir, "two")
	if err != nil {
		t.Fatal(err)
	}
	compareTrials(t, back, tr)
}

// TestCaliperJSONRanks writes the lulesh scan as json-split with two ranks,
// rank 1 taking three times rank 0's time, and checks the threads and the
// derived mean and total.
func TestCaliperJSONRanks(t *testing.T) {
	s := scanLulesh(t)
	var doc map[string]any
	if err := json.Unmarshal(luleshJSONSplit(t, s), &doc); err != nil {
		t.Fatal(err)
	}
	rows := doc["data"].([]any)
	for _, r := range append([]any(nil), rows...) {
		row := append([]any(nil), r.([]any)...)
		row[1] = 1
		row[2] = 3 * row[2].(float64)
		rows = append(rows, row)
	}
	doc["data"] = rows
	data, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := ReadCaliperJSON(bytes.NewReader(data), "ranks.json", "ranks")
	if err != nil {
		t.Fatal(err)
	}
	if tr.TotalThreads != 2 || tr.Thread(1) == nil || tr.Thread(1).NodeRank != 1 {
		t.Fatalf("threads %d; want ranks 0 and 1 as nodes 0 and 1", tr.TotalThreads)
	}
	for key, sec := range s.sum {
		c := tr.Callpath(key)
		if c == nil || strings.Count(key, "=>") == 0 {
			continue
		}
		mean := tr.Thread(MeanWithoutNulls).CallDataFor(c).Values[0].Exclusive
		total := tr.Thread(Total).CallDataFor(c).Values[0].Exclusive
		if !relClose(mean, 2*sec*1e6) || !relClose(total, 4*sec*1e6) {
			t.Errorf("%q: mean %v total %v; want %v and %v", key, mean, total, 2*sec*1e6, 4*sec*1e6)
		}
	}
}
