package instrument

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kipimo-hpc/kipimo/internal/frame"
	"github.com/kipimo-hpc/kipimo/internal/mpitest"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
)

// The library is built once per test binary, into a cache of its own.
var (
	libOnce  sync.Once
	libBuilt *Library
	libErr   error
	libCache string
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kipimo-lib-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	libCache = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// requireMPI skips a test that needs an MPI installation (failing in CI
// instead) and holds the machine's MPI test lock until it ends.
func requireMPI(t testing.TB) {
	t.Helper()
	mpitest.Require(t, "mpicc", "mpirun")
	mpitest.Lock(t)
}

// library builds the event library (with the MPI wrappers when mpicc is
// there) or skips the test when there is no C compiler.
func library(t testing.TB) *Library {
	t.Helper()
	libOnce.Do(func() {
		mpicc := os.Getenv("MPICC")
		if mpicc == "" {
			mpicc = "mpicc"
		}
		_, mpiErr := exec.LookPath(mpicc)
		libBuilt, libErr = Build(context.Background(), BuildOptions{CacheDir: libCache, MPI: mpiErr == nil})
	})
	if errors.Is(libErr, ErrNoCompiler) {
		t.Skip(libErr)
	}
	if libErr != nil {
		t.Fatal(libErr)
	}
	return libBuilt
}

// compileProgram builds testdata/src with compiler instrumentation and the
// library's API; with mpi it uses mpicc and OpenMP.
func compileProgram(t testing.TB, lib *Library, src string, mpi bool) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), strings.TrimSuffix(src, ".c"))
	cc, args := "cc", []string{"-O1", "-g"}
	if mpi {
		cc = "mpicc"
		args = append(args, "-fopenmp")
	}
	args = append(args, strings.Fields(lib.CFlags())...)
	args = append(args, filepath.Join("testdata", src), "-o", out)
	args = append(args, strings.Fields(lib.LDFlags())...)
	if b, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", cc, strings.Join(args, " "), err, b)
	}
	return out
}

