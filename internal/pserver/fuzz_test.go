package pserver

import (
	"encoding/json"
	"testing"
)

// FuzzSyncRequest feeds arbitrary bytes to the sync path: it must answer
// every input (with an error for bad ones) and never panic or corrupt the
// state for later requests.
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
	f.Fuzz(func(t *testing.T, data []byte) {
		st := NewState(4)
		req, err := decodeRequest(data)
		if err != nil {
			return
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
		_ = heatMap(st, 0)
		_ = funcTable(st)
		_ = topFuncs(st, 3, "severity")
	})
}

// FuzzSnapshot decodes arbitrary snapshot bytes: an error or a usable state,
// never a panic.
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
		_ = heatMap(got, 0)
		_ = topRanks(got, 5, "count")
		_ = funcTable(got)
	})
}
