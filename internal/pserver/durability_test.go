package pserver

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestDurabilityModes checks each durability implementation against what
// its mode promises after a restart, clean or crashed, and against what it
// keeps in JetStream: none keeps nothing (no bucket, no log), snapshot keeps
// what its last snapshot holds (a bucket, no log), wal keeps every answered
// request (a bucket and the log).
func TestDurabilityModes(t *testing.T) {
	tests := []struct {
		name      string
		mode      string
		crash     bool
		kept      bool // every applied request survives the restart
		bucket    bool
		log       bool
		wantType  string
		snapshots bool // Snapshot writes a manifest
	}{
		{"none, clean shutdown", DurabilityNone, false, false, false, false, "memory", false},
		{"none, crash", DurabilityNone, true, false, false, false, "memory", false},
		{"snapshot, clean shutdown", DurabilitySnapshot, false, true, true, false, "snapshot", true},
		{"snapshot, crash before any snapshot", DurabilitySnapshot, true, false, true, false, "snapshot", true},
		{"wal, clean shutdown", DurabilityWAL, false, true, true, true, "wal", true},
		{"wal, crash", DurabilityWAL, true, true, true, true, "wal", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, nc := startNATS(t)
			// No snapshot is due during the test but the final one.
			cfg := Config{Run: "dur", Durability: tc.mode, SnapshotEvery: 1 << 20, SnapshotInterval: time.Hour}
			a := startServer(t, nc, cfg)
			switch d := a.dur.(type) {
			case memoryDurability:
				check(t, tc.wantType == "memory", "mode %s has a memory durability", tc.mode)
			case *snapshotDurability:
				check(t, tc.wantType == "snapshot", "mode %s has a snapshot durability", tc.mode)
			case *walDurability:
				check(t, tc.wantType == "wal", "mode %s has a wal durability", tc.mode)
			default:
				t.Fatalf("mode %s: durability %T", tc.mode, d)
			}
			g := newGenRun(3, 4, 5, 1, 41)
			n := 0
			for _, row := range g.reqs {
				for i := range row {
					doSync(t, nc, "dur", 0, &row[i])
					n++
				}
			}
			if tc.crash {
				a.abort()
			} else if err := a.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			kv, err := js.KeyValue(ctx, BucketName("dur"))
			switch {
			case tc.bucket && err != nil:
				t.Errorf("no bucket %s: %v", BucketName("dur"), err)
			case !tc.bucket && !errors.Is(err, jetstream.ErrBucketNotFound):
				t.Errorf("bucket %s: %v, want none", BucketName("dur"), err)
			}
			if kv != nil {
				_, err := kv.Get(ctx, manifestKey(0))
				wantManifest := tc.snapshots && !tc.crash
				if got := err == nil; got != wantManifest {
					t.Errorf("snapshot manifest present %v (%v), want %v", got, err, wantManifest)
				}
			}
			_, err = js.Stream(ctx, WALStreamName("dur"))
			switch {
			case tc.log && err != nil:
				t.Errorf("no log stream %s: %v", WALStreamName("dur"), err)
			case !tc.log && !errors.Is(err, jetstream.ErrStreamNotFound):
				t.Errorf("log stream %s: %v, want none", WALStreamName("dur"), err)
			}
			b := startServer(t, nc, cfg)
			defer b.Shutdown(context.Background())
			got := state(b)
			want := uint64(0)
			if tc.kept {
				want = uint64(n)
			}
			if got.Applied != want {
				t.Errorf("after the restart %d requests applied, want %d of the %d answered", got.Applied, want, n)
			}
		})
	}
}

func check(t *testing.T, ok bool, format string, args ...any) {
	t.Helper()
	if !ok {
		t.Errorf("not true: "+format, args...)
	}
}
