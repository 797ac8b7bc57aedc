package adnode

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kipimo-hpc/kipimo/internal/ad"
	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

func TestParseFrameSubject(t *testing.T) {
	const prefix = "kipimo.r1.frames."
	tests := []struct {
		name    string
		subject string
		want    rankKey
		wantErr bool
	}{
		{"program and rank", "kipimo.r1.frames.2.17", rankKey{2, 17}, false},
		{"largest ids", "kipimo.r1.frames.4294967295.4294967295", rankKey{1<<32 - 1, 1<<32 - 1}, false},
		{"rank missing", "kipimo.r1.frames.2", rankKey{}, true},
		{"rank too large", "kipimo.r1.frames.0.4294967296", rankKey{}, true},
		{"extra token", "kipimo.r1.frames.0.1.2", rankKey{}, true},
		{"other run", "kipimo.r2.frames.0.1", rankKey{}, true},
		{"not a number", "kipimo.r1.frames.a.1", rankKey{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseFrameSubject(tc.subject, prefix)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("parseFrameSubject(%q) = %v, %v; want %v, error %v", tc.subject, got, err, tc.want, tc.wantErr)
			}
		})
	}
}

// Ranks of two programs appear on the subjects while Serve runs; each gets a
// detector that processes every frame, the source's dropped-frame count is
// taken from the header, and end_of_run stops them all.
func TestServeDiscoversRanks(t *testing.T) {
	_, nc := startNATS(t)
	const run = "discover"
	subj := natsx.Subjects{Run: run}
	wcfg := workload.DefaultConfig()
	wcfg.Ranks, wcfg.Steps, wcfg.EventsPerStep = 3, 5, 500
	w, err := workload.New(wcfg)
	if err != nil {
		t.Fatal(err)
	}
	coll := NewCollector(8, nil)
	end := serveDiscovering(t, nc, ServeConfig{Run: run, Collector: coll, Detector: ad.Config{Algorithm: ad.SSTD, Sink: &MemorySink{}}})
	type key struct{ pid, rank uint32 }
	targets := []key{{0, 0}, {0, 1}, {0, 2}, {5, 0}}
	var f frame.Frame
	var buf []byte
	for i, k := range targets {
		g := w.Rank(uint32(i % wcfg.Ranks))
		for s := 0; s < wcfg.Steps; s++ {
			if _, err := g.Next(&f); err != nil {
				t.Fatal(err)
			}
			f.PID, f.Rank = k.pid, k.rank
			buf = frame.AppendBinary(buf[:0], &f)
			m := &nats.Msg{Subject: subj.Frames(k.pid, k.rank), Data: buf, Header: nats.Header{}}
			m.Header.Set(SourceDroppedHeader, "0")
			if k == (key{5, 0}) {
				m.Header.Set(SourceDroppedHeader, "3")
			}
			if err := nc.PublishMsg(m); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := nc.PublishMsg(&nats.Msg{Subject: subj.Frames(0, 1), Header: nats.Header{EndOfStreamHeader: []string{"1"}}}); err != nil {
		t.Fatal(err)
	}
	// Frames on a malformed subject are ignored, not a new rank.
	if err := nc.Publish("kipimo."+run+".frames.x.1", buf); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every frame to be processed", func() bool {
		var n uint64
		for _, s := range coll.Stats() {
			n += s.Frames
		}
		return n == uint64(len(targets)*wcfg.Steps)
	})
	stats := end()
	if len(stats) != len(targets) {
		t.Fatalf("%d detectors, want %d", len(stats), len(targets))
	}
	for _, s := range stats {
		k := key{s.PID, s.Rank}
		if s.Frames != uint64(wcfg.Steps) || s.BadFrames != 0 || s.Executions == 0 {
			t.Errorf("program %d rank %d: %d frames (%d bad), %d executions; want %d frames", s.PID, s.Rank, s.Frames, s.BadFrames, s.Executions, wcfg.Steps)
		}
		wantDropped := uint64(0)
		if k == (key{5, 0}) {
			wantDropped = 3
		}
		if s.SourceDroppedFrames != wantDropped {
			t.Errorf("program %d rank %d: source dropped %d, want %d", s.PID, s.Rank, s.SourceDroppedFrames, wantDropped)
		}
		if s.Ended != (k == key{0, 1}) {
			t.Errorf("program %d rank %d: ended %v", s.PID, s.Rank, s.Ended)
		}
	}
}

// serveDiscovering starts Serve with discovery on cfg.Run (its connection,
// logger and readiness filled in) and waits until it subscribed; the
// function it returns sends end_of_run and returns Serve's counts.
func serveDiscovering(t *testing.T, nc *nats.Conn, cfg ServeConfig) func() []ad.Stats {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	type result struct {
		stats []ad.Stats
		err   error
	}
	done := make(chan result, 1)
	ready := make(chan struct{})
	// cfg.Logger left zero logs nothing.
	cfg.Conn, cfg.Discover, cfg.Ready = nc, true, func() { close(ready) }
	go func() {
		st, err := Serve(ctx, cfg)
		done <- result{st, err}
	}()
	<-ready
	return func() []ad.Stats {
		t.Helper()
		b, _ := json.Marshal(ControlMessage{Kind: ControlEndOfRun})
		if err := nc.Publish(natsx.Subjects{Run: cfg.Run}.Control(), b); err != nil {
			t.Fatal(err)
		}
		res := <-done
		if res.err != nil {
			t.Fatal(res.err)
		}
		return res.stats
	}
}
