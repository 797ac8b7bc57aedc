// Package cali reads the text form of Caliper's .cali streams, the part every
// reader of them shares: one record per line, and the context tree that node
// records build and snapshot records refer to.
//
// A line is a list of entries separated by ','; an entry is a key and its
// values separated by '='; '\' escapes the next character ("\n" is a
// newline). Every record has one __rec entry naming its kind (node, ctx,
// globals). A node record (id, attr, data, parent) adds a node to the tree:
// a node whose attr is 8 (cali.attribute.name) defines an attribute named by
// its data, whose properties are the data of its cali.attribute.prop (10)
// ancestor; every other node is a value of the attribute its attr names. A
// snapshot refers to nodes (ref), each standing for its whole path from the
// root, and carries immediate attr/data pairs.
//
// What a stream means (an aggregate region profile, an event trace) is up to
// its reader: internal/taudb and internal/replay/caliper.
package cali

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Caliper's bootstrap attributes: the ids every stream may use without
// defining them.
const (
	AttrName = 8  // cali.attribute.name: the node defines an attribute
	AttrType = 9  // cali.attribute.type
	AttrProp = 10 // cali.attribute.prop: the properties of the attributes below it
	// LastBootstrap is the last id of the bootstrap nodes (types and the
	// three meta attributes); streams may write them out again.
	LastBootstrap = 11
)

// Attribute property bits (Caliper's cali_attr_properties).
const (
	PropNested = 256 // the attribute's values nest (regions)
	PropGlobal = 512 // run metadata
)

// Record is one parsed line: each key with its values, in file order.
type Record map[string][]string

// Clip quotes s for an error message, cut to its first 32 bytes: a binary
// file read as a .cali would otherwise fill the message.
func Clip(s string) string {
	const most = 32
	if len(s) <= most {
		return strconv.Quote(s)
	}
	return strconv.Quote(s[:most]) + fmt.Sprintf("... (%d bytes; is this a text .cali file?)", len(s))
}

// ParseRecord splits one line into a Record. It fails on an entry without
// '=', a line ending in '\', or a record without exactly one __rec entry.
func ParseRecord(line string) (Record, error) {
	rec := Record{}
	var parts []string
	var cur strings.Builder
	end := func(col int) error {
		parts = append(parts, cur.String())
		cur.Reset()
		if len(parts) == 1 {
			if parts[0] == "" {
				parts = parts[:0]
				return nil
			}
			return fmt.Errorf("column %d: entry %s has no '=value'", col+1, Clip(parts[0]))
		}
		rec[parts[0]] = append(rec[parts[0]], parts[1:]...)
		parts = parts[:0]
		return nil
	}
	for i := 0; i < len(line); i++ {
		switch c := line[i]; c {
		case '\\':
			i++
			if i >= len(line) {
				return nil, fmt.Errorf("column %d: the line ends with an escape character", i)
			}
			if line[i] == 'n' {
				cur.WriteByte('\n')
			} else {
				cur.WriteByte(line[i])
			}
		case ',':
			if err := end(i); err != nil {
				return nil, err
			}
		case '=':
			parts = append(parts, cur.String())
			cur.Reset()
		default:
			cur.WriteByte(c)
		}
	}
	if err := end(len(line)); err != nil {
		return nil, err
	}
	switch v := rec["__rec"]; len(v) {
	case 1:
		return rec, nil
	case 0:
		return nil, errors.New("no __rec entry: every record names its kind")
	default:
		return nil, fmt.Errorf("%d __rec entries, want one", len(v))
	}
}

// Kind returns the record's kind, its __rec value.
func (r Record) Kind() string { return r["__rec"][0] }

// Uint returns the one value of key as a number.
func (r Record) Uint(key string) (uint64, error) {
	v := r[key]
	if len(v) != 1 {
		return 0, fmt.Errorf("want one %s= entry, got %d", key, len(v))
	}
	n, err := strconv.ParseUint(v[0], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s=%s is not a number", key, Clip(v[0]))
	}
	return n, nil
}

// Node is a node of the context tree.
type Node struct {
	Attr   uint64 // the attribute node this is a value of (8: it defines an attribute)
	Data   string
	Parent int64 // -1 for a root
}

// Attribute is an attribute a node record defined.
type Attribute struct {
	Name  string
	Props int64 // PropNested, PropGlobal, ...
}

// Entry is one attribute:value pair of a snapshot.
type Entry struct {
	Attr, Value string
	Props       int64
}

// Tree is the context tree of one stream. It is not safe for concurrent use.
type Tree struct {
	nodes map[uint64]Node
	attrs map[uint64]Attribute
}

