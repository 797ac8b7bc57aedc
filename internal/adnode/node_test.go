package adnode

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/ad"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provstream"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

// The node is a component: New registers its metrics on the registerer it
// is given, Start returns once its ranks listen, it ends by itself when
// every rank's stream has ended (Done), and Shutdown drains its own sink
// into the run's provenance stream.
func TestNodeServesUntilStreamsEnd(t *testing.T) {
	_, nc := startNATS(t)
	const run = "node"
	wcfg := workload.DefaultConfig()
	wcfg.Ranks, wcfg.Steps, wcfg.EventsPerStep = 2, 4, 2000
	byRank, _ := encodedFrames(t, wcfg)
	reg := prometheus.NewRegistry()
	n, err := New(Config{Serve: ServeConfig{Run: run, Ranks: []uint32{0, 1}, Detector: ad.Config{Algorithm: ad.SSTD}}, NoPServer: true}, nc, zerolog.Nop(), reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.Start(ctx); err == nil {
		t.Error("a second Start succeeded")
	}
	publishFrames(t, nc, run, byRank, 0, wcfg.Steps, true)
	select {
	case <-n.Done():
	case <-ctx.Done():
		t.Fatal("the node did not end with its ranks' streams")
	}
	if err := n.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	st := n.Stats()
	if len(st) != 2 {
		t.Fatalf("%d ranks' counts, want 2", len(st))
	}
	var records uint64
	for _, s := range st {
		if s.Frames != uint64(wcfg.Steps) || !s.Ended {
			t.Errorf("rank %d: %d frames, ended %v; want %d, true", s.Rank, s.Frames, s.Ended, wcfg.Steps)
		}
		records += s.Records
	}
	if records == 0 || n.Sink().Published() != records {
		t.Errorf("sink published %d records, the detectors made %d", n.Sink().Published(), records)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := provstream.EnsureStream(ctx, js, run)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := s.Info(ctx); err != nil || info.State.Msgs == 0 {
		t.Errorf("provenance stream: %v, %+v; want the node's batches", err, info)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() == "kipimo_ad_frames_total" {
			found = len(mf.GetMetric()) == 2
		}
	}
	if !found {
		t.Error("the registerer given has no kipimo_ad_frames_total of the 2 ranks")
	}
}

// Shutdown stops a node whose streams have not ended: every detector is
// closed and Done is closed.
func TestNodeShutdownStopsServing(t *testing.T) {
	_, nc := startNATS(t)
	n, err := New(Config{Serve: ServeConfig{Run: "stop", Ranks: []uint32{0}, Detector: ad.Config{Algorithm: ad.SSTD}}, NoPServer: true}, nc, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-n.Done():
	default:
		t.Fatal("Done not closed after Shutdown")
	}
	if st := n.Stats(); len(st) != 1 || st[0].Ended {
		t.Errorf("counts %+v: want one rank, not ended", st)
	}
}

// New refuses what cannot serve, naming it.
func TestNodeNewRefuses(t *testing.T) {
	_, nc := startNATS(t)
	for _, tc := range []struct {
		name string
		cfg  Config
		nc   bool
		want string
	}{
		{"no connection", Config{Serve: ServeConfig{Run: "r", Ranks: []uint32{0}}}, false, "no NATS connection"},
		{"bad run", Config{Serve: ServeConfig{Run: "a.b", Ranks: []uint32{0}}}, true, "run"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := nc
			if !tc.nc {
				c = nil
			}
			if _, err := New(tc.cfg, c, zerolog.Nop(), nil); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New: %v, want an error naming %q", err, tc.want)
			}
		})
	}
}
