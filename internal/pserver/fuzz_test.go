package pserver

import (
	"encoding/json"
	"testing"
)

// FuzzSyncRequest feeds arbitrary bytes to the sync path (decode, validate,
// apply): it must answer every input (with an error for bad ones) and never
// panic or corrupt the state for later requests: whatever validation lets
// through must leave a state whose replies, snapshot and views encode.
func FuzzSyncRequest(f *testing.F) {
	g := newGenRun(2, 2, 4, 0, 81)
	for _, r := range g.all() {
		b, _ := json.Marshal(r)
		f.Add(b)
	}
	f.Add([]byte(`{"pid":1,"rank":2,"seq":3,"models":[{"key":"f","moments":{"n":1,"mean":2}}]}`))
	f.Add([]byte(`{"seq":1,"models":[{"key":"f","histogram":{"first_edge":0,"bin_width":-1,"counts":[1]}}]}`))
	f.Add([]byte(`{"seq":1,"steps":[{"io_step":18446744073709551615,"funcs":[{"func":"x","count":1}]}]}`))
	f.Add([]byte(`null`))
	f.Add([]byte(poisonNegativeN))
	for _, p := range poisons() {
		f.Add([]byte(p.body))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		st := NewState(4)
		req, err := decodeRequest(data)
		if err != nil {
			return
		}
		if err := req.Validate(); err != nil {
			return // the server refuses it before it reaches the state
		}
		if ok, err := st.Apply(req); err == nil {
			if _, err := json.Marshal(st.Reply(req, ok)); err != nil {
				t.Fatalf("reply does not encode: %v", err)
			}
		}
		// The state still works and still encodes.
		ok := g.reqs[0][0]
		ok.Rank = 77
		if _, err := st.Apply(&ok); err != nil {
			t.Fatalf("valid request after fuzz input: %v", err)
		}
		if _, _, err := encodeState(st); err != nil {
			t.Fatalf("state no longer encodes: %v", err)
		}
		if _, err := json.Marshal(funcTable(st)); err != nil {
			t.Fatalf("function table does not encode: %v", err)
		}
		if _, err := json.Marshal(counterTable(st)); err != nil {
			t.Fatalf("counter table does not encode: %v", err)
		}
		for k, m := range st.Models {
			if _, err := json.Marshal(finiteStats(m.Moments)); err != nil {
				t.Fatalf("final statistics of %q do not encode: %v", k, err)
			}
		}
		_ = heatMap(st, 0)
		_ = funcTable(st)
		_ = topFuncs(st, 3, "severity")
	})
}

// FuzzSnapshot decodes arbitrary snapshot bytes: an error or a usable state
// (once sanitized, as the server loads it) whose views encode, never a
// panic.
func FuzzSnapshot(f *testing.F) {
	st := reference(f, newGenRun(3, 3, 3, 1, 91).all(), 4)
	data, _, _ := encodeState(st)
	f.Add(data)
	f.Add(data[:len(data)/2])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := decodeState(data, 4)
		if err != nil {
			return
		}
		got.sanitize() // as the server does on load
		_ = heatMap(got, 0)
		_ = topRanks(got, 5, "count")
		if _, err := json.Marshal(funcTable(got)); err != nil {
			t.Fatalf("function table of a loaded snapshot does not encode: %v", err)
		}
		if _, err := json.Marshal(counterTable(got)); err != nil {
			t.Fatalf("counter table of a loaded snapshot does not encode: %v", err)
		}
	})
}
