// Package config gives every Kipimo daemon the same three sources of settings,
// in this order of precedence (highest first):
//
//  1. command-line flags given explicitly;
//  2. environment variables KIPIMO_<FLAG>, the flag name upper-cased with '-'
//     replaced by '_' (--nats -> KIPIMO_NATS, --token-file -> KIPIMO_TOKEN_FILE);
//  3. a YAML config file (--config FILE or KIPIMO_CONFIG) whose keys are the flag
//     names; unknown keys are errors;
//
// and last the flags' defaults. Secrets never belong in flags: options named
// *-file (token-file, password-file) name files whose contents are read by the
// daemon, and URLs with passwords should come from the environment.
package config

import (
	"bytes"
	"fmt"
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

// AddConfigFlag adds --config to fs.
func AddConfigFlag(fs *pflag.FlagSet) {
	fs.String(ConfigFlag, "", "YAML config file; keys are flag names (env KIPIMO_CONFIG)")
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
	if lookup == nil {
		lookup = os.LookupEnv
	}
	fromEnv := map[string]bool{}
	var errs []string
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed {
			return
		}
		v, ok := lookup(EnvName(f.Name))
		if !ok {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			errs = append(errs, fmt.Sprintf("environment %s=%q: %v", EnvName(f.Name), v, err))
			return
		}
		fromEnv[f.Name] = true
	})
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	file := ""
	if f := fs.Lookup(ConfigFlag); f != nil {
		file = f.Value.String()
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
		f := fs.Lookup(k)
		if f == nil || k == ConfigFlag {
			return fmt.Errorf("config %s: unknown key %q (keys are the flag names: %s)", file, k, flagNames(fs))
		}
		if f.Changed || fromEnv[k] {
			continue
		}
		if err := setFromYAML(fs, f, values[k]); err != nil {
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

func setFromYAML(fs *pflag.FlagSet, f *pflag.Flag, n yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		return fs.Set(f.Name, n.Value)
	case yaml.SequenceNode:
		for _, item := range n.Content {
			if item.Kind != yaml.ScalarNode {
				return fmt.Errorf("line %d: list items must be scalars", item.Line)
			}
			if err := fs.Set(f.Name, item.Value); err != nil {
				return err
			}
		}
		return nil
	default:
		return fmt.Errorf("line %d: expected a scalar or a list", n.Line)
	}
}

func flagNames(fs *pflag.FlagSet) string {
	var names []string
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Name != ConfigFlag && f.Name != "help" {
			names = append(names, f.Name)
		}
	})
	return strings.Join(names, ", ")
}

// ReadSecret returns the trimmed contents of a secret file, or "" when path
// is empty. The error names the file, never its contents.
func ReadSecret(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read secret: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}
