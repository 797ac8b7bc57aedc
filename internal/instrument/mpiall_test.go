package instrument

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kipimo-hpc/kipimo/internal/mpitest"
)

func TestParseDecls(t *testing.T) {
	src := `typedef struct { int a; int b; } MPI_Status;
typedef int (MPI_Copy_function)(int, int);
__attribute__((visibility("default"))) int MPI_Send(const void *buf, int count,
        MPI_Datatype datatype, int dest, int tag, MPI_Comm comm);
int PMPI_Send(const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm)
    __attribute__((visibility ("default")));
extern double MPI_Wtime(void);
static inline int MPI_Inline(int a) { return a; }
__attribute__((visibility("default"))) int MPI_Attr_get(MPI_Comm comm, int keyval, void *attribute_val, int *flag)
            __attribute__((__deprecated__("MPI_Attr_get was deprecated in MPI-2.0; use MPI_Comm_get_attr instead")));
MPI_Aint MPI_Aint_add(MPI_Aint base, MPI_Aint disp);
int MPI_Group_range_incl(MPI_Group group, int n, int ranges[][3], MPI_Group *newgroup);
int foo(int x);
`
	got := parseDecls([]byte(src))
	want := map[string]cDecl{
		"MPI_Send": {ret: "int", name: "MPI_Send",
			params: "const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm"},
		"PMPI_Send": {ret: "int", name: "PMPI_Send",
			params: "const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm"},
		"MPI_Wtime":    {ret: "double", name: "MPI_Wtime", params: "void"},
		"MPI_Attr_get": {ret: "int", name: "MPI_Attr_get", params: "MPI_Comm comm, int keyval, void *attribute_val, int *flag"},
		"MPI_Aint_add": {ret: "MPI_Aint", name: "MPI_Aint_add", params: "MPI_Aint base, MPI_Aint disp"},
		"MPI_Group_range_incl": {ret: "int", name: "MPI_Group_range_incl",
			params: "MPI_Group group, int n, int ranges[][3], MPI_Group *newgroup"},
	}
	if len(got) != len(want) {
		t.Errorf("found %d declarations %v, want %d", len(got), got, len(want))
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("%s: %+v, want %+v", name, got[name], w)
		}
	}
}

func TestSplitParams(t *testing.T) {
	tests := []struct {
		list         string
		decls, names []string
		ok           bool
	}{
		{list: "void", ok: true},
		{list: "", ok: true},
		{list: "MPI_Comm comm, int *rank", decls: []string{"MPI_Comm comm", "int *rank"}, names: []string{"comm", "rank"}, ok: true},
		{list: "MPI_Group group, int n, int ranges[][3], MPI_Group *newgroup",
			decls: []string{"MPI_Group group", "int n", "int ranges[][3]", "MPI_Group *newgroup"},
			names: []string{"group", "n", "ranges", "newgroup"}, ok: true},
		{list: "MPI_Comm, int*", decls: []string{"MPI_Comm kp0", "int* kp1"}, names: []string{"kp0", "kp1"}, ok: true},
		{list: "const MPI_Datatype, const int []", decls: []string{"const MPI_Datatype kp0", "const int kp1[]"},
			names: []string{"kp0", "kp1"}, ok: true},
		{list: "unsigned long long n, struct foo *p", decls: []string{"unsigned long long n", "struct foo *p"},
			names: []string{"n", "p"}, ok: true},
		{list: "void (*fn)(int, void *), void *extra", decls: []string{"void (*fn)(int, void *)", "void *extra"},
			names: []string{"fn", "extra"}, ok: true},
		{list: "const int level, ...", ok: false},
		{list: "int (*)(int)", ok: false},
	}
	for _, tt := range tests {
		decls, names, ok := splitParams(tt.list)
		if ok != tt.ok || !slices.Equal(decls, tt.decls) || !slices.Equal(names, tt.names) {
			t.Errorf("splitParams(%q) = %q %q %v, want %q %q %v", tt.list, decls, names, ok, tt.decls, tt.names, tt.ok)
		}
	}
}

