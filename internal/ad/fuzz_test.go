package ad

import (
	"context"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/frame"
)

// FuzzBuilder feeds arbitrary event sequences (entries and exits on a few
// threads, counters, comm, GPU metadata, across steps) to every algorithm:
// nothing may panic, and every entry ends as exactly one execution.
func FuzzBuilder(f *testing.F) {
	f.Add([]byte{0, 1, 10, 4, 1, 5, 8, 3, 2, 2, 9, 1, 0, 0, 0, 7})
	f.Add([]byte{0x10, 0x11, 0x12, 0x13, 0x90, 0x91, 0x92, 0x93, 0xff, 0x00, 0x41, 0x52})
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, algo := range []string{SSTD, HBOS, COPOD} {
			d, err := New(Config{Algorithm: algo, Window: 2, ByCallPath: len(data)%2 == 0, MaxPendingSteps: 2, NormalRate: 0.5})
			if err != nil {
				t.Fatal(err)
			}
			var fr frame.Frame
			fr.Funcs = []frame.Name{{ID: 0, Name: "f0"}, {ID: 1, Name: "f1"}, {ID: 2, Name: "f2"}, {ID: 3, Name: "f3"},
				{ID: 4, Name: "f4"}, {ID: 5, Name: "f5"}, {ID: 6, Name: "f6"}, {ID: 7, Name: "f7"}}
			fr.Counters = []frame.Name{{ID: 0, Name: "c0"}, {ID: 1, Name: CorrelationCounter}}
			fr.Metadata = []frame.Meta{{Tid: 3, Key: "CUDA Stream", Value: "1"}}
			ts := map[uint32]uint64{}
			var entries uint64
			step := uint64(0)
			flush := func() {
				fr.Step = step
				if err := d.Process(context.Background(), &fr); err != nil {
					t.Fatal(err)
				}
				step++
				fr.Reset()
			}
			for i := 0; i+1 < len(data); i += 2 {
				b, c := data[i], data[i+1]
				tid := uint32(b & 3)
				ts[tid] += uint64(c)
				switch b >> 5 {
				case 0, 1, 2:
					fr.Events = append(fr.Events, frame.FuncEvent{Tid: tid, Kind: frame.Entry, FID: uint32(c & 7), TS: ts[tid]})
					entries++
				case 3, 4:
					fr.Events = append(fr.Events, frame.FuncEvent{Tid: tid, Kind: frame.Exit, FID: uint32(c & 7), TS: ts[tid]})
				case 5:
					fr.CounterEvents = append(fr.CounterEvents, frame.CounterEvent{Tid: tid, CID: uint32(b>>2) & 1, Value: uint64(c & 3), TS: ts[tid]})
				case 6:
					fr.Comms = append(fr.Comms, frame.CommEvent{Tid: tid, Kind: frame.CommKind(c & 1), Partner: uint32(c), Bytes: uint64(c), TS: ts[tid]})
				default:
					flush()
				}
			}
			flush()
			if err := d.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			s := d.Stats()
			if s.Executions != entries {
				t.Fatalf("%s: %d entries became %d executions (%+v)", algo, entries, s.Executions, s)
			}
			_ = d.Callstacks()
			_ = d.Profiles(true)
		}
	})
}

// FuzzProcessBinary decodes arbitrary bytes as a binary frame and, when they
// decode, processes them: bad frames are rejected with an error, never a panic.
func FuzzProcessBinary(f *testing.F) {
	good := frame.AppendBinary(nil, &frame.Frame{Step: 1, Funcs: []frame.Name{{ID: 1, Name: "f"}},
		Events: []frame.FuncEvent{{Tid: 0, Kind: frame.Entry, FID: 1, TS: 5}, {Tid: 0, Kind: frame.Exit, FID: 1, TS: 9}}})
	f.Add(good)
	f.Add([]byte("garbage"))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := New(Config{Algorithm: HBOS})
		if err != nil {
			t.Fatal(err)
		}
		var fr frame.Frame
		if err := frame.DecodeMessage(data, &fr); err != nil {
			return
		}
		_ = d.Process(context.Background(), &fr)
		if err := d.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}
