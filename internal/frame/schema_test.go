package frame

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

const schemaPath = "../../schemas/frame.schema.json"

func compileSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	raw, err := os.ReadFile(schemaPath)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("parse %s: %v", schemaPath, err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("frame.schema.json", doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile("frame.schema.json")
	if err != nil {
		t.Fatalf("compile %s: %v", schemaPath, err)
	}
	return sch
}

// TestSchemaAcceptsGolden validates the JSON golden frames against the
// schema.
func TestSchemaAcceptsGolden(t *testing.T) {
	sch := compileSchema(t)
	files, err := filepath.Glob(filepath.Join("testdata", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden JSON files (%v)", err)
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
			if err != nil {
				t.Fatal(err)
			}
			if err := sch.Validate(inst); err != nil {
				t.Fatalf("%s does not match the schema: %v", path, err)
			}
		})
	}
}

// TestSchemaAgreesWithDecoder: frames the strict decoder rejects for their
// shape or values, the schema rejects too.
func TestSchemaAgreesWithDecoder(t *testing.T) {
	sch := compileSchema(t)
	const head = `"pid":1,"rank":2,"io_step":3,"t_start":4,"t_end":5`
	cases := []struct {
		name string
		doc  string
	}{
		{"unknown field", `{` + head + `,"ranks":2}`},
		{"missing field", `{"pid":1,"rank":2,"io_step":3,"t_start":4}`},
		{"negative", `{"pid":-1,"rank":2,"io_step":3,"t_start":4,"t_end":5}`},
		{"pid beyond 32 bits", `{"pid":4294967296,"rank":2,"io_step":3,"t_start":4,"t_end":5}`},
		{"fraction", `{` + head + `,"events":[{"tid":0,"kind":0,"fid":1,"ts":5.5}]}`},
		{"event kind 2", `{` + head + `,"events":[{"tid":0,"kind":2,"fid":1,"ts":5}]}`},
		{"comm kind 2", `{` + head + `,"comms":[{"tid":0,"kind":2,"tag":0,"partner":0,"bytes":0,"ts":0}]}`},
		{"missing event field", `{` + head + `,"events":[{"tid":0,"kind":0,"ts":5}]}`},
		{"unknown counter field", `{` + head + `,"counter_events":[{"tid":0,"cid":0,"value":0,"ts":0,"unit":"s"}]}`},
		{"null array", `{` + head + `,"funcs":null}`},
		{"name not a string", `{` + head + `,"funcs":[{"id":0,"name":5}]}`},
		{"not an object", `[1]`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var f Frame
			if err := DecodeJSON([]byte(tc.doc), &f); err == nil {
				t.Errorf("DecodeJSON accepts %s", tc.doc)
			}
			inst, err := jsonschema.UnmarshalJSON(bytes.NewReader([]byte(tc.doc)))
			if err != nil {
				t.Fatal(err)
			}
			if err := sch.Validate(inst); err == nil {
				t.Errorf("the schema accepts %s", tc.doc)
			}
		})
	}
}
