package ad

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/replay/steps"
	"github.com/kipimo-hpc/kipimo/internal/replay/tautrace"
	"github.com/kipimo-hpc/kipimo/internal/stats"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

// ckSyncer is the pserver double of the checkpoint tests: a fakePServer
// that logs every request it answers, per rank and shard, and can hold one
// request (the next of a rank on a shard) until released or until the
// attempt's context ends (then the attempt fails and is not logged).
type ckSyncer struct {
	ps *fakePServer

	mu      sync.Mutex
	tails   map[string]*stats.TailHist // merged as the pserver merges them
	log     map[[2]uint64][]string
	hold    *[2]uint64
	release chan struct{}
	// incs is the incarnations each rank's requests carried (the log
	// leaves them out: two runs draw different ones).
	incs map[uint32]map[uint64]bool
}

func newCkSyncer() *ckSyncer {
	return &ckSyncer{ps: newFakePServer(), tails: map[string]*stats.TailHist{}, log: map[[2]uint64][]string{}, release: make(chan struct{}), incs: map[uint32]map[uint64]bool{}}
}

// holdNext makes the next request of rank on shard wait for unhold.
func (s *ckSyncer) holdNext(rank uint32, shard int) {
	s.mu.Lock()
	s.hold = &[2]uint64{uint64(rank), uint64(shard)}
	s.mu.Unlock()
}

func (s *ckSyncer) unhold() { close(s.release) }

