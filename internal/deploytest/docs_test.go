package deploytest

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// markdownFiles lists the hand-written documents: docs/*.md (not the
// generated docs/cli/) and the READMEs under deploy/.
func markdownFiles(t testing.TB, root string) []string {
	t.Helper()
	var out []string
	for _, dir := range []string{"docs", "deploy"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && p == filepath.Join(root, "docs", "cli") {
				return filepath.SkipDir
			}
			if !d.IsDir() && strings.HasSuffix(p, ".md") {
				rel, _ := filepath.Rel(root, p)
				out = append(out, rel)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("walk %s: %v", dir, err)
		}
	}
	return out
}

// shellFence is a fenced block marked as shell; anyFence any fenced block.
var (
	shellFence = regexp.MustCompile("(?ms)^```(?:sh|bash|console|shell)[ \\t]*\n(.*?)^```")
	anyFence   = regexp.MustCompile("(?ms)^```[^\n]*\n.*?^```")
)

// docUsages lists the commands of ours in a document's shell code blocks.
// "go run ./cmd/X" counts as running X; a leading "$ " prompt is dropped.
func docUsages(t testing.TB, root, rel string) []usage {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatalf("read %s: %v", rel, err)
	}
	text := string(b)
	var out []usage
	for _, m := range shellFence.FindAllStringSubmatchIndex(text, -1) {
		block := text[m[2]:m[3]]
		firstLine := strings.Count(text[:m[2]], "\n") + 1
		block = strings.ReplaceAll(block, "go run ./cmd/", "")
		var lines []string
		for _, l := range strings.Split(block, "\n") {
			lines = append(lines, strings.TrimPrefix(strings.TrimSpace(l), "$ "))
		}
		for _, ll := range logicalLines(strings.Join(lines, "\n")) {
			fields := strings.Fields(ll.text)
			for len(fields) > 0 {
				u, ok := argvUsage(rel+":"+strconv.Itoa(firstLine+ll.line-1), fields)
				if !ok {
					break
				}
				out = append(out, u)
				fields = afterStop(u.argv[1:])
			}
		}
	}
	// Inline code that starts with one of our programs: `ad --window`.
	prose := anyFence.ReplaceAllStringFunc(text, func(b string) string { return strings.Repeat("\n", strings.Count(b, "\n")) })
	for _, m := range inlineCode.FindAllStringSubmatchIndex(prose, -1) {
		fields := strings.Fields(prose[m[2]:m[3]])
		if len(fields) == 0 || !isBinary(fields[0]) {
			continue
		}
		if u, ok := argvUsage(rel+":"+strconv.Itoa(strings.Count(prose[:m[0]], "\n")+1), fields); ok {
			out = append(out, u)
		}
	}
	return out
}

var inlineCode = regexp.MustCompile("`([^`\n]+)`")

var (
	mdLink    = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	mdHeading = regexp.MustCompile(`(?m)^#{1,6}\s+(.+?)\s*#*\s*$`)
	codeSpan  = regexp.MustCompile("(?ms)^```.*?^```|`[^`\n]*`")
)

// slug is GitHub's anchor for a heading: lower case, spaces to '-', and
// everything but letters, digits, '-' and '_' dropped.
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

func anchors(t testing.TB, file string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("read %s: %v", file, err)
	}
	text := regexp.MustCompile("(?ms)^```.*?^```").ReplaceAllString(string(b), "")
	out := map[string]bool{}
	for _, m := range mdHeading.FindAllStringSubmatch(text, -1) {
		h := strings.NewReplacer("`", "", "*", "").Replace(m[1])
		s := slug(h)
		for i := 0; out[s]; i++ {
			s = slug(h) + "-" + strconv.Itoa(i+1)
		}
		out[s] = true
	}
	return out
}

// TestDocLinks checks that every relative link in docs/ and the deploy READMEs
// names an existing file, and every #anchor into a Markdown file names one
// of its headings.
func TestDocLinks(t *testing.T) {
	root := repoRoot(t)
	mds := markdownFiles(t, root)
	if len(mds) == 0 {
		t.Fatal("no Markdown files in docs/ or deploy/")
	}
	for _, rel := range mds {
		t.Run(rel, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join(root, rel))
			if err != nil {
				t.Fatal(err)
			}
			text := codeSpan.ReplaceAllString(string(b), "")
			for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, frag, _ := strings.Cut(target, "#")
				full := filepath.Join(root, rel)
				if file != "" {
					full = filepath.Join(filepath.Dir(full), file)
					if _, err := os.Stat(full); err != nil {
						t.Errorf("link %q: %v", target, err)
						continue
					}
				}
				if frag != "" && strings.HasSuffix(full, ".md") && !anchors(t, full)[frag] {
					t.Errorf("link %q: %s has no heading with anchor #%s", target, filepath.Base(full), frag)
				}
			}
		})
	}
}