// FuzzParseDecls: any text parses without panicking, and every declaration
// found has a name of the MPI's and parameters that split into as many
// declarations as names.
func FuzzParseDecls(f *testing.F) {
	f.Add("int MPI_Send(const void *buf, int count);")
	f.Add("__attribute__((x(\"a\"))) int MPI_A(int (*f)(int), int b[][3]) __attribute__((y));")
	f.Add("int MPI_B(MPI_Comm, ...); } ) ( ;")
	f.Fuzz(func(t *testing.T, src string) {
		for name, d := range parseDecls([]byte(src)) {
			if name != d.name || !strings.HasPrefix(strings.TrimPrefix(name, "P"), "MPI_") {
				t.Fatalf("declaration %q named %q", name, d.name)
			}
			if decls, names, ok := splitParams(d.params); ok && len(decls) != len(names) {
				t.Fatalf("%s: %d declarations, %d names", name, len(decls), len(names))
			}
		}
	})
}

// The wrappers generated from each installed MPI's mpi.h cover every
// function it declares with a profiling entry point, but the few that must
// not be wrapped, and compile.
func TestGenerateAllCoversTheInstalledMPI(t *testing.T) {
	requireMPI(t)
	for _, k := range installedMPIs {
		t.Run(k.name, func(t *testing.T) {
			mpitest.Require(t, k.mpicc)
			generateAllWith(t, k.mpicc)
		})
	}
}

func generateAllWith(t *testing.T, mpicc string) {
	header, err := mpiHeader(context.Background(), mpicc)
	if err != nil {
		t.Fatal(err)
	}
	hand, err := sources.ReadFile("csrc/kipimo_mpi.c")
	if err != nil {
		t.Fatal(err)
	}
	src, wrapped := generateAll(header, hand)
	decls := parseDecls(header)
	handled := map[string]bool{}
	for _, m := range handRE.FindAllSubmatch(hand, -1) {
		handled[string(m[1])] = true
	}
	if len(handled) < 60 {
		t.Fatalf("found %d hand-ruled wrappers in kipimo_mpi.c", len(handled))
	}
	var missing []string
	for name := range decls {
		if !strings.HasPrefix(name, "MPI_") || decls["P"+name].name == "" || handled[name] ||
			slices.Contains(wrapped, name) || slices.Contains(notWrapped, name) || conversionRE.MatchString(name) {
			continue
		}
		missing = append(missing, name)
	}
	if len(missing) > 0 {
		t.Errorf("declared with a profiling entry point but not wrapped: %v", missing)
	}
	for _, name := range []string{"MPI_Cart_get", "MPI_Cart_rank", "MPI_Cancel", "MPI_Comm_split_type", "MPI_Get_address"} {
		if !slices.Contains(wrapped, name) {
			t.Errorf("%s is not wrapped", name)
		}
	}
	for _, name := range []string{"MPI_Wtime", "MPI_Wtick", "MPI_Pcontrol", "MPI_Comm_f2c", "MPI_Send"} {
		if slices.Contains(wrapped, name) {
			t.Errorf("%s is wrapped by the generated file", name)
		}
	}
	if len(wrapped)+len(handled) < 250 {
		t.Errorf("%d functions wrapped in all, want the whole interface (over 250)", len(wrapped)+len(handled))
	}
	t.Logf("%d hand-ruled and %d generated wrappers", len(handled), len(wrapped))
	dir := t.TempDir()
	if err := writeSources(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, mpiAllSource), src, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(mpicc, "-c", "-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", "-fPIC", mpiAllSource)
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", mpicc, mpiAllSource, err, b)
	}
}

// mpiKind is an MPI installation the tests build and run programs with.
type mpiKind struct {
	name, mpicc, mpirun string
}