// startNATS starts an embedded NATS server on a free loopback port.
func startNATS(t testing.TB) *natsx.Server {
	t.Helper()
	cfg := natsx.DefaultServerConfig(t.TempDir())
	cfg.JetStream = false
	s, err := natsx.StartServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// stream is what a test received of one rank's frames, rebuilt into
// executions the way a detector would: call counts, parents, comm events.
type stream struct {
	names    map[uint32]string
	counters map[uint32]string
	frames   int
	steps    []uint64
	calls    map[string]int            // calls streamed and summarised
	parents  map[string]map[string]int // function -> parent -> count
	// summarised are the hot leaf calls the frames' summary counters
	// reported, by function; droppedCalls the calls dropped whole.
	summarised   map[string]int
	droppedCalls map[string]int
	threads      map[uint32]bool
	comms        []frame.CommEvent
	values       map[string][]uint64 // counter name -> values
	metadata     map[string]string
	// execs are the completed executions: function, tid, entry, exit (µs).
	execs    []execution
	open     map[uint32][]openExec
	mismatch int
	// unnamed counts events whose function id had no name yet; used the
	// ids seen in events.
	unnamed int
	used    map[uint32]bool
	eos     bool
	dropped string // last Kipimo-Source-Dropped header seen
}

type execution struct {
	fn          string
	tid         uint32
	entry, exit uint64
}

type openExec struct {
	fid   uint32
	entry uint64
}

func newStream() *stream {
	return &stream{
		names: map[uint32]string{}, counters: map[uint32]string{}, calls: map[string]int{},
		parents: map[string]map[string]int{}, threads: map[uint32]bool{}, values: map[string][]uint64{},
		metadata: map[string]string{}, open: map[uint32][]openExec{}, used: map[uint32]bool{},
		summarised: map[string]int{}, droppedCalls: map[string]int{},
	}
}

func (s *stream) add(t testing.TB, f *frame.Frame) {
	s.frames++
	s.steps = append(s.steps, f.Step)
	for _, n := range f.Funcs {
		s.names[n.ID] = n.Name
	}
	for _, n := range f.Counters {
		s.counters[n.ID] = n.Name
	}
	for _, m := range f.Metadata {
		s.metadata[m.Key] = m.Value
	}
	for _, e := range f.Events {
		s.threads[e.Tid] = true
		name, ok := s.names[e.FID]
		if !ok {
			s.unnamed++
		}
		s.used[e.FID] = true
		st := s.open[e.Tid]
		if e.Kind == frame.Entry {
			parent := ""
			if len(st) > 0 {
				parent = s.names[st[len(st)-1].fid]
			}
			if s.parents[name] == nil {
				s.parents[name] = map[string]int{}
			}
			s.parents[name][parent]++
			s.open[e.Tid] = append(st, openExec{e.FID, e.TS})
			continue
		}
		if len(st) == 0 || st[len(st)-1].fid != e.FID {
			s.mismatch++
			continue
		}
		top := st[len(st)-1]
		s.open[e.Tid] = st[:len(st)-1]
		s.calls[name]++
		s.execs = append(s.execs, execution{name, e.Tid, top.entry, e.TS})
	}
	for _, c := range f.CounterEvents {
		name := s.counters[c.CID]
		s.values[name] = append(s.values[name], c.Value)
		if path, ok := strings.CutPrefix(name, "Kipimo Summary Calls: "); ok {
			fns := strings.Split(path, " => ")
			fn, parent := fns[len(fns)-1], ""
			if len(fns) > 1 {
				parent = fns[len(fns)-2]
			}
			if s.parents[fn] == nil {
				s.parents[fn] = map[string]int{}
			}
			s.parents[fn][parent] += int(c.Value)
			s.calls[fn] += int(c.Value)
			s.summarised[fn] += int(c.Value)
		}
		if fn, ok := strings.CutPrefix(name, "Kipimo Dropped Calls: "); ok {
			s.droppedCalls[fn] += int(c.Value)
		}
	}
	s.comms = append(s.comms, f.Comms...)
}

// collector subscribes to every frame of a run and sorts them by rank.
type collector struct {
	mu      sync.Mutex
	t       testing.TB
	ranks   map[uint32]*stream
	bad     []error
	sub     *nats.Subscription
	arrived chan struct{}
}

func collect(t testing.TB, nc *nats.Conn, run string) *collector {
	t.Helper()
	c := &collector{t: t, ranks: map[uint32]*stream{}, arrived: make(chan struct{}, 1)}
	sub, err := nc.Subscribe(natsx.Subjects{Run: run}.AllFrames(), func(m *nats.Msg) {
		c.mu.Lock()
		defer c.mu.Unlock()
		var pid, rank uint32
		if _, err := fmt.Sscanf(m.Subject[strings.Index(m.Subject, ".frames.")+8:], "%d.%d", &pid, &rank); err != nil {
			c.bad = append(c.bad, fmt.Errorf("subject %s: %w", m.Subject, err))
			return
		}
		s := c.ranks[rank]
		if s == nil {
			s = newStream()
			c.ranks[rank] = s
		}
		if d := m.Header.Get("Kipimo-Source-Dropped"); d != "" {
			s.dropped = d
		}
		if m.Header.Get("Kipimo-End-Of-Stream") != "" {
			s.eos = true
			return
		}
		var f frame.Frame
		n, err := frame.DecodeBinary(m.Data, &f)
		if err != nil || n != len(m.Data) {
			c.bad = append(c.bad, fmt.Errorf("frame of rank %d: %d of %d bytes: %v", rank, n, len(m.Data), err))
			return
		}
		if f.Rank != rank {
			c.bad = append(c.bad, fmt.Errorf("frame of rank %d on the subject of rank %d", f.Rank, rank))
		}
		s.add(t, &f)
		select {
		case c.arrived <- struct{}{}:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	c.sub = sub
	return c
}

// waitEOS waits until n ranks have ended their streams.
func (c *collector) waitEOS(t testing.TB, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		c.mu.Lock()
		done := 0
		for _, s := range c.ranks {
			if s.eos {
				done++
			}
		}
		c.mu.Unlock()
		if done >= n {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%d ranks did not end their streams within 20s", n)
}

func connect(t testing.TB, s *natsx.Server) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// runProgram runs a program under the library and returns its output and
// exit status.
func runProgram(t testing.TB, env []string, name string, args ...string) (stdout string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("%s: %v\n%s", name, err, errb.String())
	}
	if errb.Len() > 0 {
		t.Logf("%s stderr:\n%s", name, errb.String())
	}
	return out.String(), code
}

func TestSerialProgramStreamsEveryCall(t *testing.T) {
	lib := library(t)
	prog := compileProgram(t, lib, "serial.c", false)
	ns := startNATS(t)
	nc := connect(t, ns)
	const run = "serial"
	c := collect(t, nc, run)
	status := t.TempDir()
	const n = 5000
	env := lib.Environ(Env{NATSURL: ns.ClientURL(), Run: run, Period: 20 * time.Millisecond, StatusDir: status}, os.Environ())
	plain, plainCode := runProgram(t, append(os.Environ(), "KIPIMO_DISABLE=1"), prog, fmt.Sprint(n))
	out, code := runProgram(t, env, prog, fmt.Sprint(n))
	if out != plain || code != plainCode || code != 3 {
		t.Errorf("under Kipimo: output %q status %d; alone: %q status %d (want status 3)", out, code, plain, plainCode)
	}
	c.waitEOS(t, 1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.bad) > 0 {
		t.Fatal(c.bad)
	}
	s := c.ranks[0]
	want := map[string]int{"main": 1, "outer": n, "inner": 2 * n, "marked": n / 10}
	for fn, w := range want {
		if s.calls[fn] != w {
			t.Errorf("%s: %d calls, want %d", fn, s.calls[fn], w)
		}
	}
	wantParents := map[string]string{"outer": "main", "inner": "outer", "marked": "outer", "main": ""}
	for fn, p := range wantParents {
		if len(s.parents[fn]) != 1 || s.parents[fn][p] == 0 {
			t.Errorf("%s: parents %v, want only %q", fn, s.parents[fn], p)
		}
	}
	if got := len(s.values["progress"]); got != n/10 {
		t.Errorf("counter progress: %d values, want %d", got, n/10)
	}
	for i, v := range s.values["progress"] {
		if v != uint64(10*i) {
			t.Errorf("progress value %d = %d, want %d", i, v, 10*i)
			break
		}
	}
	if s.metadata["test key"] != "test value" || s.metadata["Executable"] != prog {
		t.Errorf("metadata %v: want the API's key and the executable", s.metadata)
	}
	if len(s.values["CPU Time (us)"]) != s.frames || len(s.values["Memory Footprint (VmRSS) (KB)"]) != s.frames {
		t.Errorf("process counters: %d CPU and %d RSS values in %d frames", len(s.values["CPU Time (us)"]), len(s.values["Memory Footprint (VmRSS) (KB)"]), s.frames)
	}
	for i, st := range s.steps {
		if st != uint64(i) {
			t.Fatalf("io_steps %v: want 0, 1, 2...", s.steps)
		}
	}
	if s.mismatch != 0 || s.unnamed != 0 {
		t.Errorf("%d exits did not match their entries, %d events came before their function's name", s.mismatch, s.unnamed)
	}
	for _, e := range s.execs {
		if e.exit < e.entry {
			t.Fatalf("%s exits at %d before its entry at %d", e.fn, e.exit, e.entry)
		}
	}
	st, err := ReadStatus(status)
	if err != nil || len(st) != 1 {
		t.Fatalf("status: %v %v", st, err)
	}
	if st[0].FramesSent != uint64(s.frames) || st[0].FramesDropped != 0 || st[0].EventsDropped != 0 {
		t.Errorf("status %+v: want %d frames sent, none dropped", st[0], s.frames)
	}
}

func TestBuildErrors(t *testing.T) {
	if _, err := exec.LookPath("cc"); err != nil {
		t.Skip("no C compiler")
	}
	tests := []struct {
		name string
		opts BuildOptions
		want error
	}{
		{"no C compiler", BuildOptions{CC: "/nonexistent/cc"}, ErrNoCompiler},
		{"no mpicc", BuildOptions{MPICC: "/nonexistent/mpicc", MPI: true}, ErrNoMPI},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.CacheDir = t.TempDir()
			_, err := Build(context.Background(), tc.opts)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), "apt-get install") {
				t.Errorf("error %v, want %v saying what to install", err, tc.want)
			}
		})
	}
}

