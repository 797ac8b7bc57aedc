package adnode

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/ad"
	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provstream"
)

// A thread with more call paths than one message holds still has its
// profile: published in parts, each within the batch limit, that join into
// the whole; the profile carries the thread's wall time, and calls whose
// path found no room in the table are in Overflow, never top-level calls.
func TestProfilesOfManyCallPaths(t *testing.T) {
	const paths = 12000
	f := &frame.Frame{Funcs: []frame.Name{{ID: 1, Name: "main"}, {ID: 2, Name: "leaf"}}}
	ts := uint64(1000)
	f.Events = append(f.Events, en(0, 1, ts))
	for i := range uint32(paths) {
		fid := 3 + i
		f.Funcs = append(f.Funcs, frame.Name{ID: fid, Name: fmt.Sprintf("namespace::component_%05d::operator()(std::vector<double> const&)", i)})
		f.Events = append(f.Events, en(0, fid, ts+1), en(0, 2, ts+2), ex(0, 2, ts+3), ex(0, fid, ts+4))
		ts += 10
	}
	f.Events = append(f.Events, ex(0, 1, ts), en(0, 2, ts+5), ex(0, 2, ts+7))
	d, err := ad.New(ad.Config{ProfilePaths: 1000})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := d.Process(ctx, f); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(ctx); err != nil {
		t.Fatal(err)
	}
	parts := d.Profiles(true)
	if len(parts) < 2 {
		t.Fatalf("%d profile records for %d call paths: not split", len(parts), 2*paths)
	}
	for _, p := range parts {
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > provstream.MaxBatchBytes {
			t.Errorf("part %d of %d is %d bytes, more than a batch (%d)", p.Part, p.Parts, len(b), provstream.MaxBatchBytes)
		}
	}
	p, err := provenance.Join(parts)
	if err != nil {
		t.Fatal(err)
	}
	if p.FirstTS != 1000 || p.LastTS != ts+7 {
		t.Errorf("first and last timestamps %d, %d; want 1000, %d", p.FirstTS, p.LastTS, ts+7)
	}
	flat := map[string]provenance.TimerProfile{}
	var pathCalls uint64
	for _, tm := range p.Timers {
		if !strings.Contains(tm.Name, "=>") {
			flat[tm.Name] = tm
		} else if strings.HasSuffix(tm.Name, "=> leaf") {
			pathCalls += tm.Calls
		}
	}
	if flat["leaf"].Calls != paths+1 {
		t.Errorf("leaf: %d calls, want %d", flat["leaf"].Calls, paths+1)
	}
	var over uint64
	for _, o := range p.Overflow {
		if o.Name == "leaf" {
			over = o.Calls
		}
	}
	// One call of leaf is top-level: the flat timer less its paths and its
	// overflow.
	if top := flat["leaf"].Calls - pathCalls - over; over == 0 || top != 1 {
		t.Errorf("leaf: %d calls on paths, %d overflowed, so %d top-level; want some overflowed and 1 top-level", pathCalls, over, top)
	}
}

// ev builds a function event.
func en(tid, fid uint32, ts uint64) frame.FuncEvent {
	return frame.FuncEvent{Tid: tid, Kind: frame.Entry, FID: fid, TS: ts}
}

func ex(tid, fid uint32, ts uint64) frame.FuncEvent {
	return frame.FuncEvent{Tid: tid, Kind: frame.Exit, FID: fid, TS: ts}
}
