package culprit

import (
	"reflect"
	"slices"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/syncproto"
)

// rank builds one rank's report: work functions, point-to-point waits by
// function, collectives and waits by partner (µs).
type rank struct {
	r     uint32
	work  map[string]uint64
	p2p   map[string]uint64
	coll  map[string]uint64
	waits map[uint32]uint64
	calls map[string]uint64 // work functions' calls (default 1)
	max   map[string]uint64 // their longest call (default none)
}

func (x rank) report() RankStep {
	rs := RankStep{Rank: x.r}
	for _, m := range []struct {
		kind string
		m    map[string]uint64
	}{{syncproto.PeerWork, x.work}, {syncproto.PeerP2P, x.p2p}, {syncproto.PeerCollective, x.coll}} {
		for f, us := range m.m {
			calls := uint64(1)
			if n, ok := x.calls[f]; ok && m.kind == syncproto.PeerWork {
				calls = n
			}
			rs.Peer.Funcs = append(rs.Peer.Funcs, syncproto.PeerFunc{Func: f, Kind: m.kind, Us: us, Calls: calls, MaxUs: x.max[f]})
		}
	}
	for p, us := range x.waits {
		rs.Peer.Waits = append(rs.Peer.Waits, syncproto.PeerWait{Partner: p, Us: us})
	}
	return rs
}

// halo is a step of a ring of n ranks: each computes base µs (plus
// extra[r]), waits on both neighbours (plus waited[r] on partner late[r])
// and reduces (plus reduceWait[r]).
func halo(n int, extra, waited, reduceWait map[uint32]uint64, late map[uint32]uint32) []rank {
	var out []rank
	for i := range n {
		r := uint32(i)
		left, right := uint32((i+n-1)%n), uint32((i+1)%n)
		w := 200 + waited[r]
		waits := map[uint32]uint64{left: w, right: w}
		if p, ok := late[r]; ok {
			waits = map[uint32]uint64{left: 200, right: 200}
			waits[p] = w
		}
		out = append(out, rank{
			r:     r,
			work:  map[string]uint64{"compute": 10000 + uint64(i)*7 + extra[r], "pack": 300 + uint64(i)},
			p2p:   map[string]uint64{"MPI_Waitall": w},
			coll:  map[string]uint64{"MPI_Allreduce": 100 + uint64(i)*3 + reduceWait[r]},
			waits: waits,
		})
	}
	return out
}

func reports(rs []rank) []RankStep {
	out := make([]RankStep, len(rs))
	for i, r := range rs {
		out[i] = r.report()
	}
	return out
}

type want struct {
	rank    uint32
	fn      string
	step    uint64
	victims []uint32
}

