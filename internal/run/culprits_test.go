package run

import (
	"bytes"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/pserver"
)

// The text summary lists the top five culprits and the standing outlier
// ranks only.
func TestCulpritText(t *testing.T) {
	s := &Summary{
		Culprits: []pserver.CulpritRow{
			{Rank: 2, Func: "compute", TimeLostUs: 1_500_000, OwnUs: 500_000, CausedUs: 1_000_000, Bursts: 4, Top: 4},
			{Rank: 0, Func: "", TimeLostUs: 30_000, Bursts: 1},
		},
		OutlierRanks: []pserver.OutlierRow{
			{Rank: 2, Func: "compute", Steps: 4, ExcessUs: 500_000, Standing: true},
			{Rank: 3, Func: "MPI_Irecv", Steps: 1, ExcessUs: 20_000},
		},
	}
	var b bytes.Buffer
	writeCulpritText(&b, s)
	out := b.String()
	for _, want := range []string{
		"culprits\trank 2 in compute: 1.5s lost (500ms own, 1s waited by others) in 4 bursts, top in 4",
		"\trank 0 in (unreported): 30ms lost",
		"outlier ranks\trank 2 in compute: 4 io_steps, 500ms beyond its peers",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("%q lacks %q", out, want)
		}
	}
	if strings.Contains(out, "MPI_Irecv") {
		t.Errorf("%q lists an outlier that does not stand", out)
	}
	b.Reset()
	writeCulpritText(&b, &Summary{})
	if b.Len() != 0 {
		t.Errorf("nothing to say, wrote %q", b.String())
	}
}
