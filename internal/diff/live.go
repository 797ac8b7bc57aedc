package diff

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// LivePath is the path, under a pserver's dashboard URL, of the models a
// running run has merged so far (pserver.LiveFuncStats).
const LivePath = "/api/func_stats"

// maxLiveBody bounds the reply read from a pserver.
const maxLiveBody = 1 << 30

// ErrNotLive is returned by FetchLive when the server answers but serves
// no live models: not a pserver's dashboard, or one of a finished run.
var ErrNotLive = errors.New("no live models there")

// Live is a running run's models merged so far, as its pserver serves them
// (GET /api/func_stats): the func_stats records the run would end with
// were it to end now, and how far it has got.
type Live struct {
	// URL is the dashboard asked.
	URL string `json:"-"`
	// Run is the run's id, Status "live" while detectors may still sync
	// ("finished" once the pserver has stopped taking them).
	Run    string `json:"run"`
	Status string `json:"status"`
	// Shard of Shards is the share of the model keys the server holds.
	Shard  int `json:"shard"`
	Shards int `json:"shards"`
	// IOSteps is how many io_steps the run has had so far, IOStep the last
	// of them (nil before any).
	IOSteps   uint64                       `json:"io_steps"`
	IOStep    *uint64                      `json:"io_step"`
	FuncStats []provenance.GlobalFuncStats `json:"func_stats"`
}

// DecodeLive reads a pserver's GET /api/func_stats reply and checks that
// it is one: a status, a shard within its shards, io_step the last of
// io_steps, and records that name their model key.
func DecodeLive(r io.Reader) (*Live, error) {
	var l struct {
		Live
		FuncStats *[]provenance.GlobalFuncStats `json:"func_stats"`
	}
	if err := json.NewDecoder(r).Decode(&l); err != nil {
		return nil, fmt.Errorf("read the live models: %w", err)
	}
	switch {
	case l.Status == "" || l.FuncStats == nil:
		return nil, errors.New("read the live models: the reply has no status or no func_stats: not a pserver's /api/func_stats")
	case l.Shards < 1 || l.Shard < 0 || l.Shard >= l.Shards:
		return nil, fmt.Errorf("read the live models: shard %d of %d is not a shard", l.Shard, l.Shards)
	case (l.IOStep == nil) != (l.IOSteps == 0) || (l.IOStep != nil && *l.IOStep != l.IOSteps-1):
		return nil, fmt.Errorf("read the live models: io_step %v does not end %d io_steps", deref(l.IOStep), l.IOSteps)
	}
	for i, f := range *l.FuncStats {
		if f.Func == "" {
			return nil, fmt.Errorf("read the live models: func_stats record %d names no function", i)
		}
	}
	out := l.Live
	out.FuncStats = *l.FuncStats
	return &out, nil
}

func deref(p *uint64) any {
	if p == nil {
		return "null"
	}
	return *p
}

// FetchLive asks the pserver dashboard at base (http://host:port, as
// kipimo run prints it and writes it into its run directory's
// endpoints.json) for the models its run has merged so far, with the
// dashboard's bearer token when token is not "". A server that answers 404
// gives an error wrapping ErrNotLive.
func FetchLive(ctx context.Context, base, token string) (*Live, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%q is not the http://host:port of a pserver's dashboard", base)
	}
	u = u.JoinPath(LivePath)
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
		return nil, fmt.Errorf("ask the pserver at %s: %w (is the run still going? a finished run is read from its directory)", base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		err := fmt.Errorf("the pserver at %s answered %s: %s", base, resp.Status, strings.TrimSpace(string(msg)))
		switch resp.StatusCode {
		case http.StatusNotFound:
			return nil, fmt.Errorf("%w: %w", ErrNotLive, err)
		case http.StatusUnauthorized, http.StatusForbidden:
			return nil, fmt.Errorf("%w (its dashboard needs a token: --token-file)", err)
		}
		return nil, err
	}
	l, err := DecodeLive(io.LimitReader(resp.Body, maxLiveBody))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", base, err)
	}
	l.URL = base
	return l, nil
}