func (s *ckSyncer) Sync(ctx context.Context, shard int, req *syncproto.SyncRequest) (*syncproto.SyncReply, error) {
	id := [2]uint64{uint64(req.Rank), uint64(shard)}
	s.mu.Lock()
	held := s.hold != nil && *s.hold == id && req.Seq > 0
	if held {
		s.hold = nil
	}
	s.mu.Unlock()
	if held {
		select {
		case <-s.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	// The counters, and the functions of a step summary, come in map
	// order: log them sorted.
	q := *req
	q.Incarnation = 0
	q.Counters = slices.Clone(q.Counters)
	sort.Slice(q.Counters, func(i, j int) bool { return q.Counters[i].Name < q.Counters[j].Name })
	q.Steps = slices.Clone(q.Steps)
	for i := range q.Steps {
		fs := slices.Clone(q.Steps[i].Funcs)
		sort.Slice(fs, func(a, b int) bool { return fs[a].Func < fs[b].Func })
		q.Steps[i].Funcs = fs
	}
	b, err := json.Marshal(&q)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rep := s.ps.handle(shard, req)
	for _, m := range req.Models {
		if m.Tail == nil || !rep.Applied {
			continue
		}
		h := s.tails[m.Key]
		if h == nil {
			h = &stats.TailHist{}
			s.tails[m.Key] = h
		}
		if err := h.Merge(*m.Tail); err != nil {
			return nil, err
		}
	}
	for i := range rep.Models {
		if h := s.tails[rep.Models[i].Key]; h != nil {
			c := h.Clone()
			rep.Models[i].Tail = &c
		}
	}
	s.log[id] = append(s.log[id], string(b))
	if s.incs[req.Rank] == nil {
		s.incs[req.Rank] = map[uint64]bool{}
	}
	s.incs[req.Rank][req.Incarnation] = true
	return rep, nil
}

// ckWorkload is a stream of frames per rank, binary encoded.
type ckWorkload struct {
	name   string
	frames [][][]byte // rank, step
}

var ckWorkloads struct {
	once sync.Once
	m    map[string]ckWorkload
	err  error
}

// synthetic is the workload generator's stream: GPU threads, counters
// (correlation ids), halo exchanges between ranks, injected anomalies.
func syntheticWorkload(ranks, nsteps, perStep int) (ckWorkload, error) {
	wcfg := workload.DefaultConfig()
	wcfg.Ranks, wcfg.ThreadsPerRank, wcfg.Steps, wcfg.EventsPerStep, wcfg.GPU, wcfg.Seed = ranks, 2, nsteps, perStep, true, 7
	w, err := workload.New(wcfg)
	if err != nil {
		return ckWorkload{}, err
	}
	out := ckWorkload{name: "synthetic", frames: make([][][]byte, ranks)}
	for r := range ranks {
		g := w.Rank(uint32(r))
		var f frame.Frame
		for {
			if _, err := g.Next(&f); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return ckWorkload{}, err
			}
			out.frames[r] = append(out.frames[r], frame.AppendBinary(nil, &f))
		}
	}
	return out, nil
}

// tauWorkload is a real TAU trace (MPI+OpenMP rank 0 with messages), cut
// into steps of 20 ms.
func tauWorkload() (ckWorkload, error) {
	out := ckWorkload{name: "tau-hecatoncheir", frames: make([][][]byte, 1)}
	cfg := steps.Config{Step: 20 * time.Millisecond}
	if err := cfg.Validate(); err != nil {
		return out, err
	}
	b := steps.New(cfg, func(f *frame.Frame) error {
		if f.Rank != 0 {
			return fmt.Errorf("frame of rank %d", f.Rank)
		}
		out.frames[0] = append(out.frames[0], frame.AppendBinary(nil, f))
		return nil
	})
	err := tautrace.Read(context.Background(), []string{"testdata/checkpoint/hecatoncheir/tautrace.0.0.0.trc"}, b)
	return out, err
}

// lateNames is w with the names of its first n frames moved to frame n,
// as a detector that starts late sees a stream: its first frames wait for
// their names.
func lateNames(w ckWorkload, n int) (ckWorkload, error) {
	out := ckWorkload{name: w.name + "-late-names", frames: make([][][]byte, len(w.frames))}
	for r, fs := range w.frames {
		var funcs, ctrs []frame.Name
		for i, b := range fs {
			var f frame.Frame
			if _, err := frame.DecodeBinary(b, &f); err != nil {
				return out, err
			}
			if i < n {
				funcs, ctrs = append(funcs, f.Funcs...), append(ctrs, f.Counters...)
				f.Funcs, f.Counters = nil, nil
			} else if i == n {
				f.Funcs, f.Counters = append(funcs, f.Funcs...), append(ctrs, f.Counters...)
			}
			out.frames[r] = append(out.frames[r], frame.AppendBinary(nil, &f))
		}
	}
	return out, nil
}

func loadCkWorkloads(t testing.TB) map[string]ckWorkload {
	ckWorkloads.once.Do(func() {
		m := map[string]ckWorkload{}
		add := func(w ckWorkload, err error) {
			if err != nil && ckWorkloads.err == nil {
				ckWorkloads.err = fmt.Errorf("workload %s: %w", w.name, err)
			}
			m[w.name] = w
		}
		add(syntheticWorkload(2, 14, 4000))
		cb, _ := chimbench(14, 4000)
		add(ckWorkload{name: "chimbench", frames: [][][]byte{encodeFrames(cb)}}, nil)
		add(tauWorkload())
		add(lateNames(m["synthetic"], 3))
		ckWorkloads.m = m
	})
	if ckWorkloads.err != nil {
		t.Fatal(ckWorkloads.err)
	}
	return ckWorkloads.m
}

// ckState is what a checkpoint held, counted from the detectors at the cut
// (so that a case can require what it claims to test).
type ckState struct {
	openStacks, pending, settling, inflight, detached, held int
	launches, counters, comms                               int // GPU launches, attached events
}

func stateOf(ds []*Detector) ckState {
	var s ckState
	for _, d := range ds {
		for _, t := range d.stacks.threads {
			s.openStacks += len(t.stack)
			s.detached += len(t.detached)
			for i := range t.ring {
				if e := &t.ring[i]; e.flags&flagDone != 0 && e.label == labelNone {
					s.settling++
				}
			}
		}
		s.pending += len(d.rec.pending)
		s.launches += len(d.stacks.launches)
		for _, t := range d.stacks.threads {
			s.counters += len(t.counters)
			s.comms += len(t.comms)
		}
		s.held += len(d.held)
		for _, sh := range d.sync.shards {
			if sh.inflight != nil {
				s.inflight++
			}
		}
	}
	return s
}

// ckOutput is what a run shows through the public outputs.
type ckOutput struct {
	after    [][]string // per rank, the JSON of every batch after the cut
	stats    []Stats
	requests map[[2]uint64][]string
	incs     map[uint32]map[uint64]bool // the incarnations of each rank's requests
	cps      [][]byte                   // the checkpoints taken at the cut
	state    ckState
}

// ckRun runs one detector per rank over w, every rank's step before any
// rank's next; after cut steps each detector is checkpointed, and with
// restore it is dropped as a crashed process would be (its senders stopped,
// nothing flushed) and replaced by a detector restored from the checkpoint.
// With hold, rank 0's request on shard 0 of step cut stays in flight across
// the cut; with extras, each detector is also given a frame of another rank
// (rejected, counted in the next step's summary) and asked for its profiles
// (published with the next step's records) just before the cut. Before each
// later step the test waits for the replies to the
// requests in flight, so that both runs see them at the same step.
func ckRun(t *testing.T, w ckWorkload, cfg Config, cut int, hold, pserver, extras, restore bool) ckOutput {
	t.Helper()
	ctx := context.Background()
	var ps *ckSyncer
	if pserver {
		ps = newCkSyncer()
		cfg.Syncer = ps
	}
	cfg.SyncWait = time.Minute
	cfg.SyncTimeout = time.Minute
	cfg.Hostname = "ckhost"
	ranks := len(w.frames)
	ds := make([]*Detector, ranks)
	sinks := make([]*MemorySink, ranks)
	mark := make([]int, ranks)
	cfgs := make([]Config, ranks)
	for r := range ranks {
		cfgs[r] = cfg
		cfgs[r].Rank = uint32(r)
		sinks[r] = &MemorySink{}
		cfgs[r].Sink = sinks[r]
		d, err := New(cfgs[r])
		if err != nil {
			t.Fatal(err)
		}
		ds[r] = d
	}
	out := ckOutput{after: make([][]string, ranks), cps: make([][]byte, ranks)}
	waitReplies := func() {
		deadline := time.Now().Add(time.Minute)
		for _, d := range ds {
			for i, sh := range d.sync.shards {
				for sh.inflight != nil && len(sh.done) == 0 {
					if time.Now().After(deadline) {
						t.Fatalf("rank %d shard %d: no reply to seq %d within a minute", d.cfg.Rank, i, sh.inflight.Seq)
					}
					time.Sleep(time.Millisecond)
				}
			}
		}
	}
	var f frame.Frame
	for step := 0; ; step++ {
		more := false
		if hold && step == cut-1 {
			ps.holdNext(0, 0)
			ds[0].sync.shards[0].healthy.Store(false) // the step does not wait for it
		}
		for r, d := range ds {
			if step >= len(w.frames[r]) {
				continue
			}
			more = true
			if _, err := frame.DecodeBinary(w.frames[r][step], &f); err != nil {
				t.Fatal(err)
			}
			if err := d.Process(ctx, &f); err != nil {
				t.Fatal(err)
			}
		}
		if !more {
			break
		}
		if step == cut-1 {
			if extras {
				for r, d := range ds {
					foreign := f
					foreign.Rank = uint32(r + 100)
					if err := d.Process(ctx, &foreign); err == nil {
						t.Fatal("a frame of another rank was taken")
					}
					d.requestProfiles.Store(true)
				}
			}
			out.state = stateOf(ds)
			for r, d := range ds {
				cp, err := d.Checkpoint()
				if err != nil {
					t.Fatal(err)
				}
				if again, err := d.Checkpoint(); err != nil || !bytes.Equal(again, cp) {
					t.Fatalf("rank %d: a second checkpoint of the same state differs (%v)", r, err)
				}
				out.cps[r] = cp
				mark[r] = len(sinks[r].Batches)
				if !restore {
					continue
				}
				d.sync.cancel() // the process dies: its senders stop
				d.sync.wg.Wait()
				sinks[r] = &MemorySink{}
				mark[r] = 0
				c := cfgs[r]
				c.Sink = sinks[r]
				c.Hostname = "another-host"
				if ds[r], err = Restore(c, cp); err != nil {
					t.Fatal(err)
				}
				var last frame.Frame
				if _, err := frame.DecodeBinary(w.frames[r][step], &last); err != nil {
					t.Fatal(err)
				}
				if s, ok := ds[r].LastStep(); !ok || s != last.Step {
					t.Fatalf("rank %d: restored detector's last step is %d (%v), the checkpoint's frame's is %d", r, s, ok, last.Step)
				}
			}
			if hold {
				ps.unhold()
			}
		}
		if step >= cut-1 {
			waitReplies()
		}
	}
	for r, d := range ds {
		if err := d.Close(ctx); err != nil {
			t.Fatal(err)
		}
		for _, b := range sinks[r].Batches[mark[r]:] {
			j, err := json.Marshal(b)
			if err != nil {
				t.Fatal(err)
			}
			out.after[r] = append(out.after[r], string(j))
		}
		out.stats = append(out.stats, d.Stats())
	}
	if ps != nil {
		out.requests, out.incs = ps.log, ps.incs
	}
	return out
}

func TestCheckpointRestoresExactly(t *testing.T) {
	ws := loadCkWorkloads(t)
	tests := []struct {
		name     string
		workload string
		cfg      Config
		cut      int
		hold     bool
		pserver  bool
		extras   bool               // a rejected frame and a profile request at the cut
		want     func(ckState) bool // what the checkpoint must hold
		wantDesc string
	}{
		{"synthetic/tail/mid-run", "synthetic", Config{ProfileEvery: 3}, 6, false, true, false,
			func(s ckState) bool {
				return s.openStacks > 0 && s.pending > 0 && s.launches > 0 && s.counters > 0 && s.comms > 0
			}, "open stacks, pending windows, GPU launches and attached counters and comms"},
		{"synthetic/tail/settling", "synthetic", Config{SettleCount: 50000, MaxPendingSteps: 6}, 3, false, true, false,
			func(s ckState) bool { return s.settling > 0 && s.openStacks > 0 }, "settling candidates"},
		{"synthetic/tail/in-flight", "synthetic", Config{NormalRate: 0.001}, 10, true, true, false,
			func(s ckState) bool { return s.inflight > 0 && s.pending > 0 }, "a sync in flight"},
		{"synthetic/hbos/call-path/3-shards/in-flight", "synthetic", Config{Algorithm: HBOS, ByCallPath: true, Shards: 3}, 5, true, true, false,
			func(s ckState) bool { return s.inflight > 0 }, "a sync in flight"},
		{"synthetic/copod/window-8", "synthetic", Config{Algorithm: COPOD, Window: 8}, 8, false, true, false,
			func(s ckState) bool { return s.openStacks > 0 }, "open stacks"},
		{"synthetic/sstd-chimbuko/inclusive", "synthetic", Config{Algorithm: SSTD, Chimbuko: true, Statistic: Inclusive}, 4, false, true, false,
			func(s ckState) bool { return s.openStacks > 0 }, "open stacks"},
		{"synthetic-late-names/tail/held", "synthetic-late-names", Config{}, 2, false, true, false,
			func(s ckState) bool { return s.held > 0 }, "frames held for their names"},
		{"synthetic-late-names/hbos/held/in-flight", "synthetic-late-names", Config{Algorithm: HBOS}, 4, true, true, false,
			func(s ckState) bool { return s.inflight > 0 }, "a sync in flight"},
		{"synthetic/tail/bad-frame/profile-request", "synthetic", Config{}, 5, false, true, true,
			func(s ckState) bool { return s.openStacks > 0 }, "open stacks"},
		{"synthetic/tail/no-pserver", "synthetic", Config{}, 9, false, false, false,
			func(s ckState) bool { return s.openStacks > 0 }, "open stacks"},
		{"chimbench/tail/normals", "chimbench", Config{NormalRate: 0.01, ProfileEvery: 4}, 10, false, true, false,
			func(s ckState) bool { return s.pending > 0 && s.settling > 0 }, "pending windows and settling candidates"},
		{"chimbench/hbos/in-flight", "chimbench", Config{Algorithm: HBOS}, 9, true, true, false,
			func(s ckState) bool { return s.inflight > 0 }, "a sync in flight"},
		{"tau/tail/mid-run", "tau-hecatoncheir", Config{NormalRate: 0.05}, 0, false, true, false,
			func(s ckState) bool { return s.openStacks > 0 }, "open stacks"},
		{"tau/tail/in-flight", "tau-hecatoncheir", Config{SettleCount: 200}, 0, true, true, false,
			func(s ckState) bool { return s.inflight > 0 && s.openStacks > 0 }, "a sync in flight"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := ws[tc.workload]
			cut := tc.cut
			if cut == 0 {
				cut = len(w.frames[0]) / 2
			}
			if cut < 1 || cut >= len(w.frames[0]) {
				t.Fatalf("cut %d of %d steps", cut, len(w.frames[0]))
			}
			ref := ckRun(t, w, tc.cfg, cut, tc.hold, tc.pserver, tc.extras, false)
			got := ckRun(t, w, tc.cfg, cut, tc.hold, tc.pserver, tc.extras, true)
			if !tc.want(ref.state) {
				t.Fatalf("the checkpoint at step %d does not hold %s: %+v", cut, tc.wantDesc, ref.state)
			}
			t.Logf("%d steps, cut after %d: %+v; checkpoint of rank 0: %d B", len(w.frames[0]), cut, ref.state, len(ref.cps[0]))
			for r := range ref.after {
				if len(ref.after[r]) == 0 {
					t.Errorf("rank %d: no batch after the cut", r)
				}
				if len(got.after[r]) != len(ref.after[r]) {
					t.Errorf("rank %d: %d batches after the cut, uninterrupted %d", r, len(got.after[r]), len(ref.after[r]))
					continue
				}
				for i := range ref.after[r] {
					if got.after[r][i] != ref.after[r][i] {
						t.Errorf("rank %d: batch %d after the cut differs:\nrestored      %s\nuninterrupted %s", r, i, around(got.after[r][i], ref.after[r][i]), around(ref.after[r][i], got.after[r][i]))
						break
					}
				}
			}
			if !reflect.DeepEqual(got.stats, ref.stats) {
				t.Errorf("final stats differ:\nrestored      %+v\nuninterrupted %+v", got.stats, ref.stats)
			}
			if ref.stats[0].Executions == 0 || ref.stats[0].Frames != uint64(len(w.frames[0])) {
				t.Errorf("rank 0 processed %d frames (%d executions) of %d", ref.stats[0].Frames, ref.stats[0].Executions, len(w.frames[0]))
			}
			if !tc.pserver {
				return
			}
			// The restored detector syncs as the same incarnation (the
			// pserver deduplicates its resent requests).
			for r, incs := range got.incs {
				if len(incs) != 1 || incs[0] {
					t.Errorf("rank %d synced with incarnations %v across the restore, want one non-zero", r, incs)
				}
			}
			if !reflect.DeepEqual(got.requests, ref.requests) {
				for k := range ref.requests {
					a, b := got.requests[k], ref.requests[k]
					for i := range min(len(a), len(b)) {
						if a[i] != b[i] {
							t.Errorf("rank %d shard %d: request %d differs:\nrestored      %s\nuninterrupted %s", k[0], k[1], i, around(a[i], b[i]), around(b[i], a[i]))
							break
						}
					}
					if len(a) != len(b) {
						t.Errorf("rank %d shard %d: %d requests, uninterrupted %d", k[0], k[1], len(a), len(b))
					}
				}
			}
			if tc.hold {
				// the held request is answered once, after the restart, with its Seq
				var q syncproto.SyncRequest
				log := got.requests[[2]uint64{0, 0}]
				seqs := map[uint64]int{}
				for _, s := range log {
					if err := json.Unmarshal([]byte(s), &q); err != nil {
						t.Fatal(err)
					}
					seqs[q.Seq]++
				}
				for s, n := range seqs {
					if n != 1 {
						t.Errorf("seq %d answered %d times", s, n)
					}
				}
				if got.stats[0].SyncFailures != 0 {
					t.Errorf("%d sync failures", got.stats[0].SyncFailures)
				}
			}
		})
	}
}