func TestCulprits(t *testing.T) {
	for _, tc := range []struct {
		name string
		// earlier steps, analysed first; the last step is checked
		steps    [][]rank
		culprits []want // in order, the top ones
		outliers [][2]any
	}{
		{
			name:  "balanced step: no outlier, no culprit",
			steps: [][]rank{halo(8, nil, nil, nil, nil)},
		},
		{
			name: "late sender in a ring: its neighbours wait in Waitall, rank 0 at the reduction",
			steps: [][]rank{halo(4,
				map[uint32]uint64{2: 20000},
				map[uint32]uint64{1: 20000, 3: 20000},
				map[uint32]uint64{0: 20000},
				map[uint32]uint32{1: 2, 3: 2})},
			culprits: []want{{rank: 2, fn: "compute", victims: []uint32{0, 1, 3}}},
			outliers: [][2]any{{uint32(2), "compute"}},
		},
		{
			name: "chain: rank 3 waits on 2, which waited on 1, whose solve ran long",
			steps: [][]rank{func() []rank {
				rs := halo(6, nil, map[uint32]uint64{2: 15000, 3: 15000}, nil, map[uint32]uint32{2: 1, 3: 2})
				rs[1].work["solve"] = 15000
				for i := range rs {
					if i != 1 {
						rs[i].work["solve"] = 10
					}
				}
				return rs
			}()},
			culprits: []want{{rank: 1, fn: "solve", victims: []uint32{2, 3}}},
			outliers: [][2]any{{uint32(1), "solve"}},
		},
		{
			name: "wait at a collective: the rank that spent least in the barrier arrived last",
			steps: [][]rank{func() []rank {
				var rs []rank
				for i := range 6 {
					r := rank{r: uint32(i), work: map[string]uint64{"io": 5000}, coll: map[string]uint64{"MPI_Barrier": 30050 + uint64(i)}}
					if i == 4 {
						r.work["io"] = 35000
						r.coll["MPI_Barrier"] = 40
					}
					rs = append(rs, r)
				}
				return rs
			}()},
			culprits: []want{{rank: 4, fn: "io", victims: []uint32{0, 1, 2, 3, 5}}},
			outliers: [][2]any{{uint32(4), "io"}},
		},
		{
			name: "late arrival from the previous step: the excess was spent before the step ended",
			steps: [][]rank{
				halo(4, map[uint32]uint64{1: 25000}, nil, nil, nil),
				halo(4, nil, nil, map[uint32]uint64{0: 25000, 2: 25000, 3: 25000}, nil),
			},
			culprits: []want{{rank: 1, fn: "compute", step: 0, victims: []uint32{0, 2, 3}}},
		},
		{
			name: "a wait with no late partner is the rank's own",
			steps: [][]rank{
				halo(4, nil, map[uint32]uint64{3: 18000}, nil, map[uint32]uint32{3: 0}),
			},
			culprits: []want{{rank: 3, fn: "MPI_Waitall"}},
		},
		{
			name: "one stalled call among many: the longest calls set it apart",
			steps: [][]rank{func() []rank {
				var rs []rank
				for i := range 6 {
					// 100 calls of about 1 ms: 99 ms to 101.5 ms a step
					r := rank{r: uint32(i), work: map[string]uint64{"kernel": 99000 + uint64(i)*500}, calls: map[string]uint64{"kernel": 100}, max: map[string]uint64{"kernel": 1400 + uint64(i)*10}}
					if i == 3 {
						// one call stalled 8 ms: 8% more in all, under Rel
						r.work["kernel"] += 8000
						r.max["kernel"] = 9400
					}
					rs = append(rs, r)
				}
				return rs
			}()},
			culprits: []want{{rank: 3, fn: "kernel"}},
			outliers: [][2]any{{uint32(3), "kernel"}},
		},
		{
			name: "learnt spread: a function noisy across ranks in every step flags nothing",
			steps: func() [][]rank {
				var steps [][]rank
				for s := range 6 {
					rs := halo(8, nil, nil, nil, nil)
					for i := range rs {
						// ±40% around 10 ms, rotating with the step
						rs[i].work["compute"] = 6000 + uint64((i+s)%8)*1100
					}
					steps = append(steps, rs)
				}
				return steps
			}(),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var res Result
			for perm := range permutations(len(tc.steps[len(tc.steps)-1])) {
				a := New(Config{})
				var got Result
				for s, rs := range tc.steps {
					rep := reports(rs)
					if s == len(tc.steps)-1 {
						shuffled := make([]RankStep, len(rep))
						for i, j := range perm {
							shuffled[i] = rep[j]
						}
						rep = shuffled
					}
					got = a.Step(uint64(s), rep)
				}
				if perm[0] == 0 && slices.IsSorted(perm) {
					res = got
				} else if !reflect.DeepEqual(got, res) {
					t.Fatalf("order %v: %+v\nin rank order: %+v", perm, got, res)
				}
			}
			if len(res.Culprits) < len(tc.culprits) {
				t.Fatalf("culprits %+v, want %+v first", res.Culprits, tc.culprits)
			}
			if len(tc.culprits) == 0 && len(res.Culprits) > 0 {
				t.Fatalf("culprits %+v on a step without any", res.Culprits)
			}
			for i, w := range tc.culprits {
				c := res.Culprits[i]
				if w.step == 0 {
					w.step = uint64(len(tc.steps) - 1)
					if tc.name == "late arrival from the previous step: the excess was spent before the step ended" {
						w.step = 0
					}
				}
				if c.Rank != w.rank || c.Func != w.fn || c.IOStep != w.step || !slices.Equal(c.Victims, w.victims) {
					t.Errorf("culprit %d: %+v, want rank %d func %q io_step %d victims %v", i, c, w.rank, w.fn, w.step, w.victims)
				}
				if c.TimeLostUs != c.OwnUs+c.CausedUs || c.TimeLostUs <= 0 {
					t.Errorf("culprit %d: time lost %v is not own %v + caused %v", i, c.TimeLostUs, c.OwnUs, c.CausedUs)
				}
			}
			var outl [][2]any
			for _, o := range res.Outliers {
				outl = append(outl, [2]any{o.Rank, o.Func})
			}
			if !reflect.DeepEqual(outl, tc.outliers) {
				t.Errorf("outliers %v, want %v", outl, tc.outliers)
			}
		})
	}
}

