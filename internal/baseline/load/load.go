// Package load reads a baseline (baseline.Reference) from where a finished
// run keeps its final models: a Kipimo run directory or provenance store,
// provdb's HTTP API, a TAU profile or a TAUdb trial. It is apart from
// package baseline so that the detectors, which only compare, do not link
// the stores' drivers.
package load

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/baseline"
	"github.com/kipimo-hpc/kipimo/internal/daemon"
	"github.com/kipimo-hpc/kipimo/internal/diff"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provdb"
	"github.com/kipimo-hpc/kipimo/internal/stats"
	"github.com/kipimo-hpc/kipimo/internal/taudb"
)

// Options says how Reference reads a reference.
type Options struct {
	// Rule is the natural-range rule bounds are read with: the detectors'
	// (ad.Config.TailRule).
	Rule stats.TailRule
	// TokenFile holds the bearer token of a provdb HTTP API that requires
	// one.
	TokenFile string
	// TaudbDSN is the PostgreSQL URL of the TAUdb of taudb:ID and
	// taudb:NAME references.
	TaudbDSN string
}

// maxFuncStatsBody bounds the func_stats reply read from provdb.
const maxFuncStatsBody = 1 << 30

// Reference reads the reference ref names:
//   - http:// or https://: a provdb's HTTP API (/api/v1/func_stats);
//   - taudb:ID or taudb:NAME: a trial of the TAUdb at opt.TaudbDSN;
//   - mongodb://: a provenance store;
//   - a directory: a Kipimo run directory (its provenance.db), or else TAU
//     profiles;
//   - a file: a SQLite provenance store, or else a profile format kipimo
//     diff reads (FORMAT:PATH names the format).
func Reference(ctx context.Context, ref string, opt Options) (*baseline.Reference, error) {
	switch {
	case ref == "":
		return nil, errors.New("baseline: empty reference: give a run directory, a provenance store, http://provdb, taudb:ID or a TAU profile")
	case strings.HasPrefix(ref, "http://") || strings.HasPrefix(ref, "https://"):
		fs, err := funcStatsHTTP(ctx, ref, opt.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("baseline %s: %w", ref, err)
		}
		return baseline.FromFuncStats(ref, fs, opt.Rule)
	case strings.HasPrefix(ref, "mongodb://") || strings.HasPrefix(ref, "mongodb+srv://"):
		return fromStore(ctx, ref, ref, opt)
	}
	op, err := diff.ParseOperand(ref)
	if err != nil {
		return nil, fmt.Errorf("baseline: %w", err)
	}
	if op.Trial != "" {
		return fromTAUdb(ctx, ref, op.Trial, opt)
	}
	if op.Format == "" || op.Format == diff.KindRun {
		if fi, err := os.Stat(op.Path); err == nil && fi.IsDir() {
			store := filepath.Join(op.Path, diff.RunStoreFile)
			if _, err := os.Stat(store); err == nil {
				return fromStore(ctx, ref, store, opt)
			}
		} else if err == nil && isSQLite(op.Path) {
			return fromStore(ctx, ref, op.Path, opt)
		}
	}
	side, err := diff.LoadPath(ctx, op.Path, op.Format)
	if err != nil {
		return nil, fmt.Errorf("baseline: %w", err)
	}
	return FromTrial(ref, side.Trial)
}

// isSQLite reports whether the file at path starts as SQLite databases do.
func isSQLite(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	head := make([]byte, 16)
	if _, err := io.ReadFull(f, head); err != nil {
		return false
	}
	return string(head) == "SQLite format 3\x00"
}

