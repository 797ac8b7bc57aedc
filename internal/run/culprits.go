package run

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/pserver"
)

// CulpritsFile is the name, in a run's directory, of the run's culprit
// analysis (pserver.Culprits as JSON), which kipimo query culprits reads.
const CulpritsFile = "culprits.json"

// summaryCulprits is how many culprits and outlier ranks the summary lists.
const summaryCulprits = 20

// addCulprits finishes the pserver's culprit analysis, writes it whole to
// the run's directory and puts its top rows in the summary.
func (p *Pipeline) addCulprits(sum *Summary) error {
	var c pserver.Culprits
	p.ps.View(func(st *pserver.State) { c = st.Culprits(true) })
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	if err := os.WriteFile(p.cfg.path(CulpritsFile), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write the culprit analysis: %w", err)
	}
	sum.Culprits = c.Culprits[:min(len(c.Culprits), summaryCulprits)]
	sum.OutlierRanks = c.Outliers[:min(len(c.Outliers), summaryCulprits)]
	return nil
}

// writeCulpritText writes the summary's top culprits and standing outlier
// ranks, one line each, for WriteText's table.
func writeCulpritText(w io.Writer, s *Summary) {
	us := func(x float64) time.Duration {
		return time.Duration(x * float64(time.Microsecond)).Round(time.Microsecond)
	}
	for i, c := range s.Culprits[:min(len(s.Culprits), 5)] {
		label := ""
		if i == 0 {
			label = "culprits"
		}
		fn := c.Func
		if fn == "" {
			fn = "(unreported)"
		}
		fmt.Fprintf(w, "%s\trank %d in %s: %s lost (%s own, %s waited by others) in %d bursts, top in %d\n",
			label, c.Rank, fn, us(c.TimeLostUs), us(c.OwnUs), us(c.CausedUs), c.Bursts, c.Top)
	}
	first := true
	for _, o := range s.OutlierRanks {
		if !o.Standing {
			continue
		}
		label := ""
		if first {
			label, first = "outlier ranks", false
		}
		fmt.Fprintf(w, "%s\trank %d in %s: %d io_steps, %s beyond its peers\n", label, o.Rank, o.Func, o.Steps, us(o.ExcessUs))
	}
}
