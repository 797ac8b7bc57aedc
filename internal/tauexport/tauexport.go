// Package tauexport turns the per-thread profiles Kipimo's detectors publish
// into a TAU trial, and writes it as TAU profile files (the default, a
// directory on disk) and, when a DSN is given, into a TAUdb in PostgreSQL, so
// ParaProf, pprof-style tools, hatchet and PerfExplorer read a Kipimo run as
// they read a TAU run.
//
// It is the run's one summary writer: ReadTrial reads the profiles and the
// metadata from the provenance store (any provenance.Store, see Source),
// keeps the latest profile of each thread (program, rank, thread), and builds
// the trial; Write writes it.
//
// A thread is placed as TAU places it, node.context.thread: the node is the
// rank, the thread the thread id, and the context the program (pid). A run of
// one program has context 0 throughout, as TAU's own profiles do; in a run of
// several programs that share rank numbers, program 1's rank 0 thread 0 is
// profile.0.1.0 next to program 0's profile.0.0.0, and a separate thread of
// the one TAUdb trial. ParaProf and TAUdb tell threads apart by all three
// numbers; hatchet's TAU reader ignores the context, so read one program of
// such a run with hatchet from a directory holding only that program's
// profile.*.<pid>.* files.
package tauexport

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/taudb"
)

// MetricName is the metric of detector profiles: wall-clock time in
// microseconds, as TAU names it.
const MetricName = "TIME"

// DefaultGroup is given to timers whose profile names no group; ParaProf does
// not show a timer without one.
const DefaultGroup = "TAU_USER"

// Source is where ReadTrial reads a run's records; every provenance.Store
// is one.
type Source interface {
	Profiles(ctx context.Context, fn func(provenance.ThreadProfile) error) error
	Metadata(ctx context.Context, fn func(provenance.Metadata) error) error
}

// ReadTrial builds the trial named name from every thread profile and
// metadata record in src. Only the latest profile of each thread is held
// while reading, so memory grows with the threads and the metadata, not with
// the snapshots taken.
//
// A thread (pid, rank, tid) published several times is taken from its final
// profile, or else its latest step; it becomes TAU thread rank.pid.tid
// (node, context, thread; see the package doc). Timers named "a => b" become
// call-graph children of "a" (flat timers are created for every node);
// counters become TAU user events. Each thread's metadata is its profile's
// map plus the run metadata of its program that applies to it: an entry for
// its rank and thread, an entry for its rank and a thread with no profile
// (applies to all the rank's threads), an entry for a rank with no profile
// (applies to every thread of the program); plus "pid" for programs other
// than 0. The root timer's values are rounded to whole microseconds, since
// hatchet's TAU reader reads them as integers (Hatchet reads them with
// int()). Derived threads, percents and the trial-level metadata are
// computed as TAU's loader does. Each thread's lines come in the order
// treeTimers gives: its root first, then its call paths from the root.
func ReadTrial(ctx context.Context, src Source, name string) (*taudb.Trial, error) {
	latest := latestProfiles{}
	// Parts of split profiles wait for their siblings.
	type splitKey struct {
		ThreadKey
		step  uint64
		final bool
	}
	split := map[splitKey][]provenance.ThreadProfile{}
	if err := src.Profiles(ctx, func(p provenance.ThreadProfile) error {
		if p.Parts > 1 {
			k := splitKey{ThreadKey{p.PID, p.Rank, p.TID}, p.Step, p.Final}
			split[k] = append(split[k], p)
			return nil
		}
		latest.add(p)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("summary: read profiles: %w", err)
	}
	for _, parts := range split {
		p, err := provenance.Join(parts)
		if err != nil {
			return nil, fmt.Errorf("summary: %w", err)
		}
		latest.add(p)
	}
	var meta []provenance.Metadata
	if err := src.Metadata(ctx, func(m provenance.Metadata) error {
		meta = append(meta, m)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("summary: read metadata: %w", err)
	}
	return buildTrial(name, latest, meta)
}

// ThreadKey names one thread of a run: program, rank and thread id.
type ThreadKey struct{ PID, Rank, TID uint32 }

// latestProfiles holds the latest profile of each thread.
type latestProfiles map[ThreadKey]provenance.ThreadProfile

// add keeps p if it is its thread's latest profile so far: a final profile
// over any snapshot, and among those the one of the highest io_step (the
// last one added on a tie). Snapshots are cumulative, so the latest one
// holds the thread's whole profile.
func (l latestProfiles) add(p provenance.ThreadProfile) {
	k := ThreadKey{p.PID, p.Rank, p.TID}
	if q, ok := l[k]; !ok || (p.Final && !q.Final) || (p.Final == q.Final && p.Step >= q.Step) {
		l[k] = p
	}
}

func buildTrial(name string, latest latestProfiles, meta []provenance.Metadata) (*taudb.Trial, error) {
	if len(latest) == 0 {
		return nil, errors.New("summary: no thread profiles")
	}
	keys := make([]ThreadKey, 0, len(latest))
	for k := range latest {
		keys = append(keys, k)
	}
	// TAU's order: node, context, thread.
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a.Rank != b.Rank {
			return a.Rank < b.Rank
		}
		if a.PID != b.PID {
			return a.PID < b.PID
		}
		return a.TID < b.TID
	})

	tr := taudb.NewTrial(name)
	m := tr.AddMetric(MetricName)
	mix := indexMetadata(meta, latest)
	for i, k := range keys {
		p := latest[k]
		th := tr.AddThread(int(p.Rank), int(p.PID), int(p.TID), i)
		if err := addTimers(tr, th, m, &p); err != nil {
			return nil, fmt.Errorf("summary: program %d rank %d thread %d: %w", p.PID, p.Rank, p.TID, err)
		}
		for _, c := range p.Counters {
			v := tr.AddCounterValue(th, tr.AddCounter(taudb.NormalizeName(c.Name)))
			if v.SampleCount > 0 {
				return nil, fmt.Errorf("summary: program %d rank %d thread %d: counter %q listed twice", p.PID, p.Rank, p.TID, c.Name)
			}
			v.SampleCount, v.Maximum, v.Minimum, v.Mean, v.SumSquares = float64(c.Count), c.Max, c.Min, c.Mean, c.SumSqr
		}
		th.Metadata = threadMetadata(&p, mix)
	}
	tr.UpdateShape()
	tr.ComputeDerived()
	tr.SplitMetadata(taudb.LoaderMetadata()...)
	return tr, nil
}