// around is a's text around its first difference from b.
func around(a, b string) string {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	return fmt.Sprintf("(at %d) …%s…", i, a[max(0, i-200):min(len(a), i+200)])
}

// TestCheckpointOfRestoredDetector: a restored detector checkpoints to the
// same bytes (every field it read, it writes back the same).
func TestCheckpointOfRestoredDetector(t *testing.T) {
	ws := loadCkWorkloads(t)
	for _, name := range []string{"synthetic", "chimbench", "tau-hecatoncheir"} {
		t.Run(name, func(t *testing.T) {
			w := ws[name]
			out := ckRun(t, w, Config{Algorithm: COPOD}, len(w.frames[0])/2, true, true, true, false)
			for r, cp := range out.cps {
				d, err := Restore(Config{Rank: uint32(r), Algorithm: COPOD, Syncer: newFakePServer(), SyncTimeout: time.Minute}, cp)
				if err != nil {
					t.Fatal(err)
				}
				again, err := d.Checkpoint()
				if err != nil {
					t.Fatal(err)
				}
				d.sync.cancel()
				d.sync.wg.Wait()
				if !bytes.Equal(again, cp) {
					t.Errorf("rank %d: checkpoint of the restored detector differs (%d B, was %d B)", r, len(again), len(cp))
				}
			}
		})
	}
}

