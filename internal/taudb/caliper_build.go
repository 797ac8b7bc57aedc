package taudb

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/kipimo-hpc/kipimo/internal/format/tauprofile"
)

// caliNodeAgg is one region path on one thread, summed over its rows.
type caliNodeAgg struct {
	path     []caliRegion
	key      string
	excl     map[string]float64
	hasExcl  map[string]bool
	incl     map[string]float64 // given by the file
	count    float64
	children []*caliNodeAgg
	// computed
	calls, subrs float64
	inclusive    map[string]float64
	exclusive    map[string]float64
}

type caliThreadAgg struct {
	rank, thread int
	nodes        []*caliNodeAgg
	byKey        map[string]*caliNodeAgg
}

func caliPathKey(p []caliRegion) string {
	var b strings.Builder
	for _, r := range p {
		b.WriteString(r.Attr)
		b.WriteByte(0)
		b.WriteString(r.Name)
		b.WriteByte(0)
	}
	return b.String()
}

func (t *caliThreadAgg) node(p []caliRegion) *caliNodeAgg {
	key := caliPathKey(p)
	if n := t.byKey[key]; n != nil {
		return n
	}
	var parent *caliNodeAgg
	if len(p) > 1 {
		parent = t.node(p[:len(p)-1])
	}
	n := &caliNodeAgg{path: append([]caliRegion(nil), p...), key: key, excl: map[string]float64{}, hasExcl: map[string]bool{}, incl: map[string]float64{}}
	t.byKey[key] = n
	t.nodes = append(t.nodes, n)
	if parent != nil {
		parent.children = append(parent.children, n)
	}
	return n
}

// caliperTrial turns aggregated Caliper rows into TAU profiles per thread and
// metric, as a TAU call-path profile of the same run would hold them, and
// builds the trial with BuildTrial.
func caliperTrial(name, file string, rows []caliRow, globals []Attribute) (*Trial, error) {
	// Thread numbering: omp.thread.num as is; thread.id numbered per rank
	// in ascending order.
	rawIDs := map[int]map[string]bool{}
	for _, r := range rows {
		if !r.HasOMP && r.RawThreadID != "" {
			if rawIDs[r.Rank] == nil {
				rawIDs[r.Rank] = map[string]bool{}
			}
			rawIDs[r.Rank][r.RawThreadID] = true
		}
	}
	rawIndex := map[int]map[string]int{}
	for rank, ids := range rawIDs {
		list := make([]string, 0, len(ids))
		for id := range ids {
			list = append(list, id)
		}
		sort.Slice(list, func(i, j int) bool {
			a, ea := strconv.ParseUint(list[i], 10, 64)
			b, eb := strconv.ParseUint(list[j], 10, 64)
			if ea == nil && eb == nil {
				return a < b
			}
			return list[i] < list[j]
		})
		rawIndex[rank] = map[string]int{}
		for i, id := range list {
			rawIndex[rank][id] = i
		}
	}
	var metrics []string
	seenMetric := map[string]bool{}
	addMetric := func(m string) {
		if !seenMetric[m] {
			seenMetric[m] = true
			metrics = append(metrics, m)
		}
	}
	threads := map[[2]int]*caliThreadAgg{}
	var threadOrder [][2]int
	for _, r := range rows {
		tid := r.Thread
		if !r.HasOMP && r.RawThreadID != "" {
			tid = rawIndex[r.Rank][r.RawThreadID]
		}
		key := [2]int{r.Rank, tid}
		t := threads[key]
		if t == nil {
			t = &caliThreadAgg{rank: r.Rank, thread: tid, byKey: map[string]*caliNodeAgg{}}
			threads[key] = t
			threadOrder = append(threadOrder, key)
		}
		n := t.node(r.Path)
		for m, v := range r.Exclusive {
			n.excl[m] += v
			n.hasExcl[m] = true
		}
		for m, v := range r.Inclusive {
			n.incl[m] += v
		}
		n.count += r.Count
	}
	for _, r := range rows {
		for _, m := range sortedKeys(r.Exclusive) {
			addMetric(m)
		}
		for _, m := range sortedKeys(r.Inclusive) {
			addMetric(m)
		}
	}
	if len(metrics) == 0 {
		addMetric("TIME")
	}
	// TIME first, as TAU writes it.
	sort.SliceStable(metrics, func(i, j int) bool { return metrics[i] == "TIME" && metrics[j] != "TIME" })
	sort.Slice(threadOrder, func(i, j int) bool {
		if threadOrder[i][0] != threadOrder[j][0] {
			return threadOrder[i][0] < threadOrder[j][0]
		}
		return threadOrder[i][1] < threadOrder[j][1]
	})
	sets := make([][]*tauprofile.File, len(metrics))
	for _, key := range threadOrder {
		t := threads[key]
		t.compute(metrics)
		files := make([]*tauprofile.File, len(metrics))
		for mi, m := range metrics {
			files[mi] = &tauprofile.File{Node: t.rank, Context: 0, Thread: t.thread, Header: "templated_functions_MULTI_" + m,
				Metadata: append([]Attribute{{Name: MetricNameKey, Value: m}}, globals...)}
			sets[mi] = append(sets[mi], files[mi])
		}
		t.lines(metrics, files)
	}
	tr, err := BuildTrial(name, sets)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	tr.DataSource = DataSourceOther
	tr.SplitMetadata(Attribute{Name: "File Type Index", Value: strconv.Itoa(DataSourceOther)}, Attribute{Name: "File Type Name", Value: "Caliper region profile"})
	return tr, nil
}

