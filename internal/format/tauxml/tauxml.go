// Package tauxml reads the XML profiles TAU writes with
// TAU_PROFILE_FORMAT=snapshot (snapshot.N.C.T, one per thread, one <profile>
// block per snapshot) and TAU_PROFILE_FORMAT=merged (one tauprofile.xml for
// the whole run, its documents separated by NUL bytes).
//
// What is read: the <thread> blocks and their metadata (a second block with
// the same id adds or replaces attributes); the <definitions> of metrics,
// events (name, group) and user events, per thread or for all ("*"),
// accumulated across snapshots; each thread's last <profile> block, its
// <interval_data> (event, calls, subrs, then excl and incl per metric listed)
// and <atomic_data> (user event, numevents, max, min, mean, sumsqr). Read
// returns them as TAU profile files (tauprofile.File), one per thread and
// metric, so that one merge (internal/taudb's BuildTrial) builds trials from
// every TAU format. Negative times are read as 0, as TAU's reader reads them.
//
// Not read: earlier snapshots of a thread, the merged file's
// <derivedentity>/<derivedprofile> blocks (TAU's own statistics over the
// threads, recomputed by the merge), <units> and <timestamp>. The XML is
// decoded strictly; errors are *tauprofile.ParseError naming the file and
// line.
package tauxml

import (
	"bufio"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/kipimo-hpc/kipimo/internal/format/tauprofile"
)

// xmlThread is one thread of a snapshot or merged XML profile.
type xmlThread struct {
	id                    string
	node, context, thread int
	metadata              []tauprofile.Attribute
	defs                  *xmlDefs
	last                  *xmlProfile // the thread's final (last) snapshot
}

// xmlDefs holds the definitions for one thread id, or for "*".
type xmlDefs struct {
	metrics    map[int]string
	events     map[int][2]string // name, groups
	userEvents map[int]string
}

func newXMLDefs() *xmlDefs {
	return &xmlDefs{metrics: map[int]string{}, events: map[int][2]string{}, userEvents: map[int]string{}}
}

// xmlProfile is one <profile> block: the raw text of its data sections and
// the lines they start on.
type xmlProfile struct {
	file                 string
	metrics              []int
	interval, atomic     string
	intervalAt, atomicAt int
}

// snapshotReader accumulates the threads of one or more XML files.
type snapshotReader struct {
	threads map[string]*xmlThread
	order   []string
	global  *xmlDefs
	defs    map[string]*xmlDefs
}

func newSnapshotReader() *snapshotReader {
	return &snapshotReader{threads: map[string]*xmlThread{}, global: newXMLDefs(), defs: map[string]*xmlDefs{}}
}

// nulToSpace replaces NUL bytes (TAU's merged file separates its documents
// with them) by spaces, keeping byte offsets and line numbers.
type nulToSpace struct{ r io.Reader }

func (n nulToSpace) Read(p []byte) (int, error) {
	k, err := n.r.Read(p)
	for i := 0; i < k; i++ {
		if p[i] == 0 {
			p[i] = ' '
		}
	}
	return k, err
}

// Read reads a TAU snapshot (snapshot.N.C.T) or merged (tauprofile.xml) XML
// profile: each thread's last snapshot, every metric and the user events, as
// TAU profile files. sets[m] holds the files of metric m (in the order the
// metrics first appear), one per thread; each file's metadata is "Metric
// Name" and then the thread's. The derived profiles a merged file carries are
// not read. file is used in errors.
func Read(r io.Reader, file string) (sets [][]*tauprofile.File, err error) {
	s := newSnapshotReader()
	if err := s.read(r, file); err != nil {
		return nil, err
	}
	return s.files(file)
}

// ReadDir reads every snapshot.N.C.T file in dir (SnapshotFiles) as one run,
// as Read does.
func ReadDir(dir string) (sets [][]*tauprofile.File, err error) {
	files, err := SnapshotFiles(dir)
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%s holds no snapshot.N.C.T files", dir)
	}
	s := newSnapshotReader()
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return nil, fmt.Errorf("read snapshot: %w", err)
		}
		err = s.read(fh, f)
		fh.Close()
		if err != nil {
			return nil, err
		}
	}
	return s.files(dir)
}