// ApplicationRoot is the root timer TAU gives every thread; the summary adds
// it to a thread that has more than one top-level function, so that each
// thread has one root, as Hatchet needs.
const ApplicationRoot = ".TAU application"

// profileLine is one line of a thread's profile, in file order.
type profileLine struct {
	provenance.TimerProfile
	// keep writes the line even with no calls: a call path's prefix that
	// had not completed when the profile was taken.
	keep bool
}

// treeTimers orders a thread's timers as TAU writes a deep call-path profile
// and as Hatchet reads one: the thread's root first, then every call path
// from that root, each after its prefix, then the other flat timers. The
// root is the thread's only top-level function, or else ApplicationRoot,
// added with a path to each top-level function and above every path. A
// function's top-level calls are its flat values less those of the paths
// that end in it.
//
// The added root's inclusive time is the thread's wall time (LastTS less
// FirstTS) when the profile has it, as TAU's ".TAU application" is, and its
// exclusive time what the top-level calls leave of it; without it, the sum
// of the top-level calls. Calls in Overflow ran below another call with no
// call path of their own: they are never top-level calls.
func treeTimers(tp *provenance.ThreadProfile) []profileLine {
	timers := tp.Timers
	type fn struct {
		flat  provenance.TimerProfile
		top   provenance.TimerProfile // flat less the paths ending in it
		first int                     // order of first appearance
	}
	funcs := map[string]*fn{}
	var order []string
	get := func(name string) *fn {
		f := funcs[name]
		if f == nil {
			f = &fn{first: len(order)}
			funcs[name] = f
			order = append(order, name)
		}
		return f
	}
	var paths []provenance.TimerProfile
	for _, t := range timers {
		t.Name = taudb.NormalizeName(t.Name)
		nodes := taudb.SplitCallpath(t.Name)
		if len(nodes) == 1 {
			f := get(t.Name)
			f.flat, f.top = t, t
			continue
		}
		paths = append(paths, t)
	}
	for _, o := range tp.Overflow {
		if f := funcs[taudb.NormalizeName(o.Name)]; f != nil {
			subtractTimer(&f.top, &o)
		}
	}
	for _, p := range paths {
		nodes := taudb.SplitCallpath(p.Name)
		f := get(nodes[len(nodes)-1])
		subtractTimer(&f.top, &p)
		// a path's first frame ran at the top level
		get(nodes[0])
	}
	var roots []string
	isRoot := map[string]bool{}
	for _, name := range order {
		f := funcs[name]
		if f.top.Calls > 0 {
			roots = append(roots, name)
			isRoot[name] = true
		}
	}
	// Paths cut on the root side (a call-path depth limit) do not start at
	// a root: they are kept as they are, under no added root.
	full := true
	for _, p := range paths {
		full = full && isRoot[taudb.SplitCallpath(p.Name)[0]]
	}
	out := make([]profileLine, 0, len(timers)+len(roots)+1)
	have := map[string]bool{}
	prefix := ""
	switch {
	case len(roots) == 1:
		out = append(out, profileLine{TimerProfile: funcs[roots[0]].flat})
		have[roots[0]] = true
	case len(roots) > 1 && !full:
		// The largest top-level function first, as TAU's own files have it.
		best := roots[0]
		for _, r := range roots {
			if funcs[r].flat.Inclusive > funcs[best].flat.Inclusive {
				best = r
			}
		}
		out = append(out, profileLine{TimerProfile: funcs[best].flat})
		have[best] = true
	case len(roots) > 1:
		root := provenance.TimerProfile{Name: ApplicationRoot, Group: "TAU_DEFAULT", Calls: 1}
		var tops float64
		for _, r := range roots {
			top := funcs[r].top
			root.Subrs += top.Calls
			tops += top.Inclusive
		}
		root.Inclusive = tops
		if tp.LastTS > tp.FirstTS {
			root.Inclusive = max(tops, float64(tp.LastTS-tp.FirstTS))
		}
		root.Exclusive = root.Inclusive - tops
		out = append(out, profileLine{TimerProfile: root})
		have[ApplicationRoot] = true
		prefix = ApplicationRoot + " => "
		for _, r := range roots {
			top := funcs[r].top
			top.Name = prefix + r
			paths = append(paths, top)
		}
	}
	for i := range paths {
		if prefix != "" && !strings.HasPrefix(paths[i].Name, prefix) {
			paths[i].Name = prefix + paths[i].Name
		}
	}
	// A prefix sorts before the paths that extend it.
	sort.SliceStable(paths, func(i, j int) bool {
		return lessPath(taudb.SplitCallpath(paths[i].Name), taudb.SplitCallpath(paths[j].Name))
	})
	for _, p := range paths {
		nodes := taudb.SplitCallpath(p.Name)
		for k := 2; k < len(nodes); k++ {
			pre := strings.Join(nodes[:k], " => ")
			if !have[pre] {
				have[pre] = true
				out = append(out, profileLine{TimerProfile: provenance.TimerProfile{Name: pre, Group: p.Group}, keep: true})
			}
		}
		if !have[p.Name] {
			have[p.Name] = true
			out = append(out, profileLine{TimerProfile: p})
		}
	}
	for _, name := range order {
		if !have[name] && funcs[name].flat.Name != "" {
			have[name] = true
			out = append(out, profileLine{TimerProfile: funcs[name].flat})
		}
	}
	return out
}

