// Package config gives every Kipimo daemon the same three sources of settings,
// in this order of precedence (highest first):
//
//  1. command-line flags given explicitly;
//  2. environment variables KIPIMO_<FLAG>, the flag name upper-cased with '-'
//     replaced by '_' (--nats -> KIPIMO_NATS, --token-file -> KIPIMO_TOKEN_FILE);
//  3. a YAML config file (--config FILE or KIPIMO_CONFIG) whose keys are the flag
//     names; unknown keys are errors;
//
// and last the flags' defaults. Flags take two dashes (--http); a long flag
// given with one (-http) is an error that says so. Every binary's --help
// prints FlagsHeading above its flags. Secrets never belong in flags: options
// named *-file (token-file, password-file) name files whose contents are read
// by the daemon, and URLs with passwords should come from the environment.
package config

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
)

// EnvPrefix is the prefix of every environment variable Kipimo reads.
const EnvPrefix = "KIPIMO_"

// ConfigFlag is the name of the flag that names a config file.
const ConfigFlag = "config"

// FlagsHeading is the line every Kipimo binary's --help prints above the
// flags that follow this package's conventions.
const FlagsHeading = "Flags (also KIPIMO_<FLAG> environment variables and --config YAML keys):"

// configUsage is the help text of --config.
const configUsage = "YAML config file; keys are flag names (env KIPIMO_CONFIG)"

// AddConfigFlag adds --config to fs.
func AddConfigFlag(fs *pflag.FlagSet) { fs.String(ConfigFlag, "", configUsage) }

// Parse is the whole convention for a daemon's flag set: it rejects long
// flags given with one dash (CheckDashes), parses args into fs and then fills
// the flags not given from the environment and the config file (Apply).
// It returns pflag.ErrHelp after printing help.
func Parse(fs *pflag.FlagSet, args []string, lookup func(string) (string, bool)) error {
	if err := CheckDashes(fs, args); err != nil {
		return err
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	return Apply(fs, lookup)
}

// SetUsage makes fs's help print intro (usage line and description), then
// FlagsHeading and the flags.
func SetUsage(fs *pflag.FlagSet, w io.Writer, intro string) {
	fs.Usage = func() {
		fmt.Fprintf(w, "%s\n\n%s\n%s", strings.TrimRight(intro, "\n"), FlagsHeading, fs.FlagUsages())
	}
}

// CheckDashes returns an error for the first long flag of args given with a
// single dash (-http instead of --http): pflag would read it as a group of
// one-letter flags ("-h" asks for help). Groups made only of fs's defined
// shorthands, values of flags that take one, and everything after "--" are
// left alone.
func CheckDashes(fs *pflag.FlagSet, args []string) error {
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			return nil
		case strings.HasPrefix(a, "--"):
			name, _, hasValue := strings.Cut(a[2:], "=")
			if f := fs.Lookup(name); f != nil && !hasValue && f.NoOptDefVal == "" {
				i++ // the next word is this flag's value
			}
		case len(a) > 2 && a[0] == '-':
			name, _, _ := strings.Cut(a[1:], "=")
			if len(name) < 2 || shorthands(fs, name) {
				continue
			}
			if fs.Lookup(name) != nil || name == "help" {
				return fmt.Errorf("flag %s has one dash: use --%s (flags take two dashes)", a, strings.TrimPrefix(a, "-"))
			}
			return fmt.Errorf("unknown flag %s: flags take two dashes, and %s has no flag --%s", a, fs.Name(), name)
		}
	}
	return nil
}

// shorthands reports whether every letter of group is a one-letter flag of fs.
func shorthands(fs *pflag.FlagSet, group string) bool {
	for _, c := range group {
		if fs.ShorthandLookup(string(c)) == nil {
			return false
		}
	}
	return true
}