// TestTimeLost: the culprit's time lost is its own excess plus every wait
// traced to it, and the step's waits add up to what was traced.
func TestTimeLost(t *testing.T) {
	a := New(Config{})
	res := a.Step(7, reports(halo(4,
		map[uint32]uint64{2: 20000},
		map[uint32]uint64{1: 20000, 3: 20000},
		map[uint32]uint64{0: 20000},
		map[uint32]uint32{1: 2, 3: 2})))
	if len(res.Culprits) != 1 {
		t.Fatalf("culprits %+v, want one", res.Culprits)
	}
	c := res.Culprits[0]
	// compute: 20014 against the median of 10000, 10007, 10021 and 30014
	// (10014); waits: 20000 on ranks 1 and 3 beyond the lower quartile,
	// and rank 0's 20100 beyond rank 1's 103 at the reduction (rank 1
	// arrived last there, late itself from its wait on rank 2)
	own := 30014.0 - (10007+10021)/2.0
	caused := 20000 + 20000 + (20100.0 - 103)
	if c.OwnUs != own || c.CausedUs != caused || c.TimeLostUs != own+caused || res.WaitUs != caused {
		t.Errorf("own %v caused %v lost %v wait %v, want %v %v %v %v", c.OwnUs, c.CausedUs, c.TimeLostUs, res.WaitUs, own, caused, own+caused, caused)
	}
}

// A rank reported twice counts once, and a step of fewer ranks than
// Config.MinRanks is not compared.
func TestFewRanks(t *testing.T) {
	a := New(Config{})
	rs := reports(halo(2, map[uint32]uint64{1: 50000}, nil, nil, nil))
	res := a.Step(0, append(rs, rs[1]))
	if res.Ranks != 2 || len(res.Outliers) != 0 || len(res.Culprits) != 0 {
		t.Errorf("%+v, want 2 ranks and nothing compared", res)
	}
}

// permutations yields every order of 0..n-1 for n <= 6, and 64 rotations
// and reversals beyond.
func permutations(n int) func(func([]int) bool) {
	return func(yield func([]int) bool) {
		p := make([]int, n)
		for i := range p {
			p[i] = i
		}
		if n > 6 {
			for k := range n {
				q := append(slices.Clone(p[k:]), p[:k]...)
				if !yield(q) {
					return
				}
				slices.Reverse(q)
				if !yield(q) {
					return
				}
			}
			return
		}
		var rec func(int) bool
		rec = func(k int) bool {
			if k == n {
				return yield(slices.Clone(p))
			}
			for i := k; i < n; i++ {
				p[k], p[i] = p[i], p[k]
				if !rec(k + 1) {
					return false
				}
				p[k], p[i] = p[i], p[k]
			}
			return true
		}
		rec(0)
	}
}
