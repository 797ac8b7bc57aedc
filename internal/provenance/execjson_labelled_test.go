package provenance_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// labelled_io_step goes through the hand-written codec as through
// encoding/json: written after io_step_tend when set, left out when 0, and
// read back.
func TestExecJSONLabelledIOStep(t *testing.T) {
	for _, labelled := range []uint64{0, 1, 9, 1 << 40} {
		e := generated(1)[0]
		e.IOStep, e.LabelledIOStep = 1, labelled
		want, err := json.Marshal(&e)
		if err != nil {
			t.Fatal(err)
		}
		got, err := provenance.AppendExecJSON(nil, &e)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("labelled_io_step %d: AppendExecJSON differs from json.Marshal:\n got %s\nwant %s", labelled, got, want)
		}
		if has := bytes.Contains(got, []byte(`"io_step_tend":`)) && bytes.Contains(got, []byte(`"labelled_io_step":`)); has != (labelled != 0) {
			t.Errorf("labelled_io_step %d: written %v", labelled, has)
		}
		var back provenance.Exec
		if err := provenance.DecodeExec(got, &back); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(back, e) {
			t.Errorf("labelled_io_step %d: decoded %+v, want %+v", labelled, back.LabelledIOStep, e.LabelledIOStep)
		}
	}
}
