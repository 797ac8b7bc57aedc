// Package hatchetread reads a directory of TAU profile files the way
// Hatchet's TAU reader (llnl-hatchet 2024.1.0, hatchet/readers/tau_reader.py)
// does, with its rules ported one by one, so that tests can check that the
// profiles Kipimo writes load in Hatchet and Thicket, which cannot be
// installed where the tests run. Where Hatchet would crash or silently lose a
// node, Read returns an error naming the file, the line and the rule.
package hatchetread

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Node is one call-tree node: a call path from a root.
type Node struct {
	// Path is the node's frames, root first.
	Path []string
	// Parent is the node's parent, nil for a root.
	Parent *Node
	// Children in the order they were first read.
	Children []*Node
	// Rows are the node's metrics per (rank, thread) that has a line for it.
	Rows map[[2]int]Row
}

// Row is one file's values for a node.
type Row struct {
	Calls, Subrs, Exclusive, Inclusive float64
}

// Graph is what Read builds: Hatchet's call tree of a profile directory.
type Graph struct {
	Roots []*Node
	// Nodes by their path with spaces stripped, Hatchet's key.
	Nodes map[string]*Node
	// Metric is the metric name of the files (from "Metric Name").
	Metric string
	// Unread lists, per file, the functions that have only a flat line and
	// are neither the root nor the last frame of a call path: Hatchet does
	// not read them, silently.
	Unread map[string][]string
}

// Rule-numbered errors; each names the rule of Hatchet's reader it enforces.
var (
	// Rule 1: line 2 needs " # " after its columns, and the metric name as
	// the first metadata attribute (re.match(r"\#\s(.*)\s\#") and the first
	// <value>).
	errHeader = "rule 1 (line 2: columns between '# ' and ' #', Metric Name the first attribute)"
	// Rule 2: the root is the first function line; its values are read
	// with int().
	errRoot = "rule 2 (the first function line is the root, its numbers integers)"
	// Rule 3: after the root only lines containing "=>" are read; each path
	// must start at a root of this file or of one read before, or the
	// reader fails in _create_parent (IndexError).
	errNoRoot = "rule 3 (every call path starts at a root)"
	// Rule 4: every prefix of a path is a line of its own; an ancestor the
	// reader has to create upward has no metrics.
	errPrefix = "rule 4 (every prefix of a call path is a line)"
	// Rule 5: a path appears once per file (duplicates break the reshape).
	errDuplicate = "rule 5 (no call path twice in one file)"
	// Rule 6: every line containing "=>" must match the function-line
	// pattern "(.*)"\s(.*)\sG, user-event lines included.
	errPattern = "rule 6 (a line with => matches the function-line pattern)"
)

var (
	columnsRe = regexp.MustCompile(`\#\s(.*)\s\#`)
	valueRe   = regexp.MustCompile(`<value>(.*?)<\/value>`)
	nameRe    = regexp.MustCompile(`<name>(.*?)<\/name>`)
	lineRe    = regexp.MustCompile(`"(.*)"\s(.*)\sG`)
)

// Read reads every profile.* file under dir, in Hatchet's order (every
// subfolder, names sorted as text), and returns the call tree.
func Read(dir string) (*Graph, error) {
	var files []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasPrefix(d.Name(), "profile.") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%s: no profile.* files", dir)
	}
	sort.Strings(files)
	g := &Graph{Nodes: map[string]*Node{}, Unread: map[string][]string{}}
	for _, f := range files {
		if err := g.readFile(f); err != nil {
			return nil, err
		}
	}
	return g, nil
}

func key(path []string) string {
	return strings.ReplaceAll(strings.Join(path, "=>"), " ", "")
}