// ckSample returns a checkpoint of rank 0 of the synthetic workload after
// 5 steps, with the config it was taken with.
func ckSample(t testing.TB) (Config, []byte, string) { return ckSampleOf(t, HBOS) }

// ckSampleOf is ckSample under algorithm algo.
func ckSampleOf(t testing.TB, algo string) (Config, []byte, string) {
	cfg := Config{Algorithm: algo, Shards: 2, Syncer: newFakePServer(), Hostname: "h", SyncWait: time.Minute}
	d := syntheticDetector(t, cfg, 5)
	cp, err := d.Checkpoint()
	if err != nil {
		t.Fatal(err)
	}
	host := d.Config().Hostname
	if err := d.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	return cfg, cp, host
}

func TestRestoreRefusesMismatchedConfig(t *testing.T) {
	cfg, cp, host := ckSample(t)
	tests := []struct {
		name    string
		change  func(*Config)
		setting string
	}{
		{"rank", func(c *Config) { c.Rank = 1 }, "rank"},
		{"pid", func(c *Config) { c.PID = 9 }, "pid"},
		{"algorithm", func(c *Config) { c.Algorithm = COPOD }, "algorithm"},
		{"keying", func(c *Config) { c.ByCallPath = true }, "by-call-path"},
		{"statistic", func(c *Config) { c.Statistic = Inclusive }, "statistic"},
		{"window", func(c *Config) { c.Window = 7 }, "window"},
		{"shards", func(c *Config) { c.Shards = 3 }, "shards"},
		{"bins", func(c *Config) { c.Bins = 100 }, "bins"},
		{"tail rule", func(c *Config) { c.TailRatio = 2 }, "tail-ratio"},
		{"ignore", func(c *Config) { c.Ignore = []string{"MPI_Wait"} }, "ignore"},
		{"no pserver", func(c *Config) { c.Syncer = nil }, "pserver"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := cfg
			tc.change(&c)
			d, err := Restore(c, cp)
			if err == nil {
				d.sync.cancel()
				t.Fatal("restored into a mismatched config")
			}
			if !errors.Is(err, ErrCheckpointMismatch) || !strings.Contains(err.Error(), tc.setting) {
				t.Errorf("error %q does not say the setting %q differs", err, tc.setting)
			}
		})
	}
	// what may differ does
	c := cfg
	c.Syncer, c.SyncWait, c.ProfileEvery, c.MaxStepSummaries, c.Hostname = newFakePServer(), time.Second, 5, 10, "elsewhere"
	d, err := Restore(c, cp)
	if err != nil {
		t.Fatalf("restore with other operational settings: %v", err)
	}
	if d.Config().Hostname != host || host == "elsewhere" {
		t.Errorf("hostname %q, the checkpoint's is %q", d.Config().Hostname, host)
	}
	if err := d.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Checkpoint(); !errors.Is(err, ErrClosed) {
		t.Errorf("checkpoint of a closed detector: %v, want ErrClosed", err)
	}
}

