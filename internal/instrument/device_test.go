package instrument

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
)

// accelFrames keeps every frame of one rank of a run, in arrival order.
type accelFrames struct {
	mu     sync.Mutex
	frames []frame.Frame
	eos    bool
	bad    []error
}

func recordAccelFrames(t testing.TB, nc *nats.Conn, run string) *accelFrames {
	t.Helper()
	l := &accelFrames{}
	sub, err := nc.Subscribe(natsx.Subjects{Run: run}.AllFrames(), func(m *nats.Msg) {
		l.mu.Lock()
		defer l.mu.Unlock()
		if m.Header.Get("Kipimo-End-Of-Stream") != "" {
			l.eos = true
			return
		}
		var f frame.Frame
		if n, err := frame.DecodeBinary(m.Data, &f); err != nil || n != len(m.Data) {
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

// wait waits for the end of the stream and returns the frames.
func (l *accelFrames) wait(t testing.TB) []frame.Frame {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		l.mu.Lock()
		done := l.eos
		l.mu.Unlock()
		if done {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.eos {
		t.Fatal("the stream did not end within 20s")
	}
	if len(l.bad) > 0 {
		t.Fatal(l.bad)
	}
	return l.frames
}

// accelExec is an execution rebuilt from frames, with the counters recorded
// inside it (not inside a call it made), the way the detector attaches them.
type accelExec struct {
	fn          string
	tid         uint32
	entry, exit uint64
	parent      string
	ctr         map[string]uint64
}

// accelView is a rank's stream rebuilt: executions, metadata per thread,
// calls dropped, and the order violations seen.
type accelView struct {
	execs    []accelExec
	meta     map[uint32]map[string]string
	dropped  map[string]uint64
	mismatch int
	// unordered counts events of a thread earlier than the one before them
	// in the same frame.
	unordered int
}

// replayAccel replays frames as the detector does: per thread, a counter at an
// entry's time belongs to the new call, one at an exit's time to the call
// that ends.
func replayAccel(frames []frame.Frame) *accelView {
	v := &accelView{meta: map[uint32]map[string]string{}, dropped: map[string]uint64{}}
	funcs, ctrs := map[uint32]string{}, map[uint32]string{}
	open := map[uint32][]*accelExec{}
	for fi := range frames {
		f := &frames[fi]
		for _, n := range f.Funcs {
			funcs[n.ID] = n.Name
		}
		for _, n := range f.Counters {
			ctrs[n.ID] = n.Name
		}
		for _, m := range f.Metadata {
			if v.meta[m.Tid] == nil {
				v.meta[m.Tid] = map[string]string{}
			}
			v.meta[m.Tid][m.Key] = m.Value
		}
		byTid := map[uint32][]frame.CounterEvent{}
		for _, c := range f.CounterEvents {
			byTid[c.Tid] = append(byTid[c.Tid], c)
		}
		last := map[uint32]uint64{}
		attach := func(tid uint32, ts uint64, incl bool) {
			cs := byTid[tid]
			for len(cs) > 0 && (cs[0].TS < ts || (incl && cs[0].TS == ts)) {
				c := cs[0]
				cs = cs[1:]
				name := ctrs[c.CID]
				if fn, ok := strings.CutPrefix(name, "Kipimo Dropped Calls: "); ok {
					v.dropped[fn] += c.Value
					continue
				}
				if st := open[tid]; len(st) > 0 {
					st[len(st)-1].ctr[name] = c.Value
				}
			}
			byTid[tid] = cs
		}
		for _, e := range f.Events {
			if l, ok := last[e.Tid]; ok && e.TS < l {
				v.unordered++
			}
			last[e.Tid] = e.TS
			st := open[e.Tid]
			if e.Kind == frame.Entry {
				attach(e.Tid, e.TS, false)
				x := &accelExec{fn: funcs[e.FID], tid: e.Tid, entry: e.TS, ctr: map[string]uint64{}}
				if len(st) > 0 {
					x.parent = st[len(st)-1].fn
				}
				open[e.Tid] = append(st, x)
				continue
			}
			attach(e.Tid, e.TS, true)
			if len(st) == 0 || st[len(st)-1].fn != funcs[e.FID] {
				v.mismatch++
				continue
			}
			x := st[len(st)-1]
			open[e.Tid] = st[:len(st)-1]
			x.exit = e.TS
			v.execs = append(v.execs, *x)
		}
		for tid := range byTid {
			attach(tid, ^uint64(0), true)
		}
	}
	sort.SliceStable(v.execs, func(i, j int) bool { return v.execs[i].entry < v.execs[j].entry })
	return v
}

// gpuThreads are the threads whose metadata marks them a queue of runtime,
// by the value of "<runtime> Stream".
func (v *accelView) gpuThreads(runtime string) map[string]uint32 {
	out := map[string]uint32{}
	for tid, m := range v.meta {
		if s, ok := m[runtime+" Stream"]; ok {
			out[s] = tid
		}
	}
	return out
}

// count counts executions of fn on tid (any thread when tid is nil).
func (v *accelView) count(fn string, tid *uint32) int {
	n := 0
	for _, x := range v.execs {
		if x.fn == fn && (tid == nil || x.tid == *tid) {
			n++
		}
	}
	return n
}

// requireDevice skips a test whose runtime is not installed, failing it
// instead when the environment variable req is set (CI).
func requireDevice(t testing.TB, req string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if os.Getenv(req) != "" {
		t.Fatalf("%v (%s is set)", err, req)
	}
	t.Skipf("%v (set %s to fail instead)", err, req)
}

// buildOpenCLProgram compiles testdata/oclprog.c against the system's
// OpenCL, or skips.
func buildOpenCLProgram(t testing.TB) string {
	t.Helper()
	prog := t.TempDir() + "/oclprog"
	b, err := exec.Command("cc", "-O1", "-o", prog, "testdata/oclprog.c", "-lOpenCL").CombinedOutput()
	if err != nil {
		err = fmt.Errorf("build an OpenCL program (Debian: apt-get install ocl-icd-opencl-dev opencl-headers pocl-opencl-icd): %v\n%s", err, b)
	}
	requireDevice(t, "KIPIMO_REQUIRE_OPENCL", err)
	return prog
}

// deviceLibrary builds the library for command, as kipimo run --exec does,
// which finds the program's OpenCL or Kokkos.
func deviceLibrary(t testing.TB, command ...string) *Library {
	t.Helper()
	coreLibrary(t) // skips without a C compiler
	lib, err := Build(context.Background(), BuildOptions{CacheDir: libCache, Command: command})
	if err != nil {
		t.Fatal(err)
	}
	return lib
}

// The OpenCL program of testdata/oclprog.c, unmodified and preloaded with
// the OpenCL interposer: every command it enqueues arrives once as a device
// execution on the virtual thread of its queue (queue A's commands on one,
// queue B's on the other), each linked by its correlation id to the one
// host call of the right name that launched it, with its bytes; the durations
// agree with the program's own profiling reading to the µs; every host call
// is an execution; and the program's output and exit status are those of
// its run without the library.
func TestOpenCLProgramDeviceActivity(t *testing.T) {
	prog := buildOpenCLProgram(t)
	const iters, elems = 25, 4096
	const bytes = elems * 4
	args := []string{fmt.Sprint(iters), fmt.Sprint(elems)}
	plain, code := runProgram(t, os.Environ(), prog, args...)
	if code == 2 {
		requireDevice(t, "KIPIMO_REQUIRE_OPENCL", fmt.Errorf("no OpenCL platform runs the program (Debian: apt-get install pocl-opencl-icd)"))
	}
	if code != 0 {
		t.Fatalf("alone: status %d\n%s", code, plain)
	}
	lib := deviceLibrary(t, prog)
	if !lib.UseOpenCL || lib.UseKokkos {
		t.Fatalf("Build found OpenCL %v and Kokkos %v in %s, want OpenCL only", lib.UseOpenCL, lib.UseKokkos, prog)
	}
	ns := startNATS(t)
	nc := connect(t, ns)
	log := recordAccelFrames(t, nc, "ocl")
	env := lib.Environ(Env{NATSURL: ns.ClientURL(), Run: "ocl", Period: 20 * time.Millisecond}, os.Environ())
	out, code := runProgram(t, env, prog, args...)
	if code != 0 {
		t.Fatalf("under the library: status %d\n%s", code, out)
	}
	v := replayAccel(log.wait(t))
	if v.mismatch != 0 || v.unordered != 0 || len(v.dropped) != 0 {
		t.Errorf("%d mismatched exits, %d events out of order, dropped %v", v.mismatch, v.unordered, v.dropped)
	}

	// the program's results and its own profiling readings
	var prof [][3]string
	result := func(s string) string {
		var r string
		for _, l := range strings.Split(s, "\n") {
			if strings.HasPrefix(l, "result ") {
				r = l
			}
		}
		return r
	}
	if result(out) == "" || result(out) != result(plain) {
		t.Errorf("result under the library %q, alone %q", result(out), result(plain))
	}
	for _, l := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(l, "prof "); ok {
			i := strings.LastIndexByte(rest, ' ')
			j := strings.LastIndexByte(rest[:i], ' ')
			prof = append(prof, [3]string{rest[:j], rest[j+1 : i], rest[i+1:]})
		}
	}
	if len(prof) != 3*iters {
		t.Fatalf("%d profiling lines, want %d", len(prof), 3*iters)
	}

	host := map[string]int{
		"clEnqueueWriteBuffer": 2*iters + 1, "clEnqueueNDRangeKernel": 2 * iters, "clEnqueueReadBuffer": iters + 1,
		"clEnqueueCopyBuffer": iters, "clEnqueueFillBuffer": iters, "clWaitForEvents": iters,
		"clEnqueueMapBuffer": 1, "clEnqueueUnmapMemObject": 1, "clFinish": 2,
	}
	main := uint32(0) // the program's one thread, the first to record
	for fn, n := range host {
		if got := v.count(fn, &main); got != n {
			t.Errorf("%d executions of %s on thread 0, the program calls it %d times", got, fn, n)
		}
	}
	queues := v.gpuThreads("OpenCL")
	if len(queues) != 2 {
		t.Fatalf("OpenCL queue threads %v, want 2 (metadata %v)", queues, v.meta)
	}
	qa, qb := queues["0"], queues["1"]
	for _, tid := range []uint32{qa, qb} {
		if v.meta[tid]["OpenCL Device"] != "0" || v.meta[tid]["OpenCL Context"] != "0" {
			t.Errorf("queue thread %d: metadata %v", tid, v.meta[tid])
		}
	}
	device := []struct {
		fn       string
		tid      uint32
		n        int
		bytes    uint64
		launcher string
	}{
		{"OpenCL Write Buffer", qa, 2 * iters, bytes, "clEnqueueWriteBuffer"},
		{"vadd", qa, iters, 0, "clEnqueueNDRangeKernel"},
		{"OpenCL Read Buffer", qa, iters, bytes, "clEnqueueReadBuffer"},
		{"OpenCL Map Buffer", qa, 1, bytes, "clEnqueueMapBuffer"},
		{"OpenCL Unmap", qa, 1, 0, "clEnqueueUnmapMemObject"},
		{"OpenCL Write Buffer", qb, 1, bytes, "clEnqueueWriteBuffer"},
		{"scale", qb, iters, 0, "clEnqueueNDRangeKernel"},
		{"OpenCL Copy Buffer", qb, iters, bytes, "clEnqueueCopyBuffer"},
		{"OpenCL Fill Buffer", qb, iters, bytes / 2, "clEnqueueFillBuffer"},
		{"OpenCL Read Buffer", qb, 1, bytes, "clEnqueueReadBuffer"},
	}
	onDevice := 0
	for _, d := range device {
		if got := v.count(d.fn, &d.tid); got != d.n {
			t.Errorf("%d executions of %s on queue thread %d, want %d", got, d.fn, d.tid, d.n)
		}
		onDevice += d.n
	}
	// correlation: each device execution to exactly one host call
	launches := map[uint64]accelExec{}
	for _, x := range v.execs {
		if c, ok := x.ctr["Correlation ID"]; ok && x.tid != qa && x.tid != qb {
			if _, dup := launches[c]; dup {
				t.Errorf("correlation id %d on two host calls", c)
			}
			launches[c] = x
		}
	}
	seen := map[uint64]bool{}
	n := 0
	for _, x := range v.execs {
		if x.tid != qa && x.tid != qb {
			continue
		}
		n++
		c := x.ctr["Correlation ID"]
		l, ok := launches[c]
		if !ok || seen[c] {
			t.Errorf("device execution %s at %d: correlation id %d, launched by %v, seen before %v", x.fn, x.entry, c, ok, seen[c])
			continue
		}
		seen[c] = true
		for _, d := range device {
			if d.fn == x.fn && d.tid == x.tid {
				if l.fn != d.launcher {
					t.Errorf("%s launched by %s, want %s", x.fn, l.fn, d.launcher)
				}
				if x.ctr["Device Bytes"] != d.bytes {
					t.Errorf("%s: %d bytes, want %d", x.fn, x.ctr["Device Bytes"], d.bytes)
				}
			}
		}
		// the device clock, converted, puts the command after its launch
		if x.entry+50 < l.entry {
			t.Errorf("%s starts at %d, %d µs before its launch by %s", x.fn, x.entry, l.entry-x.entry, l.fn)
		}
	}
	if n != onDevice {
		t.Errorf("%d device executions, want %d", n, onDevice)
	}
	// durations: queue B's commands in order, against the program's readings
	var onB []accelExec
	for _, x := range v.execs {
		if x.tid == qb && (x.fn == "scale" || x.fn == "OpenCL Copy Buffer" || x.fn == "OpenCL Fill Buffer") {
			onB = append(onB, x)
		}
	}
	if len(onB) == len(prof) {
		for i, p := range prof {
			var s, e uint64
			fmt.Sscan(p[1], &s)
			fmt.Sscan(p[2], &e)
			want, got := int64(e/1000)-int64(s/1000), int64(onB[i].exit-onB[i].entry)
			if onB[i].fn != p[0] || got < want-2 || got > want+2 {
				t.Errorf("command %d: %s of %d µs, the program read %s of %d µs", i, onB[i].fn, got, p[0], want)
			}
		}
	}
}

// buildKokkosProgram compiles testdata/kokkosprog.cpp against the system's
// Kokkos (Debian's Trilinos Kokkos), or skips.
func buildKokkosProgram(t testing.TB) string {
	t.Helper()
	prog := t.TempDir() + "/kokkosprog"
	b, err := exec.Command("g++", "-O1", "-std=c++17", "-I/usr/include/trilinos", "-o", prog,
		"testdata/kokkosprog.cpp", "-ltrilinos_kokkoscore", "-ldl").CombinedOutput()
	if err != nil {
		err = fmt.Errorf("build a Kokkos program (Debian: apt-get install g++ libtrilinos-kokkos-dev): %v\n%s", err, b)
	}
	requireDevice(t, "KIPIMO_REQUIRE_KOKKOS", err)
	return prog
}

// The Kokkos program of testdata/kokkosprog.cpp, unmodified, with the
// connector that Build chose for it (through KOKKOS_TOOLS_LIBS and
// KOKKOS_PROFILE_LIBRARY): each of its regions, kernels, deep copies and
// fences is an execution of its label as many times as its loop runs, each
// nested in the region the program opened it in, the deep copies with their
// bytes; and its output is that of its run alone.
func TestKokkosProgramRegions(t *testing.T) {
	prog := buildKokkosProgram(t)
	const iters, elems = 30, 1000
	args := []string{fmt.Sprint(iters), fmt.Sprint(elems)}
	plain, code := runProgram(t, os.Environ(), prog, args...)
	if code != 0 {
		t.Fatalf("alone: status %d\n%s", code, plain)
	}
	lib := deviceLibrary(t, prog)
	if !lib.UseKokkos || lib.UseOpenCL {
		t.Fatalf("Build found Kokkos %v and OpenCL %v in %s, want Kokkos only", lib.UseKokkos, lib.UseOpenCL, prog)
	}
	ns := startNATS(t)
	nc := connect(t, ns)
	log := recordAccelFrames(t, nc, "kokkos")
	env := lib.Environ(Env{NATSURL: ns.ClientURL(), Run: "kokkos", Period: 20 * time.Millisecond}, os.Environ())
	out, code := runProgram(t, env, prog, args...)
	if code != 0 || out != plain {
		t.Fatalf("under the library: status %d, output %q; alone %q", code, out, plain)
	}
	v := replayAccel(log.wait(t))
	if v.mismatch != 0 || v.unordered != 0 || len(v.dropped) != 0 {
		t.Errorf("%d mismatched exits, %d events out of order, dropped %v", v.mismatch, v.unordered, v.dropped)
	}
	want := []struct {
		fn, parent string
		n          int
	}{
		{"outer", "", 1},
		{"step", "outer", iters},
		{"Kokkos::parallel_for fill", "step", iters},
		{"Kokkos::parallel_reduce sum", "step", iters},
		{"Kokkos::parallel_scan prefix", "step", iters},
		{"Kokkos::deep_copy Host <- Host", "step", iters},
		{"Kokkos::fence step fence", "step", iters},
	}
	for _, w := range want {
		n := 0
		for _, x := range v.execs {
			if x.fn != w.fn {
				continue
			}
			n++
			if x.parent != w.parent || x.tid != 0 {
				t.Errorf("%s on thread %d inside %q, want thread 0 inside %q", x.fn, x.tid, x.parent, w.parent)
			}
			if strings.HasPrefix(x.fn, "Kokkos::deep_copy") && x.ctr["Device Bytes"] != elems*8 {
				t.Errorf("%s of %d bytes, want %d", x.fn, x.ctr["Device Bytes"], elems*8)
			}
		}
		if n != w.n {
			t.Errorf("%d executions of %s, the program runs it %d times", n, w.fn, w.n)
		}
	}
	if len(v.meta[0]) == 0 || v.meta[0]["Kokkos Tools Interface"] == "" {
		t.Errorf("no Kokkos Tools metadata: %v", v.meta[0])
	}
}

// Real OpenCL programs nobody here wrote, unmodified, under the library:
// Debian's clpeak (its kernel latency test) and one of CLBlast's tuners. Each
// exits as it does alone, its own report is unchanged (the latency line;
// the tuner's count of configurations whose results match), and every
// kernel it launched arrives once on a queue thread, linked to one of its
// clEnqueueNDRangeKernel calls: as many kernels as those calls.
func TestOpenCLProgramsOfOthers(t *testing.T) {
	for _, tc := range []struct {
		cmd    []string
		report func(out string) string
	}{
		{[]string{"clpeak", "--kernel-latency"}, func(out string) string {
			for _, l := range strings.Split(out, "\n") {
				if strings.Contains(l, "Kernel launch latency") {
					return "latency reported"
				}
			}
			return ""
		}},
		{[]string{"clblast_tuner_xdot", "-n", "16384", "-runs", "1"}, func(out string) string {
			return fmt.Sprintf("%d configurations match", strings.Count(out, "results match"))
		}},
	} {
		t.Run(tc.cmd[0], func(t *testing.T) {
			path, err := exec.LookPath(tc.cmd[0])
			if err != nil {
				err = fmt.Errorf("%s (Debian: apt-get install clpeak clblast-utils pocl-opencl-icd): %w", tc.cmd[0], err)
			}
			requireDevice(t, "KIPIMO_REQUIRE_OPENCL", err)
			// in a directory of its own: the tuner writes its results there
			dir := t.TempDir()
			plain, code := runProgramIn(t, dir, os.Environ(), path, tc.cmd[1:]...)
			if code != 0 || tc.report(plain) == "" {
				requireDevice(t, "KIPIMO_REQUIRE_OPENCL", fmt.Errorf("%s alone: status %d\n%s", tc.cmd[0], code, plain))
			}
			lib := deviceLibrary(t, path)
			if !lib.UseOpenCL {
				t.Fatalf("Build did not find that %s loads OpenCL", path)
			}
			ns := startNATS(t)
			nc := connect(t, ns)
			log := recordAccelFrames(t, nc, "others")
			env := lib.Environ(Env{NATSURL: ns.ClientURL(), Run: "others", Period: 50 * time.Millisecond}, os.Environ())
			out, code := runProgramIn(t, dir, env, path, tc.cmd[1:]...)
			if code != 0 || tc.report(out) != tc.report(plain) {
				t.Fatalf("under the library: status %d, %q; alone %q\n%s", code, tc.report(out), tc.report(plain), out)
			}
			v := replayAccel(log.wait(t))
			if v.mismatch != 0 || v.unordered != 0 || len(v.dropped) != 0 {
				t.Errorf("%d mismatched exits, %d events out of order, dropped %v", v.mismatch, v.unordered, v.dropped)
			}
			queue := map[uint32]bool{}
			for _, tid := range v.gpuThreads("OpenCL") {
				queue[tid] = true
			}
			launches := map[uint64]bool{}
			for _, x := range v.execs {
				if x.fn == "clEnqueueNDRangeKernel" {
					launches[x.ctr["Correlation ID"]] = true
				}
			}
			kernels := 0
			for _, x := range v.execs {
				if !queue[x.tid] || strings.HasPrefix(x.fn, "OpenCL ") {
					continue
				}
				kernels++
				c := x.ctr["Correlation ID"]
				if !launches[c] {
					t.Errorf("kernel %s at %d: correlation id %d is no clEnqueueNDRangeKernel call's, or another kernel's", x.fn, x.entry, c)
				}
				delete(launches, c)
			}
			calls := v.count("clEnqueueNDRangeKernel", nil)
			if kernels == 0 || kernels != calls {
				t.Errorf("%d kernels on %d queue threads, %d clEnqueueNDRangeKernel calls", kernels, len(queue), calls)
			}
			t.Logf("%s: %d kernels on %d queues, %d executions in all", tc.cmd[0], kernels, len(queue), len(v.execs))
		})
	}
}

// With a staging queue of 64 activities (KIPIMO_DEVICE_EVENTS) and cuts
// only when it fills, device activities beyond it are dropped and counted:
// the activities streamed and those counted as dropped add up to the
// commands the program enqueued, and what is streamed is whole and in order.
func TestOpenCLDeviceActivityDropsAreCounted(t *testing.T) {
	prog := buildOpenCLProgram(t)
	const iters = 300
	lib := deviceLibrary(t, prog)
	ns := startNATS(t)
	nc := connect(t, ns)
	log := recordAccelFrames(t, nc, "drops")
	env := lib.Environ(Env{NATSURL: ns.ClientURL(), Run: "drops", Period: 10 * time.Second}, os.Environ())
	out, code := runProgram(t, append(env, "KIPIMO_DEVICE_EVENTS=64"), prog, fmt.Sprint(iters), "1024")
	if code == 2 {
		requireDevice(t, "KIPIMO_REQUIRE_OPENCL", fmt.Errorf("no OpenCL platform runs the program"))
	}
	if code != 0 {
		t.Fatalf("status %d\n%s", code, out)
	}
	v := replayAccel(log.wait(t))
	if v.mismatch != 0 || v.unordered != 0 {
		t.Errorf("%d mismatched exits, %d events out of order", v.mismatch, v.unordered)
	}
	queue := map[uint32]bool{}
	for _, tid := range v.gpuThreads("OpenCL") {
		queue[tid] = true
	}
	streamed := 0
	for _, x := range v.execs {
		if queue[x.tid] {
			streamed++
		}
	}
	var dropped uint64
	for _, n := range v.dropped {
		dropped += n
	}
	// per iteration 4 commands on queue A and 3 on B; 2 on each outside the loop
	if dropped == 0 {
		t.Errorf("nothing dropped: %d device executions streamed through a queue of 64", streamed)
	}
	if want := 7*iters + 4; streamed+int(dropped) != want {
		t.Errorf("%d device executions streamed and %d dropped (%v), the program enqueued %d", streamed, dropped, v.dropped, want)
	}
	t.Logf("%d device executions streamed, %d dropped", streamed, dropped)
}

// Preload loads the OpenCL interposer only for a program that loads
// OpenCL; Environ points Kokkos at the connector only for a Kokkos program
// and leaves a tools library the user chose alone.
func TestDeviceEnviron(t *testing.T) {
	lib := Library{Core: "/l/libkipimo.so", OpenCL: "/l/libkipimo-opencl.so", Kokkos: "/l/libkipimo-kokkos.so"}
	for _, tc := range []struct {
		name           string
		opencl, kokkos bool
		base           []string
		preload, tools string
	}{
		{"neither", false, false, nil, "/l/libkipimo.so", ""},
		{"opencl", true, false, nil, "/l/libkipimo.so /l/libkipimo-opencl.so", ""},
		{"kokkos", false, true, nil, "/l/libkipimo.so", "/l/libkipimo-kokkos.so"},
		{"kokkos with a tool of the user's", false, true, []string{"KOKKOS_PROFILE_LIBRARY=/u/tool.so"}, "/l/libkipimo.so", "/u/tool.so"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := lib
			l.UseOpenCL, l.UseKokkos = tc.opencl, tc.kokkos
			got := map[string]string{}
			for _, kv := range l.Environ(Env{Run: "r"}, tc.base) {
				k, v, _ := strings.Cut(kv, "=")
				got[k] = v
			}
			if got["LD_PRELOAD"] != tc.preload || got[kokkosProfileVar] != tc.tools {
				t.Errorf("LD_PRELOAD %q, %s %q; want %q, %q", got["LD_PRELOAD"], kokkosProfileVar, got[kokkosProfileVar], tc.preload, tc.tools)
			}
			if tc.base == nil && got[kokkosToolsVar] != tc.tools {
				t.Errorf("%s %q, want %q", kokkosToolsVar, got[kokkosToolsVar], tc.tools)
			}
		})
	}
}

// A kernel named in KIPIMO_INJECT is delayed on the device: each delayed
// launch of vadd (the status file's ground truth: thread and entry) is an
// execution of vadd on queue A's thread that took at least the delay, and
// no other execution of vadd did.
func TestOpenCLKernelInjection(t *testing.T) {
	prog := buildOpenCLProgram(t)
	const iters, delay = 150, 3 * time.Millisecond
	lib := deviceLibrary(t, prog)
	ns := startNATS(t)
	nc := connect(t, ns)
	log := recordAccelFrames(t, nc, "inject")
	status := t.TempDir()
	env := lib.Environ(Env{NATSURL: ns.ClientURL(), Run: "inject", Period: 50 * time.Millisecond, StatusDir: status, Seed: 7,
		Inject: []Injection{{Func: "vadd", Prob: 0.05, Delay: delay}}}, os.Environ())
	out, code := runProgram(t, env, prog, fmt.Sprint(iters), "1024")
	if code == 2 {
		requireDevice(t, "KIPIMO_REQUIRE_OPENCL", fmt.Errorf("no OpenCL platform runs the program"))
	}
	if code != 0 {
		t.Fatalf("status %d\n%s", code, out)
	}
	v := replayAccel(log.wait(t))
	st, err := ReadStatus(status)
	if err != nil || len(st) != 1 {
		t.Fatalf("status files: %v %v", st, err)
	}
	qa := v.gpuThreads("OpenCL")["0"]
	injected := map[uint64]bool{}
	for _, in := range st[0].Injected {
		if in.Func != "vadd" || in.Tid != qa || in.DelayUS != uint64(delay.Microseconds()) {
			t.Errorf("injected %+v, want vadd on queue thread %d", in, qa)
		}
		injected[in.Entry] = true
	}
	if len(injected) == 0 {
		t.Fatalf("nothing injected in %d launches at probability 0.05", iters)
	}
	slow := 0
	for _, x := range v.execs {
		if x.fn != "vadd" {
			continue
		}
		long := x.exit-x.entry >= uint64(delay.Microseconds())
		if long != injected[x.entry] {
			t.Errorf("vadd at %d took %d µs; injected: %v", x.entry, x.exit-x.entry, injected[x.entry])
		}
		if long {
			slow++
		}
	}
	if slow != len(injected) {
		t.Errorf("%d executions of vadd took the delay, %d were delayed", slow, len(injected))
	}
	t.Logf("%d of %d launches of vadd delayed", len(injected), iters)
}

// runProgramIn runs a program in dir and returns its output and exit status.
func runProgramIn(t testing.TB, dir string, env []string, name string, args ...string) (stdout string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir, cmd.Env = dir, env
	var out strings.Builder
	cmd.Stdout = &out
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("%s: %v", name, err)
	}
	return out.String(), code
}