// SnapshotFiles lists the snapshot.N.C.T files of dir, sorted by name.
func SnapshotFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read snapshot directory: %w", err)
	}
	var out []string
	for _, e := range entries {
		if _, _, _, ok := tauprofile.NCT(e.Name()); ok && !e.IsDir() && strings.HasPrefix(e.Name(), "snapshot.") {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	sort.Strings(out)
	return out, nil
}

func (s *snapshotReader) read(r io.Reader, file string) error {
	dec := xml.NewDecoder(nulToSpace{bufio.NewReaderSize(r, 64*1024)})
	dec.Strict = true
	fail := func(format string, args ...any) error {
		line, _ := dec.InputPos()
		return &tauprofile.ParseError{File: file, Line: line, Msg: fmt.Sprintf(format, args...)}
	}
	// text reads the character data of the current element up to its end.
	text := func(what string) (string, int, error) {
		line, _ := dec.InputPos()
		var b strings.Builder
		for {
			tok, err := dec.Token()
			if err != nil {
				return "", 0, fail("in <%s>: %v", what, err)
			}
			switch t := tok.(type) {
			case xml.CharData:
				b.Write(t)
			case xml.EndElement:
				return b.String(), line, nil
			case xml.StartElement:
				return "", 0, fail("unexpected <%s> inside <%s>", t.Name.Local, what)
			}
		}
	}
	attr := func(e xml.StartElement, name string) (string, bool) {
		for _, a := range e.Attr {
			if a.Name.Local == name {
				return a.Value, true
			}
		}
		return "", false
	}
	intAttr := func(e xml.StartElement, name string) (int, error) {
		v, ok := attr(e, name)
		if !ok {
			return 0, fail("<%s> has no %s attribute", e.Name.Local, name)
		}
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 0 {
			return 0, fail("<%s %s=%q>: want a number >= 0", e.Name.Local, name, v)
		}
		return n, nil
	}
	var (
		thread *xmlThread // inside <thread>
		defs   *xmlDefs   // inside <definitions>
		prof   *xmlProfile
		profTh string
		docs   int
	)
	// element reads a definition element's children as name -> text.
	children := func(e xml.StartElement) (map[string]string, error) {
		out := map[string]string{}
		for {
			tok, err := dec.Token()
			if err != nil {
				return nil, fail("in <%s>: %v", e.Name.Local, err)
			}
			switch t := tok.(type) {
			case xml.StartElement:
				v, _, err := text(t.Name.Local)
				if err != nil {
					return nil, err
				}
				out[t.Name.Local] = v
			case xml.EndElement:
				return out, nil
			}
		}
	}
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fail("%v", err)
		}
		switch t := tok.(type) {
		case xml.StartElement:
			switch t.Name.Local {
			case "profile_xml":
				docs++
			case "thread":
				id, ok := attr(t, "id")
				if !ok {
					return fail("<thread> has no id attribute")
				}
				var v [3]int
				for i, a := range [3]string{"node", "context", "thread"} {
					if v[i], err = intAttr(t, a); err != nil {
						return err
					}
				}
				thread = s.threads[id]
				if thread == nil {
					thread = &xmlThread{id: id, node: v[0], context: v[1], thread: v[2]}
					s.threads[id] = thread
					s.order = append(s.order, id)
				}
			case "attribute":
				if thread == nil {
					if err := dec.Skip(); err != nil {
						return fail("%v", err)
					}
					continue
				}
				kv, err := children(t)
				if err != nil {
					return err
				}
				thread.setMetadata(kv["name"], kv["value"])
			case "definitions":
				id, _ := attr(t, "thread")
				if id == "*" || id == "" {
					defs = s.global
				} else {
					if s.defs[id] == nil {
						s.defs[id] = newXMLDefs()
					}
					defs = s.defs[id]
				}
			case "metric", "event", "userevent":
				if defs == nil {
					return fail("<%s> outside <definitions>", t.Name.Local)
				}
				id, err := intAttr(t, "id")
				if err != nil {
					return err
				}
				kv, err := children(t)
				if err != nil {
					return err
				}
				switch t.Name.Local {
				case "metric":
					defs.metrics[id] = kv["name"]
				case "event":
					defs.events[id] = [2]string{kv["name"], kv["group"]}
				case "userevent":
					defs.userEvents[id] = kv["name"]
				}
			case "profile":
				id, ok := attr(t, "thread")
				if !ok {
					return fail("<profile> has no thread attribute")
				}
				prof, profTh = &xmlProfile{file: file}, id
			case "interval_data", "atomic_data":
				if prof == nil {
					return fail("<%s> outside <profile>", t.Name.Local)
				}
				if t.Name.Local == "interval_data" {
					ms, _ := attr(t, "metrics")
					for _, f := range strings.Fields(ms) {
						m, err := strconv.Atoi(f)
						if err != nil || m < 0 {
							return fail("<interval_data metrics=%q>: want metric ids", ms)
						}
						prof.metrics = append(prof.metrics, m)
					}
					if prof.interval, prof.intervalAt, err = text(t.Name.Local); err != nil {
						return err
					}
				} else {
					if prof.atomic, prof.atomicAt, err = text(t.Name.Local); err != nil {
						return err
					}
				}
			case "derivedentity", "derivedprofile":
				// TAU's own statistics over the threads; recomputed instead.
				if err := dec.Skip(); err != nil {
					return fail("%v", err)
				}
			}
		case xml.EndElement:
			switch t.Name.Local {
			case "thread":
				thread = nil
			case "definitions":
				defs = nil
			case "profile":
				th := s.threads[profTh]
				if th == nil {
					return fail("<profile thread=%q> has no <thread id=%q> before it", profTh, profTh)
				}
				th.last = prof
				prof = nil
			}
		}
	}
	if docs == 0 {
		return &tauprofile.ParseError{File: file, Line: 1, Msg: "no <profile_xml> element: not a TAU snapshot or merged XML profile"}
	}
	return nil
}