// fromStore reads the final func_stats records of the provenance store at
// spec.
func fromStore(ctx context.Context, ref, spec string, opt Options) (*baseline.Reference, error) {
	st, err := provdb.OpenStore(ctx, spec, true)
	if err != nil {
		return nil, fmt.Errorf("baseline %s: %w", ref, err)
	}
	defer st.Close()
	var fs []provenance.GlobalFuncStats
	if err := st.FuncStats(ctx, func(f provenance.GlobalFuncStats) error {
		fs = append(fs, f)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("baseline %s: read func_stats: %w", ref, err)
	}
	return baseline.FromFuncStats(ref, fs, opt.Rule)
}

// funcStatsHTTP asks a provdb's /api/v1/func_stats.
func funcStatsHTTP(ctx context.Context, raw, tokenFile string) ([]provenance.GlobalFuncStats, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("%q is not an http:// or https:// URL of a provdb", raw)
	}
	token, err := daemon.Secret("token-file", tokenFile)
	if err != nil {
		return nil, err
	}
	u = u.JoinPath("/api/v1/func_stats")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	client := &http.Client{Timeout: time.Minute}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("ask provdb: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("provdb answered %s: %s (a token: --baseline-token-file)", resp.Status, strings.TrimSpace(string(msg)))
	}
	return DecodeFuncStats(io.LimitReader(resp.Body, maxFuncStatsBody))
}

// DecodeFuncStats reads provdb's func_stats reply: {"func_stats": [...]}.
func DecodeFuncStats(r io.Reader) ([]provenance.GlobalFuncStats, error) {
	var out struct {
		FuncStats []provenance.GlobalFuncStats `json:"func_stats"`
		Skipped   int64                        `json:"skipped"`
	}
	if err := json.NewDecoder(r).Decode(&out); err != nil {
		return nil, fmt.Errorf("read provdb's func_stats: %w", err)
	}
	if out.Skipped > 0 {
		return nil, fmt.Errorf("provdb left %d func_stats records out (undecodable documents in its store): the baseline would miss keys", out.Skipped)
	}
	return out.FuncStats, nil
}

// fromTAUdb reads trial (an id or a name) from the TAUdb at opt.TaudbDSN.
func fromTAUdb(ctx context.Context, ref, trial string, opt Options) (*baseline.Reference, error) {
	if opt.TaudbDSN == "" {
		return nil, fmt.Errorf("baseline %s: no TAUdb: give its PostgreSQL URL (--dsn or $KIPIMO_TAUDB_DSN)", ref)
	}
	s, err := taudb.Open(ctx, opt.TaudbDSN)
	if err != nil {
		return nil, fmt.Errorf("baseline %s: %w", ref, err)
	}
	defer s.Close()
	id, err := trialID(ctx, s, trial)
	if err != nil {
		return nil, fmt.Errorf("baseline %s: %w", ref, err)
	}
	tr, err := s.LoadTrial(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("baseline %s: %w", ref, err)
	}
	return FromTrial(ref, tr)
}

// trialID resolves a trial id or name.
func trialID(ctx context.Context, s *taudb.Store, trial string) (int, error) {
	var id int
	if _, err := fmt.Sscanf(trial, "%d", &id); err == nil && id > 0 && fmt.Sprint(id) == trial {
		return id, nil
	}
	trials, err := s.Trials(ctx, taudb.Filter{Name: trial})
	if err != nil {
		return 0, err
	}
	if len(trials) != 1 {
		return 0, fmt.Errorf("%d trials are named %q: name one by id, taudb:ID (see `kipimo taudb list`)", len(trials), trial)
	}
	return trials[0].ID, nil
}

// FromTrial builds a reference from a TAU trial: per flat function and
// call path, its calls and exclusive TIME (µs) over every real thread. It
// has no histograms and no io_steps: only mean time per call and calls
// are compared.
func FromTrial(source string, tr *taudb.Trial) (*baseline.Reference, error) {
	m := tr.Metric("TIME")
	if m == nil {
		return nil, fmt.Errorf("baseline %s: the trial has no TIME metric", source)
	}
	r := &baseline.Reference{Source: source, Kind: baseline.KindTAU, Keys: map[string]*baseline.Key{}}
	for _, th := range tr.RealThreads() {
		for _, d := range th.CallData {
			v := d.Value(m)
			if v == nil || d.Callpath == nil || d.Calls <= 0 {
				continue
			}
			k := r.Keys[d.Callpath.Name]
			if k == nil {
				k = &baseline.Key{Name: d.Callpath.Name}
				r.Keys[d.Callpath.Name] = k
			}
			k.Calls += uint64(d.Calls)
			k.TotalUs += v.Exclusive
		}
	}
	if len(r.Keys) == 0 {
		return nil, fmt.Errorf("baseline %s: the trial has no timers with calls", source)
	}
	return r, nil
}