func sortedKeys(m map[string]float64) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// compute fills each node's calls (Caliper's snapshot count, at least 1),
// subroutines (the children's calls), inclusive values (the file's, else the
// sum over the subtree) and exclusive values (the file's, else inclusive
// minus the children's inclusive).
func (t *caliThreadAgg) compute(metrics []string) {
	for _, n := range t.nodes {
		n.calls = n.count
		if n.calls < 1 {
			n.calls = 1
		}
	}
	// Nodes are created parents first, so children are finished first in
	// reverse order.
	for i := len(t.nodes) - 1; i >= 0; i-- {
		n := t.nodes[i]
		n.inclusive = map[string]float64{}
		n.exclusive = map[string]float64{}
		for _, c := range n.children {
			n.subrs += c.calls
		}
		for _, m := range metrics {
			var childIncl float64
			for _, c := range n.children {
				childIncl += c.inclusive[m]
			}
			excl, hasExcl := n.excl[m], n.hasExcl[m]
			incl, hasIncl := n.incl[m]
			switch {
			case hasIncl && !hasExcl:
				excl = incl - childIncl
				if excl < 0 {
					excl = 0
				}
			case !hasIncl:
				incl = excl + childIncl
			}
			n.exclusive[m], n.inclusive[m] = excl, incl
		}
	}
}

// lines writes the thread's profile lines: one flat line per region name
// (values summed over the paths ending in it; inclusive values not counted
// again for paths nested in the same region) and one "a => b" line per path
// of depth two or more, in order of first appearance.
func (t *caliThreadAgg) lines(metrics []string, files []*tauprofile.File) {
	type flat struct {
		group        string
		calls, subrs float64
		excl, incl   []float64
	}
	flats := map[string]*flat{}
	var order []string
	for _, n := range t.nodes {
		leaf := n.path[len(n.path)-1]
		f := flats[leaf.Name]
		if f == nil {
			f = &flat{group: leaf.Attr, excl: make([]float64, len(metrics)), incl: make([]float64, len(metrics))}
			flats[leaf.Name] = f
			order = append(order, leaf.Name)
		}
		f.calls += n.calls
		f.subrs += n.subrs
		recursive := false
		for _, r := range n.path[:len(n.path)-1] {
			if r.Name == leaf.Name {
				recursive = true
			}
		}
		for mi, m := range metrics {
			f.excl[mi] += n.exclusive[m]
			if !recursive {
				f.incl[mi] += n.inclusive[m]
			}
		}
	}
	emitted := map[string]bool{}
	for _, n := range t.nodes {
		leaf := n.path[len(n.path)-1]
		if !emitted[leaf.Name] {
			emitted[leaf.Name] = true
			f := flats[leaf.Name]
			for mi := range metrics {
				files[mi].Functions = append(files[mi].Functions, tauprofile.FunctionLine{Name: leaf.Name, Groups: f.group,
					Calls: f.calls, Subrs: f.subrs, Exclusive: f.excl[mi], Inclusive: f.incl[mi]})
			}
		}
		if len(n.path) < 2 {
			continue
		}
		names := make([]string, len(n.path))
		for i, r := range n.path {
			names[i] = r.Name
		}
		line := strings.Join(names, " => ")
		for mi, m := range metrics {
			files[mi].Functions = append(files[mi].Functions, tauprofile.FunctionLine{Name: line, Groups: "TAU_CALLPATH | " + leaf.Attr,
				Calls: n.calls, Subrs: n.subrs, Exclusive: n.exclusive[m], Inclusive: n.inclusive[m]})
		}
	}
}
