package deploytest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// TestDeployFilesExist pins the files the deployment guide promises.
func TestDeployFilesExist(t *testing.T) {
	root := repoRoot(t)
	for _, rel := range []string{
		"deploy/Dockerfile",
		"deploy/compose.yaml",
		"deploy/config/ad.yaml",
		"deploy/slurm/kipimo.sbatch",
		"deploy/slurm/README.md",
		"deploy/k8s/README.md",
		"docs/architecture.md",
		"docs/quickstart.md",
		"docs/sizing.md",
		"docs/wire-formats.md",
		"docs/coming-from-chimbuko.md",
	} {
		t.Run(rel, func(t *testing.T) {
			if _, err := os.Stat(filepath.Join(root, rel)); err != nil {
				t.Errorf("missing: %v", err)
			}
		})
	}
}

// TestStructuredFilesParse parses every YAML file (all documents of a
// stream) and every JSON file under deploy/.
func TestStructuredFilesParse(t *testing.T) {
	root := repoRoot(t)
	var files []string
	err := filepath.WalkDir(filepath.Join(root, "deploy"), func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch filepath.Ext(p) {
		case ".yaml", ".yml", ".json":
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk deploy/: %v", err)
	}
	if len(files) == 0 {
		t.Fatal("no YAML or JSON files under deploy/")
	}
	for _, f := range files {
		rel, _ := filepath.Rel(root, f)
		t.Run(rel, func(t *testing.T) {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if filepath.Ext(f) == ".json" {
				var v any
				if err := json.Unmarshal(b, &v); err != nil {
					t.Fatalf("parse: %v", err)
				}
				return
			}
			docs, err := yamlDocs(b)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if len(docs) == 0 {
				t.Fatal("no YAML document")
			}
		})
	}
}

// allUsages gathers every command line of ours in deploy/ and in the
// shell blocks of the documents.
func allUsages(t *testing.T, root string) []usage {
	t.Helper()
	us := composeUsages(t, root)
	us = append(us, k8sUsages(t, root)...)
	us = append(us, shellUsages(t, root, "deploy/slurm/kipimo.sbatch")...)
	for _, md := range markdownFiles(t, root) {
		us = append(us, docUsages(t, root, md)...)
	}
	return us
}

// TestFlagsExist checks every --flag and KIPIMO_* variable given to one of
// our programs in deploy/ (compose commands, Kubernetes args, the Slurm
// script) and in the documents' shell blocks against that program's --help.
func TestFlagsExist(t *testing.T) {
	root := repoRoot(t)
	us := allUsages(t, root)
	programs := map[string]bool{}
	for _, u := range us {
		programs[u.program] = true
	}
	// Every daemon is deployed somewhere.
	for _, want := range []string{"ad", "pserver", "provdb", "kipimo gen", "kipimo replay"} {
		if !programs[want] {
			t.Errorf("no deployment file runs %q", want)
		}
	}
	for _, u := range us {
		t.Run(u.where+" "+u.program, func(t *testing.T) {
			known, err := commandFlags(t, u.program)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range u.oneDash {
				t.Errorf("%s: %s is given %s with one dash; its flags take two (--%s)", u.where, u.program, f, strings.TrimPrefix(f, "-"))
			}
			for _, f := range u.flags {
				if !known[f] {
					t.Errorf("%s: %s has no flag --%s (it has --%s)", u.where, u.program, f, strings.Join(sortedKeys(known), ", --"))
				}
			}
			if len(u.env) > 0 && !known["config"] {
				t.Errorf("%s: %s is given %v but has no --config flag: it does not read settings through internal/config, so KIPIMO_* variables are ignored", u.where, u.program, u.env)
			}
			for _, e := range u.env {
				if f := flagOfEnv(e); !known[f] {
					t.Errorf("%s: %s reads no %s: it has no flag --%s", u.where, u.program, e, f)
				}
			}
		})
	}
}

// TestConfigKeysAreFlags checks the daemon config files: their keys are
// flag names, which the daemons require (unknown keys are errors).
func TestConfigKeysAreFlags(t *testing.T) {
	root := repoRoot(t)
	cfgs := configFiles(t, root)
	if len(cfgs) == 0 {
		t.Fatal("no daemon config files in deploy/config or Kubernetes ConfigMaps")
	}
	for _, c := range cfgs {
		t.Run(c.where, func(t *testing.T) {
			known, err := commandFlags(t, c.program)
			if err != nil {
				t.Fatal(err)
			}
			if !known["config"] {
				t.Errorf("%s: %s has no --config flag, so it cannot read this file", c.where, c.program)
			}
			sort.Strings(c.keys)
			for _, k := range c.keys {
				if k == "config" || !known[k] {
					t.Errorf("%s: key %q is not a flag of %s (keys are flag names: %s)", c.where, k, c.program, strings.Join(sortedKeys(known), ", "))
				}
			}
		})
	}
}

var (
	secretFlag  = regexp.MustCompile(`^(token|password|passwd|secret|api-key|key)$|-(token|password|secret)$`)
	urlPassword = regexp.MustCompile(`://[^/@\s:]+:[^/@\s]+@`)
)

// TestNoSecretsOnCommandLines: secrets come from files (--token-file) or the
// environment, never from a command line, where ps and logs would show them.
func TestNoSecretsOnCommandLines(t *testing.T) {
	root := repoRoot(t)
	for _, u := range allUsages(t, root) {
		t.Run(u.where+" "+u.program, func(t *testing.T) {
			for _, f := range u.flags {
				if secretFlag.MatchString(f) {
					t.Errorf("%s: --%s puts a secret on the command line; use a --*-file flag or the environment", u.where, f)
				}
			}
			for _, w := range u.argv {
				if urlPassword.MatchString(w) && !strings.Contains(w, "$") {
					t.Errorf("%s: %q carries a password in a URL on the command line", u.where, w)
				}
			}
		})
	}
}

var (
	stageLine = regexp.MustCompile(`(?im)^FROM\s+(\S+)(?:\s+AS\s+(\S+))?`)
	cmdPkg    = regexp.MustCompile(`\./cmd/([a-z0-9_-]+)`)
)

// dockerfile is what the compose test needs to know of deploy/Dockerfile.
type dockerfile struct {
	stages   map[string]bool
	binaries map[string]bool
}

func readDockerfile(t *testing.T, root string) dockerfile {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "deploy", "Dockerfile"))
	if err != nil {
		t.Fatalf("read deploy/Dockerfile: %v", err)
	}
	d := dockerfile{stages: map[string]bool{}, binaries: map[string]bool{}}
	for _, m := range stageLine.FindAllStringSubmatch(string(b), -1) {
		if m[2] != "" {
			d.stages[m[2]] = true
		}
	}
	for _, m := range cmdPkg.FindAllStringSubmatch(string(b), -1) {
		d.binaries[m[1]] = true
	}
	return d
}

