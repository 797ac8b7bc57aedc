package diff

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
	"github.com/kipimo-hpc/kipimo/internal/taudb"
)

// KindRun is the Side.Kind of a Kipimo run directory; KindTAUdb that of a
// trial read from a TAUdb.
const (
	KindRun   = "run"
	KindTAUdb = "taudb"
)

// TAUdbPrefix starts an operand naming a TAUdb trial: taudb:ID or
// taudb:NAME.
const TAUdbPrefix = "taudb:"

// Run directory layout: what `kipimo run` writes under <out>/<run>.
const (
	RunProfilesDir = "profiles"
	RunStoreFile   = "provenance.db"
)

// Operand is one parsed command-line operand.
type Operand struct {
	// Trial is the TAUdb trial id or name of a taudb: operand ("" otherwise).
	Trial string
	// Path and Format name a file or directory; Format is "" to detect it.
	Path, Format string
}

// ParseOperand reads "taudb:ID", "taudb:NAME", "FORMAT:PATH" (FORMAT one of
// taudb.Formats or "run") or a plain path. A path that exists is taken as
// a path even when it looks like FORMAT:PATH.
func ParseOperand(s string) (Operand, error) {
	if s == "" {
		return Operand{}, errors.New("empty operand: want a path or taudb:ID")
	}
	if _, err := os.Stat(s); err == nil {
		return Operand{Path: s}, nil
	}
	if rest, ok := strings.CutPrefix(s, TAUdbPrefix); ok {
		if rest == "" {
			return Operand{}, fmt.Errorf("%q: name the trial, taudb:ID or taudb:NAME", s)
		}
		return Operand{Trial: rest}, nil
	}
	if f, rest, ok := strings.Cut(s, ":"); ok {
		for _, known := range append([]string{KindRun}, taudb.Formats...) {
			if f == known {
				if rest == "" {
					return Operand{}, fmt.Errorf("%q: a path must follow %s:", s, f)
				}
				return Operand{Path: rest, Format: f}, nil
			}
		}
	}
	return Operand{Path: s}, nil
}

// IsRunDir reports whether dir is a Kipimo run directory: it holds the
// run's profiles directory.
func IsRunDir(dir string) bool {
	fi, err := os.Stat(filepath.Join(dir, RunProfilesDir))
	return err == nil && fi.IsDir()
}

// LoadPath reads a profile file or directory: a Kipimo run directory (its
// profiles and, when present, its provenance store's anomaly counts) when
// format is "run" or "" and dir looks like one, else whatever
// taudb.LoadPath reads in format ("" to detect it).
func LoadPath(ctx context.Context, path, format string) (*Side, error) {
	if format == KindRun || (format == "" && IsRunDir(path)) {
		return LoadRun(ctx, path)
	}
	if format == "" {
		f, err := taudb.DetectFormat(path)
		if err != nil {
			return nil, fmt.Errorf("%w (kipimo diff takes a format as FORMAT:PATH, e.g. %s:%s)", err, taudb.FormatPPK, path)
		}
		format = f
	}
	tr, err := taudb.LoadPathContext(ctx, path, format)
	if err != nil {
		return nil, err
	}
	return &Side{Label: path, Kind: format, Trial: tr}, nil
}

// LoadRun reads a Kipimo run directory: the TAU profiles under profiles/
// and, when provenance.db is there, how many anomalies each thread had in
// each function.
func LoadRun(ctx context.Context, dir string) (*Side, error) {
	tr, err := taudb.LoadPathContext(ctx, filepath.Join(dir, RunProfilesDir), taudb.FormatTAU)
	if err != nil {
		return nil, fmt.Errorf("run %s: %w", dir, err)
	}
	tr.Name = filepath.Base(filepath.Clean(dir))
	s := &Side{Label: dir, Kind: KindRun, Trial: tr}
	store := filepath.Join(dir, RunStoreFile)
	if _, err := os.Stat(store); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return s, nil
		}
		return nil, fmt.Errorf("run %s: %w", dir, err)
	}
	if s.Anomalies, err = CountAnomalies(ctx, store); err != nil {
		return nil, fmt.Errorf("run %s: %w", dir, err)
	}
	return s, nil
}

// CountAnomalies counts the anomalies in the SQLite provenance store at
// path by thread (rank as node, context 0, tid as thread) and function name,
// streaming them.
func CountAnomalies(ctx context.Context, path string) (map[ThreadKey]map[string]int64, error) {
	st, err := sqlitestore.Open(ctx, path, sqlitestore.Options{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer st.Close()
	out := map[ThreadKey]map[string]int64{}
	err = st.Each(ctx, provenance.Query{Limit: provenance.NoLimit}, func(e provenance.Exec) error {
		k := ThreadKey{Node: int(e.RID), Thread: int(e.TID)}
		m := out[k]
		if m == nil {
			m = map[string]int64{}
			out[k] = m
		}
		m[taudb.NormalizeName(e.Func)]++
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("count anomalies in %s: %w", path, err)
	}
	return out, nil
}