// subtractTimer takes o's calls and times out of t, never below zero.
func subtractTimer(t, o *provenance.TimerProfile) {
	t.Calls -= min(t.Calls, o.Calls)
	t.Subrs -= min(t.Subrs, o.Subrs)
	t.Inclusive = max(0, t.Inclusive-o.Inclusive)
	t.Exclusive = max(0, t.Exclusive-o.Exclusive)
	t.SumSqInclusive = max(0, t.SumSqInclusive-o.SumSqInclusive)
	t.SumSqExclusive = max(0, t.SumSqExclusive-o.SumSqExclusive)
}

// lessPath orders call paths frame by frame, a prefix first.
func lessPath(a, b []string) bool {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return len(a) < len(b)
}

func addTimers(tr *taudb.Trial, th *taudb.Thread, m *taudb.Metric, p *provenance.ThreadProfile) error {
	lines := treeTimers(p)
	root := ""
	if len(lines) > 0 {
		root = lines[0].Name
	}
	for _, l := range lines {
		t := l.TimerProfile
		if t.Calls == 0 && !l.keep {
			continue // TAU writes no line for a timer that was never called
		}
		if math.IsNaN(t.Inclusive) || math.IsNaN(t.Exclusive) {
			return fmt.Errorf("timer %q has a NaN time", t.Name)
		}
		name := taudb.NormalizeName(t.Name)
		if name == "" {
			return errors.New("a timer has an empty name")
		}
		groups := taudb.SplitGroups(t.Group)
		var flat []string
		for _, g := range groups {
			if g != "TAU_CALLPATH" {
				flat = append(flat, g)
			}
		}
		if len(flat) == 0 {
			flat = []string{DefaultGroup}
		}
		nodes := taudb.SplitCallpath(name)
		c := tr.AddCallpath(nodes)
		for _, n := range nodes {
			if tm := tr.Timer(n); len(tm.Groups) == 0 {
				tm.Groups = flat
			}
		}
		if len(nodes) > 1 {
			c.GroupSpelling = "TAU_CALLPATH|" + strings.Join(flat, "|")
		}
		incl, excl := t.Inclusive, t.Exclusive
		if name == root {
			incl, excl = math.Round(incl), math.Round(excl)
		}
		d := tr.AddCallData(th, c)
		d.Calls += float64(t.Calls)
		d.Subroutines += float64(t.Subrs)
		v := d.Value(m)
		if v != nil {
			incl += v.Inclusive
			excl += v.Exclusive
		}
		v = d.SetValue(m, incl, excl)
		if t.SumSqExclusive > 0 {
			sq := t.SumSqExclusive
			if v.SumExclusiveSquared != nil {
				sq += *v.SumExclusiveSquared
			}
			v.SumExclusiveSquared = &sq
		}
	}
	return nil
}