// TestDockerfileBuildsEveryBinary: the image holds all four programs, built
// from packages that exist, and runs as a non-root user.
func TestDockerfileBuildsEveryBinary(t *testing.T) {
	root := repoRoot(t)
	d := readDockerfile(t, root)
	for _, b := range Binaries {
		if !d.binaries[b] {
			t.Errorf("deploy/Dockerfile does not build ./cmd/%s", b)
		}
	}
	for b := range d.binaries {
		if _, err := os.Stat(filepath.Join(root, "cmd", b)); err != nil {
			t.Errorf("deploy/Dockerfile builds ./cmd/%s, which does not exist", b)
		}
	}
	text, _ := os.ReadFile(filepath.Join(root, "deploy", "Dockerfile"))
	users := regexp.MustCompile(`(?m)^USER\s+(\S+)`).FindAllStringSubmatch(string(text), -1)
	if len(users) == 0 {
		t.Error("deploy/Dockerfile sets no USER: the image would run as root")
	} else if u := users[len(users)-1][1]; u == "root" || u == "0" || strings.HasPrefix(u, "0:") {
		t.Errorf("deploy/Dockerfile runs as %q", u)
	}
}

// TestCompose checks the compose file's references: built images come from
// deploy/Dockerfile stages, services on our image run programs the image
// holds, other images are pinned, and depends_on, volumes and secrets name
// things the file declares.
func TestCompose(t *testing.T) {
	root := repoRoot(t)
	d := readDockerfile(t, root)
	doc := readYAMLDocs(t, filepath.Join(root, "deploy", "compose.yaml"))[0]
	services := mapOf(path(doc, "services"))
	if len(services) == 0 {
		t.Fatal("deploy/compose.yaml has no services")
	}
	ours := map[string]bool{} // image names built from the Dockerfile
	for _, svc := range services {
		if path(svc, "build") != nil {
			ours[strOf(path(svc, "image"))] = true
		}
	}
	volumes := mapOf(path(doc, "volumes"))
	secrets := mapOf(path(doc, "secrets"))
	configs := mapOf(path(doc, "configs"))
	names := make([]string, 0, len(services))
	for n := range services {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		svc := services[name]
		t.Run(name, func(t *testing.T) {
			image := strOf(path(svc, "image"))
			if b := path(svc, "build"); b != nil {
				ctx := strOf(path(b, "context"))
				df := strOf(path(b, "dockerfile"))
				if df == "" {
					df = "Dockerfile"
				}
				if got := filepath.Clean(filepath.Join(root, "deploy", ctx, df)); got != filepath.Join(root, "deploy", "Dockerfile") {
					t.Errorf("build uses %s, want deploy/Dockerfile", got)
				}
				if tg := strOf(path(b, "target")); tg != "" && !d.stages[tg] {
					t.Errorf("build target %q is not a stage of deploy/Dockerfile (stages %v)", tg, sortedKeys(d.stages))
				}
			}
			switch {
			case image == "":
				t.Error("no image")
			case ours[image]:
				argv := append(words(path(svc, "entrypoint")), words(path(svc, "command"))...)
				if len(argv) == 0 {
					t.Error("runs the image's default command; name the program")
				} else if p := programName(argv[0]); !d.binaries[p] {
					t.Errorf("runs %q, which deploy/Dockerfile does not build (it builds %v)", argv[0], sortedKeys(d.binaries))
				}
			default:
				_, tag, ok := strings.Cut(image[strings.LastIndex(image, "/")+1:], ":")
				if !ok || tag == "latest" || tag == "" {
					t.Errorf("image %q is not pinned to a version tag", image)
				}
			}
			for _, dep := range dependsOn(path(svc, "depends_on")) {
				if _, ok := services[dep]; !ok {
					t.Errorf("depends_on %q: no such service", dep)
				}
			}
			for _, v := range listOf(path(svc, "volumes")) {
				src := strOf(path(v, "source"))
				if s, ok := v.(string); ok {
					src, _, _ = strings.Cut(s, ":")
				}
				if src == "" || strings.HasPrefix(src, ".") || strings.HasPrefix(src, "/") {
					if strings.HasPrefix(src, ".") {
						if _, err := os.Stat(filepath.Join(root, "deploy", src)); err != nil {
							t.Errorf("bind mount %q: %v", src, err)
						}
					}
					continue
				}
				if _, ok := volumes[src]; !ok {
					t.Errorf("volume %q is not declared under top-level volumes", src)
				}
			}
			for kind, decl := range map[string]map[string]any{"secrets": secrets, "configs": configs} {
				for _, s := range listOf(path(svc, kind)) {
					n := strOf(s)
					if n == "" {
						n = strOf(path(s, "source"))
					}
					if _, ok := decl[n]; !ok {
						t.Errorf("%s %q is not declared at the top level", kind, n)
					}
				}
			}
		})
	}
	for kind, decl := range map[string]map[string]any{"secrets": secrets, "configs": configs} {
		for n, v := range decl {
			if f := strOf(path(v, "file")); f != "" {
				if _, err := os.Stat(filepath.Join(root, "deploy", f)); err != nil {
					t.Errorf("top-level %s %q: file %v", kind, n, err)
				}
			}
		}
	}
}

