package adnode

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/kipimo-hpc/kipimo/internal/ad"
	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/syncproto"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

const syncSchemaPath = "../../schemas/sync.schema.json"

func syncSchema(t *testing.T, def string) *jsonschema.Schema {
	t.Helper()
	raw, err := os.ReadFile(syncSchemaPath)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("parse %s: %v", syncSchemaPath, err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("sync.schema.json", doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile("sync.schema.json" + def)
	if err != nil {
		t.Fatalf("compile %s%s: %v", syncSchemaPath, def, err)
	}
	return sch
}

func validate(t *testing.T, sch *jsonschema.Schema, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if err := sch.Validate(inst); err != nil {
		t.Fatalf("%s does not match the schema: %v", b, err)
	}
}

// recordingSyncer keeps every request and reply it passes to a fakePServer.
type recordingSyncer struct {
	ps   *fakePServer
	mu   sync.Mutex
	reqs []syncproto.SyncRequest
	reps []syncproto.SyncReply
}

func (r *recordingSyncer) Sync(ctx context.Context, shard int, req *syncproto.SyncRequest) (*syncproto.SyncReply, error) {
	rep, err := r.ps.Sync(ctx, shard, req)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reqs = append(r.reqs, *req)
	if rep != nil {
		r.reps = append(r.reps, *rep)
	}
	return rep, err
}

func TestSyncMessagesMatchSchema(t *testing.T) {
	for _, algo := range []string{ad.SSTD, ad.HBOS} {
		t.Run(algo, func(t *testing.T) {
			wcfg := workload.DefaultConfig()
			wcfg.Ranks, wcfg.Steps, wcfg.EventsPerStep, wcfg.GPU = 1, 3, 3000, true
			wcfg.Rates = workload.DefaultRates.Scale(10)
			w, err := workload.New(wcfg)
			if err != nil {
				t.Fatal(err)
			}
			rec := &recordingSyncer{ps: newFakePServer()}
			d, err := ad.New(ad.Config{Algorithm: algo, Syncer: rec, Shards: 3})
			if err != nil {
				t.Fatal(err)
			}
			g := w.Rank(0)
			var f frame.Frame
			for s := 0; s < wcfg.Steps; s++ {
				if _, err := g.Next(&f); err != nil {
					t.Fatal(err)
				}
				if err := d.Process(context.Background(), &f); err != nil {
					t.Fatal(err)
				}
			}
			validate(t, syncSchema(t, "#/$defs/CallstackReply"), d.Callstacks())
			if err := d.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			reqSch, repSch := syncSchema(t, "#/$defs/SyncRequest"), syncSchema(t, "#/$defs/SyncReply")
			var hist, steps, counters bool
			for _, r := range rec.reqs {
				validate(t, reqSch, r)
				for _, m := range r.Models {
					hist = hist || m.Histogram != nil
				}
				steps = steps || len(r.Steps) > 0
				counters = counters || len(r.Counters) > 0
			}
			for _, r := range rec.reps {
				validate(t, repSch, r)
			}
			if len(rec.reqs) == 0 || !steps || !counters || hist != (algo == ad.HBOS) {
				t.Errorf("%d requests; histograms %v, step summaries %v, counters %v", len(rec.reqs), hist, steps, counters)
			}
		})
	}
	validate(t, syncSchema(t, "#/$defs/ControlMessage"), ControlMessage{Kind: ControlEndOfRun})
	r := uint32(3)
	validate(t, syncSchema(t, "#/$defs/CallstackRequest"), syncproto.CallstackRequest{Rank: &r})
	validate(t, syncSchema(t, ""), syncproto.CallstackRequest{})
}

func TestNodeSyncMessagesMatchSchema(t *testing.T) {
	wcfg := workload.DefaultConfig()
	wcfg.Ranks, wcfg.Steps, wcfg.EventsPerStep = 3, 2, 3000
	w, err := workload.New(wcfg)
	if err != nil {
		t.Fatal(err)
	}
	var calls []*nodeCall
	for r := range uint32(wcfg.Ranks) {
		rec := &recordingSyncer{ps: newFakePServer()}
		d, err := ad.New(ad.Config{Algorithm: ad.HBOS, Rank: r, Syncer: rec})
		if err != nil {
			t.Fatal(err)
		}
		g := w.Rank(r)
		var f frame.Frame
		for range wcfg.Steps {
			if _, err := g.Next(&f); err != nil {
				t.Fatal(err)
			}
			if err := d.Process(context.Background(), &f); err != nil {
				t.Fatal(err)
			}
		}
		if len(rec.reqs) == 0 {
			t.Fatalf("rank %d sent nothing", r)
		}
		calls = append(calls, &nodeCall{req: &rec.reqs[len(rec.reqs)-1]})
	}
	req, err := mergeRequests("host:1", calls)
	if err != nil {
		t.Fatal(err)
	}
	if len(req.Ranks) != wcfg.Ranks || len(req.Models) == 0 || len(req.Models[0].More) == 0 || req.Models[0].More[0].Histogram == nil {
		t.Fatalf("merged request has %d ranks and models %d, the first with %d further parts", len(req.Ranks), len(req.Models), len(req.Models[0].More))
	}
	validate(t, syncSchema(t, "#/$defs/SyncRequest"), req)
	validate(t, syncSchema(t, "#/$defs/SyncReply"), syncproto.SyncReply{Stale: []syncproto.RankSeq{{PID: 1, Rank: 2, Seq: 3}}})
}
