package syncproto

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

func goodPeer() *PeerStep {
	return &PeerStep{Start: 10, End: 1_000_010,
		Funcs: []PeerFunc{{Func: "compute", Us: 900, Calls: 3, MaxUs: 500}, {Func: "MPI_Waitall", Kind: PeerP2P, Us: 40, Calls: 3, MaxUs: 30}, {Func: "MPI_Allreduce", Kind: PeerCollective, Us: 9, Calls: 3}},
		Waits: []PeerWait{{Partner: 3, Us: 40}, {Partner: 5, Us: 40}}}
}

// A step summary's peer data is refused beyond its bounds, and what a
// detector sends matches the schema.
func TestPeerValidate(t *testing.T) {
	if err := (&SyncRequest{Steps: []StepSummary{{Peer: goodPeer()}}}).Validate(); err != nil {
		t.Fatalf("a good peer refused: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(p *PeerStep)
		want string
	}{
		{"end before start", func(p *PeerStep) { p.End = 5 }, "start <= end"},
		{"too many functions", func(p *PeerStep) { p.Funcs = make([]PeerFunc, MaxPeerFuncs+1) }, "functions"},
		{"too many partners", func(p *PeerStep) { p.Waits = make([]PeerWait, MaxPeerWaits+1) }, "partners"},
		{"long name", func(p *PeerStep) { p.Funcs[0].Func = strings.Repeat("x", MaxKeyLen+1) }, "bytes"},
		{"unknown kind", func(p *PeerStep) { p.Funcs[0].Kind = "io" }, "kind"},
		{"huge time", func(p *PeerStep) { p.Funcs[0].Us = MaxCount + 1 }, "beyond"},
		{"longest call beyond the total", func(p *PeerStep) { p.Funcs[0].MaxUs = 901 }, "beyond"},
		{"function twice", func(p *PeerStep) { p.Funcs[1].Func = "compute" }, "twice"},
		{"partner twice", func(p *PeerStep) { p.Waits[1].Partner = 3 }, "twice"},
		{"huge wait", func(p *PeerStep) { p.Waits[0].Us = MaxCount + 1 }, "beyond"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := goodPeer()
			tc.edit(p)
			err := (&SyncRequest{Steps: []StepSummary{{Peer: p}}}).Validate()
			if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate: %v, want an ErrInvalid naming %q", err, tc.want)
			}
		})
	}

	raw, err := os.ReadFile("../../schemas/sync.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("sync.schema.json", doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile("sync.schema.json#/$defs/StepSummary")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []*PeerStep{goodPeer(), {Start: 1, End: 1}} {
		b, _ := json.Marshal(StepSummary{Peer: p})
		inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		if err := sch.Validate(inst); err != nil {
			t.Errorf("%s does not match the schema: %v", b, err)
		}
	}
	b, _ := json.Marshal(StepSummary{Peer: &PeerStep{Funcs: []PeerFunc{{Func: "f", Kind: "io"}}}})
	inst, _ := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if sch.Validate(inst) == nil {
		t.Errorf("%s matches the schema: an unknown kind", b)
	}
}
