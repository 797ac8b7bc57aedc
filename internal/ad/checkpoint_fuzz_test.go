package ad

import (
	"bytes"
	"context"
	"encoding/binary"
	"hash/crc32"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/frame"
)

// fuzzConfigs are the configurations FuzzRestore restores with; the first
// byte of an input picks one (its seeds were checkpointed with it).
var fuzzConfigs = []Config{
	{Hostname: "fuzz"},
	{Algorithm: HBOS, Shards: 2, Hostname: "fuzz"},
	{Algorithm: COPOD, ByCallPath: true, Window: 3, Hostname: "fuzz"},
	{Algorithm: SSTD, Chimbuko: true, Hostname: "fuzz"},
}

func fuzzConfig(i byte) Config {
	c := fuzzConfigs[int(i)%len(fuzzConfigs)]
	c.Syncer = newFakePServer()
	c.SyncWait = time.Second
	c.SyncTimeout = time.Second
	return c
}

// FuzzRestore restores arbitrary checkpoints: the input is a config index
// and a checkpoint without its checksum (the test appends the right one, so
// that the fuzzer reaches the decoder). Nothing may panic or allocate beyond
// the input's size; a checkpoint that restores must process frames and
// close, and checkpoint again to bytes that restore to the same bytes.
// Seeds are checkpoints of the synthetic workload (GPU threads, comms, a
// sync in flight), of a real TAU trace and of frames held for their names.
func FuzzRestore(f *testing.F) {
	ws := loadCkWorkloads(f)
	seed := func(ci byte, w ckWorkload, cut int, hold bool) {
		cfg := fuzzConfigs[ci]
		ps := newCkSyncer()
		cfg.Syncer, cfg.SyncWait, cfg.SyncTimeout = ps, time.Minute, time.Minute
		d, err := New(cfg)
		if err != nil {
			f.Fatal(err)
		}
		var fr frame.Frame
		for i, b := range w.frames[0][:cut] {
			if hold && i == cut-1 {
				ps.holdNext(0, 0)
				d.sync.shards[0].healthy.Store(false)
			}
			if _, err := frame.DecodeBinary(b, &fr); err != nil {
				f.Fatal(err)
			}
			if err := d.Process(context.Background(), &fr); err != nil {
				f.Fatal(err)
			}
		}
		cp, err := d.Checkpoint()
		if err != nil {
			f.Fatal(err)
		}
		d.sync.cancel()
		d.sync.wg.Wait()
		f.Add(append([]byte{ci}, cp[:len(cp)-4]...))
	}
	seed(0, ws["tau-hecatoncheir"], 40, false)
	seed(0, ws["tau-hecatoncheir"], 300, true)
	seed(1, ws["synthetic-late-names"], 2, false)
	seed(2, ws["tau-hecatoncheir"], 120, false)
	seed(3, ws["tau-hecatoncheir"], 60, false)
	small, err := syntheticWorkload(1, 4, 300)
	if err != nil {
		f.Fatal(err)
	}
	seed(1, small, 3, true)
	seed(2, small, 2, false)
	tail := ws["tau-hecatoncheir"].frames[0]
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		cfg := fuzzConfig(data[0])
		cp := binary.LittleEndian.AppendUint32(bytes.Clone(data[1:]), crc32.Checksum(data[1:], castagnoli))
		if d, err := Restore(cfg, data[1:]); err == nil { // raw, with whatever trailer it has
			closeFuzz(t, d)
		}
		d, err := Restore(cfg, cp)
		if err != nil {
			return
		}
		again, err := d.Checkpoint()
		if err != nil {
			t.Fatalf("checkpoint of a restored detector: %v", err)
		}
		d2, err := Restore(fuzzConfig(data[0]), again)
		if err != nil {
			t.Fatalf("a restored detector's checkpoint does not restore: %v", err)
		}
		third, err := d2.Checkpoint()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(third, again) {
			t.Fatalf("checkpoint, restore, checkpoint changed the bytes (%d B, then %d B)", len(again), len(third))
		}
		closeFuzz(t, d2)
		// the restored detector goes on with the frames of a real stream
		var fr frame.Frame
		step, _ := d.LastStep()
		for _, b := range tail[len(tail)-3:] {
			if _, err := frame.DecodeBinary(b, &fr); err != nil {
				t.Fatal(err)
			}
			fr.PID, fr.Rank = cfg.PID, cfg.Rank
			step++
			fr.Step = step
			_ = d.Process(context.Background(), &fr) // a frame may be refused; nothing may panic
		}
		closeFuzz(t, d)
	})
}

func closeFuzz(t *testing.T, d *Detector) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = d.Close(ctx)
}