func (t *xmlThread) setMetadata(name, value string) {
	for i := range t.metadata {
		if t.metadata[i].Name == name {
			t.metadata[i].Value = value
			return
		}
	}
	t.metadata = append(t.metadata, tauprofile.Attribute{Name: name, Value: value})
}

// lookup finds a definition for thread id, then among the global ones.
func (s *snapshotReader) lookup(id string) *xmlDefs {
	d := s.defs[id]
	if d == nil {
		return s.global
	}
	return d
}

// files turns the threads' last snapshots into profile files per metric.
func (s *snapshotReader) files(where string) ([][]*tauprofile.File, error) {
	var metricNames []string
	metricIndex := map[string]int{}
	type nct [3]int
	files := map[string]map[nct]*tauprofile.File{}
	for _, id := range s.order {
		th := s.threads[id]
		p := th.last
		if p == nil {
			continue
		}
		defs := s.lookup(id)
		def := func(kind string, i int) (string, bool) {
			switch kind {
			case "metric":
				if v, ok := defs.metrics[i]; ok {
					return v, true
				}
				v, ok := s.global.metrics[i]
				return v, ok
			case "userevent":
				if v, ok := defs.userEvents[i]; ok {
					return v, true
				}
				v, ok := s.global.userEvents[i]
				return v, ok
			}
			return "", false
		}
		perMetric := make([]*tauprofile.File, len(p.metrics))
		for k, mid := range p.metrics {
			mname, ok := def("metric", mid)
			if !ok {
				return nil, &tauprofile.ParseError{File: p.file, Line: p.intervalAt, Msg: fmt.Sprintf("thread %s: metric %d is not defined", id, mid)}
			}
			if _, ok := metricIndex[mname]; !ok {
				metricIndex[mname] = len(metricNames)
				metricNames = append(metricNames, mname)
				files[mname] = map[nct]*tauprofile.File{}
			}
			if files[mname][nct{th.node, th.context, th.thread}] != nil {
				return nil, fmt.Errorf("%s: thread %d,%d,%d appears twice", p.file, th.node, th.context, th.thread)
			}
			pf := &tauprofile.File{Node: th.node, Context: th.context, Thread: th.thread, Header: "templated_functions_MULTI_" + mname,
				Metadata: append([]tauprofile.Attribute{{Name: tauprofile.MetricNameKey, Value: mname}}, th.metadata...)}
			files[mname][nct{th.node, th.context, th.thread}] = pf
			perMetric[k] = pf
		}
		if err := s.intervalLines(id, p, defs, perMetric); err != nil {
			return nil, err
		}
		if err := s.atomicLines(id, p, def, perMetric); err != nil {
			return nil, err
		}
	}
	if len(metricNames) == 0 {
		return nil, fmt.Errorf("%s: no thread has profile data", where)
	}
	sets := make([][]*tauprofile.File, len(metricNames))
	for i, m := range metricNames {
		for _, f := range files[m] {
			sets[i] = append(sets[i], f)
		}
	}
	return sets, nil
}

