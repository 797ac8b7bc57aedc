package provenance_test

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
	"github.com/kipimo-hpc/kipimo/internal/provenance/storetest"
	"github.com/kipimo-hpc/kipimo/schemas"
)

// compile compiles the JSON Schema of kind's records, as embedded by
// package schemas.
func compile(t *testing.T, kind provenance.Kind) *jsonschema.Schema {
	t.Helper()
	name := "provenance/" + string(kind) + ".schema.json"
	data, err := schemas.Provenance.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("schema of %s: %v", kind, err)
	}
	c := jsonschema.NewCompiler()
	url := "file:///schemas/" + name
	if err := c.AddResource(url, doc); err != nil {
		t.Fatalf("schema of %s: %v", kind, err)
	}
	s, err := c.Compile(url)
	if err != nil {
		t.Fatalf("compile schema of %s: %v", kind, err)
	}
	return s
}

func validate(t *testing.T, s *jsonschema.Schema, v any) error {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	return s.Validate(inst)
}

// TestSchemasAcceptStoredRecords validates records of every kind, as
// written to and read back from a store, against their collection's schema.
func TestSchemasAcceptStoredRecords(t *testing.T) {
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "p.db"), sqlitestore.Options{Synchronous: "OFF"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	execs := storetest.Generate(storetest.GenConfig{Seed: 5, N: 200, Anomaly: true})
	if err := st.Write(ctx, provenance.Batch{Kind: provenance.KindAnomalies, Execs: execs}); err != nil {
		t.Fatal(err)
	}
	back, err := st.Query(ctx, provenance.Query{Limit: 1000})
	if err != nil || len(back) != len(execs) {
		t.Fatalf("read back %d records (%v)", len(back), err)
	}
	for _, kind := range []provenance.Kind{provenance.KindAnomalies, provenance.KindNormalExecs} {
		s := compile(t, kind)
		gpu := 0
		for i := range back {
			if err := validate(t, s, &back[i]); err != nil {
				t.Fatalf("%s record %s: %v", kind, back[i].EventID, err)
			}
			if back[i].IsGPUEvent {
				gpu++
			}
		}
		if gpu == 0 {
			t.Fatal("no GPU record validated")
		}
	}
	meta, fs, cs, prof := storetest.GenerateOthers(0, 3)
	for kind, recs := range map[provenance.Kind]any{provenance.KindMetadata: meta, provenance.KindFuncStats: fs, provenance.KindCounterStats: cs, provenance.KindProfiles: prof} {
		s := compile(t, kind)
		data, _ := json.Marshal(recs)
		b, err := provenance.DecodeBatch(kind, data)
		if err != nil {
			t.Fatal(err)
		}
		var items []json.RawMessage
		if err := json.Unmarshal(data, &items); err != nil || len(items) != b.Len() {
			t.Fatal(err)
		}
		for i, it := range items {
			inst, _ := jsonschema.UnmarshalJSON(bytes.NewReader(it))
			if err := s.Validate(inst); err != nil {
				t.Fatalf("%s record %d: %v", kind, i, err)
			}
		}
	}
}

// TestSchemasRefuseDrift checks the schemas catch a renamed, missing or
// mistyped field, so they pin the field names of seed 002.
func TestSchemasRefuseDrift(t *testing.T) {
	e := storetest.Generate(storetest.GenConfig{Seed: 6, N: 1})[0]
	data, _ := json.Marshal(e)
	s := compile(t, provenance.KindAnomalies)
	cases := map[string]func(m map[string]any){
		"renamed rid":        func(m map[string]any) { m["rank"] = m["rid"]; delete(m, "rid") },
		"missing call_stack": func(m map[string]any) { delete(m, "call_stack") },
		"string entry":       func(m map[string]any) { m["entry"] = "12" },
		"bad event_id":       func(m map[string]any) { m["event_id"] = "0-1-2" },
		"window field renamed": func(m map[string]any) {
			w := m["event_window"].(map[string]any)
			w["execs"] = w["exec_window"]
			delete(w, "exec_window")
		},
		"bad comm type": func(m map[string]any) {
			m["event_window"].(map[string]any)["comm_window"] = []any{map[string]any{"type": "BCAST"}}
		},
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			var m map[string]any
			if err := json.Unmarshal(data, &m); err != nil {
				t.Fatal(err)
			}
			if err := validate(t, s, m); err != nil {
				t.Fatalf("unmodified record refused: %v", err)
			}
			mutate(m)
			err := validate(t, s, m)
			if err == nil {
				t.Fatal("schema accepted the drifted record")
			}
			if strings.TrimSpace(err.Error()) == "" {
				t.Fatal("empty validation error")
			}
		})
	}
}
