package deploytest

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// usage is one place a deployment file runs one of our programs.
type usage struct {
	where   string   // file:line or file:service
	program string   // "ad", "pserver", "provdb" or "kipimo <sub>"
	flags   []string // long flag names given, without dashes
	oneDash []string // long flags given with a single dash (-http), which the programs reject
	env     []string // KIPIMO_* variables set for the program
	argv    []string // the words of the command line, for messages
}

// kipimoGroups are kipimo subcommands that only hold further subcommands.
var kipimoGroups = map[string]bool{"frames": true, "taudb": true, "query": true}

// shellStops end a command inside a shell line.
var shellStops = map[string]bool{"&&": true, "||": true, ";": true, "|": true, "&": true, ">": true, ">>": true, "2>&1": true, ")": true}

// launchers run the command that follows them (after their own flags), and
// shell keywords after which a command starts.
var launchers = map[string]bool{
	"srun": true, "mpirun": true, "mpiexec": true, "exec": true, "env": true, "time": true,
	"nohup": true, "sudo": true, "bash": true, "sh": true,
	"then": true, "do": true, "else": true, "if": true, "while": true, "!": true, "{": true, "(": true,
}

// argvUsage finds our program at a command position of argv (a command line
// split into words: the first word, a word after a shell separator, or after a
// launcher such as srun and its flags) and returns the flags given to it. ok
// is false when argv runs none of ours.
func argvUsage(where string, argv []string) (u usage, ok bool) {
	cmdPos, inLauncher := true, false
	for i, w := range argv {
		if shellStops[w] {
			cmdPos, inLauncher = true, false
			continue
		}
		if !cmdPos {
			continue
		}
		w = strings.TrimLeft(w, "(")
		if inLauncher && strings.HasPrefix(w, "-") {
			continue
		}
		if n, _, ok := strings.Cut(w, "="); ok && isName(n) {
			continue // VAR=value before a command
		}
		name := programName(w)
		if launchers[name] {
			inLauncher = true
			continue
		}
		cmdPos, inLauncher = false, false
		if !isBinary(name) {
			continue
		}
		prog := name
		rest := argv[i+1:]
		if name == "kipimo" {
			for len(rest) > 0 && !strings.HasPrefix(rest[0], "-") && !shellStops[rest[0]] {
				prog += " " + rest[0]
				sub := rest[0]
				rest = rest[1:]
				if !kipimoGroups[sub] {
					break
				}
			}
		}
		u = usage{where: where, program: prog, argv: argv[i:]}
		for _, a := range rest {
			if shellStops[a] {
				break
			}
			a = strings.Trim(a, `"'`)
			if a == "--" {
				break // what follows is the command kipimo runs, with its own flags
			}
			if oneDashFlag.MatchString(a) {
				u.oneDash = append(u.oneDash, a)
				continue
			}
			if !strings.HasPrefix(a, "--") {
				continue
			}
			n, _, _ := strings.Cut(a[2:], "=")
			u.flags = append(u.flags, n)
		}
		return u, true
	}
	return usage{}, false
}

// oneDashFlag matches a long flag written with one dash (-http, -run=x);
// one-letter flags (-h) and negative numbers do not match.
var oneDashFlag = regexp.MustCompile(`^-[A-Za-z][A-Za-z0-9_-]+(=.*)?$`)

// isName reports whether s is a shell variable name.
func isName(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		if r != '_' && !(r >= 'A' && r <= 'Z') && !(r >= 'a' && r <= 'z') && !(i > 0 && r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// programName returns the binary a word runs, or "" when it runs none of
// ours: ad, "$KIPIMO_BIN/ad" and /usr/local/bin/pserver run a binary; a data
// path such as /var/lib/kipimo/provdb does not (its directory is no bin).
func programName(word string) string {
	word = strings.Trim(word, `"'`)
	dir, base := "", word
	if i := strings.LastIndex(word, "/"); i >= 0 {
		dir, base = word[:i], word[i+1:]
	}
	if dir != "" && !strings.Contains(strings.ToLower(dir), "bin") {
		return ""
	}
	return base
}

// flagOfEnv maps KIPIMO_TOKEN_FILE to token-file.
func flagOfEnv(name string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(name, "KIPIMO_")), "_", "-")
}

// yamlDocs decodes every document of a YAML stream into generic values.
func yamlDocs(data []byte) ([]any, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var docs []any
	for {
		var v any
		err := dec.Decode(&v)
		if err == io.EOF {
			return docs, nil
		}
		if err != nil {
			return docs, err
		}
		if v != nil {
			docs = append(docs, v)
		}
	}
}

