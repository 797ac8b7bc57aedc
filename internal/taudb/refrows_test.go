package taudb

import (
	"encoding/csv"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// refTables are the tables of testdata/taudb-ref compared row for row.
var refTables = []string{
	"trial", "thread", "metric", "timer", "timer_group", "timer_parameter", "timer_callpath",
	"timer_call_data", "timer_value", "counter", "counter_value", "primary_metadata",
	"secondary_metadata", "time_range",
}

// doubleCols names the DOUBLE PRECISION columns, printed as Python's repr.
var doubleCols = map[string]bool{
	"inclusive_value": true, "exclusive_value": true, "inclusive_percent": true, "exclusive_percent": true,
	"sum_exclusive_squared": true, "maximum_value": true, "minimum_value": true, "mean_value": true,
	"standard_deviation": true,
}

const null = `\N`

// pyRepr prints v as Python's repr(float(v)).
func pyRepr(v float64) string {
	if math.IsInf(v, 0) || math.IsNaN(v) {
		return strconv.FormatFloat(v, 'g', -1, 64)
	}
	e := strconv.FormatFloat(v, 'e', -1, 64)
	i := strings.IndexByte(e, 'e')
	exp, _ := strconv.Atoi(e[i+1:])
	if decpt := exp + 1; decpt > -4 && decpt <= 16 {
		f := strconv.FormatFloat(v, 'f', -1, 64)
		if !strings.Contains(f, ".") {
			f += ".0"
		}
		return f
	}
	return e
}

func readRefCSV(t testing.TB, dir, table string) (header []string, rows [][]string) {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "taudb-ref", dir, table+".csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	all, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatalf("%s/%s.csv: %v", dir, table, err)
	}
	return all[0], all[1:]
}

// normalizeRows rewrites double columns with pyRepr and sorts the rows.
func normalizeRows(header []string, rows [][]string) [][]string {
	for _, r := range rows {
		for i, h := range header {
			if doubleCols[h] && r[i] != null {
				if v, err := strconv.ParseFloat(r[i], 64); err == nil {
					r[i] = pyRepr(v)
				}
			}
		}
	}
	sort.Slice(rows, func(i, j int) bool { return strings.Join(rows[i], "\x00") < strings.Join(rows[j], "\x00") })
	return rows
}

func itoaN(i int) string { return strconv.Itoa(i) }

func nullable(s string) string {
	if s == "" {
		return null
	}
	return s
}

// dumpTrial gives the rows TAU's loader stores for tr, in the natural-key
// form of testdata/taudb-ref/queries.sql.
func dumpTrial(tr *Trial) map[string][][]string {
	out := map[string][][]string{}
	add := func(table string, row ...string) { out[table] = append(out[table], row) }
	add("trial", tr.Name, itoaN(tr.DataSource), itoaN(tr.NodeCount), itoaN(tr.ContextsPerNode), itoaN(tr.ThreadsPerContext), itoaN(tr.TotalThreads))
	for _, th := range tr.Threads {
		add("thread", itoaN(th.Index), itoaN(th.NodeRank), itoaN(th.ContextRank), itoaN(th.ThreadRank))
	}
	for _, m := range tr.Metrics {
		add("metric", m.Name, map[bool]string{true: "t", false: "f"}[m.Derived])
	}
	for _, t := range tr.Timers {
		add("timer", t.Name, t.ShortName, nullable(t.SourceFile), itoaN(t.LineNumber), itoaN(t.LineNumberEnd), itoaN(t.ColumnNumber), itoaN(t.ColumnNumberEnd))
		for _, g := range t.Groups {
			add("timer_group", t.Name, g)
		}
		for _, p := range t.Parameters {
			add("timer_parameter", t.Name, p.Name, p.Value)
		}
	}
	for _, c := range tr.Callpaths {
		parent := null
		if c.Parent != nil {
			parent = c.Parent.Name
		}
		add("timer_callpath", c.Name, c.Timer.Name, parent, itoaN(c.Depth()))
	}
	for _, th := range tr.Threads {
		for _, d := range th.CallData {
			if d.Calls <= 0 && !th.IsDerived() {
				continue
			}
			add("timer_call_data", d.Callpath.Name, itoaN(th.Index), itoaN(th.NodeRank), itoaN(th.ContextRank), itoaN(th.ThreadRank),
				strconv.Itoa(int(javaInt(d.Calls))), strconv.Itoa(int(javaInt(d.Subroutines))), null)
			for _, v := range d.Values {
				if v == nil {
					continue
				}
				sq := null
				if v.SumExclusiveSquared != nil {
					sq = pyRepr(checkDouble(*v.SumExclusiveSquared))
				}
				add("timer_value", d.Callpath.Name, itoaN(th.Index), v.Metric.Name, pyRepr(checkDouble(v.Inclusive)), pyRepr(checkDouble(v.Exclusive)),
					pyRepr(checkDouble(v.InclusivePercent)), pyRepr(checkDouble(v.ExclusivePercent)), sq)
			}
		}
		if th.IsDerived() {
			continue
		}
		for _, v := range th.CounterValues {
			add("counter_value", v.Counter.Name, null, itoaN(th.Index), strconv.Itoa(int(javaInt(v.SampleCount))), pyRepr(checkDouble(v.Maximum)),
				pyRepr(checkDouble(v.Minimum)), pyRepr(checkDouble(v.Mean)), pyRepr(checkDouble(v.SumSquares)))
		}
	}
	for _, c := range tr.Counters {
		add("counter", c.Name)
	}
	for _, a := range tr.PrimaryMetadata {
		add("primary_metadata", a.Name, a.Value)
	}
	for _, s := range tr.SecondaryMetadata {
		th := null
		if s.Thread != nil {
			th = itoaN(s.Thread.Index)
		}
		add("secondary_metadata", null, s.Name, s.Value, map[bool]string{true: "t", false: "f"}[s.IsArray], th, null, null)
	}
	for k, rows := range out {
		sort.Slice(rows, func(i, j int) bool { return strings.Join(rows[i], "\x00") < strings.Join(rows[j], "\x00") })
		out[k] = rows
	}
	return out
}

func compareRows(t *testing.T, table string, got, want [][]string) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d rows, TAU's loader wrote %d", table, len(got), len(want))
	}
	n := 0
	for i := 0; i < len(got) && i < len(want); i++ {
		if strings.Join(got[i], ",") != strings.Join(want[i], ",") {
			t.Errorf("%s row %d:\n got  %q\n want %q", table, i, got[i], want[i])
			if n++; n > 5 {
				return
			}
		}
	}
}

// TestReferenceRows checks that the rows we would store for each fixture are
// the rows TAU's Java loader stored (testdata/taudb-ref), with the loader's
// -a app -x exp primary metadata added.
func TestReferenceRows(t *testing.T) {
	for _, fx := range fixtures {
		t.Run(fx.name, func(t *testing.T) {
			tr := readFixture(t, fx.dir)
			tr.PrimaryMetadata = append(tr.PrimaryMetadata, Attribute{Name: "Application", Value: "app"}, Attribute{Name: "Experiment", Value: "exp"})
			got := dumpTrial(tr)
			for _, table := range refTables {
				header, want := readRefCSV(t, fx.ref, table)
				compareRows(t, table, got[table], normalizeRows(header, want))
			}
		})
	}
}