// installedMPIs are Open MPI (Debian's default mpicc and mpirun) and MPICH
// (Debian's mpicc.mpich and mpirun.mpich); a test runs with each that is
// installed, and fails without one in CI (KIPIMO_REQUIRE_MPI=1).
var installedMPIs = []mpiKind{
	{"Open MPI", "mpicc", "mpirun"},
	{"MPICH", "mpicc.mpich", "mpirun.mpich"},
}

// libraryFor builds the event library for command as kipimo run does: with
// the MPI wrappers of the MPI the command's program uses.
func libraryFor(t *testing.T, command ...string) *Library {
	t.Helper()
	lib, err := Build(context.Background(), BuildOptions{CacheDir: libCache, MPI: true, Command: command})
	if err != nil {
		t.Fatal(err)
	}
	return lib
}

// A C program's calls of functions that only the wrappers generated from
// mpi.h record (MPI_Cart_get, MPI_Cart_rank, MPI_Cancel...) stream as
// executions, as many as the program makes, under Open MPI and under
// MPICH alike, each with the library Build chose for the program's MPI;
// the cancelled receive records no message.
func TestGeneratedWrappersStreamTheirCalls(t *testing.T) {
	requireMPI(t)
	const (
		ranks = 2
		iters = 300
	)
	want := map[string]int{
		"MPI_Init": 1, "MPI_Comm_rank": 1, "MPI_Comm_size": 1, "MPI_Dims_create": 1, "MPI_Cart_create": 1,
		"MPI_Cart_get": iters, "MPI_Cart_rank": iters, "MPI_Irecv": 1, "MPI_Cancel": 1, "MPI_Wait": 1,
		"MPI_Test_cancelled": 1, "MPI_Comm_free": 1, "MPI_Finalize": 1,
	}
	for _, k := range installedMPIs {
		t.Run(k.name, func(t *testing.T) {
			mpitest.Require(t, k.mpicc, k.mpirun)
			prog := filepath.Join(t.TempDir(), "mpiextra")
			if b, err := exec.Command(k.mpicc, "-O1", "-o", prog, filepath.Join("testdata", "mpiextra.c")).CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", k.mpicc, err, b)
			}
			lib := libraryFor(t, k.mpirun, "-np", "2", prog)
			ns := startNATS(t)
			nc := connect(t, ns)
			run := "extra"
			c := collect(t, nc, run)
			base := mpitest.Env(os.Environ())
			args := []string{"-np", fmt.Sprint(ranks), prog, fmt.Sprint(iters)}
			plain, plainCode := runProgram(t, base, k.mpirun, args...)
			env := lib.Environ(Env{NATSURL: ns.ClientURL(), Run: run, Period: 50 * time.Millisecond}, base)
			out, code := runProgram(t, env, k.mpirun, args...)
			if code != 0 || plainCode != 0 || sortedLines(out) != sortedLines(plain) || !strings.Contains(out, "cancelled 1") {
				t.Fatalf("under Kipimo: status %d, output\n%s\nalone: status %d, output\n%s", code, out, plainCode, plain)
			}
			c.waitEOS(t, ranks)
			c.mu.Lock()
			defer c.mu.Unlock()
			if len(c.bad) > 0 {
				t.Fatal(c.bad)
			}
			for r := uint32(0); r < ranks; r++ {
				s := c.ranks[r]
				if s == nil {
					t.Fatalf("rank %d streamed nothing", r)
				}
				if !maps.Equal(s.calls, want) {
					t.Errorf("rank %d: executions %v, want %v", r, s.calls, want)
				}
				if len(s.comms) != 0 || s.mismatch != 0 || s.unnamed != 0 {
					t.Errorf("rank %d: %d comm events (want none), %d mismatched exits, %d unnamed events", r, len(s.comms), s.mismatch, s.unnamed)
				}
			}
		})
	}
}
