package run

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kipimo-hpc/kipimo/internal/natsx"
)

// ExistsError refuses a run id that an earlier run holds: its directory
// under Out is not empty, or, on an external NATS server, its provenance
// stream exists. A run is never added to another's store: the records of
// two runs would mix, and the store would drop the second run's records
// whose event ids the first run's had.
type ExistsError struct {
	// Run is the id asked for; Dir the directory of the earlier run.
	Run, Dir string
	// Stream, when set, is the provenance stream on the NATS server at
	// NATSURL that holds the id.
	Stream, NATSURL string
}

func (e *ExistsError) Error() string {
	if e.Stream != "" {
		return fmt.Sprintf("run id %q is taken on the NATS server %s: its provenance stream %s exists. "+
			"Choose another id with --run, leave --run out for a new one, or add --replace to delete that stream and start again under this id",
			e.Run, e.NATSURL, e.Stream)
	}
	return fmt.Sprintf("run id %q is taken: %s holds an earlier run (kipimo serve --store %s opens it; a run cannot be continued). "+
		"Choose another id with --run, leave --run out for a new one, or add --replace to delete that run and start again under this id",
		e.Run, e.Dir, filepath.Join(e.Dir, "provenance.db"))
}

// claimRunDir creates the run's directory, Out/RunID, as this run's own.
// An empty directory is taken as it is. A directory that holds anything
// is an earlier run: it is deleted when Replace is set; when Validate
// chose the id, the next free id of the form <id>-2, <id>-3... is taken
// instead; otherwise the id is refused with an ExistsError. Creating the
// directory with Mkdir makes the claim atomic: two runs started at once
// never get the same directory.
func (p *Pipeline) claimRunDir() error {
	c := &p.cfg
	if _, err := os.Stat(c.Out); errors.Is(err, fs.ErrNotExist) {
		p.createdOut = true
	}
	if err := os.MkdirAll(c.Out, 0o755); err != nil {
		return fmt.Errorf("create output directory: %w", err)
	}
	base := c.RunID
	const tries = 1000
	for n := 2; n < tries; n++ {
		dir := c.path("")
		err := os.Mkdir(dir, 0o755)
		if err == nil {
			p.createdDir = dir
			return nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("create the run's directory: %w", err)
		}
		if emptyDir(dir) {
			return nil
		}
		switch {
		case c.Replace:
			if err := os.RemoveAll(dir); err != nil {
				return fmt.Errorf("delete the earlier run %s (--replace): %w", c.RunID, err)
			}
		case c.autoID:
			c.RunID = fmt.Sprintf("%s-%d", base, n)
			if err := natsx.ValidRun(c.RunID); err != nil {
				return err
			}
		default:
			return &ExistsError{Run: c.RunID, Dir: dir}
		}
	}
	return fmt.Errorf("no free run id under %s after %d tries: choose one with --run", c.Out, tries)
}

// emptyDir reports whether dir is a directory with nothing in it.
func emptyDir(dir string) bool {
	f, err := os.Open(dir)
	if err != nil {
		return false
	}
	defer f.Close()
	_, err = f.Readdirnames(1)
	return errors.Is(err, io.EOF)
}

// claimStream makes sure no earlier run of the same id left its
// provenance stream on an external NATS server: JetStream would keep that
// run's records in the stream and drop, as duplicates, the new run's
// batches that have the same message ids. With Replace the stream is
// deleted; otherwise the id is refused.
func (p *Pipeline) claimStream(ctx context.Context) error {
	name := natsx.ProvStream(p.cfg.RunID)
	_, err := p.js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("look up the provenance stream %s: %w", name, err)
	}
	if !p.cfg.Replace {
		return &ExistsError{Run: p.cfg.RunID, Stream: name, NATSURL: p.cfg.NATSURL}
	}
	if err := p.js.DeleteStream(ctx, name); err != nil {
		return fmt.Errorf("delete the earlier run's provenance stream %s (--replace): %w", name, err)
	}
	return nil
}
