package perfetto_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/cli"
	"github.com/kipimo-hpc/kipimo/internal/mpitest"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
)

// kipimo runs the kipimo command with args, failing t on an error.
func kipimo(t *testing.T, args ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	root := cli.NewRoot(&out, &errb)
	root.SetArgs(args)
	if err := root.ExecuteContext(context.Background()); err != nil {
		t.Fatalf("kipimo %s: %v\n%s", strings.Join(args, " "), err, errb.String())
	}
	return errb.String()
}

// storedRecords reads every anomaly and normal execution of a store.
func storedRecords(t *testing.T, path string) []rec {
	t.Helper()
	ctx := context.Background()
	s, err := sqlitestore.Open(ctx, path, sqlitestore.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var rs []rec
	for _, k := range []provenance.Kind{provenance.KindAnomalies, provenance.KindNormalExecs} {
		if err := s.Each(ctx, provenance.Query{Kind: k, Limit: provenance.NoLimit}, func(e provenance.Exec) error {
			rs = append(rs, rec{k, e})
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	return rs
}

func filter(rs []rec, keep func(*provenance.Exec) bool) []rec {
	var out []rec
	for _, r := range rs {
		if keep(&r.e) {
			out = append(out, r)
		}
	}
	return out
}

// exportRun runs kipimo export perfetto with args on store, checks that
// the file decodes and reads back with Kipimo's Chrome reader, and returns
// it decoded.
func exportRun(t *testing.T, name, store string, args ...string) *decoded {
	t.Helper()
	out := filepath.Join(t.TempDir(), name+".json")
	start := time.Now()
	msg := kipimo(t, append([]string{"export", "perfetto", "--store", store, "--out", out}, args...)...)
	took := time.Since(start)
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %d bytes in %s: %s", name, len(data), took.Round(time.Millisecond), strings.TrimSpace(strings.Split(msg, "\n")[0]))
	d := decodeTrace(t, data)
	// Kipimo's Chrome reader reads the same executions back.
	got := readBack(t, data)
	want := map[string]int{}
	for k, s := range d.execSlices(t) {
		tr, _, _ := strings.Cut(k, "|")
		_, th, _ := strings.Cut(tr, "/")
		want[fmt.Sprintf("%s|%s|%d|%d", th, s.ev.Name, int64(s.ev.Ts), int64(s.end))]++
	}
	if !mapsEqual(got, want) {
		t.Errorf("%s: the Chrome reader read %d distinct executions back, the timeline holds %d", name, len(got), len(want))
	}
	return d
}

// checkStoredRun exports a finished run's store three ways and checks each
// timeline against the stored records: io_steps of every rank, the whole
// run of some ranks, and the top anomaly's window with what the other
// ranks did meanwhile.
func checkStoredRun(t *testing.T, store string, steps [2]uint64) {
	rs := storedRecords(t, store)
	if len(rs) == 0 {
		t.Fatal("the run stored no records")
	}
	// io_steps, every rank.
	d := exportRun(t, "steps", store, "--steps", fmt.Sprintf("%d-%d", steps[0], steps[1]))
	sel := filter(rs, func(e *provenance.Exec) bool { return e.IOStep >= steps[0] && e.IOStep <= steps[1] })
	checkTimeline(t, d, expected(sel))
	if len(d.procName) < 2 {
		t.Errorf("io_steps %v: %d ranks in the timeline", steps, len(d.procName))
	}
	// The whole run of ranks 0 and 1.
	d = exportRun(t, "ranks", store, "--ranks", "0-1")
	checkTimeline(t, d, expected(filter(rs, func(e *provenance.Exec) bool { return e.RID <= 1 })))
	if len(d.flowsOut) == 0 {
		t.Error("ranks 0-1: no message flows")
	}
	// The top anomaly's window: all of it, once, among what other records
	// say of that time.
	var top *provenance.Exec
	for i := range rs {
		if rs[i].kind == provenance.KindAnomalies && len(rs[i].e.EventWindow.ExecWindow) > 1 && (top == nil || rs[i].e.OutlierScore > top.OutlierScore) {
			top = &rs[i].e
		}
	}
	if top == nil {
		t.Fatal("no anomaly with an event window")
	}
	d = exportRun(t, "record", store, "--record", top.EventID)
	all := expected(rs)
	got := d.execSlices(t)
	anchor := expected([]rec{{provenance.KindAnomalies, *top}})
	for k := range anchor.execs {
		if _, ok := got[k]; !ok {
			t.Errorf("record %s: execution %s of its window missing", top.EventID, k)
		}
	}
	sub := want{execs: map[string]wantExec{}, msgs: map[string]bool{}}
	for k := range got {
		x, ok := all.execs[k]
		if !ok {
			t.Errorf("record %s: execution %s is in no record", top.EventID, k)
		}
		sub.execs[k] = x
	}
	for _, r := range rs {
		for _, c := range r.e.EventWindow.CommWindow {
			if _, ok := got[trackName(c.RID, c.TID, nil)+"|"+c.ExecdataKey]; ok {
				sub.msgs[fmt.Sprintf("%s|%s|%d|%d|%d|%d|%d", trackName(c.RID, c.TID, nil), c.Type, c.Src, c.Tar, c.Tag, c.Bytes, c.Timestamp)] = true
			}
		}
	}
	lo, hi := top.Entry, top.Exit
	for _, w := range top.EventWindow.ExecWindow {
		lo, hi = min(lo, w.Entry), max(hi, w.Exit)
	}
	for k := range sub.msgs {
		var ts uint64
		fmt.Sscan(k[strings.LastIndex(k, "|")+1:], &ts)
		if ts < lo || ts > hi {
			delete(sub.msgs, k)
		}
	}
	checkTimeline(t, d, sub)
	t.Logf("record %s (%s, score %.3g): %d executions on %d ranks", top.EventID, top.Func, top.OutlierScore, len(got), len(d.procName))
}

// A replayed 12-rank MPI trace (kanika_phase1, TAU, with messages and
// counters), run through kipimo run and exported.
func TestExportReplayed12Ranks(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole pipeline")
	}
	dir := t.TempDir()
	gen := filepath.Join(dir, "gen")
	kipimo(t, "gen", "--from", "../workload/testdata/eval/kanika_phase1", "--format", "tau", "--ranks", "12", "--steps", "6", "--out", gen)
	kipimo(t, "run", "--out", filepath.Join(dir, "out"), "--run", "r", "--normal-rate", "0.002", "--format", "frames", gen)
	store := filepath.Join(dir, "out", "r", "provenance.db")
	checkStoredRun(t, store, [2]uint64{2, 3})
}

// A short live LAMMPS run on 2 ranks, exported.
func TestExportLAMMPS(t *testing.T) {
	mpitest.Require(t, "cc", "mpicc", "mpirun", "lmp")
	mpitest.Lock(t)
	for _, kv := range mpitest.Env(nil) {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	input, err := filepath.Abs("../instrument/testdata/lj.in")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	kipimo(t, "run", "--out", dir, "--run", "lmp", "--normal-rate", "0.001", "--period", "250ms",
		"--exec", "--", "mpirun", "-np", "2", "lmp", "-in", input, "-log", "none", "-var", "steps", "600")
	checkStoredRun(t, filepath.Join(dir, "lmp", "provenance.db"), [2]uint64{2, 6})
}
