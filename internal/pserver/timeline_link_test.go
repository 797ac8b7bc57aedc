package pserver

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/provenance"
	"github.com/kipimo-hpc/kipimo/internal/provenance/sqlitestore"
)

// The record view links to the record's timeline (docs/timeline.md): the
// link's target, provdb's /api/v1/timeline under the dashboard's /provdb/,
// answers a Perfetto trace of the record's window.
func TestRecordViewLinksToTimeline(t *testing.T) {
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "prov.db"), sqlitestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	e := provenance.Exec{RID: 2, EventID: "2:1:7", Func: "compute", Entry: 1000, Exit: 1500, IOStep: 1, OutlierScore: 5,
		CallStack: []provenance.CallFrame{{EventID: "2:1:7", Func: "compute", Entry: 1000, Exit: 1500}, {EventID: "2:0:0", Func: "main", Entry: 10, Exit: 9000}},
		EventWindow: provenance.EventWindow{ExecWindow: []provenance.WindowExec{
			{EventID: "2:1:6", ParentEventID: "2:0:0", Func: "MPI_Send", Entry: 900, Exit: 950},
			{EventID: "2:1:7", ParentEventID: "2:0:0", Func: "compute", Entry: 1000, Exit: 1500},
		}}}
	if err := st.Write(ctx, provenance.Batch{Kind: provenance.KindAnomalies, Execs: []provenance.Exec{e}}); err != nil {
		t.Fatal(err)
	}
	d, err := NewStoreDashboard(ctx, st, StoreOptions{Run: "stored"})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(d.Handler())
	defer ts.Close()
	res, err := http.Get(ts.URL + "/app.js")
	if err != nil {
		t.Fatal(err)
	}
	js, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if !strings.Contains(string(js), `provURL("/api/v1/timeline"`) {
		t.Fatal("the record view builds no timeline link")
	}
	res, err = http.Get(ts.URL + "/provdb/api/v1/timeline?record=2%3A1%3A7&pid=0&token=x")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var doc struct {
		TraceEvents []struct {
			Ph   string         `json:"ph"`
			Name string         `json:"name"`
			Args map[string]any `json:"args"`
		} `json:"traceEvents"`
	}
	if err := json.NewDecoder(res.Body).Decode(&doc); err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("the link's target: %d, %v", res.StatusCode, err)
	}
	var names []string
	for _, ev := range doc.TraceEvents {
		if ev.Ph == "X" {
			names = append(names, ev.Name)
		}
	}
	if strings.Join(names, ",") != "main,MPI_Send,compute" {
		t.Errorf("timeline slices %q, want main, MPI_Send, compute", names)
	}
}