func (g *Graph) readFile(path string) error {
	parts := strings.Split(filepath.Base(path), ".")
	if len(parts) < 4 {
		return fmt.Errorf("%s: name is not profile.<rank>.<context>.<thread>", path)
	}
	rank, err1 := strconv.Atoi(parts[len(parts)-3])
	thread, err2 := strconv.Atoi(parts[len(parts)-1])
	if err1 != nil || err2 != nil {
		return fmt.Errorf("%s: name is not profile.<rank>.<context>.<thread>", path)
	}
	fh, err := os.Open(path)
	if err != nil {
		return err
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if len(lines) < 3 {
		return fmt.Errorf("%s: %s: fewer than 3 lines", path, errRoot)
	}
	if columnsRe.FindStringSubmatch(lines[1]) == nil {
		return fmt.Errorf("%s:2: %s", path, errHeader)
	}
	names, values := nameRe.FindStringSubmatch(lines[1]), valueRe.FindStringSubmatch(lines[1])
	if names == nil || values == nil || names[1] != "Metric Name" {
		return fmt.Errorf("%s:2: %s", path, errHeader)
	}
	if g.Metric == "" {
		g.Metric = values[1]
	}
	nfuncs, err := strconv.Atoi(strings.Fields(lines[0])[0])
	if err != nil {
		return fmt.Errorf("%s:1: function count: %w", path, err)
	}
	rootLine := lineRe.FindStringSubmatch(lines[2])
	if rootLine == nil {
		return fmt.Errorf("%s:3: %s: %q", path, errRoot, lines[2])
	}
	rootName := strings.TrimSpace(rootLine[1])
	if strings.Contains(rootName, "=>") {
		return fmt.Errorf("%s:3: %s: the first line is the call path %q", path, errRoot, rootName)
	}
	rootVals := strings.Fields(rootLine[2])
	if len(rootVals) < 4 {
		return fmt.Errorf("%s:3: %s: %q", path, errRoot, lines[2])
	}
	for _, v := range rootVals[:4] {
		if _, err := strconv.Atoi(v); err != nil {
			return fmt.Errorf("%s:3: %s: %q is not an integer", path, errRoot, v)
		}
	}
	row := func(fields []string) Row {
		var r [4]float64
		for i := range r {
			if i < len(fields) {
				r[i], _ = strconv.ParseFloat(fields[i], 64)
			}
		}
		return Row{Calls: r[0], Subrs: r[1], Exclusive: r[2], Inclusive: r[3]}
	}
	root := g.Nodes[key([]string{rootName})]
	if root == nil {
		root = &Node{Path: []string{rootName}, Rows: map[[2]int]Row{}}
		g.Nodes[key(root.Path)] = root
		g.Roots = append(g.Roots, root)
	}
	root.Rows[[2]int{rank, thread}] = row(rootVals)
	seen := map[string]bool{key(root.Path): true}
	var pending []struct {
		no   int
		path []string
	}
	// Function lines are lines 3..3+nfuncs-1; "=>" lines anywhere are read.
	var flat []string
	ends := map[string]bool{rootName: true}
	for i := 3; i < len(lines); i++ {
		line := lines[i]
		if !strings.Contains(line, "=>") {
			if i < 2+nfuncs {
				if m := lineRe.FindStringSubmatch(line); m != nil {
					flat = append(flat, strings.TrimSpace(m[1]))
				}
			}
			continue
		}
		m := lineRe.FindStringSubmatch(line)
		if m == nil {
			return fmt.Errorf("%s:%d: %s: %q", path, i+1, errPattern, line)
		}
		if i >= 2+nfuncs {
			continue // a user event line that matched: Hatchet reads it, Kipimo writes none
		}
		frames := strings.Split(m[1], "=>")
		for k := range frames {
			frames[k] = strings.TrimSpace(frames[k])
		}
		ends[frames[len(frames)-1]] = true
		k := key(frames)
		if seen[k] {
			return fmt.Errorf("%s:%d: %s: %q", path, i+1, errDuplicate, m[1])
		}
		seen[k] = true
		if g.Nodes[key(frames[:1])] == nil {
			return fmt.Errorf("%s:%d: %s: %q starts at %q, which is no root", path, i+1, errNoRoot, m[1], frames[0])
		}
		n := g.Nodes[k]
		if n == nil {
			n = &Node{Path: frames, Rows: map[[2]int]Row{}}
			g.Nodes[k] = n
		}
		n.Rows[[2]int{rank, thread}] = row(strings.Fields(m[2]))
		pending = append(pending, struct {
			no   int
			path []string
		}{i + 1, frames})
	}
	for _, f := range flat {
		if !ends[f] {
			g.Unread[path] = append(g.Unread[path], f)
		}
	}
	// Link parents; a prefix that is no line of this file would be created
	// upward without metrics.
	for _, p := range pending {
		for k := len(p.path) - 1; k >= 1; k-- {
			pk := key(p.path[:k])
			if !seen[pk] {
				return fmt.Errorf("%s:%d: %s: %q has no line", path, p.no, errPrefix, strings.Join(p.path[:k], " => "))
			}
		}
		n := g.Nodes[key(p.path)]
		if n.Parent == nil {
			parent := g.Nodes[key(p.path[:len(p.path)-1])]
			n.Parent = parent
			parent.Children = append(parent.Children, n)
		}
	}
	return nil
}

// Tree prints the graph as an indented tree with each node's inclusive time
// summed over the files that have it, as hatchet's gf.tree() shows it.
func (g *Graph) Tree() string {
	var b strings.Builder
	var walk func(n *Node, depth int)
	walk = func(n *Node, depth int) {
		var incl float64
		for _, r := range n.Rows {
			incl += r.Inclusive
		}
		fmt.Fprintf(&b, "%s%.3f %s\n", strings.Repeat("  ", depth), incl, n.Path[len(n.Path)-1])
		for _, c := range n.Children {
			walk(c, depth+1)
		}
	}
	for _, r := range g.Roots {
		walk(r, 0)
	}
	return b.String()
}
