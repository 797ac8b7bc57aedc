package perfetto_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/perfetto"
	"github.com/kipimo-hpc/kipimo/internal/provenance"
)

// fuzzRecords builds records from arbitrary bytes: any times, parents,
// names and messages, consistent or not.
func fuzzRecords(data []byte) []rec {
	next := func() uint64 {
		if len(data) == 0 {
			return 0
		}
		v := uint64(data[0])
		data = data[1:]
		return v
	}
	var rs []rec
	for len(data) > 0 && len(rs) < 16 {
		e := provenance.Exec{RID: uint32(next() % 3), TID: uint32(next() % 2), Entry: next() * 7, IOStep: next() % 3}
		e.Exit = e.Entry + next()
		e.EventID = fmt.Sprintf("%d:%d:%d", e.RID, e.IOStep, next()%8)
		e.Func = []string{"a", "b", "\"q\"", "MPI_Send"}[next()%4]
		if next()%5 == 0 {
			e.IsGPUEvent, e.GPULocation = true, &provenance.GPULocation{Stream: uint32(next())}
			e.GPUParent = &provenance.GPUParent{EventID: fmt.Sprintf("%d:0:%d", e.RID, next()%8), TID: 0}
		}
		for n := next() % 4; n > 0; n-- {
			w := provenance.WindowExec{EventID: fmt.Sprintf("%d:%d:%d", e.RID, next()%3, next()%8), ParentEventID: fmt.Sprintf("%d:0:%d", e.RID, next()%8),
				Func: "w", Entry: next() * 7}
			if next()%4 != 0 {
				w.Exit = w.Entry + next()
			}
			e.EventWindow.ExecWindow = append(e.EventWindow.ExecWindow, w)
		}
		for n := next() % 3; n > 0; n-- {
			typ := "SEND"
			if next()%2 == 0 {
				typ = "RECV"
			}
			e.EventWindow.CommWindow = append(e.EventWindow.CommWindow, provenance.CommRecord{Type: typ, RID: e.RID, TID: e.TID,
				Src: uint32(next() % 3), Tar: uint32(next() % 3), Tag: uint32(next() % 2), Bytes: next() % 2, Timestamp: next() * 7, ExecdataKey: e.EventID})
		}
		if next()%3 == 0 {
			e.CounterEvents = append(e.CounterEvents, provenance.CounterEvent{CounterName: "c", CounterValue: next(), RID: e.RID, TID: e.TID, TS: next() * 7})
		}
		for n := next() % 3; n > 0; n-- {
			e.CallStack = append(e.CallStack, provenance.CallFrame{EventID: fmt.Sprintf("%d:0:%d", e.RID, next()%8), Func: "s", Entry: next() * 7, Exit: next() * 9})
		}
		kind := provenance.KindAnomalies
		if next()%2 == 0 {
			kind = provenance.KindNormalExecs
		}
		rs = append(rs, rec{kind, e})
	}
	return rs
}

// Whatever the records, the timeline is valid JSON in the object format,
// every slice has a non-negative duration, each execution is written once
// and each flow has one start and one end.
func FuzzTimeline(f *testing.F) {
	f.Add([]byte("\x01\x00\x10\x01\x05\x02\x00\x03\x01\x01\x00\x02\x05\x01\x00\x01\x01\x00\x00\x04"))
	f.Add(bytes.Repeat([]byte{7, 3, 200, 1, 9, 5, 4, 2, 2, 0, 1, 1, 6}, 12))
	f.Fuzz(func(t *testing.T, data []byte) {
		rs := fuzzRecords(data)
		for _, opt := range []perfetto.Options{{}, {From: 100, To: 900}} {
			tl := perfetto.New(opt)
			for i := range rs {
				tl.Add(rs[i].kind, &rs[i].e)
			}
			var buf bytes.Buffer
			st, err := tl.Write(&buf)
			if err != nil {
				t.Fatal(err)
			}
			var doc struct {
				TraceEvents []struct {
					Ph      string         `json:"ph"`
					Cat     string         `json:"cat"`
					Pid     int64          `json:"pid"`
					Tid     int64          `json:"tid"`
					Dur     *float64       `json:"dur"`
					BindID  string         `json:"bind_id"`
					FlowOut bool           `json:"flow_out"`
					FlowIn  bool           `json:"flow_in"`
					Args    map[string]any `json:"args"`
				} `json:"traceEvents"`
			}
			if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
				t.Fatalf("not JSON: %v", err)
			}
			if len(doc.TraceEvents) != st.Events {
				t.Fatalf("%d events, stats say %d", len(doc.TraceEvents), st.Events)
			}
			seen := map[string]bool{}
			outs, ins := map[string]int{}, map[string]int{}
			for _, e := range doc.TraceEvents {
				if e.Ph == "X" {
					if e.Dur == nil || *e.Dur < 0 {
						t.Fatalf("slice without a non-negative duration: %+v", e)
					}
					if e.Cat != "message" {
						k := fmt.Sprintf("%d/%d/%v", e.Pid, e.Tid, e.Args["event_id"])
						if seen[k] {
							t.Fatalf("execution %s written twice", k)
						}
						seen[k] = true
					}
				}
				if e.FlowOut {
					outs[e.BindID]++
				}
				if e.FlowIn {
					ins[e.BindID]++
				}
			}
			for id, n := range outs {
				if n != 1 || ins[id] != 1 {
					t.Fatalf("flow %s: %d starts, %d ends", id, n, ins[id])
				}
			}
			if len(ins) != len(outs) || len(seen) != st.Executions {
				t.Fatalf("%d flow ends for %d starts; %d executions, stats say %d", len(ins), len(outs), len(seen), st.Executions)
			}
		}
	})
}