// NewTree returns a tree holding Caliper's bootstrap nodes.
func NewTree() *Tree {
	t := &Tree{nodes: map[uint64]Node{}, attrs: map[uint64]Attribute{
		AttrName: {Name: "cali.attribute.name"},
		AttrType: {Name: "cali.attribute.type"},
		AttrProp: {Name: "cali.attribute.prop"},
	}}
	for id, name := range []string{"usr", "int", "uint", "string", "addr", "double", "bool", "type"} {
		t.nodes[uint64(id)] = Node{Attr: AttrType, Data: name, Parent: -1}
	}
	t.nodes[AttrName] = Node{Attr: AttrName, Data: "cali.attribute.name", Parent: 3}
	t.nodes[AttrType] = Node{Attr: AttrName, Data: "cali.attribute.type", Parent: 7}
	t.nodes[AttrProp] = Node{Attr: AttrName, Data: "cali.attribute.prop", Parent: 1}
	t.nodes[LastBootstrap] = Node{Attr: AttrType, Data: "ptr", Parent: -1}
	return t
}

// NodeOf reads a node record's id and node without adding it.
func NodeOf(rec Record) (uint64, Node, error) {
	id, err := rec.Uint("id")
	if err != nil {
		return 0, Node{}, err
	}
	attr, err := rec.Uint("attr")
	if err != nil {
		return 0, Node{}, err
	}
	n := Node{Attr: attr, Parent: -1}
	switch d := rec["data"]; len(d) {
	case 0:
	case 1:
		n.Data = d[0]
	default:
		return 0, Node{}, fmt.Errorf("node %d has %d data= entries, want one", id, len(d))
	}
	if _, ok := rec["parent"]; ok {
		p, err := rec.Uint("parent")
		if err != nil {
			return 0, Node{}, err
		}
		if p > 1<<62 {
			return 0, Node{}, fmt.Errorf("node %d: parent %d is not a node id", id, p)
		}
		n.Parent = int64(p)
	}
	return id, n, nil
}

// Add adds node n as id. A bootstrap id (<= LastBootstrap) is known already
// and left as it is. A node that defines an attribute (Attr 8) takes the
// properties of its cali.attribute.prop ancestor; an ancestor not defined
// (yet) gives none. Add checks nothing else: a reader that wants parents
// defined before their children checks it first (a Path through an
// undefined node or a cycle fails).
func (t *Tree) Add(id uint64, n Node) {
	if id <= LastBootstrap {
		return
	}
	t.nodes[id] = n
	if n.Attr != AttrName {
		return
	}
	a := Attribute{Name: n.Data}
	for p, depth := n.Parent, 0; p > LastBootstrap && depth <= len(t.nodes); depth++ {
		pn, ok := t.nodes[uint64(p)]
		if !ok {
			break
		}
		if pn.Attr == AttrProp {
			a.Props, _ = strconv.ParseInt(pn.Data, 10, 64)
		}
		p = pn.Parent
	}
	t.attrs[id] = a
}

// Node returns node id.
func (t *Tree) Node(id uint64) (Node, bool) {
	n, ok := t.nodes[id]
	return n, ok
}

// Attribute returns the attribute node id defines.
func (t *Tree) Attribute(id uint64) (Attribute, bool) {
	a, ok := t.attrs[id]
	return a, ok
}

// Path appends the entries of node id and its ancestors to out, root first.
// The bootstrap nodes are not context and end a path.
func (t *Tree) Path(id uint64, out []Entry) ([]Entry, error) {
	start := len(out)
	for depth := 0; ; depth++ {
		if depth > len(t.nodes) {
			return nil, fmt.Errorf("node %d: parent chain has a cycle", id)
		}
		n, ok := t.nodes[id]
		if !ok {
			return nil, fmt.Errorf("reference to undefined node %d", id)
		}
		a, ok := t.attrs[n.Attr]
		if !ok {
			return nil, fmt.Errorf("node %d: attribute %d is not defined", id, n.Attr)
		}
		out = append(out, Entry{Attr: a.Name, Value: n.Data, Props: a.Props})
		if n.Parent <= LastBootstrap {
			break
		}
		id = uint64(n.Parent)
	}
	for i, j := start, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out, nil
}

// Entries appends a snapshot record's entries to out: each reference's path,
// then the immediate attr/data pairs.
func (t *Tree) Entries(rec Record, out []Entry) ([]Entry, error) {
	for _, r := range rec["ref"] {
		id, err := strconv.ParseUint(r, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("ref=%s is not a node id", Clip(r))
		}
		if out, err = t.Path(id, out); err != nil {
			return nil, err
		}
	}
	attrs, data := rec["attr"], rec["data"]
	if len(attrs) != len(data) {
		return nil, fmt.Errorf("%d attr= values but %d data= values: immediate attributes must pair", len(attrs), len(data))
	}
	for i, s := range attrs {
		id, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("attr=%s is not an attribute id", Clip(s))
		}
		a, ok := t.attrs[id]
		if !ok {
			return nil, fmt.Errorf("attribute %d is not defined", id)
		}
		out = append(out, Entry{Attr: a.Name, Value: data[i], Props: a.Props})
	}
	return out, nil
}
