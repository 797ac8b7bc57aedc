package workload

import (
	"bytes"
	"reflect"
	"testing"
)

// FuzzReadTruth feeds arbitrary bytes to the truth reader: it must return
// records or an error, never panic, and what it reads must survive a
// write/read round trip unchanged.
func FuzzReadTruth(f *testing.F) {
	f.Add([]byte(`{"pid":0,"rank":1,"tid":0,"fid":9,"func":"lj_kernel","io_step":3,"entry":1750000000062387,"exit":1750000000062688,"runtime_exclusive":301,"kind":"slow_call"}` + "\n"))
	f.Add([]byte("\n\n{}\n"))
	f.Add([]byte(`{"pid":-1}`))
	f.Add([]byte(`{"func":"\ud800"}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		recs, err := ReadTruth(bytes.NewReader(in))
		if err != nil {
			return
		}
		var buf bytes.Buffer
		if err := WriteTruth(&buf, recs); err != nil {
			t.Fatal(err)
		}
		back, err := ReadTruth(&buf)
		if err != nil {
			t.Fatalf("re-reading written truth: %v", err)
		}
		if len(recs) == 0 && len(back) == 0 {
			return
		}
		if !reflect.DeepEqual(recs, back) {
			t.Fatalf("round trip changed %+v into %+v", recs, back)
		}
	})
}
