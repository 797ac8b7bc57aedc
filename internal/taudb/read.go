package taudb

import (
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/kipimo-hpc/kipimo/internal/format/ppk"
	"github.com/kipimo-hpc/kipimo/internal/format/tauprofile"
	"github.com/kipimo-hpc/kipimo/internal/format/tauxml"
)

// Data source ids of the trial table: what a trial was read from.
const (
	DataSourcePPK = 0 // ParaProf packed profiles
	// DataSourceSnapshot is TAU snapshot and merged XML profiles ("SNAP" in
	// TAUdb's data_source table).
	DataSourceSnapshot = 10
)

// ReadDir reads a TAU profile directory (tauprofile.ReadDir) into a trial
// named name: the profile.N.C.T files in dir, or, when there are none, one
// MULTI__<metric> subdirectory per metric. Derived threads and metadata rows
// are computed.
func ReadDir(dir, name string) (*Trial, error) {
	sets, err := tauprofile.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	tr, err := BuildTrial(name, sets)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return tr, nil
}

// ReadPPK reads a ParaProf packed profile (ppk.Read; gzip-compressed or not)
// into a trial named name, through the same merge (BuildTrial) as TAU profile
// directories: one profile per thread and metric, trial metadata followed by
// the thread's own as each thread's metadata. file is used in errors.
func ReadPPK(r io.Reader, file, name string) (*Trial, error) {
	sets, err := ppk.Read(r, file)
	if err != nil {
		return nil, err
	}
	tr, err := BuildTrial(name, sets)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	tr.DataSource = DataSourcePPK
	tr.SplitMetadata(Attribute{Name: "File Type Index", Value: "0"}, Attribute{Name: "File Type Name", Value: "ParaProf Packed Profile"})
	return tr, nil
}

// ReadSnapshotXML reads a TAU snapshot (snapshot.N.C.T) or merged
// (tauprofile.xml) XML profile (tauxml.Read) into a trial named name: each
// thread's last snapshot, every metric, and user events, merged by BuildTrial
// as TAU profile files are. The derived profiles a merged file carries are not
// read; the derived threads are computed. file is used in errors.
func ReadSnapshotXML(r io.Reader, file, name string) (*Trial, error) {
	sets, err := tauxml.Read(r, file)
	if err != nil {
		return nil, err
	}
	return snapshotTrial(name, file, sets)
}

// ReadSnapshotDir reads every snapshot.N.C.T file in dir as one trial.
func ReadSnapshotDir(dir, name string) (*Trial, error) {
	sets, err := tauxml.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	return snapshotTrial(name, dir, sets)
}

func snapshotTrial(name, where string, sets [][]*tauprofile.File) (*Trial, error) {
	tr, err := BuildTrial(name, sets)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	tr.DataSource = DataSourceSnapshot
	tr.SplitMetadata(Attribute{Name: "File Type Index", Value: strconv.Itoa(DataSourceSnapshot)}, Attribute{Name: "File Type Name", Value: "TAU Snapshot profiles"})
	return tr, nil
}

// BuildTrial merges parsed profile files into a trial: sets[m] holds the
// files of metric m (one per thread). Metric 0 supplies calls, subroutines,
// groups, user events and metadata, as in TAU's reader. The derived threads,
// percents and the primary/secondary metadata split are computed.
func BuildTrial(name string, sets [][]*tauprofile.File) (*Trial, error) {
	if len(sets) == 0 || len(sets[0]) == 0 {
		return nil, errors.New("no profile files")
	}
	tr := NewTrial(name)
	type nct struct{ n, c, t int }
	threads := map[nct]*Thread{}
	for mi, set := range sets {
		sort.Slice(set, func(i, j int) bool {
			a, b := set[i], set[j]
			if a.Node != b.Node {
				return a.Node < b.Node
			}
			if a.Context != b.Context {
				return a.Context < b.Context
			}
			return a.Thread < b.Thread
		})
		if len(set) == 0 {
			return nil, fmt.Errorf("metric %d has no profile files", mi)
		}
		m := tr.AddMetric(set[0].MetricName())
		if m.Index != mi {
			return nil, fmt.Errorf("metric %q appears in two directories", m.Name)
		}
		for _, p := range set {
			key := nct{p.Node, p.Context, p.Thread}
			th := threads[key]
			if th == nil {
				th = tr.AddThread(p.Node, p.Context, p.Thread, len(threads))
				threads[key] = th
			}
			for len(th.Files) <= mi {
				th.Files = append(th.Files, nil)
			}
			th.Files[mi] = &FileLayout{Header: p.Header, Metadata: p.Metadata, NoMetadata: p.NoMetadata}
			if mi == 0 {
				for _, a := range p.Metadata {
					if a.Name != MetricNameKey || a.Context != nil {
						th.Metadata = append(th.Metadata, a)
					}
				}
			}
			for _, f := range p.Functions {
				addFunction(tr, th, m, f)
			}
			if mi == 0 {
				for _, e := range p.UserEvents {
					addUserEvent(tr, th, e)
				}
			}
		}
	}
	tr.UpdateShape()
	tr.ComputeDerived()
	tr.SplitMetadata(LoaderMetadata()...)
	return tr, nil
}

func addFunction(tr *Trial, th *Thread, m *Metric, f tauprofile.FunctionLine) {
	groups := SplitGroups(f.Groups)
	for _, g := range groups {
		if g == "TAU_CALLPATH_DERIVED" {
			return
		}
	}
	norm := NormalizeName(f.Name)
	var c *TimerCallpath
	if strings.Contains(norm, "=>") {
		c = tr.AddCallpath(SplitCallpath(norm))
		if c.Spelling == "" {
			c.Spelling, c.GroupSpelling = f.Name, f.Groups
		}
	} else {
		t := tr.AddTimer(norm)
		if t.Spelling == "" {
			t.Spelling, t.GroupSpelling, t.Groups = f.Name, f.Groups, groups
		}
		c = t.Root()
	}
	existing := th.CallDataFor(c)
	d := tr.AddCallData(th, c)
	if m.Index == 0 {
		d.Calls += f.Calls
		d.Subroutines += f.Subrs
	}
	v := d.Value(m)
	if existing != nil && v != nil {
		// TAU's reader sums duplicate lines of one file.
		v.Inclusive += f.Inclusive
		v.Exclusive += f.Exclusive
		return
	}
	v = d.SetValue(m, f.Inclusive, f.Exclusive)
	v.SumExclusiveSquared = f.SumExclSqr
}

func addUserEvent(tr *Trial, th *Thread, e tauprofile.UserEventLine) {
	c := tr.AddCounter(NormalizeName(e.Name))
	if c.Spelling == "" {
		c.Spelling = e.Name
	}
	existing := th.CounterValueFor(c)
	v := tr.AddCounterValue(th, c)
	if existing == nil {
		v.SampleCount, v.Maximum, v.Minimum, v.Mean, v.SumSquares = e.NumEvents, e.Max, e.Min, e.Mean, e.SumSquare
		return
	}
	// A duplicate name on one thread is combined, as TAU's reader does.
	n := v.SampleCount + e.NumEvents
	if n > 0 {
		v.Mean = (v.Mean*v.SampleCount + e.Mean*e.NumEvents) / n
	}
	v.SampleCount = n
	v.SumSquares += e.SumSquare
	v.Minimum = math.Min(v.Minimum, e.Min)
	v.Maximum = math.Max(v.Maximum, e.Max)
}
