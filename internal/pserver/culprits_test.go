package pserver

import (
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// ringSteps is a ring of n ranks over steps io_steps of 100 ms, each rank
// cutting its steps at its own phase (up to 40 ms late): in step late.step
// rank late.rank computes 30 ms longer, its two neighbours wait for it in
// MPI_Waitall and every other rank at MPI_Allreduce. One request per rank
// and step.
func ringSteps(n, steps int, lateRank uint32, lateStep uint64) []syncproto.SyncRequest {
	const period = 100_000
	var reqs []syncproto.SyncRequest
	for st := range uint64(steps) {
		for i := range n {
			r := uint32(i)
			left, right := (r+uint32(n)-1)%uint32(n), (r+1)%uint32(n)
			phase := uint64(i%5) * 10_000
			compute, wait, reduce := uint64(60_000+i%7*40), uint64(500+i%3*10), uint64(200+i%11)
			if st == lateStep {
				switch r {
				case lateRank:
					compute += 30_000
				case left, right:
				default:
					reduce += 30_000
				}
				if r == (lateRank+1)%uint32(n) || r == (lateRank+uint32(n)-1)%uint32(n) {
					wait += 30_000
				}
			}
			waits := []syncproto.PeerWait{{Partner: left, Us: wait}, {Partner: right, Us: wait}}
			start := 1_000_000 + st*period + phase
			peer := &syncproto.PeerStep{
				Start: start, End: start + period,
				Funcs: []syncproto.PeerFunc{
					{Func: "compute", Us: compute, Calls: 10},
					{Func: "MPI_Waitall", Kind: syncproto.PeerP2P, Us: wait, Calls: 10},
					{Func: "MPI_Allreduce", Kind: syncproto.PeerCollective, Us: reduce, Calls: 10},
				},
				Waits: waits,
			}
			var anomalies uint64
			if st == lateStep && (r == lateRank || r == (lateRank+1)%uint32(n) || r == (lateRank+uint32(n)-1)%uint32(n)) {
				anomalies = 1
			}
			reqs = append(reqs, syncproto.SyncRequest{PID: 0, Rank: r, Seq: st + 1, Step: st, Algorithm: "tail",
				Steps: []syncproto.StepSummary{{Step: st, Anomalies: anomalies, Executions: 30, MinTS: start, MaxTS: start + period, Peer: peer}}})
		}
	}
	return reqs
}

// TestCulpritsManyRanks: 512 ranks sync in a random order (each rank's
// steps in order, the ranks interleaved): the late rank is the top culprit
// of its burst with every other rank its victim, it is the only outlier,
// and the analysis is the same whatever the order.
func TestCulpritsManyRanks(t *testing.T) {
	const n, lateRank, lateStep = 512, 77, 4
	reqs := ringSteps(n, 8, lateRank, lateStep)
	var first Culprits
	for trial := range 3 {
		order := interleave(reqs, n, rand.New(rand.NewPCG(uint64(trial), 9)))
		st := NewState(0)
		for _, i := range order {
			if _, err := st.Apply(&reqs[i]); err != nil {
				t.Fatal(err)
			}
		}
		got := st.Culprits(true)
		if trial == 0 {
			first = got
			continue
		}
		if !reflect.DeepEqual(got, first) {
			t.Fatalf("order %d gave another analysis", trial)
		}
	}
	c := first
	if c.Steps != 8 || c.Pending != 0 {
		t.Errorf("%d steps analysed, %d pending; want 8, 0", c.Steps, c.Pending)
	}
	if len(c.Culprits) != 1 || c.Culprits[0].Rank != lateRank || c.Culprits[0].Func != "compute" || c.Culprits[0].Top != 1 || c.Culprits[0].Bursts != 1 {
		t.Fatalf("culprits %+v, want rank %d in compute, top of one burst", c.Culprits, lateRank)
	}
	if len(c.Outliers) != 1 || c.Outliers[0].Rank != lateRank || !slices.Equal(c.Outliers[0].IOSteps, []uint64{lateStep}) || c.Outliers[0].Standing {
		t.Errorf("outliers %+v, want rank %d at io_step %d only, not standing", c.Outliers, lateRank, lateStep)
	}
	var burst *Burst
	for i := range c.Bursts {
		if c.Bursts[i].IOStep == lateStep {
			burst = &c.Bursts[i]
		}
	}
	if burst == nil || len(c.Bursts) != 1 {
		t.Fatalf("bursts %+v, want one at io_step %d", c.Bursts, lateStep)
	}
	top := burst.Culprits[0]
	if top.Rank != lateRank || top.VictimCount != n-1 || len(top.Victims) != maxVictims || burst.Anomalies != 3 || burst.AnomalousRanks != 3 || burst.Ranks != n {
		t.Errorf("burst %+v: top culprit %+v, want rank %d with %d victims, 3 anomalies on 3 of %d ranks", burst, top, lateRank, n-1, n)
	}
	// own 30 ms plus 2 neighbours' waits and n-3 reductions of about 30 ms
	if lost := top.TimeLostUs; lost < 30_000*float64(n-1) || lost > 30_500*float64(n) {
		t.Errorf("time lost %.0f µs, want about %d", lost, 30_000*n)
	}
}

// A rank that is slow in every step stands out as a standing outlier;
// one step's report arriving after its step was analysed counts as late.
func TestCulpritsStandingAndLate(t *testing.T) {
	const n = 16
	st := NewState(0)
	var held *syncproto.SyncRequest
	for s := range uint64(12) {
		for i := range n {
			compute := uint64(50_000 + i*20)
			if i == 5 {
				compute += 20_000
			}
			req := &syncproto.SyncRequest{Rank: uint32(i), Seq: s + 1, Step: s, Algorithm: "tail", Steps: []syncproto.StepSummary{{Step: s,
				Peer: &syncproto.PeerStep{Start: s * 100_000, End: (s + 1) * 100_000, Funcs: []syncproto.PeerFunc{{Func: "compute", Us: compute, Calls: 1}}}}}}
			if s == 1 && i == 3 {
				held = req
				continue
			}
			if _, err := st.Apply(req); err != nil {
				t.Fatal(err)
			}
		}
	}
	// its Seq is below the rank's latest: as a request it is a duplicate
	st.Agg.AddStep(DetectorID{0, 3}, &held.Steps[0])
	c := st.Culprits(true)
	if c.Late != 1 {
		t.Errorf("%d late reports, want 1", c.Late)
	}
	if len(c.Outliers) != 1 || c.Outliers[0].Rank != 5 || c.Outliers[0].Steps != 12 || !c.Outliers[0].Standing {
		t.Errorf("outliers %+v, want rank 5 standing in all 12 io_steps", c.Outliers)
	}
}

// The HTTP API serves the analysis, bounded by n.
func TestCulpritsAPI(t *testing.T) {
	st := NewState(0)
	for _, req := range ringSteps(8, 5, 2, 3) {
		if _, err := st.Apply(&req); err != nil {
			t.Fatal(err)
		}
	}
	st.Culprits(true)
	d := &dashboard{view: func(f func(*State)) { f(st) }}
	mux := http.NewServeMux()
	d.culpritRoutes(mux)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	var c Culprits
	get(t, srv.URL+"/api/culprits?n=1", &c)
	if len(c.Culprits) != 1 || c.Culprits[0].Rank != 2 || len(c.Bursts) == 0 || c.Bursts[0].Culprits[0].Rank != 2 {
		t.Errorf("/api/culprits: %+v", c)
	}
	var o struct {
		Steps    int          `json:"steps_analysed"`
		Outliers []OutlierRow `json:"outlier_ranks"`
	}
	get(t, srv.URL+"/api/outliers", &o)
	if o.Steps != 5 || len(o.Outliers) != 1 || o.Outliers[0].Rank != 2 {
		t.Errorf("/api/outliers: %+v", o)
	}
	resp, err := http.Get(srv.URL + "/api/culprits?n=x")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("n=x: %s, want 400", resp.Status)
	}
}

func get(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatal(err)
	}
}

// interleave returns an order of reqs (n ranks' requests, step by step)
// that keeps each rank's steps in order and mixes the ranks at random,
// up to two steps apart.
func interleave(reqs []syncproto.SyncRequest, n int, rng *rand.Rand) []int {
	next := make([]int, n) // each rank's next step
	steps := len(reqs) / n
	var order []int
	for len(order) < len(reqs) {
		r := rng.IntN(n)
		low := slices.Min(next)
		if next[r] == steps || next[r] > low+1 {
			continue
		}
		order = append(order, next[r]*n+r)
		next[r]++
	}
	return order
}