func readYAMLDocs(t testing.TB, path string) []any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	docs, err := yamlDocs(b)
	if err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	return docs
}

// Accessors for generic YAML values; a missing or mistyped value is the zero value.
func mapOf(v any) map[string]any { m, _ := v.(map[string]any); return m }
func listOf(v any) []any         { l, _ := v.([]any); return l }
func strOf(v any) string         { s, _ := v.(string); return s }

func path(v any, keys ...string) any {
	for _, k := range keys {
		v = mapOf(v)[k]
	}
	return v
}

// words turns a compose/k8s command (a list, or a string split like a shell
// would without quoting rules) into words.
func words(v any) []string {
	switch c := v.(type) {
	case string:
		return strings.Fields(c)
	case []any:
		var out []string
		for _, x := range c {
			out = append(out, fmt.Sprint(x))
		}
		return out
	}
	return nil
}

// envNames returns the variable names of a compose environment (map or list)
// or a Kubernetes env list.
func envNames(v any) []string {
	var names []string
	switch e := v.(type) {
	case map[string]any:
		for k := range e {
			names = append(names, k)
		}
	case []any:
		for _, x := range e {
			if s, ok := x.(string); ok {
				n, _, _ := strings.Cut(s, "=")
				names = append(names, n)
			} else if n := strOf(mapOf(x)["name"]); n != "" {
				names = append(names, n)
			}
		}
	}
	var out []string
	for _, n := range names {
		if strings.HasPrefix(n, "KIPIMO_") {
			out = append(out, n)
		}
	}
	return out
}

// composeUsages lists the programs run by the compose file's services.
func composeUsages(t testing.TB, root string) []usage {
	t.Helper()
	file := filepath.Join(root, "deploy", "compose.yaml")
	docs := readYAMLDocs(t, file)
	if len(docs) != 1 {
		t.Fatalf("%s: want one YAML document, got %d", file, len(docs))
	}
	var out []usage
	for name, svc := range mapOf(path(docs[0], "services")) {
		argv := append(words(path(svc, "entrypoint")), words(path(svc, "command"))...)
		u, ok := argvUsage("deploy/compose.yaml: service "+name, argv)
		if !ok {
			continue
		}
		u.env = envNames(path(svc, "environment"))
		out = append(out, u)
	}
	return out
}

// podSpecs returns the pod specs of a Kubernetes object, by workload kind.
func podSpecs(doc any) []any {
	switch strOf(path(doc, "kind")) {
	case "Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet":
		return []any{path(doc, "spec", "template", "spec")}
	case "CronJob":
		return []any{path(doc, "spec", "jobTemplate", "spec", "template", "spec")}
	case "Pod":
		return []any{path(doc, "spec")}
	}
	return nil
}

// containers returns the containers and init containers of a pod spec.
func containers(spec any) []any {
	return append(listOf(path(spec, "initContainers")), listOf(path(spec, "containers"))...)
}

// k8sFiles lists the manifests: every .yaml file under deploy/k8s.
func k8sFiles(t testing.TB, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(filepath.Join(root, "deploy", "k8s"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".yaml") {
			files = append(files, p)
		}
		return err
	})
	if err != nil || len(files) == 0 {
		t.Fatalf("no Kubernetes manifests in deploy/k8s (err %v)", err)
	}
	return files
}

// k8sUsages lists the programs run by the Kubernetes manifests' containers.
func k8sUsages(t testing.TB, root string) []usage {
	t.Helper()
	var out []usage
	for _, file := range k8sFiles(t, root) {
		rel, _ := filepath.Rel(root, file)
		for _, doc := range readYAMLDocs(t, file) {
			for _, spec := range podSpecs(doc) {
				for _, c := range containers(spec) {
					argv := append(words(path(c, "command")), words(path(c, "args"))...)
					where := fmt.Sprintf("%s: %s/%s container %s", rel, strOf(path(doc, "kind")), strOf(path(doc, "metadata", "name")), strOf(path(c, "name")))
					u, ok := argvUsage(where, argv)
					if !ok {
						continue
					}
					u.env = envNames(path(c, "env"))
					out = append(out, u)
				}
			}
		}
	}
	return out
}

