package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/run"
)

// defaultOut is kipimo run's --out default, where query and callstack look
// for runs.
const defaultOut = "kipimo-out"

// storeFile is the provenance store's name in a run's directory.
const storeFile = "provenance.db"

// resolve turns the query's --url and --store, as given, into what is read:
// --url may name a running run's directory (its provdb API, from the
// endpoints file), --store a run's directory (its store); without either,
// the store of the latest run under ./kipimo-out is read, and w says which.
func (o *queryOpts) resolve(w io.Writer) error {
	if o.url != "" && o.store != "" {
		return errors.New("give --url or --store, not both")
	}
	if o.url != "" {
		if strings.Contains(o.url, "://") {
			return nil
		}
		if fi, err := os.Stat(o.url); err == nil && fi.IsDir() {
			e, err := run.ReadEndpoints(o.url)
			if err != nil {
				return fmt.Errorf("--url: %w", err)
			}
			o.url = e.ProvDB
		}
		return nil
	}
	if o.store == "" {
		path, err := latestStore(defaultOut)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "reading %s (--store chooses another store)\n", path)
		o.store = path
		return nil
	}
	if fi, err := os.Stat(o.store); err == nil && fi.IsDir() {
		path := filepath.Join(o.store, storeFile)
		if _, err := os.Stat(path); err != nil {
			return fmt.Errorf("--store %s: a directory without a %s: give a run's directory (<out>/<run>) or its store file", o.store, storeFile)
		}
		o.store = path
	}
	return nil
}

// latestStore is the store of the run under out written last or, with no
// run there, the provdb daemon's default store in the current directory.
func latestStore(out string) (string, error) {
	entries, err := os.ReadDir(out)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	var (
		latest string
		when   time.Time
	)
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		path := filepath.Join(out, e.Name(), storeFile)
		fi, err := os.Stat(path)
		if err != nil {
			continue
		}
		if latest == "" || fi.ModTime().After(when) {
			latest, when = path, fi.ModTime()
		}
	}
	if latest == "" {
		// The provdb daemon's own default store.
		if _, err := os.Stat(provdbDefaultStore); err == nil {
			return provdbDefaultStore, nil
		}
		return "", fmt.Errorf("no --store given, and no run's store under ./%s: give --store (the store or the run's directory kipimo run printed) or --url", out)
	}
	return latest, nil
}

// provdbDefaultStore is where the provdb daemon writes when not told.
const provdbDefaultStore = "kipimo-prov.db"

// callstackTarget fills a callstack's --nats and --run, where not given,
// from the endpoints of the running run whose directory is dir.
func callstackTarget(o *callstackOpts, dir string, natsSet, runSet bool) error {
	e, err := run.ReadEndpoints(dir)
	if err != nil {
		return err
	}
	if !natsSet {
		o.natsURL = e.NATS
	}
	if !runSet {
		o.run = e.Run
	}
	return nil
}