// reCRC replaces b's trailer with the checksum of the rest.
func reCRC(b []byte) []byte {
	b = slices.Clone(b)
	end := len(b) - 4
	binary.LittleEndian.PutUint32(b[end:], crc32.Checksum(b[:end], crc32.MakeTable(crc32.Castagnoli)))
	return b
}

func TestRestoreRefusesBadCheckpoints(t *testing.T) {
	cfg, cp, _ := ckSample(t)
	flip := func(i int) []byte { b := slices.Clone(cp); b[i] ^= 0x40; return b }
	// offset of the body: magic, version
	body := len(CheckpointMagic) + 1
	tests := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "too short"},
		{"magic", append([]byte("KPFR"), cp[4:]...), "magic"},
		{"truncated by one byte", cp[:len(cp)-1], "checksum"},
		{"truncated to half", cp[:len(cp)/2], "checksum"},
		{"bit flipped in the body", flip(len(cp) / 2), "checksum"},
		{"bit flipped in the trailer", flip(len(cp) - 2), "checksum"},
		{"version", reCRC(append([]byte("KPCK\x09"), cp[body:]...)), "version 9"}, // one newer than CheckpointVersion
		{"body cut, checksum fixed", reCRC(append(slices.Clone(cp[:len(cp)/3]), 0, 0, 0, 0)), "offset"},
		{"huge count, checksum fixed", reCRC(append(append([]byte(CheckpointMagic), CheckpointVersion, 0xff, 0xff, 0xff, 0xff, 0x0f), cp[body+5:]...)), "elements"},
		{"trailing bytes, checksum fixed", reCRC(append(slices.Clone(cp[:len(cp)-4]), 1, 2, 3, 0, 0, 0, 0)), "after the last section"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, err := Restore(cfg, tc.data)
			if err == nil {
				d.sync.cancel()
				t.Fatal("a bad checkpoint was restored")
			}
			if !errors.Is(err, ErrBadCheckpoint) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q: want ErrBadCheckpoint saying %q", err, tc.want)
			}
			if !strings.Contains(err.Error(), "offset") {
				t.Errorf("error %q names no offset", err)
			}
		})
	}
}

