package cli

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/provdb"
	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
)

// timelineStore writes a store of 3 ranks × 3 io_steps: on each rank,
// main spans the run; in each step a solve call holds a send and a
// receive (to and from the next rank), and solve is an anomaly whose
// record holds them in its window. Steps are 1000 µs apart and do not
// overlap.
func timelineStore(t *testing.T) string {
	t.Helper()
	const b = 1_700_000_000_000_000
	var es []provenance.Exec
	for r := uint32(0); r < 3; r++ {
		main := provenance.CallFrame{EventID: fmt.Sprintf("%d:0:0", r), Func: "main", Entry: b, Exit: b + 3000}
		for s := uint64(0); s < 3; s++ {
			id := func(i int) string { return fmt.Sprintf("%d:%d:%d", r, s, i) }
			t0 := b + s*1000 + 100
			next, prev := (r+1)%3, (r+2)%3
			e := provenance.Exec{
				PID: 0, RID: r, TID: 0, EventID: id(10), Func: "solve", Entry: t0, Exit: t0 + 600, IOStep: s, OutlierScore: 5,
				CallStack: []provenance.CallFrame{{EventID: id(10), Func: "solve", Entry: t0, Exit: t0 + 600, IsAnomaly: true}, main},
				EventWindow: provenance.EventWindow{
					ExecWindow: []provenance.WindowExec{
						{EventID: id(10), ParentEventID: main.EventID, Func: "solve", Entry: t0, Exit: t0 + 600, IsAnomaly: true},
						{EventID: id(11), ParentEventID: id(10), Func: "MPI_Send", Entry: t0 + 10, Exit: t0 + 20},
						{EventID: id(12), ParentEventID: id(10), Func: "MPI_Recv", Entry: t0 + 30, Exit: t0 + 500},
					},
					CommWindow: []provenance.CommRecord{
						{Type: "SEND", RID: r, Src: r, Tar: next, Tag: 1, Bytes: 8, Timestamp: t0 + 15, ExecdataKey: id(11)},
						{Type: "RECV", RID: r, Src: prev, Tar: r, Tag: 1, Bytes: 8, Timestamp: t0 + 490, ExecdataKey: id(12)},
					},
				},
			}
			es = append(es, e)
		}
	}
	path := filepath.Join(t.TempDir(), "prov.db")
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, path, sqlitestore.Options{Synchronous: "OFF"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Write(ctx, provenance.Batch{Kind: provenance.KindAnomalies, Execs: es}); err != nil {
		t.Fatal(err)
	}
	return path
}

// timelineIDs reads a written timeline (gzipped or not) and returns the
// event ids of its executions and the number of message flows.
func timelineIDs(t *testing.T, path string) (ids []string, flows int) {
	t.Helper()
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	var r io.Reader = fh
	if strings.HasSuffix(path, ".gz") {
		z, err := gzip.NewReader(fh)
		if err != nil {
			t.Fatal(err)
		}
		r = z
	}
	var doc struct {
		TraceEvents []struct {
			Ph      string         `json:"ph"`
			Cat     string         `json:"cat"`
			FlowOut bool           `json:"flow_out"`
			Args    map[string]any `json:"args"`
		} `json:"traceEvents"`
	}
	if err := json.NewDecoder(r).Decode(&doc); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	for _, e := range doc.TraceEvents {
		if e.Ph == "X" && e.Cat == "function" {
			ids = append(ids, e.Args["event_id"].(string))
		}
		if e.FlowOut {
			flows++
		}
	}
	slices.Sort(ids)
	return ids, flows
}

func stepIDs(ranks []int, steps []int) []string {
	var ids []string
	for _, r := range ranks {
		ids = append(ids, fmt.Sprintf("%d:0:0", r))
		for _, s := range steps {
			for _, i := range []int{10, 11, 12} {
				ids = append(ids, fmt.Sprintf("%d:%d:%d", r, s, i))
			}
		}
	}
	slices.Sort(ids)
	return ids
}

func TestExportPerfettoChooses(t *testing.T) {
	store := timelineStore(t)
	ro, err := sqlitestore.Open(context.Background(), store, sqlitestore.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	srv := httptest.NewServer(provdb.NewHTTPHandler(ro, ""))
	defer srv.Close()
	cases := []struct {
		name  string
		args  []string
		ids   []string
		flows int
	}{
		// Ranks 0 and 1 of step 1: 0 sends to 1 (paired); 1's send to 2
		// and 0's receive from 2 have no partner here.
		{"steps and ranks", []string{"--steps", "1", "--ranks", "0-1"}, stepIDs([]int{0, 1}, []int{1}), 1},
		{"steps", []string{"--steps", "0-1"}, stepIDs([]int{0, 1, 2}, []int{0, 1}), 6},
		{"ranks", []string{"--ranks", "2"}, stepIDs([]int{2}, []int{0, 1, 2}), 0},
		// The anomaly of rank 1 in step 2, and what ranks 0 and 2 did
		// meanwhile.
		{"record", []string{"--record", "1:2:10"}, stepIDs([]int{0, 1, 2}, []int{2}), 3},
		{"record and ranks", []string{"--record", "1:2:10", "--ranks", "1,2"}, stepIDs([]int{1, 2}, []int{2}), 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var outs [][]byte
			for _, src := range [][]string{{"--store", store}, {"--url", srv.URL}} {
				out := filepath.Join(t.TempDir(), "t.json.gz")
				var stdout, stderr bytes.Buffer
				root := NewRoot(&stdout, &stderr)
				root.SetArgs(append(append([]string{"export", "perfetto", "--out", out}, src...), c.args...))
				if err := root.Execute(); err != nil {
					t.Fatalf("%v: %v\n%s", src, err, stderr.String())
				}
				if !strings.Contains(stderr.String(), fmt.Sprintf("%d executions", len(c.ids))) {
					t.Errorf("summary %q does not count %d executions", stderr.String(), len(c.ids))
				}
				ids, flows := timelineIDs(t, out)
				if !slices.Equal(ids, c.ids) || flows != c.flows {
					t.Errorf("%v: executions %v and %d flows, want %v and %d", src[0], ids, flows, c.ids, c.flows)
				}
				data, err := os.ReadFile(out)
				if err != nil {
					t.Fatal(err)
				}
				z, err := gzip.NewReader(bytes.NewReader(data))
				if err != nil {
					t.Fatal(err)
				}
				plain, err := io.ReadAll(z)
				if err != nil {
					t.Fatal(err)
				}
				outs = append(outs, plain)
			}
			if !bytes.Equal(outs[0], outs[1]) {
				t.Error("the store and provdb's HTTP API give different timelines")
			}
		})
	}
}

func TestExportPerfettoRefuses(t *testing.T) {
	store := timelineStore(t)
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"nothing chosen", nil, "choose what to export"},
		{"bad steps", []string{"--steps", "3-1"}, "empty"},
		{"bad ranks", []string{"--ranks", "a"}, "--ranks"},
		{"bad record", []string{"--record", "x"}, "--record"},
		{"unknown record", []string{"--record", "9:9:9"}, "--record: record 9:9:9 of program 0"},
		{"no match", []string{"--steps", "7"}, "no records match"},
		{"too many", []string{"--ranks", "0-2", "--max-records", "4"}, "more than 4 records"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			root := NewRoot(&stdout, &stderr)
			root.SetArgs(append([]string{"export", "perfetto", "--store", store, "--out", filepath.Join(t.TempDir(), "t.json")}, c.args...))
			err := root.Execute()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want one saying %q", err, c.want)
			}
		})
	}
}
