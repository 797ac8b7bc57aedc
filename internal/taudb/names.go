package taudb

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

var spaceRuns = regexp.MustCompile(` {2,}`)

// NormalizeName is TAU's name clean-up before upload: runs of two or more
// spaces become one, then leading and trailing blanks (bytes <= ' ') go.
func NormalizeName(s string) string {
	if strings.Contains(s, "  ") {
		s = spaceRuns.ReplaceAllString(s, " ")
	}
	return javaTrim(s)
}

func javaTrim(s string) string {
	return strings.TrimFunc(s, func(r rune) bool { return r <= ' ' })
}

// SplitCallpath splits a normalized "a => b => c" name into its nodes,
// outermost first; a flat name gives one node.
func SplitCallpath(name string) []string {
	if !strings.Contains(name, "=>") {
		return []string{name}
	}
	parts := strings.Split(name, "=>")
	out := parts[:0]
	for _, p := range parts {
		out = append(out, javaTrim(p))
	}
	return out
}

var paramPair = regexp.MustCompile(`<([^<>]*)> = <([^<>]*)>`)

// fillSourceLink sets short name, source location and parameters from the
// timer's name as TAU's Function.getSourceLink does:
// "name [{file} {l1,c1}-{l2,c2}]", "[{file} {l}]", the OPARI form
// "[OpenMP location: file:F <a, b>]", and parameter suffixes "[ <p> = <v> ]".
func fillSourceLink(t *Timer) {
	name := t.Name
	t.ShortName = name
	if i := strings.Index(name, "[ <"); i >= 0 {
		for _, m := range paramPair.FindAllStringSubmatch(name[i:], -1) {
			t.Parameters = append(t.Parameters, Parameter{Name: m[1], Value: m[2]})
		}
	}
	if i := strings.Index(name, "[{"); i >= 0 {
		t.ShortName = javaTrim(name[:i])
		rest := name[i+2:]
		end := strings.IndexByte(rest, '}')
		if end < 0 {
			return
		}
		t.SourceFile = sourceFile(rest[:end])
		rest = rest[end+1:]
		open := strings.IndexByte(rest, '{')
		if open < 0 {
			return
		}
		first, after := braceNumbers(rest[open:])
		if len(first) > 0 {
			t.LineNumber, t.LineNumberEnd = first[0], first[0]
		}
		if len(first) > 1 {
			t.ColumnNumber, t.ColumnNumberEnd = first[1], first[1]
		}
		if strings.HasPrefix(after, "-{") {
			second, _ := braceNumbers(after[1:])
			if len(second) > 0 {
				t.LineNumberEnd = second[0]
			}
			if len(second) > 1 {
				t.ColumnNumberEnd = second[1]
			}
		}
		return
	}
	const opari = "[OpenMP location: file:"
	if i := strings.Index(name, opari); i >= 0 {
		rest := name[i+len(opari):]
		lt := strings.IndexByte(rest, '<')
		gt := strings.IndexByte(rest, '>')
		if lt < 0 || gt < lt {
			return
		}
		t.SourceFile = sourceFile(javaTrim(rest[:lt]))
		nums := strings.Split(rest[lt+1:gt], ",")
		if len(nums) == 2 {
			a, err1 := strconv.Atoi(strings.TrimSpace(nums[0]))
			b, err2 := strconv.Atoi(strings.TrimSpace(nums[1]))
			if err1 == nil && err2 == nil {
				t.LineNumber, t.LineNumberEnd = a, b
			}
		}
	}
}

// sourceFile keeps a path that exists on this machine and reduces any other
// to its base name, as TAU's loader does.
func sourceFile(p string) string {
	if p == "" {
		return p
	}
	if _, err := os.Stat(p); err == nil {
		return p
	}
	return filepath.Base(p)
}

// braceNumbers reads "{a,b}" at the start of s and returns the numbers and
// the text after the closing brace.
func braceNumbers(s string) ([]int, string) {
	if !strings.HasPrefix(s, "{") {
		return nil, s
	}
	end := strings.IndexByte(s, '}')
	if end < 0 {
		return nil, s
	}
	var out []int
	for _, f := range strings.Split(s[1:end], ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, s[end+1:]
		}
		out = append(out, n)
	}
	return out, s[end+1:]
}

// SplitGroups splits a GROUP="a | b" value on '|' and trims each group.
func SplitGroups(s string) []string {
	var out []string
	for _, g := range strings.Split(s, "|") {
		if g = javaTrim(g); g != "" {
			out = append(out, g)
		}
	}
	return out
}
