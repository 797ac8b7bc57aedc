package run

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// EndpointsFile is the file, in a running run's directory, that says where
// its servers listen; it is removed when the run's servers stop.
const EndpointsFile = "endpoints.json"

// Endpoints are where a running `kipimo run` listens, so that other
// commands (kipimo callstack, kipimo query --url) can reach it given its
// directory.
type Endpoints struct {
	Run string `json:"run"`
	// NATS is the NATS server's client URL; Dashboard the parameter
	// server's page; ProvDB the provenance store's query API.
	NATS      string `json:"nats"`
	Dashboard string `json:"dashboard"`
	ProvDB    string `json:"provdb"`
	// PID is the kipimo process; Started when the run started.
	PID     int       `json:"pid"`
	Started time.Time `json:"started"`
}

// Endpoints says where the running pipeline listens.
func (p *Pipeline) Endpoints() Endpoints {
	return Endpoints{
		Run: p.cfg.RunID, NATS: p.natsClientURL(), Dashboard: p.DashboardURL(), ProvDB: p.provURL,
		PID: os.Getpid(), Started: p.started,
	}
}

// writeEndpoints writes the run's endpoints into its directory.
func (p *Pipeline) writeEndpoints() error {
	b, err := json.MarshalIndent(p.Endpoints(), "", "  ")
	if err != nil {
		return err
	}
	path := p.cfg.path(EndpointsFile)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write the run's endpoints: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write the run's endpoints: %w", err)
	}
	p.wroteEndpoints = true
	return nil
}

// ErrNotRunning is returned by ReadEndpoints for the directory of a run
// that is over (or of no run): it has no endpoints file.
var ErrNotRunning = errors.New("no run is running there")

// ReadEndpoints reads the endpoints of the run whose directory is dir.
func ReadEndpoints(dir string) (Endpoints, error) {
	var e Endpoints
	b, err := os.ReadFile(filepath.Join(dir, EndpointsFile))
	if errors.Is(err, fs.ErrNotExist) {
		if _, serr := os.Stat(filepath.Join(dir, "provenance.db")); serr == nil {
			return e, fmt.Errorf("%s: %w: the run there is over (read its store with --store %s)", dir, ErrNotRunning, filepath.Join(dir, "provenance.db"))
		}
		return e, fmt.Errorf("%s: %w (no %s: give the directory kipimo run printed, <out>/<run>)", dir, ErrNotRunning, EndpointsFile)
	}
	if err != nil {
		return e, err
	}
	if err := json.Unmarshal(b, &e); err != nil {
		return e, fmt.Errorf("%s: %w", filepath.Join(dir, EndpointsFile), err)
	}
	return e, nil
}