// dataLines splits an element's text into its non-blank lines with their
// line numbers.
func dataLines(text string, start int) (lines []string, at []int) {
	for i, l := range strings.Split(text, "\n") {
		if strings.TrimSpace(l) != "" {
			lines = append(lines, l)
			at = append(at, start+i)
		}
	}
	return lines, at
}

func (s *snapshotReader) intervalLines(id string, p *xmlProfile, defs *xmlDefs, out []*tauprofile.File) error {
	lines, at := dataLines(p.interval, p.intervalAt)
	want := 3 + 2*len(p.metrics)
	for i, l := range lines {
		f := strings.Fields(l)
		if len(f) != want {
			return &tauprofile.ParseError{File: p.file, Line: at[i], Msg: fmt.Sprintf("interval data: want %d fields (event id, calls, subrs, excl and incl per metric), got %d", want, len(f))}
		}
		v := make([]float64, len(f))
		for k, x := range f {
			n, err := strconv.ParseFloat(x, 64)
			if err != nil {
				return &tauprofile.ParseError{File: p.file, Line: at[i], Msg: fmt.Sprintf("interval data: field %d %q is not a number", k+1, x)}
			}
			v[k] = n
		}
		eid := int(v[0])
		ev, ok := defs.events[eid]
		if !ok {
			ev, ok = s.global.events[eid]
		}
		if !ok || float64(eid) != v[0] {
			return &tauprofile.ParseError{File: p.file, Line: at[i], Msg: fmt.Sprintf("thread %s: event %s is not defined", id, f[0])}
		}
		for k, pf := range out {
			pf.Functions = append(pf.Functions, tauprofile.FunctionLine{Name: ev[0], Groups: ev[1], Calls: v[1], Subrs: v[2],
				Exclusive: tauprofile.ClampNegative(v[3+2*k]), Inclusive: tauprofile.ClampNegative(v[4+2*k])})
		}
	}
	return nil
}

func (s *snapshotReader) atomicLines(id string, p *xmlProfile, def func(string, int) (string, bool), out []*tauprofile.File) error {
	lines, at := dataLines(p.atomic, p.atomicAt)
	for i, l := range lines {
		f := strings.Fields(l)
		if len(f) != 6 {
			return &tauprofile.ParseError{File: p.file, Line: at[i], Msg: fmt.Sprintf("atomic data: want 6 fields (user event id, numevents, max, min, mean, sumsqr), got %d", len(f))}
		}
		var v [6]float64
		for k, x := range f {
			n, err := strconv.ParseFloat(x, 64)
			if err != nil {
				return &tauprofile.ParseError{File: p.file, Line: at[i], Msg: fmt.Sprintf("atomic data: field %d %q is not a number", k+1, x)}
			}
			v[k] = n
		}
		name, ok := def("userevent", int(v[0]))
		if !ok || float64(int(v[0])) != v[0] {
			return &tauprofile.ParseError{File: p.file, Line: at[i], Msg: fmt.Sprintf("thread %s: user event %s is not defined", id, f[0])}
		}
		e := tauprofile.UserEventLine{Name: name, NumEvents: v[1], Max: v[2], Min: v[3], Mean: v[4], SumSquare: v[5]}
		for _, pf := range out {
			pf.UserEvents = append(pf.UserEvents, e)
		}
	}
	return nil
}
