package pserver

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/stats"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

func TestMergeOrderGivesSameModel(t *testing.T) {
	g := newGenRun(12, 15, 20, 5, 1)
	reqs := g.all()
	want := reference(t, reqs, 100)

	orders := map[string]func([]syncproto.SyncRequest){
		"reversed": func(r []syncproto.SyncRequest) { slices.Reverse(r) },
		"shuffled": func(r []syncproto.SyncRequest) {
			rng := rand.New(rand.NewPCG(9, 9))
			rng.Shuffle(len(r), func(i, j int) { r[i], r[j] = r[j], r[i] })
		},
		"by rank": func(r []syncproto.SyncRequest) {
			slices.SortStableFunc(r, func(a, b syncproto.SyncRequest) int { return int(a.Rank) - int(b.Rank) })
		},
	}
	for name, reorder := range orders {
		t.Run(name, func(t *testing.T) {
			rs := slices.Clone(reqs)
			reorder(rs)
			// Seq gating is per detector: reordering across detectors only, each
			// detector's own requests keep their order (as on the wire).
			got := NewState(100)
			byDet := map[DetectorID][]syncproto.SyncRequest{}
			var dets []DetectorID
			for _, r := range rs {
				id := DetectorID{r.PID, r.Rank}
				if byDet[id] == nil {
					dets = append(dets, id)
				}
				byDet[id] = append(byDet[id], r)
			}
			for _, id := range dets {
				slices.SortFunc(byDet[id], func(a, b syncproto.SyncRequest) int { return int(a.Seq) - int(b.Seq) })
			}
			// Interleave detectors in the reordered sequence of first appearance.
			for len(dets) > 0 {
				var next []DetectorID
				for _, id := range dets {
					q := byDet[id]
					if _, err := got.Apply(&q[0]); err != nil {
						t.Fatal(err)
					}
					if byDet[id] = q[1:]; len(q) > 1 {
						next = append(next, id)
					}
				}
				dets = next
			}
			compareModels(t, name, want, got)
			compareAggregates(t, name, want, got)
		})
	}
}

