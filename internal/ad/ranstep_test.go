package ad

import (
	"context"
	"testing"
	"time"
	"unsafe"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// TestRecordsKeepTheStepTheyRanIn runs the synthetic workload with a young
// model's wait (SettleCount) so that executions are labelled steps after
// they ran: every record's io_step is the step of the frame holding its
// exit (its exit inside that step's window, and its entry too when it did
// not span steps), labelled_io_step the later one it was labelled in; the
// step summaries the pserver gets (its heat map and series) count each
// anomaly in the io_step it ran in too.
func TestRecordsKeepTheStepTheyRanIn(t *testing.T) {
	w := loadCkWorkloads(t)["synthetic"]
	sink := &MemorySink{}
	ps := newFakePServer()
	d, err := New(Config{SettleCount: 50000, MaxPendingSteps: 6, NormalRate: 0.05, Sink: sink, Syncer: ps, SyncWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// the step each execution exited in, by event id, from the frames
	exitStep := map[string]uint64{}
	open := map[uint32][]string{}
	var f frame.Frame
	for _, raw := range w.frames[0] {
		if _, err := frame.DecodeBinary(raw, &f); err != nil {
			t.Fatal(err)
		}
		for i, ev := range f.Events {
			if ev.Kind == frame.Entry {
				open[ev.Tid] = append(open[ev.Tid], d.stacks.eventID(uint32(f.Step), uint32(i)))
			} else if s := open[ev.Tid]; len(s) > 0 {
				exitStep[s[len(s)-1]] = f.Step
				open[ev.Tid] = s[:len(s)-1]
			}
		}
		if err := d.Process(context.Background(), &f); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	all := sink.All()
	late := 0
	for _, recs := range [][]provenance.Exec{all.Anomalies, all.Normal} {
		for _, r := range recs {
			want, ok := exitStep[r.EventID]
			if !ok {
				t.Fatalf("record %s: no exit in the frames", r.EventID)
			}
			if r.IOStep != want {
				t.Errorf("record %s: io_step %d, ran (exited) in %d (labelled in %d)", r.EventID, r.IOStep, want, r.LabelledIOStep)
			}
			if r.LabelledIOStep < r.IOStep {
				t.Errorf("record %s: labelled in io_step %d, before it ran (%d)", r.EventID, r.LabelledIOStep, r.IOStep)
			}
			if r.Exit < r.IOStepTStart || r.Exit > r.IOStepTEnd {
				t.Errorf("record %s: exit %d outside its io_step %d's window %d..%d", r.EventID, r.Exit, r.IOStep, r.IOStepTStart, r.IOStepTEnd)
			}
			if _, entryStep, _, err := provenance.ParseEventID(r.EventID); err == nil && entryStep == r.IOStep &&
				(r.Entry < r.IOStepTStart || r.Entry > r.IOStepTEnd) {
				t.Errorf("record %s: entry %d outside its io_step %d's window %d..%d", r.EventID, r.Entry, r.IOStep, r.IOStepTStart, r.IOStepTEnd)
			}
			if r.LabelledIOStep > r.IOStep {
				late++
			}
		}
	}
	byStep := map[uint64]uint64{}
	for _, r := range all.Anomalies {
		byStep[r.IOStep]++
	}
	ps.mu.Lock()
	for k, s := range ps.steps {
		if s.Anomalies != byStep[k[1]] {
			t.Errorf("io_step %d: the pserver counts %d anomalies, %d records ran in it", k[1], s.Anomalies, byStep[k[1]])
		}
		delete(byStep, k[1])
	}
	ps.mu.Unlock()
	for step, n := range byStep {
		t.Errorf("io_step %d: %d records ran in it, the pserver has no summary of it", step, n)
	}
	if len(all.Anomalies) == 0 || late == 0 {
		t.Fatalf("%d anomalies, %d records labelled after the step they ran in: the test needs both", len(all.Anomalies), late)
	}
	t.Logf("%d anomalies and %d normal records, %d labelled after the step they ran in", len(all.Anomalies), len(all.Normal), late)
}

// forgetRanSteps drops what a checkpoint of version 5 adds to the state
// (the windows of the last io_steps, the exit steps of the executions
// waiting for a label): d is then as restored from an earlier version.
func forgetRanSteps(d *Detector) {
	d.rec.wins = nil
	for _, t := range d.stacks.threads {
		for i := range t.ring {
			if e := &t.ring[i]; e.flags&flagDone != 0 && e.label == labelNone {
				e.xstep = 0
			}
		}
		for _, e := range t.detached {
			if e.flags&flagDone != 0 && e.label == labelNone {
				e.xstep = 0
			}
		}
	}
}

// The exit's io_step rides in execRec's padding: it costs no memory per
// execution (sizing.md counts 72 B each).
func TestExecRecSize(t *testing.T) {
	if n := unsafe.Sizeof(execRec{}); n != 72 {
		t.Errorf("execRec takes %d B, want 72", n)
	}
}

// A checkpoint restored without the io_steps of the executions waiting for
// a label (version 4 and before) gives them the step they are labelled in
// (the records before version 5), and everything else goes on as from a
// checkpoint of today's version.
func TestRestoreWithoutRanSteps(t *testing.T) {
	cfg := Config{SettleCount: 50000, MaxPendingSteps: 6, Syncer: newFakePServer(), SyncWait: time.Minute}
	d := syntheticDetector(t, cfg, 3)
	w := loadCkWorkloads(t)["synthetic"]
	var f frame.Frame
	cp, err := d.Checkpoint()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	run := func(forget bool) []provenance.Exec {
		c := cfg
		sink := &MemorySink{}
		c.Syncer, c.Sink = newFakePServer(), sink
		r, err := Restore(c, cp)
		if err != nil {
			t.Fatal(err)
		}
		if forget {
			forgetRanSteps(r)
		}
		for _, raw := range w.frames[0][3:] {
			if _, err := frame.DecodeBinary(raw, &f); err != nil {
				t.Fatal(err)
			}
			if err := r.Process(context.Background(), &f); err != nil {
				t.Fatal(err)
			}
		}
		if err := r.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		return sink.All().Anomalies
	}
	withSteps, without := run(false), run(true)
	if len(withSteps) != len(without) {
		t.Fatalf("%d anomalies restored with the exit steps, %d without", len(withSteps), len(without))
	}
	moved := 0
	for i := range withSteps {
		a, b := withSteps[i], without[i]
		if a.EventID != b.EventID || a.LabelledIOStep != b.LabelledIOStep {
			t.Fatalf("record %d: %s labelled in %d with the exit steps, %s in %d without", i, a.EventID, a.LabelledIOStep, b.EventID, b.LabelledIOStep)
		}
		if b.IOStep != a.IOStep {
			moved++
			if b.IOStep != b.LabelledIOStep {
				t.Errorf("%s: without its exit step, io_step %d, want the step it was labelled in (%d)", b.EventID, b.IOStep, b.LabelledIOStep)
			}
		}
	}
	if moved == 0 {
		t.Fatal("no record waited across the checkpoint: the test needs one")
	}
}