func TestEnviron(t *testing.T) {
	lib := &Library{Dir: "/lib", Core: "/lib/libkipimo.so", MPI: "/lib/libkipimo-mpi.so"}
	got := lib.Environ(Env{
		NATSURL: "nats://127.0.0.1:4222", Run: "r1", PID: 2, Period: 250 * time.Millisecond,
		Exclude: []string{"std::*", "*_omp_fn*"}, Inject: []Injection{{Func: "MPI_Send", Prob: 0.004, Delay: 25 * time.Millisecond}, {Func: "compute", Prob: 1, Delay: time.Millisecond, Ranks: []RankRange{{2, 2}, {4, 6}}}}, Seed: 9,
	}, []string{"PATH=/bin", "LD_PRELOAD=/opt/other.so", "KIPIMO_RUN=stale"})
	want := []string{
		"PATH=/bin", "KIPIMO_EXCLUDE=std::*,*_omp_fn*", "KIPIMO_INJECT=MPI_Send:0.004:25000us,compute:1:1000us@2+4-6", "KIPIMO_NATS=nats://127.0.0.1:4222",
		"KIPIMO_PERIOD=250000us", "KIPIMO_PID=2", "KIPIMO_RUN=r1", "KIPIMO_SEED=9",
		"LD_PRELOAD=/lib/libkipimo-mpi.so /lib/libkipimo.so /opt/other.so",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("Environ:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
