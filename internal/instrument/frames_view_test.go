package instrument

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
)

// frameLog keeps every frame of one process, decoded, in arrival order.
type frameLog struct {
	mu     sync.Mutex
	frames []*frame.Frame
	bad    []error
	eos    bool
}

func logFrames(t *testing.T, nc *nats.Conn, run string) *frameLog {
	t.Helper()
	l := &frameLog{}
	sub, err := nc.Subscribe(natsx.Subjects{Run: run}.AllFrames(), func(m *nats.Msg) {
		l.mu.Lock()
		defer l.mu.Unlock()
		if m.Header.Get("Kipimo-End-Of-Stream") != "" {
			l.eos = true
			return
		}
		f := &frame.Frame{}
		if n, err := frame.DecodeBinary(m.Data, f); err != nil || n != len(m.Data) {
			l.bad = append(l.bad, fmt.Errorf("frame: %d of %d bytes: %v", n, len(m.Data), err))
			return
		}
		l.frames = append(l.frames, f)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return l
}

func (l *frameLog) waitEOS(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		l.mu.Lock()
		eos := l.eos
		l.mu.Unlock()
		if eos {
			return
		}
	}
	t.Fatal("the program's stream did not end within 20s")
}

// devExec is an execution rebuilt from frames with the "Correlation ID"
// and "Device Bytes" counters that belong to it.
type devExec struct {
	fn, parent  string
	tid         uint32
	entry, exit uint64 // µs
	corr, bytes uint64
}

// threadView is what frames say of a process's threads.
type threadView struct {
	execs    []*devExec
	meta     map[uint32]map[string]string
	mismatch int
	open     int               // executions never closed
	dropped  map[string]uint64 // "Kipimo Dropped ..." counters
}

// rebuild turns frames into executions per thread. A counter on a device
// thread (one with "CUDA Stream" metadata) belongs to the execution that
// ends at its time; on a host thread, to the innermost execution entered
// before its µs and not left before it.
func rebuild(frames []*frame.Frame) *threadView {
	v := &threadView{meta: map[uint32]map[string]string{}, dropped: map[string]uint64{}}
	names, counters := map[uint32]string{}, map[uint32]string{}
	open := map[uint32][]*devExec{}
	type sample struct {
		name     string
		tid      uint32
		value, t uint64
	}
	var samples []sample
	for _, f := range frames {
		for _, n := range f.Funcs {
			names[n.ID] = n.Name
		}
		for _, n := range f.Counters {
			counters[n.ID] = n.Name
		}
		for _, m := range f.Metadata {
			if v.meta[m.Tid] == nil {
				v.meta[m.Tid] = map[string]string{}
			}
			v.meta[m.Tid][m.Key] = m.Value
		}
		for _, e := range f.Events {
			st := open[e.Tid]
			if e.Kind == frame.Entry {
				x := &devExec{fn: names[e.FID], tid: e.Tid, entry: e.TS}
				if len(st) > 0 {
					x.parent = st[len(st)-1].fn
				}
				open[e.Tid] = append(st, x)
				continue
			}
			if len(st) == 0 || st[len(st)-1].fn != names[e.FID] {
				v.mismatch++
				continue
			}
			x := st[len(st)-1]
			x.exit = e.TS
			open[e.Tid] = st[:len(st)-1]
			v.execs = append(v.execs, x)
		}
		for _, c := range f.CounterEvents {
			name := counters[c.CID]
			if strings.HasPrefix(name, "Kipimo Dropped") {
				v.dropped[name] += c.Value
			}
			if name == "Correlation ID" || name == "Device Bytes" {
				samples = append(samples, sample{name, c.Tid, c.Value, c.TS})
			}
		}
	}
	for _, st := range open {
		v.open += len(st)
	}
	byTid := map[uint32][]*devExec{}
	for _, x := range v.execs {
		byTid[x.tid] = append(byTid[x.tid], x)
	}
	for _, s := range samples {
		var to *devExec
		device := v.meta[s.tid]["CUDA Stream"] != ""
		for _, x := range byTid[s.tid] {
			// a host call's counter is in a later µs than its entry (the
			// next call may enter in the µs the counter is in)
			if x.entry > s.t || s.t > x.exit || (!device && x.entry == s.t) {
				continue
			}
			switch {
			case to == nil:
				to = x
			case device:
				// the one it ends, and of two, the one without the counter
				if (x.exit == s.t) != (to.exit == s.t) {
					if x.exit == s.t {
						to = x
					}
				} else if s.name == "Correlation ID" && to.corr != 0 && x.corr == 0 || s.name == "Device Bytes" && to.bytes != 0 && x.bytes == 0 {
					to = x
				}
			case x.entry >= to.entry:
				to = x
			}
		}
		switch {
		case to == nil:
		case s.name == "Correlation ID":
			to.corr = s.value
		default:
			to.bytes = s.value
		}
	}
	return v
}
