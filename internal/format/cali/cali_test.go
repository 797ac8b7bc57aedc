package cali

import (
	"strings"
	"testing"
)

func TestParseRecord(t *testing.T) {
	cases := []struct {
		name, line string
		want       map[string][]string
		err        string
	}{
		{"node", `__rec=node,id=24,attr=8,data=iter,parent=23`, map[string][]string{"__rec": {"node"}, "id": {"24"}, "attr": {"8"}, "data": {"iter"}, "parent": {"23"}}, ""},
		{"ctx", `__rec=ctx,ref=25=4,attr=19=24,data=13=1`, map[string][]string{"__rec": {"ctx"}, "ref": {"25", "4"}, "attr": {"19", "24"}, "data": {"13", "1"}}, ""},
		{"escapes", `__rec=node,id=1,attr=8,data=a\,b\=c\\d\ne`, map[string][]string{"__rec": {"node"}, "id": {"1"}, "attr": {"8"}, "data": {"a,b=c\\d\ne"}}, ""},
		{"dangling escape", `__rec=node,data=x\`, nil, "escape"},
		{"no value", `__rec=node,id`, nil, "no '=value'"},
		{"no rec", `id=1`, nil, "no __rec"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseRecord(tc.line)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for k, v := range tc.want {
				if strings.Join(got[k], "|") != strings.Join(v, "|") {
					t.Errorf("%s = %q, want %q", k, got[k], v)
				}
			}
		})
	}
}

func TestTreePaths(t *testing.T) {
	// An attribute with properties (nested), one with none, a chain of
	// two values, a snapshot with a reference and an immediate pair.
	lines := []string{
		`__rec=node,id=12,attr=10,data=256,parent=3`,
		`__rec=node,id=13,attr=8,data=function,parent=12`,
		`__rec=node,id=14,attr=8,data=iteration,parent=2`,
		`__rec=node,id=15,attr=13,data=main`,
		`__rec=node,id=16,attr=13,data=solve,parent=15`,
		`__rec=ctx,ref=16,attr=14,data=7`,
	}
	tr := NewTree()
	var es []Entry
	for _, l := range lines {
		rec, err := ParseRecord(l)
		if err != nil {
			t.Fatal(err)
		}
		switch rec.Kind() {
		case "node":
			id, n, err := NodeOf(rec)
			if err != nil {
				t.Fatal(err)
			}
			tr.Add(id, n)
		case "ctx":
			if es, err = tr.Entries(rec, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := []Entry{{"function", "main", PropNested}, {"function", "solve", PropNested}, {"iteration", "7", 0}}
	if len(es) != len(want) {
		t.Fatalf("entries %v, want %v", es, want)
	}
	for i := range want {
		if es[i] != want[i] {
			t.Errorf("entry %d = %+v, want %+v", i, es[i], want[i])
		}
	}
}

func TestTreeErrors(t *testing.T) {
	cases := []struct{ name, text, want string }{
		{"undefined node", "__rec=ctx,ref=99", "undefined node 99"},
		{"undefined attribute", "__rec=node,id=20,attr=77,data=x\n__rec=ctx,ref=20", "attribute 77 is not defined"},
		{"bad id", "__rec=node,id=x,attr=8,data=a", "not a number"},
		{"unpaired", "__rec=ctx,attr=8=9,data=1", "2 attr= values but 1 data= values"},
		{"cycle", "__rec=node,id=20,attr=8,data=a,parent=21\n__rec=node,id=21,attr=8,data=b,parent=20\n__rec=ctx,ref=20", "cycle"},
		{"two data", "__rec=node,id=20,attr=8,data=a=b", "2 data= entries"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tr := NewTree()
			var err error
			for _, l := range strings.Split(tc.text, "\n") {
				var rec Record
				if rec, err = ParseRecord(l); err != nil {
					break
				}
				if rec.Kind() == "node" {
					var id uint64
					var n Node
					if id, n, err = NodeOf(rec); err != nil {
						break
					}
					tr.Add(id, n)
					continue
				}
				if _, err = tr.Entries(rec, nil); err != nil {
					break
				}
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

// FuzzStream reads arbitrary lines as a stream: it must never panic or
// loop, and every path it returns is root first and no longer than the tree.
func FuzzStream(f *testing.F) {
	f.Add("__rec=node,id=12,attr=8,data=function\n__rec=node,id=13,attr=12,data=main\n__rec=ctx,ref=13,attr=12,data=x")
	f.Add("__rec=node,id=20,attr=8,data=a,parent=21\n__rec=node,id=21,attr=8,data=b,parent=20\n__rec=ctx,ref=20")
	f.Add(`__rec=ctx,ref=1\,2=3,attr=\`)
	f.Fuzz(func(t *testing.T, text string) {
		tr := NewTree()
		nodes := 0
		for _, l := range strings.Split(text, "\n") {
			rec, err := ParseRecord(l)
			if err != nil {
				continue
			}
			switch rec.Kind() {
			case "node":
				if id, n, err := NodeOf(rec); err == nil {
					tr.Add(id, n)
					nodes++
				}
			default:
				es, err := tr.Entries(rec, nil)
				if err == nil && len(es) > len(rec["attr"])+len(rec["ref"])*(nodes+12) {
					t.Fatalf("%d entries from %d refs over %d nodes", len(es), len(rec["ref"]), nodes)
				}
			}
		}
	})
}
