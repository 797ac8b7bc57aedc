package ad

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"io"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// TestRestoreVersion6InFlight restores checkpoints written by version 6,
// whose request in flight held each model's histograms behind a presence
// byte (testdata/checkpoint/v6-synthetic-<algorithm>-inflight.kpck.gz: rank
// 0 of the synthetic checkpoint workload under ckRun, its request of the
// cut held in flight, taken by that version): each restores to exactly the
// state today's checkpoint of the same run holds (the two checkpoints are
// the same bytes, once given one incarnation), its request in flight with
// the same models.
func TestRestoreVersion6InFlight(t *testing.T) {
	w := loadCkWorkloads(t)["synthetic"]
	one := ckWorkload{name: w.name, frames: w.frames[:1]}
	for _, algo := range []string{Tail, HBOS} {
		t.Run(algo, func(t *testing.T) {
			old := v6Sample(t, algo)
			fresh := ckRun(t, one, Config{Algorithm: algo}, 5, true, true, false, false).cps[0]
			restore := func(cp []byte) *Detector {
				t.Helper()
				d, err := Restore(Config{Algorithm: algo, Syncer: newFakePServer(), Hostname: "ckhost"}, cp)
				if err != nil {
					t.Fatal(err)
				}
				return d
			}
			a, b := restore(old), restore(fresh)
			defer func() {
				for _, d := range []*Detector{a, b} {
					if err := d.Close(context.Background()); err != nil {
						t.Error(err)
					}
				}
			}()
			models, hists, tails := 0, 0, 0
			for _, sh := range a.sync.shards {
				if sh.inflight == nil {
					continue
				}
				for i := range sh.inflight.Models {
					models++
					if sh.inflight.Models[i].Histogram != nil {
						hists++
					}
					if sh.inflight.Models[i].Tail != nil {
						tails++
					}
				}
			}
			if models == 0 || tails == 0 || (algo == HBOS) != (hists > 0) {
				t.Fatalf("restored request in flight holds %d models, %d with a histogram, %d with a tail", models, hists, tails)
			}
			// the counters of a request are in no order (a map's)
			for _, d := range []*Detector{a, b} {
				for _, sh := range d.sync.shards {
					if sh.inflight != nil {
						slices.SortFunc(sh.inflight.Counters, func(x, y syncproto.CounterDelta) int { return strings.Compare(x.Name, y.Name) })
					}
				}
			}
			b.sync.incarnation = a.sync.incarnation
			for _, sh := range b.sync.shards {
				if sh.inflight != nil {
					sh.inflight.Incarnation = a.sync.incarnation
				}
			}
			var cps [2][]byte
			var err error
			for i, d := range []*Detector{a, b} {
				if cps[i], err = d.Checkpoint(); err != nil {
					t.Fatal(err)
				}
			}
			if n := commonPrefix(cps[0], cps[1]); n != len(cps[0]) || n != len(cps[1]) {
				t.Fatalf("the checkpoint of the detector restored from version 6 (%d bytes) differs from today's (%d bytes) from byte %d on", len(cps[0]), len(cps[1]), n)
			}
		})
	}
}

// v6Sample returns the version 6 checkpoint of algo under testdata.
func v6Sample(t *testing.T, algo string) []byte {
	t.Helper()
	data, err := os.ReadFile("testdata/checkpoint/v6-synthetic-" + algo + "-inflight.kpck.gz")
	var zr *gzip.Reader
	if err == nil {
		zr, err = gzip.NewReader(bytes.NewReader(data))
	}
	var cp []byte
	if err == nil {
		cp, err = io.ReadAll(zr)
	}
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := binary.Uvarint(cp[len(CheckpointMagic):]); v != 6 {
		t.Fatalf("the sample is version %d, want 6", v)
	}
	return cp
}

// commonPrefix is the length of the longest common prefix of a and b.
func commonPrefix(a, b []byte) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}