func TestSlug(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"plain", "Sizing", "sizing"},
		{"spaces and punctuation", "When to shard the pserver (--shards)", "when-to-shard-the-pserver---shards"},
		{"dots and slashes", "deploy/k8s: manifests v1.2", "deployk8s-manifests-v12"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := slug(tc.in); got != tc.want {
				t.Errorf("slug(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestArgvUsage(t *testing.T) {
	for _, tc := range []struct {
		name    string
		argv    string
		ok      bool
		program string
		flags   string
	}{
		{"daemon with flags", `ad --nats=nats://h:4222 --ranks 0-3 --algo hbos`, true, "ad", "nats ranks algo"},
		{"through srun and a bin directory", `srun -N1 --ntasks=1 "$KIPIMO_BIN/pserver" --shard 0`, true, "pserver", "shard"},
		{"kipimo subcommand", `/usr/local/bin/kipimo replay --run r1 --format frames /data/r1`, true, "kipimo replay", "run format"},
		{"kipimo nested subcommand", `kipimo frames dump --json x.kfr`, true, "kipimo frames dump", "json"},
		{"stops at a shell separator", `kipimo gen --out d && echo --not-a-flag`, true, "kipimo gen", "out"},
		{"data path is not a program", `mkdir -p /var/lib/kipimo/provdb --mode 0700`, false, "", ""},
		{"another program", `nats-server -js --config leaf.conf`, false, "", ""},
		{"a value is not a program", `kubectl -n kipimo create secret generic s`, false, "", ""},
		{"after a separator", `mkdir -p d && ad --ranks 0`, true, "ad", "ranks"},
		{"after an assignment", `KIPIMO_RUN=x provdb --store s`, true, "provdb", "store"},
		{"through bash -c", `srun --overlap bash -c '"$KIPIMO_BIN/kipimo" replay --run r'`, true, "kipimo replay", "run"},
		{"echoed text is not a command", `echo run ad --window 5`, false, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, ok := argvUsage("x", strings.Fields(tc.argv))
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v", ok, tc.ok)
			}
			if !ok {
				return
			}
			if u.program != tc.program || strings.Join(u.flags, " ") != tc.flags {
				t.Errorf("got %q flags %q, want %q flags %q", u.program, strings.Join(u.flags, " "), tc.program, tc.flags)
			}
		})
	}
}

func TestParseHelpFlags(t *testing.T) {
	for _, tc := range []struct{ name, help, want string }{
		{"cobra", "Usage:\n  kipimo gen [flags]\n\nFlags:\n  -h, --help          help for gen\n      --ranks int     ranks (default 4)\n      --out string    dir\n\nGlobal Flags:\n      --log-level string   level\n", "help log-level out ranks"},
		{"standard flag package", "Usage of ad:\n  -nats string\n    \tNATS URL\n  -window int\n    \twindow\n", "nats window"},
		{"prose is not a flag", "Run the detector.\nUse --nats to point at a server.\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := strings.Join(sortedKeys(parseHelpFlags(tc.help)), " "); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestStripComment(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"trailing comment", `ALGO=${ALGO:-hbos}   # sstd | hbos`, `ALGO=${ALGO:-hbos}   `},
		{"hash in a parameter expansion", `n=${#NODES[@]}`, `n=${#NODES[@]}`},
		{"hash in quotes", `echo "a # b" # c`, `echo "a # b" `},
		{"whole line", `# kipimo gen --out x`, ``},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := stripComment(tc.in); got != tc.want {
				t.Errorf("stripComment(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestArgvUsageOneDash(t *testing.T) {
	for _, tc := range []struct {
		name, argv, flags, oneDash string
	}{
		{"two dashes", `pserver --http 0.0.0.0:8080 --run r`, "http run", ""},
		{"one dash", `pserver -http 0.0.0.0:8080 --run r`, "run", "-http"},
		{"one dash with value", `provdb -store=x.db`, "", "-store=x.db"},
		{"shorthand and numbers are not long flags", `ad -h --min-runtime -1`, "min-runtime", ""},
		{"the command after -- has its own flags", `kipimo run --exec -- mpirun -np 2 lmp --in x`, "exec", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, ok := argvUsage("x", strings.Fields(tc.argv))
			if !ok {
				t.Fatal("no usage found")
			}
			if got := strings.Join(u.flags, " "); got != tc.flags {
				t.Errorf("flags %q, want %q", got, tc.flags)
			}
			if got := strings.Join(u.oneDash, " "); got != tc.oneDash {
				t.Errorf("one-dash flags %q, want %q", got, tc.oneDash)
			}
		})
	}
}
