package adnode

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/ad"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

// startServer runs a NATS server with JetStream in domain, on loopback.
func startServer(t *testing.T, name, domain string, leaf server.LeafNodeOpts) *server.Server {
	t.Helper()
	s, err := server.NewServer(&server.Options{
		ServerName: name, Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		JetStream: true, JetStreamDomain: domain, StoreDir: t.TempDir(), LeafNode: leaf,
	})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatalf("%s not ready", name)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// TestDurableFramesStayOnTheLeaf runs a node's detectors with durable frames
// on a leaf server that has JetStream of its own (domain node1), as on a
// compute node whose leaf connects to the job's hub, with provenance records
// sent to the hub's domain (--prov-domain hub): the frame stream and the
// checkpoints live on the leaf, the frames never reach the hub, and the
// records do.
func TestDurableFramesStayOnTheLeaf(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	leafPort := l.Addr().(*net.TCPAddr).Port
	l.Close()
	hub := startServer(t, "hub", "hub", server.LeafNodeOpts{Host: "127.0.0.1", Port: leafPort})
	remote, err := url.Parse(fmt.Sprintf("nats-leaf://127.0.0.1:%d", leafPort))
	if err != nil {
		t.Fatal(err)
	}
	leaf := startServer(t, "leaf", "node1", server.LeafNodeOpts{Remotes: []*server.RemoteLeafOpts{{URLs: []*url.URL{remote}}}})
	waitFor(t, "the leaf's connection to the hub", func() bool { return hub.NumLeafNodes() == 1 })
	nc, err := nats.Connect(leaf.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc) // the leaf's own domain
	if err != nil {
		t.Fatal(err)
	}
	hubJS, err := jetstream.NewWithDomain(nc, "hub")
	if err != nil {
		t.Fatal(err)
	}
	const run = "leafrun"
	double := &natsDouble{ps: newFakePServer(), nc: nc, subj: natsx.Subjects{Run: run}}
	double.start(t)
	wcfg := workload.DefaultConfig()
	wcfg.Ranks, wcfg.Steps, wcfg.EventsPerStep = 2, 12, 3000
	byRank, _ := encodedFrames(t, wcfg)
	var frameBytes int
	for _, fs := range byRank {
		for _, b := range fs {
			frameBytes += len(b)
		}
	}
	before := hubInBytes(t, hub)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sink, err := NewNATSSink(hubJS, run, 64, Block, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	if err := sink.Start(ctx); err != nil {
		t.Fatal(err)
	}
	ready := make(chan struct{})
	done := make(chan serveResult, 1)
	go func() {
		st, err := Serve(ctx, ServeConfig{
			Conn: nc, Run: run, Ranks: []uint32{0, 1}, Logger: zerolog.Nop(), Ready: func() { close(ready) },
			Durable:  &Durable{JS: js, CheckpointEvery: 4},
			Detector: ad.Config{Sink: sink, Syncer: &NATSSyncer{Conn: nc, Subjects: natsx.Subjects{Run: run}}},
		})
		done <- serveResult{st, err}
	}()
	<-ready
	publishFrames(t, nc, run, byRank, 0, len(byRank[0]), true)
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	for _, s := range r.stats {
		if s.Frames != uint64(len(byRank[s.Rank])) || s.MissingSteps != 0 {
			t.Errorf("rank %d: %d frames, %d missing steps; %d published", s.Rank, s.Frames, s.MissingSteps, len(byRank[s.Rank]))
		}
	}
	if _, err := js.Stream(ctx, natsx.FrameStream(run)); err != nil {
		t.Errorf("the leaf's domain has no frame stream: %v", err)
	}
	if err := sink.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := hubJS.Stream(ctx, natsx.FrameStream(run)); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("the hub's domain: frame stream lookup gave %v, want not found", err)
	}
	prov, err := hubJS.Stream(ctx, natsx.ProvStream(run))
	if err != nil {
		t.Fatalf("the hub's domain has no provenance stream: %v", err)
	}
	info, err := prov.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs == 0 || sink.Published() == 0 {
		t.Errorf("the hub's provenance stream holds %d batches; the sink published %d records", info.State.Msgs, sink.Published())
	}
	// What the hub received beyond the record batches it stored: had the
	// frames crossed, they would be most of it.
	if got := hubInBytes(t, hub) - before - int64(info.State.Bytes); got > int64(frameBytes)/10 {
		t.Errorf("the hub received %d bytes besides %d of records while %d bytes of frames were published on the leaf", got, info.State.Bytes, frameBytes)
	}
}

// hubInBytes is the bytes a server has received from its clients and leaves.
func hubInBytes(t *testing.T, s *server.Server) int64 {
	t.Helper()
	v, err := s.Varz(nil)
	if err != nil {
		t.Fatal(err)
	}
	return v.InBytes
}
