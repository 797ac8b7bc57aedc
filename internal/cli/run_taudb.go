package cli

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/kipimo-hpc/kipimo/internal/taudb"
)

// checkRunTrial refuses, before a run starts, a run whose TAUdb trial
// (named by its id) would take a name the TAUdb at dsn already has: two
// trials of one name cannot be told apart by name (kipimo diff
// taudb:NAME), and a run refused at its end would have done its work for
// nothing. fromEnv says the DSN came from KIPIMO_TAUDB_DSN, not --taudb.
func checkRunTrial(ctx context.Context, dsn, name string, fromEnv bool) error {
	src := "--taudb"
	if fromEnv {
		src = "KIPIMO_TAUDB_DSN"
	}
	s, err := taudb.Open(ctx, dsn)
	if err != nil {
		return fmt.Errorf("%s: %w", src, err)
	}
	defer s.Close()
	if _, _, err := s.Configure(ctx); err != nil {
		return fmt.Errorf("%s: %w", src, err)
	}
	trials, err := s.Trials(ctx, taudb.Filter{Name: name})
	if err != nil {
		return fmt.Errorf("%s: %w", src, err)
	}
	if len(trials) == 0 {
		return nil
	}
	ids := make([]string, len(trials))
	for i, t := range trials {
		ids[i] = strconv.Itoa(t.ID)
	}
	return fmt.Errorf("the TAUdb of %s already has a trial named %q (id %s), the name this run's trial would take: choose another --run, or unset %s and load the profiles later under another name (kipimo taudb load --name NAME <out>/%s)",
		src, name, strings.Join(ids, ", "), src, name)
}