// shellUsages lists the programs run by a shell script: each logical line
// (backslash continuations joined) is split into words, and every command
// of ours on it is a usage. Comments are ignored.
func shellUsages(t testing.TB, root, rel string) []usage {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatalf("read %s: %v", rel, err)
	}
	var out []usage
	for _, ll := range logicalLines(string(b)) {
		fields := strings.Fields(ll.text)
		for len(fields) > 0 {
			u, ok := argvUsage(fmt.Sprintf("%s:%d", rel, ll.line), fields)
			if !ok {
				break
			}
			// Assignments just before the program (KIPIMO_RUN=x ad ...) set its environment.
			before := fields[:len(fields)-len(u.argv)]
			for i := len(before) - 1; i >= 0 && strings.Contains(before[i], "="); i-- {
				if n, _, _ := strings.Cut(before[i], "="); strings.HasPrefix(n, "KIPIMO_") {
					u.env = append(u.env, n)
				}
			}
			out = append(out, u)
			fields = afterStop(u.argv[1:])
		}
	}
	return out
}

// afterStop returns the words after the first shell separator, or nil.
func afterStop(ws []string) []string {
	for i, w := range ws {
		if shellStops[w] {
			return ws[i+1:]
		}
	}
	return nil
}

// stripComment drops a shell comment: a '#' at the start of a word and
// outside quotes ("${#a[@]}" and "a#b" are not comments).
func stripComment(line string) string {
	var quote rune
	prev := ' '
	for i, r := range line {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '\'' || r == '"':
			quote = r
		case r == '#' && (prev == ' ' || prev == '\t'):
			return line[:i]
		}
		prev = r
	}
	return line
}

type logicalLine struct {
	line int
	text string
}

// logicalLines joins backslash-continued lines and drops comments.
func logicalLines(script string) []logicalLine {
	var out []logicalLine
	sc := bufio.NewScanner(strings.NewReader(script))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	n, start := 0, 0
	var cur strings.Builder
	for sc.Scan() {
		n++
		line := stripComment(sc.Text())
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") {
			if cur.Len() == 0 {
				continue
			}
			trimmed = ""
		}
		if cur.Len() == 0 {
			start = n
		}
		if strings.HasSuffix(trimmed, `\`) {
			cur.WriteString(strings.TrimSuffix(trimmed, `\`))
			cur.WriteString(" ")
			continue
		}
		cur.WriteString(trimmed)
		if s := cur.String(); strings.TrimSpace(s) != "" {
			out = append(out, logicalLine{start, s})
		}
		cur.Reset()
	}
	if cur.Len() > 0 {
		out = append(out, logicalLine{start, cur.String()})
	}
	return out
}

// configFile is a daemon config file (keys are flag names) found in deploy/.
type configFile struct {
	where   string
	program string
	keys    []string
}

// configFiles returns deploy/config/<binary>.yaml files and the
// <binary>.yaml entries of Kubernetes ConfigMaps.
func configFiles(t testing.TB, root string) []configFile {
	t.Helper()
	var out []configFile
	keysOf := func(where string, data []byte) []string {
		docs, err := yamlDocs(data)
		if err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		if len(docs) != 1 {
			t.Fatalf("%s: want one YAML document, got %d", where, len(docs))
		}
		m := mapOf(docs[0])
		if m == nil {
			t.Fatalf("%s: want a mapping of flag names to values", where)
		}
		var keys []string
		for k := range m {
			keys = append(keys, k)
		}
		return keys
	}
	files, _ := filepath.Glob(filepath.Join(root, "deploy", "config", "*.yaml"))
	for _, f := range files {
		prog := strings.TrimSuffix(filepath.Base(f), ".yaml")
		rel, _ := filepath.Rel(root, f)
		if !isBinary(prog) {
			t.Errorf("%s: config files are named after the binary that reads them (%v)", rel, Binaries)
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatalf("read %s: %v", rel, err)
		}
		out = append(out, configFile{rel, prog, keysOf(rel, b)})
	}
	for _, file := range k8sFiles(t, root) {
		rel, _ := filepath.Rel(root, file)
		for _, doc := range readYAMLDocs(t, file) {
			if strOf(path(doc, "kind")) != "ConfigMap" {
				continue
			}
			for k, v := range mapOf(path(doc, "data")) {
				prog := strings.TrimSuffix(k, ".yaml")
				if !strings.HasSuffix(k, ".yaml") || !isBinary(prog) {
					continue
				}
				where := fmt.Sprintf("%s: ConfigMap/%s key %s", rel, strOf(path(doc, "metadata", "name")), k)
				out = append(out, configFile{where, prog, keysOf(where, []byte(strOf(v)))})
			}
		}
	}
	return out
}
