package cli

import (
	"bufio"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// queryExecs runs a query printing JSON lines and decodes its records.
func queryExecs(t *testing.T, args ...string) []provenance.Exec {
	t.Helper()
	out, errOut, err := runCLI(t, append([]string{"query", "--json"}, args...)...)
	if err != nil {
		t.Fatalf("kipimo query %s: %v\n%s", strings.Join(args, " "), err, errOut)
	}
	var es []provenance.Exec
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var e provenance.Exec
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("kipimo query %s: line %q: %v", strings.Join(args, " "), sc.Text(), err)
		}
		es = append(es, e)
	}
	return es
}

// A run whose young models make executions wait for a label
// (--settle-count): every stored record's io_step is the one it ran in (its
// exit inside that step's window, its entry too when it did not span
// steps), labelled_io_step the later one it was labelled in; query list
// --step-min/--step-max select by the former and query show says both.
func TestQueryStepsAreWhereRecordsRan(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole pipeline")
	}
	out := t.TempDir()
	if _, errOut, err := runCLI(t, "run", "--out", out, "--run", "steps", "--ranks", "2", "--steps", "10",
		"--events-per-step", "4000", "--settle-count", "1000", "--json"); err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	store := filepath.Join(out, "steps", "provenance.db")
	all := queryExecs(t, "list", "--store", store, "--labels", "all", "--limit", "100000")
	var late *provenance.Exec
	for i := range all {
		e := &all[i]
		if e.Exit < e.IOStepTStart || e.Exit > e.IOStepTEnd {
			t.Errorf("%s: exit %d outside its io_step %d's window %d..%d", e.EventID, e.Exit, e.IOStep, e.IOStepTStart, e.IOStepTEnd)
		}
		if _, entryStep, _, _ := provenance.ParseEventID(e.EventID); entryStep == e.IOStep && e.Entry < e.IOStepTStart {
			t.Errorf("%s: entry %d before its io_step %d's window %d..%d", e.EventID, e.Entry, e.IOStep, e.IOStepTStart, e.IOStepTEnd)
		}
		if e.LabelledIOStep < e.IOStep {
			t.Errorf("%s: labelled in io_step %d, before it ran (%d)", e.EventID, e.LabelledIOStep, e.IOStep)
		}
		if e.LabelledIOStep > e.IOStep && late == nil {
			late = e
		}
	}
	if late == nil {
		t.Fatalf("none of %d anomalies was labelled after the io_step it ran in: the test needs one", len(all))
	}
	has := func(es []provenance.Exec) bool {
		for _, e := range es {
			if e.EventID == late.EventID && e.PID == late.PID {
				return true
			}
		}
		return false
	}
	ran, labelled := fmt.Sprint(late.IOStep), fmt.Sprint(late.LabelledIOStep)
	if es := queryExecs(t, "list", "--store", store, "--labels", "all", "--step-min", ran, "--step-max", ran); !has(es) {
		t.Errorf("--step-min %s --step-max %s: %d records without %s, which ran in io_step %s", ran, ran, len(es), late.EventID, ran)
	}
	if es := queryExecs(t, "list", "--store", store, "--labels", "all", "--step-min", labelled); has(es) {
		t.Errorf("--step-min %s lists %s, which ran in io_step %s (labelled in %s)", labelled, late.EventID, ran, labelled)
	}
	show, errOut, err := runCLI(t, "query", "show", "--store", store, late.EventID)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	for _, want := range []string{"when: io_step " + ran + " [", "labelled in io_step " + labelled} {
		if !strings.Contains(show, want) {
			t.Errorf("query show %s does not say %q:\n%s", late.EventID, want, show)
		}
	}
}