// metaIndex sorts the run's metadata by the threads it applies to, so that
// each thread's set is found without scanning every entry for every thread.
type metaIndex struct {
	exact   map[ThreadKey][]provenance.Metadata // a known thread
	rank    map[[2]uint32][]provenance.Metadata // (pid, rank) known, no such thread: all its threads
	program map[uint32][]provenance.Metadata    // rank unknown in its program: every thread of the program
}

func indexMetadata(meta []provenance.Metadata, threads latestProfiles) *metaIndex {
	ranks := map[[2]uint32]bool{}
	for k := range threads {
		ranks[[2]uint32{k.PID, k.Rank}] = true
	}
	ix := &metaIndex{exact: map[ThreadKey][]provenance.Metadata{}, rank: map[[2]uint32][]provenance.Metadata{}, program: map[uint32][]provenance.Metadata{}}
	for _, e := range meta {
		k := ThreadKey{e.PID, e.RID, e.TID}
		switch _, known := threads[k]; {
		case known:
			ix.exact[k] = append(ix.exact[k], e)
		case ranks[[2]uint32{e.PID, e.RID}]:
			ix.rank[[2]uint32{e.PID, e.RID}] = append(ix.rank[[2]uint32{e.PID, e.RID}], e)
		default:
			ix.program[e.PID] = append(ix.program[e.PID], e)
		}
	}
	return ix
}

// threadMetadata is thread p's metadata: the run's entries that apply to it
// (later entries win within each kind, a rank's over the program's, the
// thread's own over its rank's), then its profile's map.
func threadMetadata(p *provenance.ThreadProfile, ix *metaIndex) []taudb.Attribute {
	kv := map[string]string{}
	for _, set := range [][]provenance.Metadata{ix.program[p.PID], ix.rank[[2]uint32{p.PID, p.Rank}], ix.exact[ThreadKey{p.PID, p.Rank, p.TID}]} {
		for _, e := range set {
			kv[e.Descr] = e.Value
		}
	}
	for k, v := range p.Metadata {
		kv[k] = v
	}
	if _, ok := kv["pid"]; !ok && p.PID != 0 {
		kv["pid"] = strconv.FormatUint(uint64(p.PID), 10)
	}
	delete(kv, taudb.MetricNameKey)
	names := make([]string, 0, len(kv))
	for k := range kv {
		names = append(names, k)
	}
	sort.Strings(names) // TAU writes metadata sorted by name
	out := make([]taudb.Attribute, 0, len(names))
	for _, k := range names {
		out = append(out, taudb.Attribute{Name: k, Value: kv[k]})
	}
	return out
}

// WriteProfiles writes t as TAU profile files into dir (created if needed).
func WriteProfiles(dir string, t *taudb.Trial) error {
	if err := taudb.WriteDir(dir, t); err != nil {
		return fmt.Errorf("summary: %w", err)
	}
	return nil
}

// Options says where Write puts a trial.
type Options struct {
	// Dir receives TAU profile files; empty skips them.
	Dir string
	// DSN is a PostgreSQL URL; when set, the trial is also saved to TAUdb
	// there (the schema is created if absent).
	DSN string
}

// Write writes t to the places opts names and returns the TAUdb trial id
// (0 without a DSN).
func Write(ctx context.Context, t *taudb.Trial, opts Options) (int, error) {
	if opts.Dir == "" && opts.DSN == "" {
		return 0, errors.New("summary: neither a profile directory nor a TAUdb DSN given")
	}
	if opts.Dir != "" {
		if err := WriteProfiles(opts.Dir, t); err != nil {
			return 0, err
		}
	}
	if opts.DSN == "" {
		return 0, nil
	}
	s, err := taudb.Open(ctx, opts.DSN)
	if err != nil {
		return 0, fmt.Errorf("summary: %w", err)
	}
	defer s.Close()
	if _, _, err := s.Configure(ctx); err != nil {
		return 0, fmt.Errorf("summary: %w", err)
	}
	if _, err := s.SaveTrial(ctx, t); err != nil {
		return 0, fmt.Errorf("summary: %w", err)
	}
	return t.ID, nil
}
