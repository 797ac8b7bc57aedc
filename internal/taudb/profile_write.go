package taudb

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kipimo-hpc/kipimo/internal/format/tauprofile"
)

// MultiDirName is the directory TAU writes metric name's files into when a
// run has several metrics: "MULTI__" plus the name with each of
// / \ ? % * : | " < > = and space replaced by '_'.
func MultiDirName(name string) string {
	return "MULTI__" + strings.Map(func(r rune) rune {
		if strings.ContainsRune(`/\?%*:|"<>= `, r) {
			return '_'
		}
		return r
	}, name)
}

// WriteDir writes the trial's real threads as TAU profile files under dir:
// profile.N.C.T files in dir for a single metric, or one MULTI__<metric>
// directory per metric. Files read by ReadDir are reproduced byte for byte.
func WriteDir(dir string, tr *Trial) error {
	if len(tr.Metrics) == 0 {
		return fmt.Errorf("write profiles: trial %q has no metric", tr.Name)
	}
	for _, m := range tr.Metrics {
		md := dir
		if len(tr.Metrics) > 1 {
			md = filepath.Join(dir, MultiDirName(m.Name))
		}
		if err := os.MkdirAll(md, 0o755); err != nil {
			return fmt.Errorf("write profiles: %w", err)
		}
		for _, th := range tr.RealThreads() {
			name := filepath.Join(md, fmt.Sprintf("profile.%d.%d.%d", th.NodeRank, th.ContextRank, th.ThreadRank))
			if err := os.WriteFile(name, AppendProfile(nil, tr, th, m), 0o644); err != nil {
				return fmt.Errorf("write profiles: %w", err)
			}
		}
	}
	return nil
}

// AppendProfile appends thread th's profile file for metric m, formatted as
// TAU's Profiler.cpp writes it.
func AppendProfile(b []byte, tr *Trial, th *Thread, m *Metric) []byte {
	lay := th.Layout(m.Index)
	header := "templated_functions_MULTI_" + m.Name
	if lay != nil && lay.Header != "" {
		header = lay.Header
	}
	var lines []*TimerCallData
	for _, d := range th.CallData {
		if d.Value(m) != nil || m.Index == 0 {
			lines = append(lines, d)
		}
	}
	b = strconv.AppendInt(b, int64(len(lines)), 10)
	b = append(b, ' ')
	b = append(b, header...)
	b = append(b, '\n')
	b = append(b, tauprofile.ColumnsLine...)
	switch {
	case lay != nil && lay.NoMetadata:
	case lay != nil && lay.Metadata != nil:
		b = append(b, " # "...)
		b = appendMetadataXML(b, lay.Metadata)
	default:
		attrs := append([]Attribute{{Name: MetricNameKey, Value: m.Name}}, th.Metadata...)
		b = append(b, " # "...)
		b = appendMetadataXML(b, attrs)
	}
	b = append(b, '\n')
	for _, d := range lines {
		name, groups := lineSpelling(d.Callpath)
		var incl, excl float64
		if v := d.Value(m); v != nil {
			incl, excl = v.Inclusive, v.Exclusive
		}
		b = append(b, '"')
		b = append(b, name...)
		b = append(b, "\" "...)
		b = appendLong(b, d.Calls)
		b = append(b, ' ')
		b = appendLong(b, d.Subroutines)
		b = append(b, ' ')
		b = AppendG(b, excl, 16)
		b = append(b, ' ')
		b = AppendG(b, incl, 16)
		b = append(b, " 0 GROUP=\""...)
		b = append(b, groups...)
		b = append(b, "\" \n"...)
	}
	b = append(b, "0 aggregates\n"...)
	if len(th.CounterValues) > 0 {
		b = strconv.AppendInt(b, int64(len(th.CounterValues)), 10)
		b = append(b, " userevents\n# eventname numevents max min mean sumsqr\n"...)
		for _, v := range th.CounterValues {
			name := v.Counter.Spelling
			if name == "" {
				name = v.Counter.Name
			}
			b = append(b, '"')
			b = append(b, name...)
			b = append(b, "\" "...)
			b = appendLong(b, v.SampleCount)
			for _, x := range [4]float64{v.Maximum, v.Minimum, v.Mean, v.SumSquares} {
				b = append(b, ' ')
				b = AppendG(b, x, 16)
			}
			b = append(b, '\n')
		}
	}
	return b
}

// appendLong prints v as C's %ld of a long holding it (truncated).
func appendLong(b []byte, v float64) []byte {
	switch {
	case math.IsNaN(v):
		v = 0
	case v >= math.MaxInt64:
		v = math.MaxInt64
	case v <= math.MinInt64:
		v = math.MinInt64
	}
	return strconv.AppendInt(b, int64(v), 10)
}

// lineSpelling returns the name and GROUP text of node c's profile line: the
// spelling read from a file, or the canonical form (groups joined by '|',
// "TAU_CALLPATH|<leaf groups>" for call paths).
func lineSpelling(c *TimerCallpath) (name, groups string) {
	t := c.Timer
	tg := t.GroupSpelling
	if tg == "" {
		tg = strings.Join(t.Groups, "|")
	}
	if c.Parent == nil {
		name = t.Spelling
		if name == "" {
			name = t.Name
		}
		return name, tg
	}
	name, groups = c.Spelling, c.GroupSpelling
	if name == "" {
		name = c.Name
	}
	if groups == "" {
		groups = "TAU_CALLPATH|" + tg
	}
	return name, groups
}