// EnvName is the environment variable that sets flag name.
func EnvName(flag string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// Apply fills every flag of fs that was not given on the command line from
// the environment (lookup, normally os.LookupEnv) and then from the config
// file, if one is named. It must be called after fs.Parse. Errors name the
// source and key that was wrong.
func Apply(fs *pflag.FlagSet, lookup func(string) (string, bool)) error {
	return apply(pflagSet{fs}, lookup)
}

// flags is what apply needs of a flag set.
type flags interface {
	names() []string
	changed(name string) bool
	has(name string) bool
	value(name string) string
	set(name, value string) error
}

type pflagSet struct{ fs *pflag.FlagSet }

func (p pflagSet) names() []string {
	var out []string
	p.fs.VisitAll(func(f *pflag.Flag) { out = append(out, f.Name) })
	return out
}
func (p pflagSet) changed(n string) bool { return p.fs.Changed(n) }
func (p pflagSet) has(n string) bool     { return p.fs.Lookup(n) != nil }
func (p pflagSet) value(n string) string { return p.fs.Lookup(n).Value.String() }
func (p pflagSet) set(n, v string) error { return p.fs.Set(n, v) }

func apply(fs flags, lookup func(string) (string, bool)) error {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	fromEnv := map[string]bool{}
	var errs []string
	for _, name := range fs.names() {
		if fs.changed(name) {
			continue
		}
		v, ok := lookup(EnvName(name))
		if !ok {
			continue
		}
		if err := fs.set(name, v); err != nil {
			errs = append(errs, fmt.Sprintf("environment %s=%q: %v", EnvName(name), v, err))
			continue
		}
		fromEnv[name] = true
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	file := ""
	if fs.has(ConfigFlag) {
		file = fs.value(ConfigFlag)
	}
	if file == "" {
		return nil
	}
	values, err := readFile(file)
	if err != nil {
		return err
	}
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !fs.has(k) || k == ConfigFlag {
			return fmt.Errorf("config %s: unknown key %q (keys are the flag names: %s)", file, k, flagNames(fs))
		}
		if fs.changed(k) || fromEnv[k] {
			continue
		}
		if err := setFromYAML(fs, k, values[k]); err != nil {
			return fmt.Errorf("config %s: key %q: %w", file, k, err)
		}
	}
	return nil
}

func readFile(path string) (map[string]yaml.Node, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&doc); err != nil {
		if err.Error() == "EOF" {
			return nil, nil
		}
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	if len(doc.Content) == 0 {
		return nil, nil
	}
	m := doc.Content[0]
	if m.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("config %s: line %d: expected a mapping of flag names to values", path, m.Line)
	}
	out := make(map[string]yaml.Node, len(m.Content)/2)
	for i := 0; i+1 < len(m.Content); i += 2 {
		k := m.Content[i].Value
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("config %s: line %d: key %q given twice", path, m.Content[i].Line, k)
		}
		out[k] = *m.Content[i+1]
	}
	return out, nil
}

func setFromYAML(fs flags, name string, n yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		return fs.set(name, n.Value)
	case yaml.SequenceNode:
		for _, item := range n.Content {
			if item.Kind != yaml.ScalarNode {
				return fmt.Errorf("line %d: list items must be scalars", item.Line)
			}
			if err := fs.set(name, item.Value); err != nil {
				return err
			}
		}
		return nil
	default:
		return fmt.Errorf("line %d: expected a scalar or a list", n.Line)
	}
}

func flagNames(fs flags) string {
	var names []string
	for _, n := range fs.names() {
		if n != ConfigFlag && n != "help" {
			names = append(names, n)
		}
	}
	return strings.Join(names, ", ")
}

// ReadSecret returns the contents of a secret file (a --*-file flag's value)
// without surrounding whitespace, or "" when path is empty. A file that
// cannot be read, or holds only whitespace, is an error naming the file,
// never its contents: an empty token file must not quietly turn
// authentication off. It is the one way Kipimo reads secret files.
func ReadSecret(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read secret: %w", err)
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", fmt.Errorf("secret file %s is empty", path)
	}
	return s, nil
}