// TestCheckpointCoversEveryField fails when a type whose values make up a
// detector's state gains a field the checkpoint does not know of: encode it
// (checkpoint.go, both ways) or, if it is not state, list it here with why.
func TestCheckpointCoversEveryField(t *testing.T) {
	tests := []struct {
		v      any
		fields string
	}{
		// records and sync messages: every field is written
		{provenance.Exec{}, `CallStack CounterEvents Entry Exit EventID FID Func FuncStats IsGPUEvent GPULocation GPUParent
			PID RID TID RuntimeExclusive RuntimeTotal IOStep IOStepTStart IOStepTEnd EventWindow OutlierScore OutlierSeverity
			Hostname Algorithm Explanation FinalLabel
			LabelledIOStep`}, // LabelledIOStep is set when the record leaves pending (its step)
		{provenance.CallFrame{}, "Entry Exit FID Func EventID IsAnomaly"},
		{provenance.CounterEvent{}, "CounterIdx CounterName CounterValue PID RID TID TS"},
		{provenance.FuncStats{}, "Accumulate Count Kurtosis Maximum Mean Minimum Skewness Stddev"},
		{provenance.GPULocation{}, "Context Device Stream Thread"},
		{provenance.GPUParent{}, "EventID TID CallStack"},
		{provenance.WindowExec{}, "Entry Exit FID Func EventID ParentEventID IsAnomaly"},
		{provenance.CommRecord{}, "Type PID RID TID Src Tar Bytes Tag Timestamp ExecdataKey"},
		{provenance.EventWindow{}, "ExecWindow CommWindow"},
		{provenance.Explanation{}, "Key Value NaturalMin NaturalMax LowThreshold Threshold Ratio P99 LogSigmas Excess Text Baseline"},
		{provenance.BaselineEvidence{}, "Source Bound BaselineCalls BaselineBeyond Calls Beyond PValue"},
		{syncproto.StepSummary{}, "Step Anomalies Executions MinTS MaxTS Scores Severity FuncAnomalies Events BadFrames MissingSteps SummarisedCalls DroppedCalls DroppedEvents Funcs Peer"},
		{syncproto.FuncAnomalyMetrics{}, "Func Count Score Severity FirstTS LastTS"},
		// More is only in a node's request, which a checkpoint refuses
		{syncproto.ModelDelta{}, "Key Moments Histogram Tail Anomalies More"},
		// Node and Ranks likewise
		// Incarnation is the sync state's, written once for every shard
		{syncproto.SyncRequest{}, "PID Rank Seq Incarnation Step Algorithm Models Counters Steps Hostname TailRule Node Ranks"},
		// xstep is written for the executions waiting for a label (ranSteps)
		{execRec{}, "entry exit childIncl parent step idx pstep pidx fid path key nchild score label flags xstep"},
		// ctrIdx, commIdx, ctrPos, commPos and entries are one frame's cursors;
		// fcalls is counted again from paths and over (fcallsSet unset)
		{thread{}, "tid gpu lastTS firstTS tsSeen loc meta ring base detached pins stack counters comms paths over ctrs summ ctrIdx commIdx ctrPos commPos entries fcalls fcallsSet"},
		{gpuLoc{}, "context device stream set"},
		{timerAcc{}, "calls subrs incl excl sqIncl sqExcl"},
		{counterAcc{}, "n min max sum sumsq"},
		{pathNode{}, "parent fid depth suffix"}, // depth follows from parent
		{launch{}, "tid seq step idx fid entry stack"},
		{launchFrame{}, "fid step idx entry"},
		// shard follows from the name; step, values, touched, stepAnoms
		// and best are reset at the end of every step; state is written
		// by its algorithm (HBOS's and COPOD's rebuilt from the histogram
		// they were reset with); heldAnoms is released before every
		// checkpoint (Checkpoint refuses otherwise)
		{model{}, `name shard ignored step values accum inflight global inFlight heldAnoms
			natMin natMax natLowThr natThr p99 logMean logStd det detReady state touched stepAnoms best`},
		{stats.Summary{}, "Moments Histogram Tail Anomalies"},
		{sstdState{}, "cfg std lo hi"}, // cfg is the scorer's configuration
		// cfg, stats and done are wiring; byTid, tidMap and pathTab follow
		// from threads and nodes, srcCtr from ctrNames; counterStep is empty
		// at a step boundary
		{callStacks{}, "cfg stats done xstep threads byTid tidMap funcNames funcKnown ctrNames corrCID srcCtr nodes pathTab launches launchOrder launchHead counterStep"},
		// all but the lists are the configuration and scratch
		{modelSet{}, "cfg stats stacks scorer hist gated rule tmp ignored list keyByName fidKey pathKey"},
		// preempt (the last steps' context switches) starts again after a restore
		// late is emptied at the end of every step
		{recorder{}, "cfg stats stacks models cur batch pending wins late preempt scratch"},
		{pendingRec{}, "rec t seq step anomaly ew pinnedTo"},
		{stepInfo{}, "step tstart tend"},
		// the reference and level are the restoring process's (its
		// --baseline); resolved and ref follow from the key's name
		{baseState{}, "ref level keys"},
		{baseKey{}, "resolved ref calls beyond sig"},
		// done and healthy are the senders' (a restored shard starts healthy)
		{shardState{}, "seq inflight keys done healthy"},
		// cfg, stats, models and cur are wiring; syncer, node, left,
		// refused (a log's rate), ctx, cancel and wg are the process's; held
		// is released before every checkpoint (Checkpoint refuses otherwise)
		{syncState{}, "cfg stats models cur syncer node left shards summaries held counters incarnation refused lag ctx cancel wg"},
		// batch is empty between steps (Checkpoint refuses otherwise), snap
		// follows from the stacks, closeMu and closed are the process's;
		// lent and giveBack are set only while ProcessLent runs; peers
		// is emptied at the end of every step
		{Detector{}, `cfg stacks models rec sync base metaSeen peers cur lastStep lastSeen missing stepEvents stepBad processed
			held heldOnce lent giveBack batch stats requestProfiles snap closeMu closed`},
		// a setting the state depends on goes into identity(); these are
		// the restoring process's (Hostname is the checkpoint's)
		{Config{}, `PID Rank Algorithm Chimbuko TailRatio TailRecur RecurFrac FalseAlarmRate SettleCount Resolution Sigma Threshold Bins
			Statistic SlowOnly ByCallPath ModelPathDepth ProfilePaths CallPathDepth MinRuntime Ignore MinCount Isolation
			MaxMass Window MaxPendingSteps NormalRate Shards Syncer Baseline
			ProfileEvery MaxHeldFrames MaxHeldBytes Hostname Barrier SyncWait ExactSync SyncTimeout SyncBackoffMax MaxStepSummaries Sink Logger`},
	}
	for _, tc := range tests {
		typ := reflect.TypeOf(tc.v)
		t.Run(typ.String(), func(t *testing.T) {
			known := map[string]bool{}
			for _, f := range strings.Fields(tc.fields) {
				known[f] = true
			}
			for i := range typ.NumField() {
				if name := typ.Field(i).Name; !known[name] {
					t.Errorf("%s.%s is unknown to the checkpoint: encode it in checkpoint.go or list it here with why not", typ, name)
				}
			}
		})
	}
	// every count is in the checkpoint
	var c counters
	listed := map[*atomic.Uint64]bool{}
	for _, p := range counterFields(&c) {
		listed[p] = true
	}
	v := reflect.ValueOf(&c).Elem()
	for i := range v.NumField() {
		f := v.Field(i)
		if f.Type() != reflect.TypeFor[atomic.Uint64]() {
			continue
		}
		if p := (*atomic.Uint64)(f.Addr().UnsafePointer()); !listed[p] {
			t.Errorf("count %s is not in counterFields", v.Type().Field(i).Name)
		}
	}
}