func dependsOn(v any) []string {
	var out []string
	switch d := v.(type) {
	case []any:
		for _, x := range d {
			out = append(out, strOf(x))
		}
	case map[string]any:
		for k := range d {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// k8sObjects returns every object of deploy/k8s with its file.
func k8sObjects(t *testing.T, root string) (objs []any, files []string) {
	for _, f := range k8sFiles(t, root) {
		rel, _ := filepath.Rel(root, f)
		for _, d := range readYAMLDocs(t, f) {
			objs = append(objs, d)
			files = append(files, rel)
		}
	}
	return objs, files
}

// TestKubernetesManifests checks each object's shape and the references
// between objects: namespaces, resources of every container, Service
// selectors, ConfigMaps, PVC templates, and Secrets the README tells how to
// create.
func TestKubernetesManifests(t *testing.T) {
	root := repoRoot(t)
	objs, files := k8sObjects(t, root)
	readme, err := os.ReadFile(filepath.Join(root, "deploy", "k8s", "README.md"))
	if err != nil {
		t.Fatalf("read deploy/k8s/README.md: %v", err)
	}
	createdSecrets := map[string]bool{}
	for _, m := range regexp.MustCompile(`kubectl\s+(?:-n\s+\S+\s+)?create\s+secret\s+generic\s+([a-z0-9-]+)`).FindAllStringSubmatch(string(readme), -1) {
		createdSecrets[m[1]] = true
	}
	namespaces := map[string]bool{}
	configMaps := map[string]bool{}
	var podLabels []map[string]any
	for _, o := range objs {
		switch strOf(path(o, "kind")) {
		case "Namespace":
			namespaces[strOf(path(o, "metadata", "name"))] = true
		case "ConfigMap":
			configMaps[strOf(path(o, "metadata", "name"))] = true
		}
		if len(podSpecs(o)) > 0 {
			podLabels = append(podLabels, mapOf(path(o, "spec", "template", "metadata", "labels")))
		}
	}
	kinds := map[string]bool{}
	for i, o := range objs {
		kind, name := strOf(path(o, "kind")), strOf(path(o, "metadata", "name"))
		kinds[kind] = true
		t.Run(fmt.Sprintf("%s %s/%s", files[i], kind, name), func(t *testing.T) {
			if strOf(path(o, "apiVersion")) == "" || kind == "" || name == "" {
				t.Fatalf("object needs apiVersion, kind and metadata.name")
			}
			if kind != "Namespace" {
				if ns := strOf(path(o, "metadata", "namespace")); !namespaces[ns] {
					t.Errorf("namespace %q is not created by these manifests", ns)
				}
			}
			if kind == "Service" {
				sel := mapOf(path(o, "spec", "selector"))
				if len(sel) == 0 {
					t.Error("Service has no selector")
				} else if !anyMatches(sel, podLabels) {
					t.Errorf("Service selector %v matches no pod template", sel)
				}
			}
			for _, spec := range podSpecs(o) {
				for _, c := range containers(spec) {
					cn := strOf(path(c, "name"))
					for _, r := range []string{"requests", "limits"} {
						for _, res := range []string{"cpu", "memory"} {
							if path(c, "resources", r, res) == nil {
								t.Errorf("container %s has no resources.%s.%s (see docs/sizing.md)", cn, r, res)
							}
						}
					}
					if sc := path(spec, "securityContext", "runAsNonRoot"); sc != true && path(c, "securityContext", "runAsNonRoot") != true {
						t.Errorf("container %s may run as root: set securityContext.runAsNonRoot", cn)
					}
					for _, e := range listOf(path(c, "env")) {
						if s := strOf(path(e, "valueFrom", "secretKeyRef", "name")); s != "" && !createdSecrets[s] {
							t.Errorf("container %s reads Secret %q, which deploy/k8s/README.md does not create", cn, s)
						}
						if cm := strOf(path(e, "valueFrom", "configMapKeyRef", "name")); cm != "" && !configMaps[cm] {
							t.Errorf("container %s reads ConfigMap %q, which is not in the manifests", cn, cm)
						}
					}
				}
				for _, v := range listOf(path(spec, "volumes")) {
					if cm := strOf(path(v, "configMap", "name")); cm != "" && !configMaps[cm] {
						t.Errorf("volume %s: ConfigMap %q is not in the manifests", strOf(path(v, "name")), cm)
					}
					if s := strOf(path(v, "secret", "secretName")); s != "" && !createdSecrets[s] {
						t.Errorf("volume %s: Secret %q is not created by deploy/k8s/README.md", strOf(path(v, "name")), s)
					}
				}
			}
		})
	}
	for _, want := range []string{"Namespace", "StatefulSet", "Deployment", "Service", "ConfigMap"} {
		if !kinds[want] {
			t.Errorf("deploy/k8s has no %s", want)
		}
	}
}

func anyMatches(sel map[string]any, labels []map[string]any) bool {
	for _, l := range labels {
		ok := true
		for k, v := range sel {
			if l[k] != v {
				ok = false
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// flagValue returns the value of --name in argv (--name v or --name=v).
func flagValue(argv []string, name string) (string, bool) {
	for i, a := range argv {
		a = strings.Trim(a, `"'`)
		if a == "--"+name && i+1 < len(argv) {
			return strings.Trim(argv[i+1], `"'`), true
		}
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// configValue returns key of a daemon config file given as YAML text.
func configValue(t *testing.T, where string, data []byte, key string) (string, bool) {
	t.Helper()
	docs, err := yamlDocs(data)
	if err != nil || len(docs) != 1 {
		t.Fatalf("%s: %v", where, err)
	}
	v, ok := mapOf(docs[0])[key]
	if !ok {
		return "", false
	}
	return fmt.Sprint(v), true
}

// checkListen: a daemon in a container must listen on every interface at the
// port the container publishes; its default (127.0.0.1) is unreachable there.
func checkListen(t *testing.T, where, addr string, port int) {
	t.Helper()
	host, p, ok := strings.Cut(addr, ":")
	if !ok {
		t.Errorf("%s: --http %q is not host:port", where, addr)
		return
	}
	if host != "0.0.0.0" && host != "" && host != "[::]" {
		t.Errorf("%s: --http %q listens on %s only; the published port %d is unreachable", where, addr, host, port)
	}
	if p != fmt.Sprint(port) {
		t.Errorf("%s: --http %q does not listen on the published port %d", where, addr, port)
	}
}

// TestPublishedPortsListen checks that every compose service and Kubernetes
// container of ours that publishes a port has its --http (flag or config
// file) on all interfaces at that port.
func TestPublishedPortsListen(t *testing.T) {
	root := repoRoot(t)
	doc := readYAMLDocs(t, filepath.Join(root, "deploy", "compose.yaml"))[0]
	configs := mapOf(path(doc, "configs"))
	for name, svc := range mapOf(path(doc, "services")) {
		argv := append(words(path(svc, "entrypoint")), words(path(svc, "command"))...)
		u, ok := argvUsage("", argv)
		ports := listOf(path(svc, "ports"))
		if !ok || len(ports) == 0 {
			continue
		}
		t.Run("compose "+name, func(t *testing.T) {
			spec := fmt.Sprint(ports[0])
			parts := strings.Split(spec, ":")
			var port int
			fmt.Sscan(parts[len(parts)-1], &port)
			addr, ok := flagValue(u.argv, "http")
			if !ok {
				cfg, _ := flagValue(u.argv, "config")
				for _, c := range listOf(path(svc, "configs")) {
					if strOf(path(c, "target")) == cfg {
						file := strOf(path(configs[strOf(path(c, "source"))], "file"))
						b, err := os.ReadFile(filepath.Join(root, "deploy", file))
						if err != nil {
							t.Fatal(err)
						}
						addr, ok = configValue(t, file, b, "http")
					}
				}
			}
			if !ok {
				t.Fatalf("publishes %s but sets no --http (flag or config file): the daemon would listen on 127.0.0.1", spec)
			}
			checkListen(t, "deploy/compose.yaml service "+name, addr, port)
		})
	}
	objs, files := k8sObjects(t, root)
	cm := map[string]map[string]any{}
	for _, o := range objs {
		if strOf(path(o, "kind")) == "ConfigMap" {
			cm[strOf(path(o, "metadata", "name"))] = mapOf(path(o, "data"))
		}
	}
	for i, o := range objs {
		for _, spec := range podSpecs(o) {
			vols := map[string]string{} // volume name -> ConfigMap
			for _, v := range listOf(path(spec, "volumes")) {
				vols[strOf(path(v, "name"))] = strOf(path(v, "configMap", "name"))
			}
			for _, c := range containers(spec) {
				argv := append(words(path(c, "command")), words(path(c, "args"))...)
				u, ok := argvUsage("", argv)
				var port int
				for _, p := range listOf(path(c, "ports")) {
					if strOf(path(p, "name")) == "http" {
						fmt.Sscan(fmt.Sprint(path(p, "containerPort")), &port)
					}
				}
				if !ok || port == 0 {
					continue
				}
				where := fmt.Sprintf("%s %s/%s", files[i], strOf(path(o, "kind")), strOf(path(o, "metadata", "name")))
				t.Run(where, func(t *testing.T) {
					addr, ok := flagValue(u.argv, "http")
					if !ok {
						cfg, _ := flagValue(u.argv, "config")
						for _, m := range listOf(path(c, "volumeMounts")) {
							if strOf(path(m, "mountPath")) == cfg {
								data := strOf(cm[vols[strOf(path(m, "name"))]][strOf(path(m, "subPath"))])
								addr, ok = configValue(t, where, []byte(data), "http")
							}
						}
					}
					if !ok {
						t.Fatalf("exposes port %d but sets no --http: the daemon would listen on 127.0.0.1", port)
					}
					checkListen(t, where, addr, port)
				})
			}
		}
	}
}
