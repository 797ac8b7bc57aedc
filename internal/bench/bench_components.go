package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kipimo-hpc/kipimo/internal/ad"
	"github.com/kipimo-hpc/kipimo/internal/adnode"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provstream"
	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
	"github.com/kipimo-hpc/kipimo/internal/run"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

// componentsTimeout bounds the separate-process run of the benchmark.
const componentsTimeout = 3 * time.Minute

// componentRun is what benchComponents measured.
type componentRun struct {
	// PeakRSS is each component's peak resident set size in MiB, by
	// component name (ComponentAD, ...).
	PeakRSS map[string]float64
	// Events published, and events/s from the first frame published to
	// the detector process's exit.
	Events          int
	EventsPerSecond float64
	// Flagged is what the detectors flagged, Stored the anomalies provdb
	// stored.
	Flagged uint64
	Stored  int64
	Frames  uint64
}

// benchComponents runs workload wl through the pipeline with each component
// in a process of its own: a NATS server, provdb on a SQLite file, the
// pserver, and one ad process serving every rank, all on 127.0.0.1. This
// process publishes the input with the same flow control as `kipimo run`
// (detectors at most 16 frames behind), then stops the components one by
// one; each reports its peak RSS when it exits.
func benchComponents(ctx context.Context, command []string, dir string, wl workload.Config) (*componentRun, error) {
	ctx, cancel := context.WithTimeout(ctx, componentsTimeout)
	defer cancel()
	const runID, maxLag = "bench", 16
	var children []*child
	defer func() {
		// On an error: stop whatever still runs, last started first.
		for i := len(children) - 1; i >= 0; i-- {
			_ = children[i].stop()
		}
	}()
	start := func(name string, args []string, stdout io.Writer) (*child, error) {
		c, err := startChild(ctx, command, name, filepath.Join(dir, name+".peak-rss"), args, stdout)
		if err != nil {
			return nil, err
		}
		children = append(children, c)
		return c, nil
	}

	urlOut := newLineWriter()
	nsChild, err := start(ComponentNATS, []string{"--dir", filepath.Join(dir, "nats")}, urlOut)
	if err != nil {
		return nil, err
	}
	var url string
	select {
	case url = <-urlOut.first:
	case <-nsChild.done:
		return nil, fmt.Errorf("NATS server did not start: %w", nsChild.result())
	case <-ctx.Done():
		return nil, fmt.Errorf("wait for the NATS server: %w", ctx.Err())
	}
	nc, err := natsx.Connect(ctx, url, "kipimo-bench")
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("JetStream: %w", err)
	}

	store := filepath.Join(dir, "provenance.db")
	provAddr, err := freeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	prov, err := start(ComponentProvDB, []string{"--nats", url, "--run", runID, "--store", store, "--http", provAddr, "--log-level", "warn"}, nil)
	if err != nil {
		return nil, err
	}
	if err := waitHTTP(ctx, "http://"+provAddr+"/api/v1/health", prov); err != nil {
		return nil, err
	}
	psAddr, err := freeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	ps, err := start(ComponentPServer, []string{"--nats", url, "--run", runID, "--http", psAddr, "--provdb-url", "http://" + provAddr, "--log-level", "warn"}, nil)
	if err != nil {
		return nil, err
	}
	if err := waitHTTP(ctx, "http://"+psAddr+"/api/config", ps); err != nil {
		return nil, err
	}
	ranks := make([]uint32, wl.Ranks)
	for i := range ranks {
		ranks[i] = uint32(i)
	}
	adOut := newLineWriter()
	det, err := start(ComponentAD, []string{"--nats", url, "--run", runID, "--pid", fmt.Sprint(wl.PID),
		"--ranks", fmt.Sprintf("0-%d", wl.Ranks-1), "--algorithm", ad.SSTD,
		"--pending-frames", fmt.Sprint(4 * maxLag), "--json", "--log-level", "warn"}, adOut)
	if err != nil {
		return nil, err
	}
	probe := &probeCounts{nc: nc, subj: natsx.Subjects{Run: runID}, pid: wl.PID, last: map[uint32]uint64{}}
	if err := probe.ready(ctx, ranks, det); err != nil {
		return nil, err
	}

	began := time.Now()
	counts, err := run.PublishWorkload(ctx, nc, runID, wl, probe, maxLag)
	if err != nil {
		return nil, err
	}
	select {
	case <-det.done:
	case <-ctx.Done():
		return nil, fmt.Errorf("wait for the detectors to finish: %w", ctx.Err())
	}
	elapsed := time.Since(began)
	if err := det.result(); err != nil {
		return nil, err
	}
	var sum adnode.Summary
	if err := json.Unmarshal(adOut.Bytes(), &sum); err != nil {
		return nil, fmt.Errorf("ad's summary: %w", err)
	}
	if err := provstream.WaitConsumed(ctx, js, runID, "provdb"); err != nil {
		return nil, err
	}
	res := &componentRun{PeakRSS: map[string]float64{}, Events: counts.Events, Flagged: sum.Total.Anomalies, Frames: sum.Total.Frames}
	if elapsed > 0 {
		res.EventsPerSecond = float64(counts.Events) / elapsed.Seconds()
	}
	nc.Close()
	// Stop the rest in order: the pserver, provdb, then NATS.
	for _, c := range []*child{ps, prov, nsChild} {
		if err := c.stop(); err != nil {
			return nil, err
		}
	}
	for _, c := range []*child{det, ps, prov, nsChild} {
		if mib, ok := c.peakRSS(); ok {
			res.PeakRSS[c.name] = mib
		}
	}
	st, err := sqlitestore.Open(ctx, store, sqlitestore.Options{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer st.Close()
	if res.Stored, err = st.Count(ctx, provenance.Query{Kind: provenance.KindAnomalies}); err != nil {
		return nil, fmt.Errorf("count stored anomalies: %w", err)
	}
	return res, nil
}

// freeLoopbackAddr returns 127.0.0.1 and a port free at the time of the
// call, for a child's listener.
func freeLoopbackAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	return addr, nil
}