// benchCheckpoint measures Checkpoint and Restore of a detector that has
// processed steps frames of enc (one rank), with a pserver double: the
// size of the checkpoint (B/checkpoint, the bytes a restart reads per rank)
// and the time to write and to restore it.
func benchCheckpoint(b *testing.B, cfg Config, enc [][]byte, steps int) {
	ps := newCkSyncer()
	cfg.Syncer, cfg.SyncWait, cfg.Hostname = ps, time.Minute, "bench"
	d, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	var f frame.Frame
	var events uint64
	for _, e := range enc[:steps] {
		if _, err := frame.DecodeBinary(e, &f); err != nil {
			b.Fatal(err)
		}
		events += uint64(f.NumEvents())
		if err := d.Process(context.Background(), &f); err != nil {
			b.Fatal(err)
		}
	}
	defer func() {
		if err := d.Close(context.Background()); err != nil {
			b.Fatal(err)
		}
	}()
	cp, err := d.Checkpoint()
	if err != nil {
		b.Fatal(err)
	}
	st := stateOf([]*Detector{d})
	var held int
	for _, t := range d.stacks.threads {
		held += len(t.ring) + len(t.detached)
	}
	b.Run("checkpoint", func(b *testing.B) {
		for b.Loop() {
			if cp, err = d.Checkpoint(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(len(cp)), "B/checkpoint")
		// where the bytes go: call stacks (threads, their executions and
		// profiles, call-path nodes, names) and models
		var ws, wm ckWriter
		ws.stacks(d.stacks)
		wm.models(d.models)
		var prof ckWriter
		for _, t := range d.stacks.threads {
			prof.timers(t.paths)
			prof.timers(t.over)
		}
		b.ReportMetric(float64(len(ws.B)), "B-stacks")
		b.ReportMetric(float64(len(prof.B)), "B-profiles")
		b.ReportMetric(float64(len(wm.B)), "B-models")
		b.ReportMetric(float64(len(d.models.list)), "models")
		b.ReportMetric(float64(len(d.stacks.nodes)), "paths")
		b.ReportMetric(float64(held), "executions")
		b.ReportMetric(float64(st.pending), "pending")
		b.ReportMetric(float64(len(cp))/b.Elapsed().Seconds()*float64(b.N)/1e6, "MB/s")
	})
	b.Run("restore", func(b *testing.B) {
		c := cfg
		c.Syncer = nil
		for b.Loop() {
			c.Syncer = newFakePServer()
			r, err := Restore(c, cp)
			if err != nil {
				b.Fatal(err)
			}
			r.sync.cancel()
			r.sync.wg.Wait()
		}
		b.ReportMetric(float64(len(cp)), "B/checkpoint")
		b.ReportMetric(float64(len(cp))/b.Elapsed().Seconds()*float64(b.N)/1e6, "MB/s")
	})
	_ = events
}

// BenchmarkCheckpointChimbench: one rank of the chimbench-v1 stream (4
// threads, 100,000 events per step) after 10 steps.
func BenchmarkCheckpointChimbench(b *testing.B) {
	enc, _ := chimbenchEncoded()
	for _, algo := range []string{Tail, HBOS} {
		b.Run(algo, func(b *testing.B) { benchCheckpoint(b, Config{Algorithm: algo}, enc, 10) })
	}
}

// BenchmarkCheckpointSynthetic: rank 0 of the synthetic workload (2 CPU
// threads and 2 GPU streams, halo exchanges, 30,000 events per step) after
// 15 steps.
func BenchmarkCheckpointSynthetic(b *testing.B) {
	w, err := syntheticWorkload(2, 16, 30000)
	if err != nil {
		b.Fatal(err)
	}
	benchCheckpoint(b, Config{}, w.frames[0], 15)
}

// TestRestoreVersion2 restores a checkpoint written by the previous format
// (version 2, before the false-alarm rate: testdata/checkpoint/
// v2-synthetic-hbos.kpck, ckSample's state taken by that version): it
// restores under today's configuration, goes on with the next frames, and
// its own checkpoint is of today's version and restores again.
func TestRestoreVersion2(t *testing.T) {
	old, err := os.ReadFile("testdata/checkpoint/v2-synthetic-hbos.kpck")
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := binary.Uvarint(old[len(CheckpointMagic):]); v != 2 {
		t.Fatalf("the sample is version %d, want 2", v)
	}
	cfg, fresh, _ := ckSample(t)
	restore := func(cp []byte) *Detector {
		t.Helper()
		c := cfg
		c.Syncer = newFakePServer()
		d, err := Restore(c, cp)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	a, b := restore(old), restore(fresh)
	if !slices.Equal(a.ModelKeys(), b.ModelKeys()) {
		t.Errorf("models restored from version 2: %v; from today's: %v", a.ModelKeys(), b.ModelKeys())
	}
	w := loadCkWorkloads(t)["synthetic"]
	var f frame.Frame
	for _, d := range []*Detector{a, b} {
		for _, raw := range w.frames[0][5:8] {
			if _, err := frame.DecodeBinary(raw, &f); err != nil {
				t.Fatal(err)
			}
			if err := d.Process(context.Background(), &f); err != nil {
				t.Fatal(err)
			}
		}
	}
	if sa, sb := a.Stats(), b.Stats(); sa.Anomalies != sb.Anomalies || sa.Executions != sb.Executions {
		t.Errorf("after 3 more steps: %d anomalies in %d executions from version 2, %d in %d from today's", sa.Anomalies, sa.Executions, sb.Anomalies, sb.Executions)
	}
	again, err := a.Checkpoint()
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := binary.Uvarint(again[len(CheckpointMagic):]); v != CheckpointVersion {
		t.Errorf("checkpoint of a detector restored from version 2 is version %d, want %d", v, CheckpointVersion)
	}
	for _, d := range []*Detector{a, b} {
		if err := d.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if err := restore(again).Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestRestoreVersion3 restores checkpoints written by the previous format
// (version 3, each model's statistics as interleaved fields and every
// algorithm's state: testdata/checkpoint/v3-synthetic-<algorithm>.kpck.gz,
// ckSampleOf's state under three algorithms taken by that version): each
// restores to exactly the state today's checkpoint of the same frames
// holds (the two checkpoints of today's version are the same bytes, once
// given one incarnation), and goes on with the next frames as it does.
func TestRestoreVersion3(t *testing.T) {
	w := loadCkWorkloads(t)["synthetic"]
	for _, algo := range []string{Tail, SSTD, COPOD} {
		t.Run(algo, func(t *testing.T) {
			zf, err := os.Open("testdata/checkpoint/v3-synthetic-" + algo + ".kpck.gz")
			if err != nil {
				t.Fatal(err)
			}
			defer zf.Close()
			zr, err := gzip.NewReader(zf)
			if err != nil {
				t.Fatal(err)
			}
			old, err := io.ReadAll(zr)
			if err != nil {
				t.Fatal(err)
			}
			if v, _ := binary.Uvarint(old[len(CheckpointMagic):]); v != 3 {
				t.Fatalf("the sample is version %d, want 3", v)
			}
			cfg, fresh, _ := ckSampleOf(t, algo)
			restore := func(cp []byte) *Detector {
				t.Helper()
				c := cfg
				c.Syncer = newFakePServer()
				d, err := Restore(c, cp)
				if err != nil {
					t.Fatal(err)
				}
				return d
			}
			a, b := restore(old), restore(fresh)
			// version 3 has no io_steps of the executions waiting for a
			// label, and its step summaries count anomalies in the io_step
			// they were labelled in (version 5: the one they ran in)
			forgetRanSteps(b)
			b.sync.summaries = slices.Clone(a.sync.summaries)
			for i, sh := range b.sync.shards {
				if sh.inflight != nil && a.sync.shards[i].inflight != nil {
					sh.inflight.Steps = slices.Clone(a.sync.shards[i].inflight.Steps)
				}
			}
			b.sync.incarnation = a.sync.incarnation
			for _, sh := range b.sync.shards {
				if sh.inflight != nil {
					sh.inflight.Incarnation = a.sync.incarnation
				}
			}
			same := func(when string) {
				t.Helper()
				ca, err := a.Checkpoint()
				if err != nil {
					t.Fatal(err)
				}
				cb, err := b.Checkpoint()
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(ca, cb) {
					i := 0
					for i < min(len(ca), len(cb)) && ca[i] == cb[i] {
						i++
					}
					t.Fatalf("%s: the checkpoint of the detector restored from version 3 (%d bytes) differs from today's (%d bytes) from byte %d on", when, len(ca), len(cb), i)
				}
			}
			same("restored")
			var f frame.Frame
			for _, d := range []*Detector{a, b} {
				for _, raw := range w.frames[0][5:8] {
					if _, err := frame.DecodeBinary(raw, &f); err != nil {
						t.Fatal(err)
					}
					if err := d.Process(context.Background(), &f); err != nil {
						t.Fatal(err)
					}
				}
			}
			if sa, sb := a.Stats(), b.Stats(); sa != sb {
				t.Errorf("after 3 more steps: stats %+v from version 3, %+v from today's", sa, sb)
			}
			same("3 steps on")
			for _, d := range []*Detector{a, b} {
				if err := d.Close(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// syntheticDetector returns a detector of cfg that has processed the first
// n frames of rank 0 of the synthetic checkpoint workload.
func syntheticDetector(t testing.TB, cfg Config, n int) *Detector {
	t.Helper()
	w := loadCkWorkloads(t)["synthetic"]
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var f frame.Frame
	for _, b := range w.frames[0][:n] {
		if _, err := frame.DecodeBinary(b, &f); err != nil {
			t.Fatal(err)
		}
		if err := d.Process(context.Background(), &f); err != nil {
			t.Fatal(err)
		}
	}
	return d
}
