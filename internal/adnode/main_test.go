package adnode

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kipimo-hpc/kipimo/internal/ad"
	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provstream"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

func TestParseRanks(t *testing.T) {
	tests := []struct {
		in   string
		want []uint32
		err  string
	}{
		{"0", []uint32{0}, ""},
		{"0-3,8", []uint32{0, 1, 2, 3, 8}, ""},
		{" 5 , 6-7 ", []uint32{5, 6, 7}, ""},
		{"3-1", nil, "ends before it starts"},
		{"x", nil, "not a rank number"},
		{"", nil, "names no rank"},
		{"0-99999999", nil, "more than 65536"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseRanks(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %v %v, want %v", got, err, tc.want)
			}
		})
	}
}

func TestMainEndToEnd(t *testing.T) {
	srv, nc := startNATS(t)
	const run = "e2e"
	subj := natsx.Subjects{Run: run}
	wcfg := workload.DefaultConfig()
	wcfg.Ranks, wcfg.Steps, wcfg.EventsPerStep = 2, 5, 3000
	wcfg.Rates = workload.DefaultRates.Scale(10)
	w, err := workload.New(wcfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	var mu sync.Mutex
	done := make(chan error, 1)
	go func() {
		var out, errb bytes.Buffer
		err := Main(ctx, []string{"--nats", srv.ClientURL(), "--run", run, "--ranks", "0-1", "--algorithm", "sstd",
			"--no-pserver", "--json", "--log-level", "warn"}, &out, &errb)
		mu.Lock()
		stdout, stderr = out, errb
		mu.Unlock()
		done <- err
	}()
	waitFor(t, "detectors to subscribe", func() bool {
		_, err := nc.Request(subj.Callstack(0, 1), nil, 100*time.Millisecond)
		return err == nil
	})
	var f frame.Frame
	var buf []byte
	for r := uint32(0); r < 2; r++ {
		g := w.Rank(r)
		for {
			_, err := g.Next(&f)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			buf = frame.AppendBinary(buf[:0], &f)
			if err := nc.Publish(subj.Frames(0, r), buf); err != nil {
				t.Fatal(err)
			}
		}
	}
	// a damaged frame is counted, not fatal
	if err := nc.Publish(subj.Frames(0, 0), []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(ControlMessage{Kind: ControlEndOfRun})
	if err := nc.Publish(subj.Control(), b); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Main: %v\n%s", err, stderr.String())
	}
	mu.Lock()
	defer mu.Unlock()
	var sum Summary
	if err := json.Unmarshal(stdout.Bytes(), &sum); err != nil {
		t.Fatalf("summary %q: %v", stdout.String(), err)
	}
	if len(sum.Ranks) != 2 || sum.Total.Frames != 10 || sum.Total.BadFrames != 1 || sum.Total.Anomalies == 0 {
		t.Fatalf("summary %+v", sum)
	}
	if sum.SinkDropped != 0 || sum.SinkPublished != sum.Total.Records {
		t.Errorf("sink published %d dropped %d, detectors produced %d", sum.SinkPublished, sum.SinkDropped, sum.Total.Records)
	}
	// The records are in the provenance stream.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, natsx.ProvStream(run))
	if err != nil {
		t.Fatal(err)
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	counts := map[provenance.Kind]int{}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(0); i < info.State.Msgs; i++ {
		m, err := cons.Next(jetstream.FetchMaxWait(2 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		kind := provenance.Kind(m.Subject()[strings.LastIndex(m.Subject(), ".")+1:])
		recs, err := provstream.Decode(kind, m.Headers(), m.Data())
		if err != nil {
			t.Fatalf("batch on %s: %v", m.Subject(), err)
		}
		counts[kind] += recs.Len()
		if m.Headers().Get(jetstream.MsgIDHeader) == "" {
			t.Errorf("batch on %s has no message id", m.Subject())
		}
		if kind == provenance.KindAnomalies {
			if m.Headers().Get(provstream.EncodingHeader) != provstream.EncodingBlocks {
				t.Errorf("anomaly batch not in the block encoding")
			}
			if a := recs.Execs; len(a) == 0 || a[0].EventID == "" || a[0].Algorithm != ad.SSTD {
				t.Errorf("anomaly batch: %+v", a)
			}
		}
	}
	if counts[provenance.KindAnomalies] != int(sum.Total.Anomalies) {
		t.Errorf("anomalies in the stream %d, detectors flagged %d", counts[provenance.KindAnomalies], sum.Total.Anomalies)
	}
	if counts[provenance.KindProfiles] == 0 || counts[provenance.KindMetadata] == 0 {
		t.Errorf("records per kind %v", counts)
	}
	t.Logf("records per kind %v; summary total %+v", counts, sum.Total)
}