// waitHTTP waits until url answers 200, or c exits, or ctx is done.
func waitHTTP(ctx context.Context, url string, c *child) error {
	client := &http.Client{Timeout: 2 * time.Second}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return fmt.Errorf("wait for %s: %w", c.name, err)
		}
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-c.done:
			return fmt.Errorf("%s did not start: %w", c.name, c.result())
		case <-ctx.Done():
			return fmt.Errorf("wait for %s at %s: %w", c.name, url, ctx.Err())
		case <-tick.C:
		}
	}
}

// probeCounts tells flow control how far detectors in another process got,
// through their live call-stack probes: a detector's snapshot names the last
// io_step it processed. It assumes each rank's steps are numbered from 0
// without gaps, as in the synthetic workload.
type probeCounts struct {
	nc   *nats.Conn
	subj natsx.Subjects
	pid  uint32
	mu   sync.Mutex
	last map[uint32]uint64
}

func (pc *probeCounts) Taken(ctx context.Context, rank uint32) uint64 {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pc.mu.Lock()
	defer pc.mu.Unlock()
	msg, err := pc.nc.RequestWithContext(rctx, pc.subj.Callstack(pc.pid, rank), nil)
	if err == nil {
		var rep syncproto.CallstackReply
		// Before its first frame a detector's snapshot has no threads.
		if json.Unmarshal(msg.Data, &rep) == nil && len(rep.Threads) > 0 {
			pc.last[rank] = max(pc.last[rank], rep.IOStep+1)
		}
	}
	return pc.last[rank]
}

func (pc *probeCounts) TakenAll() map[uint32]uint64 {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	out := make(map[uint32]uint64, len(pc.last))
	for r, n := range pc.last {
		out[r] = n
	}
	return out
}

// ready waits until every rank's detector answers its probe (it then
// receives its frames), or c exits, or ctx is done.
func (pc *probeCounts) ready(ctx context.Context, ranks []uint32, c *child) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for _, r := range ranks {
		for {
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := pc.nc.RequestWithContext(rctx, pc.subj.Callstack(pc.pid, r), nil)
			cancel()
			if err == nil {
				break
			}
			if !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) {
				return fmt.Errorf("probe the detector of rank %d: %w", r, err)
			}
			select {
			case <-c.done:
				return fmt.Errorf("%s did not start: %w", c.name, c.result())
			case <-ctx.Done():
				return fmt.Errorf("wait for the detector of rank %d: %w", r, ctx.Err())
			case <-tick.C:
			}
		}
	}
	return nil
}
