package tautrace

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/replay/steps"
)

// kanika is a 12-rank TAU trace from the field (kanika901/PerfomanceModeling
// phase1; copied from ../shared/fixtures/field/tau/kanika_phase1): per-thread
// tautrace.N.0.0.trc with events.N.edf, and TAU's merged tau.trc/tau.edf.
const kanika = "testdata/kanika_phase1"

type fieldCount struct{ entries, exits, samples, comms int }

// countField counts a trace's frame events independently of the reader:
// 24-byte little-endian records; the .edf says each id's group and type
// (regular expression); a user event is a run of records of one id on one
// thread, a sample per three records (0, value, 0) or a lone record.
func countField(t *testing.T, trc, edf string) fieldCount {
	t.Helper()
	text, err := os.ReadFile(edf)
	if err != nil {
		t.Fatal(err)
	}
	group, typ := map[int32]string{}, map[int32]string{}
	for _, m := range regexp.MustCompile(`(?m)^(-?\d+) (\S+) -?\d+ ".*" (\S+)$`).FindAllStringSubmatch(string(text), -1) {
		id, _ := strconv.Atoi(m[1])
		group[int32(id)], typ[int32(id)] = m[2], m[3]
	}
	data, err := os.ReadFile(trc)
	if err != nil {
		t.Fatal(err)
	}
	var c fieldCount
	type run struct {
		ev int32
		n  int
	}
	runs := map[uint32]*run{}
	end := func(r *run) {
		if r.n > 0 {
			c.samples += (r.n + 2) / 3
		}
		r.n = 0
	}
	for off := 0; off+24 <= len(data); off += 24 {
		ev := int32(binary.LittleEndian.Uint32(data[off:]))
		th := binary.LittleEndian.Uint32(data[off+4:]) // node and thread
		par := int64(binary.LittleEndian.Uint64(data[off+8:]))
		r := runs[th]
		if r == nil {
			r = &run{}
			runs[th] = r
		}
		if typ[ev] == "TriggerValue" {
			if r.ev != ev {
				end(r)
				r.ev = ev
			}
			r.n++
			continue
		}
		end(r)
		switch {
		case typ[ev] == "EntryExit" && group[ev] != "TRACER" && par > 0:
			c.entries++
		case typ[ev] == "EntryExit" && group[ev] != "TRACER" && par < 0:
			c.exits++
		case group[ev] == "TAU_MESSAGE":
			c.comms++
		}
	}
	for _, r := range runs {
		end(r)
	}
	return c
}

// TestFieldKanika: issue item 6 (lone user-event records with value 0,
// TauTraceClockOffsetStart/End, are samples) and item 8 (the merged tau.trc
// given with its per-thread files is skipped and reported, not read twice).
func TestFieldKanika(t *testing.T) {
	var perThread fieldCount
	traces, _ := filepath.Glob(filepath.Join(kanika, "tautrace.*.trc"))
	if len(traces) != 12 {
		t.Fatalf("want 12 per-thread traces, found %d", len(traces))
	}
	for _, trc := range traces {
		c := countField(t, trc, EDFPath(trc))
		perThread.entries += c.entries
		perThread.exits += c.exits
		perThread.samples += c.samples
		perThread.comms += c.comms
	}
	merged := countField(t, filepath.Join(kanika, "tau.trc"), filepath.Join(kanika, "tau.edf"))
	if merged != perThread {
		t.Fatalf("independent counts differ: merged %+v, per-thread %+v", merged, perThread)
	}
	all, _ := filepath.Glob(filepath.Join(kanika, "*.trc"))
	cases := []struct {
		name       string
		paths      []string
		duplicates int
	}{
		{"directory", []string{kanika}, 0},
		{"merged", []string{filepath.Join(kanika, "tau.trc")}, 0},
		{"merged with per-thread", all, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			frames, st, err := collect(t, steps.Config{}, func(b *steps.Builder) error {
				return Read(context.Background(), tc.paths, b)
			})
			if err != nil {
				t.Fatal(err)
			}
			var got fieldCount
			ranks := map[uint32]bool{}
			for _, f := range frames {
				ranks[f.Rank] = true
				for _, e := range f.Events {
					if e.Kind == frame.Entry {
						got.entries++
					} else {
						got.exits++
					}
				}
				got.samples += len(f.CounterEvents)
				got.comms += len(f.Comms)
			}
			if got != perThread {
				t.Errorf("frames hold %+v, the trace %+v", got, perThread)
			}
			if st.Executions != perThread.exits || len(ranks) != 12 {
				t.Errorf("%d executions on %d ranks, want %d on 12", st.Executions, len(ranks), perThread.exits)
			}
			// 12 ranks, 2 one-second steps each.
			if st.Frames != 24 {
				t.Errorf("%d frames, want 24", st.Frames)
			}
			if n := st.Losses.Count(steps.LossDuplicateInput); n != tc.duplicates || len(st.Losses) != min(tc.duplicates, 1) {
				t.Errorf("losses %v, want %d duplicate input", st.Losses, tc.duplicates)
			}
		})
	}
	// Counted by the python reference of the issue: 55,524 events.
	if n := perThread.entries + perThread.exits + perThread.samples + perThread.comms; n != 55524 {
		t.Errorf("independent count %d events, the issue's reference 55,524", n)
	}
}