func TestApplyIsIdempotent(t *testing.T) {
	g := newGenRun(3, 4, 5, 1, 2)
	want := reference(t, g.all(), 100)
	got := NewState(100)
	for _, row := range g.reqs {
		for i := range row {
			for range 3 { // every request retried twice
				if _, err := got.Apply(&row[i]); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	compareModels(t, "retried", want, got)
	compareAggregates(t, "retried", want, got)
	if got.Duplicates != uint64(2*len(g.all())) {
		t.Errorf("duplicates = %d, want %d", got.Duplicates, 2*len(g.all()))
	}
	// An old Seq after a newer one is refused too, and Seq 0 never applies.
	old := g.reqs[0][0]
	if ok, _ := got.Apply(&old); ok {
		t.Error("request with an old Seq was applied")
	}
	zero := syncproto.SyncRequest{Rank: 99}
	if ok, _ := got.Apply(&zero); ok {
		t.Error("request with Seq 0 was applied")
	}
}

func TestReplyCarriesGlobalModelOfRequestKeys(t *testing.T) {
	g := newGenRun(4, 2, 6, 0, 3)
	st := reference(t, g.all(), 100)
	req := syncproto.SyncRequest{PID: 0, Rank: 2, Seq: 99, Models: g.reqs[0][2].Models[:2]}
	rep := st.Reply(&req, false)
	if len(rep.Models) != 2 {
		t.Fatalf("reply has %d models, want 2", len(rep.Models))
	}
	for i, m := range rep.Models {
		if m.Key != req.Models[i].Key || m.Moments != st.Models[m.Key].Moments {
			t.Errorf("model %d = %+v, want the global model of %q", i, m, req.Models[i].Key)
		}
	}
	if rep.LastSeq != 2 {
		t.Errorf("last_seq = %d, want 2", rep.LastSeq)
	}
}

func TestWindowIsBounded(t *testing.T) {
	tests := []struct {
		name          string
		window, steps int
	}{
		{"smaller than run", 5, 40},
		{"equal to run", 40, 40},
		{"one step", 1, 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := newGenRun(4, tc.steps, 3, 2, 4)
			full := reference(t, g.all(), tc.steps+10)
			st := reference(t, g.all(), tc.window)
			if len(st.Agg.Steps) > tc.window {
				t.Errorf("%d steps kept, window is %d", len(st.Agg.Steps), tc.window)
			}
			if got, want := st.Agg.Total(), full.Agg.Total(); got != want {
				t.Errorf("totals %+v, want %+v (folding must not lose counts)", got, want)
			}
			for id, r := range full.Agg.Ranks {
				if st.Agg.Ranks[id].Totals != r.Totals {
					t.Errorf("rank %v totals %+v, want %+v", id, st.Agg.Ranks[id].Totals, r.Totals)
				}
			}
		})
	}
}

func TestSnapshotRoundTrip(t *testing.T) {
	g := newGenRun(5, 12, 7, 3, 5)
	st := reference(t, g.all(), 8)
	st.WALSeq = 1234
	data, seq, err := encodeState(st)
	if err != nil {
		t.Fatal(err)
	}
	if seq != 1234 {
		t.Errorf("encoded WAL seq %d, want 1234", seq)
	}
	got, err := decodeState(data, 8)
	if err != nil {
		t.Fatal(err)
	}
	compareModels(t, "decoded", st, got)
	compareAggregates(t, "decoded", st, got)
	if got.Applied != st.Applied || got.Merges != st.Merges {
		t.Errorf("applied/merges %d/%d, want %d/%d", got.Applied, got.Merges, st.Applied, st.Merges)
	}
	// The decoded state keeps working.
	more := newGenRun(5, 13, 7, 3, 5).reqs[12]
	for i := range more {
		if ok, err := got.Apply(&more[i]); !ok || err != nil {
			t.Fatalf("apply after decode: %v %v", ok, err)
		}
	}
	if _, err := decodeState([]byte("not a snapshot"), 8); err == nil {
		t.Error("decoding garbage did not fail")
	}
}

func TestBadHistogramRejectsWholeRequest(t *testing.T) {
	g := newGenRun(2, 1, 8, 0, 8)
	st := NewState(10)
	req := g.reqs[0][0]
	req.Models = slices.Clone(req.Models)
	bad := *req.Models[0].Histogram
	bad.BinWidth = -1
	req.Models[len(req.Models)-1].Histogram = &bad
	ok, err := st.Apply(&req)
	if ok || err == nil {
		t.Fatalf("Apply = %v, %v; want an error", ok, err)
	}
	if len(st.Models) != 0 || st.LastSeq[DetectorID{0, 0}] != 0 || len(st.Agg.Ranks) != 0 {
		t.Errorf("a rejected request changed the state: %d models", len(st.Models))
	}
}

func TestNaturalRanges(t *testing.T) {
	var body, withOutliers stats.TailHist
	for i := range 1000 {
		v := float64(100 + i%50)
		body.Add(v)
		withOutliers.Add(v)
	}
	withOutliers.Add(600) // isolated: outside the natural range
	rule := stats.TailRule{Ratio: 1.4, Recur: 5, RecurFrac: 0.005, Resolution: 1}
	for _, tc := range []struct {
		name string
		rule *stats.TailRule
		want map[string]provenance.Range
	}{
		{"without a rule (Chimbuko's)", nil, map[string]provenance.Range{}},
		{"with the detectors' rule", &rule, map[string]provenance.Range{"f": {Low: 100 / (1.4 * 1.4), High: 1.4 * 149}, "g": {Low: 100 / (1.4 * 1.4), High: 1.4 * 149}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := NewState(4)
			req := &syncproto.SyncRequest{Seq: 1, Algorithm: "tail", TailRule: tc.rule, Models: []syncproto.ModelDelta{
				{Key: "f", Tail: &body}, {Key: "g", Tail: &withOutliers}, {Key: "h"},
			}}
			if _, err := st.Apply(req); err != nil {
				t.Fatal(err)
			}
			got := st.NaturalRanges()
			if len(got) != len(tc.want) {
				t.Fatalf("thresholds %v, want %v", got, tc.want)
			}
			for k, w := range tc.want {
				if math.Abs(got[k].High-w.High) > 1e-9 || math.Abs(got[k].Low-w.Low) > 1e-9 {
					t.Errorf("range of %s = %+v, want %+v", k, got[k], w)
				}
			}
		})
	}
}

// Steps that never reached a detector, reported in step summaries, count
// per rank and in the run's totals, whether their step is in the window or
// folded out of it.
func TestMissingStepsAggregated(t *testing.T) {
	st := NewState(2)
	r0, r1 := DetectorID{Rank: 0}, DetectorID{Rank: 1}
	seq := map[DetectorID]uint64{}
	add := func(id DetectorID, step, missing uint64) {
		seq[id]++
		req := &syncproto.SyncRequest{PID: id.PID, Rank: id.Rank, Seq: seq[id], Algorithm: "tail",
			Steps: []syncproto.StepSummary{{Step: step, Executions: 1, MissingSteps: missing}}}
		if _, err := st.Apply(req); err != nil {
			t.Fatal(err)
		}
	}
	add(r0, 0, 0)
	add(r1, 0, 0)
	add(r0, 3, 2) // steps 1 and 2 of rank 0 never arrived
	add(r1, 1, 0)
	add(r1, 5, 3) // steps 2, 3, 4 of rank 1 never arrived
	add(r0, 6, 2)
	for _, tc := range []struct {
		name string
		got  uint64
		want uint64
	}{
		{"rank 0", st.Agg.Ranks[r0].Missing, 4},
		{"rank 1", st.Agg.Ranks[r1].Missing, 3},
		{"run total (window and folded)", st.Agg.Total().Missing, 7},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %d missing steps, want %d", tc.name, tc.got, tc.want)
		}
	}
}
