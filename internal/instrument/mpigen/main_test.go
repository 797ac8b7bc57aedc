package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite ../csrc/kipimo_mpi.c from the generator")

// cFile is the generated file, relative to this package's directory.
const cFile = "../csrc/kipimo_mpi.c"

const regenerate = "go run ./internal/instrument/mpigen -o internal/instrument/csrc/kipimo_mpi.c"

func TestGeneratedFileIsCurrent(t *testing.T) {
	want, err := generate()
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile(cFile, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(cFile)
	if err != nil {
		t.Fatalf("%v\nrun `%s` from the module root, or `go test ./internal/instrument/mpigen -update`", err, regenerate)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("csrc/kipimo_mpi.c differs from what mpigen generates (%s)\n"+
			"run `%s` from the module root, or `go test ./internal/instrument/mpigen -update`",
			firstDiff(got, want), regenerate)
	}
}

// firstDiff describes the first line where got and want differ.
func firstDiff(got, want []byte) string {
	g, w := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
	for i := range min(len(g), len(w)) {
		if g[i] != w[i] {
			return fmt.Sprintf("line %d is %q, the generator writes %q", i+1, g[i], w[i])
		}
	}
	return fmt.Sprintf("the file has %d lines, the generator writes %d", len(g), len(w))
}

func TestTable(t *testing.T) {
	if n := len(functions); n < 80 || n > 95 {
		t.Errorf("%d functions wrapped, want 80 to 95", n)
	}
	src, err := generate()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range functions {
		p, err := parseProto(f.proto)
		if err != nil {
			t.Error(err)
			continue
		}
		switch p.name {
		case "MPI_Wtime", "MPI_Wtick", "MPI_Pcontrol":
			t.Errorf("%s must not be wrapped", p.name)
		}
		// Every wrapper records one execution: one enter and one exit.
		body := wrapperBody(string(src), p.name)
		if body == "" {
			t.Errorf("%s: no wrapper in the output", p.name)
			continue
		}
		// Its definition is the prototype, line breaks aside.
		if decl, _, ok := strings.Cut(strings.TrimPrefix(body, "\n"), "\n{"); !ok {
			t.Errorf("%s: cannot find the wrapper's opening brace", p.name)
		} else if decl = strings.Join(strings.Fields(decl), " "); decl != f.proto {
			t.Errorf("%s: wrapper defined as\n %s\nwant\n %s", p.name, decl, f.proto)
		}
		for _, call := range []string{"kp_enter(fid);", "kp_exit(fid);", "int rc = P" + p.name + "("} {
			if c := strings.Count(body, call); c != 1 {
				t.Errorf("%s: %q appears %d times in the wrapper, want once", p.name, call, c)
			}
		}
	}
}

// wrapperBody returns the definition of the wrapper of name in src.
func wrapperBody(src, name string) string {
	i := strings.Index(src, "\nint "+name+"(")
	if i < 0 {
		return ""
	}
	j := strings.Index(src[i:], "\n}\n")
	if j < 0 {
		return ""
	}
	return src[i : i+j+3]
}

func TestParseProto(t *testing.T) {
	tests := []struct {
		name, proto string
		wantName    string
		wantParams  []string
		wantErr     bool
	}{
		{name: "void", proto: "int MPI_Finalize(void)", wantName: "MPI_Finalize"},
		{name: "pointers", proto: "int MPI_Init(int *argc, char ***argv)",
			wantName: "MPI_Init", wantParams: []string{"argc", "argv"}},
		{name: "spaced star", proto: "int MPI_X(void * buf, int count)",
			wantName: "MPI_X", wantParams: []string{"buf", "count"}},
		{name: "arrays and const", proto: "int MPI_Y(const int dims[], MPI_Status array_of_statuses[])",
			wantName: "MPI_Y", wantParams: []string{"dims", "array_of_statuses"}},
		{name: "not MPI", proto: "int foo(int a)", wantErr: true},
		{name: "unnamed parameter", proto: "int MPI_Z(int)", wantErr: true},
		{name: "no semicolon allowed", proto: "int MPI_Z(int a);", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := parseProto(tt.proto)
			if (err != nil) != tt.wantErr {
				t.Fatalf("parseProto(%q) error = %v, want error %v", tt.proto, err, tt.wantErr)
			}
			if tt.wantErr {
				return
			}
			if p.name != tt.wantName || !slices.Equal(p.params, tt.wantParams) {
				t.Errorf("parseProto(%q) = %s %q, want %s %q", tt.proto, p.name, p.params, tt.wantName, tt.wantParams)
			}
		})
	}
}

func TestWrapList(t *testing.T) {
	tests := []struct {
		name  string
		items []string
		col   int
		want  string
	}{
		{name: "short", items: []string{"a", "b"}, want: "f(a, b)"},
		{name: "empty", want: "f()"},
		{name: "breaks and aligns", col: 80, items: []string{"alpha", "beta"}, want: "f(alpha,\n" + strings.Repeat(" ", 82) + "beta)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := wrapList("f(", tt.items, ")", tt.col); got != tt.want {
				t.Errorf("wrapList = %q, want %q", got, tt.want)
			}
		})
	}
}

// needMPI returns the path of mpicc, or skips the test when there is none
// (fails instead when KIPIMO_REQUIRE_MPI=1).
func needMPI(t *testing.T) string {
	t.Helper()
	mpicc, err := exec.LookPath("mpicc")
	if err != nil {
		if os.Getenv("KIPIMO_REQUIRE_MPI") == "1" {
			t.Fatalf("mpicc not found and KIPIMO_REQUIRE_MPI=1: %v", err)
		}
		t.Skip("mpicc not on PATH (set KIPIMO_REQUIRE_MPI=1 to make this a failure)")
	}
	return mpicc
}

func TestCompilesWithMPICC(t *testing.T) {
	mpicc := needMPI(t)
	src, err := filepath.Abs(cFile)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		flags []string
	}{
		{name: "plain", flags: []string{"-Wall", "-Werror", "-fPIC"}},
		{name: "gnu11 O2 Wextra", flags: []string{"-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", "-fPIC"}},
		{name: "c11 O3 hidden", flags: []string{"-std=c11", "-O3", "-Wall", "-Wextra", "-Werror", "-fPIC", "-fvisibility=hidden"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obj := filepath.Join(t.TempDir(), "kipimo_mpi.o")
			args := append([]string{"-c"}, tt.flags...)
			args = append(args, src, "-o", obj)
			out, err := exec.CommandContext(t.Context(), mpicc, args...).CombinedOutput()
			if err != nil {
				t.Fatalf("mpicc %s: %v\n%s", strings.Join(args, " "), err, out)
			}
		})
	}
}

// TestPrototypesMatchMPIHeader checks each prototype of the table against
// the mpi.h mpicc compiles with, character for character once runs of white
// space are made single spaces.
func TestPrototypesMatchMPIHeader(t *testing.T) {
	mpicc := needMPI(t)
	out, err := exec.CommandContext(t.Context(), mpicc, "--showme:incdirs").Output()
	if err != nil {
		t.Skipf("mpicc does not say its include directories (%v); not Open MPI?", err)
	}
	var header []byte
	for dir := range strings.FieldsSeq(string(out)) {
		if header, err = os.ReadFile(filepath.Join(dir, "mpi.h")); err == nil {
			break
		}
	}
	if header == nil {
		t.Skipf("no mpi.h in %s", out)
	}
	text := regexp.MustCompile(`\s+`).ReplaceAllString(string(header), " ")
	for _, f := range functions {
		p, err := parseProto(f.proto)
		if err != nil {
			t.Fatal(err)
		}
		re := regexp.MustCompile(`\bint ` + p.name + ` ?\([^;]*\);`)
		decl := re.FindString(text)
		if decl == "" {
			t.Errorf("%s is not declared in mpi.h", p.name)
			continue
		}
		decl = strings.TrimSuffix(decl, ";")
		decl = strings.ReplaceAll(strings.ReplaceAll(decl, "( ", "("), " )", ")")
		decl = strings.Replace(decl, p.name+" (", p.name+"(", 1)
		decl = strings.ReplaceAll(decl, " ,", ",")
		if decl != f.proto {
			t.Errorf("prototype of %s differs from mpi.h:\n table: %s\n mpi.h: %s", p.name, f.proto, decl)
		}
		if !regexp.MustCompile(`\bint P` + p.name + ` ?\(`).MatchString(text) {
			t.Errorf("mpi.h declares no P%s", p.name)
		}
	}
}

// Every function of the table has Fortran wrappers under each name a
// Fortran MPI library exports, taking the Fortran arguments (the C ones and
// the error code, but for MPI_Init and MPI_Init_thread), which call the
// same event helpers as the C wrapper, with rc from ierror; the C wrappers
// record nothing inside one.
func TestFortranWrappers(t *testing.T) {
	src, err := generate()
	if err != nil {
		t.Fatal(err)
	}
	text := string(src)
	for _, f := range functions {
		p, err := parseProto(f.proto)
		if err != nil {
			t.Fatal(err)
		}
		n := len(p.params) + 1
		switch p.name {
		case "MPI_Init":
			n = 1
		case "MPI_Init_thread":
			n = 3
		}
		lower := strings.ToLower(p.name)
		for _, sym := range []string{lower + "_", lower + "__", lower, strings.ToUpper(p.name), lower + "_f08_", lower + "_f08ts_"} {
			decl := fmt.Sprintf("KP_EXPORT kp_fortran%d %s __attribute__((alias(", n, sym)
			if strings.Count(text, decl) != 1 {
				t.Errorf("%s: no Fortran wrapper %q", p.name, decl)
			}
		}
		body := wrapperBody(text, p.name)
		if !strings.Contains(body, "if (!kp_on() || !kp_outer())\n        return P"+p.name+"(") {
			t.Errorf("%s: the C wrapper records something inside a Fortran wrapper", p.name)
		}
		// The Fortran wrappers record the communication events the C
		// wrapper does: the same event calls, on converted arguments.
		for _, static := range []string{"kpf_", "kpf08_", "kpf08ts_"} {
			static += strings.TrimPrefix(lower, "mpi_")
			fbody := fortranBody(text, static)
			if fbody == "" {
				t.Errorf("%s: no Fortran wrapper %s", p.name, static)
				continue
			}
			for _, call := range eventCalls(body) {
				if strings.Contains(call, "kp_completion_end") {
					call = "kp_fcompletion_end"
				}
				if !strings.Contains(fbody, call) {
					t.Errorf("%s: %s does not call %s, which the C wrapper calls", p.name, static, call)
				}
			}
			if len(f.rule.uses) > 0 && strings.Contains(f.rule.post, "rc") != strings.Contains(fbody, "int rc = kp_ferr(f_ierror);") {
				t.Errorf("%s: %s does not take rc from ierror", p.name, static)
			}
		}
	}
}

// fortranBody returns the definition of the static Fortran wrapper named
// static in src.
func fortranBody(src, static string) string {
	i := strings.Index(src, "\nstatic void "+static+"(")
	if i < 0 {
		return ""
	}
	j := strings.Index(src[i:], "\n}\n")
	if j < 0 {
		return ""
	}
	return src[i : i+j+3]
}

// eventCalls lists the calls of the event helpers (kp_send_event(...)
// and the like, up to the opening parenthesis) in a wrapper's body.
func eventCalls(body string) []string {
	var calls []string
	for _, h := range []string{"kp_send_event(", "kp_recv_done(", "kp_req_track(", "kp_req_drop(",
		"kp_preq_send(", "kp_preq_recv(", "kp_preq_start(",
		"kp_completion_end(", "kp_coll_emit(", "kp_after_init(", "kp_before_finalize(", "kp_flush("} {
		if strings.Contains(body, h) {
			calls = append(calls, h)
		}
	}
	return calls
}

// Each non-blocking collective records what its blocking twin records, at
// the call: the same rule, so the same events from the same arguments.
func TestNonblockingCollectivesFollowTheirTwins(t *testing.T) {
	rules := map[string]rule{}
	for _, f := range functions {
		p, err := parseProto(f.proto)
		if err != nil {
			t.Fatal(err)
		}
		rules[p.name] = f.rule
	}
	for _, twin := range []string{"Bcast", "Reduce", "Allreduce", "Allgather", "Alltoall", "Gather",
		"Gatherv", "Scatter", "Scatterv", "Allgatherv", "Alltoallv", "Reduce_scatter",
		"Reduce_scatter_block", "Scan", "Exscan"} {
		b, ok := rules["MPI_"+twin]
		nb, nok := rules["MPI_I"+strings.ToLower(twin[:1])+twin[1:]]
		if !ok || !nok {
			t.Errorf("MPI_%s: blocking in the table %v, non-blocking %v; want both", twin, ok, nok)
			continue
		}
		if b.post == "" || b.post != nb.post || b.desc != nb.desc || !slices.Equal(b.uses, nb.uses) {
			t.Errorf("MPI_I%s does not record what MPI_%s records:\n%s\nagainst\n%s", strings.ToLower(twin[:1])+twin[1:], twin, nb.post, b.post)
		}
	}
}

// Persistent requests: the calls that make them save what MPI_Start
// records, MPI_Start and MPI_Startall record it, MPI_Request_free forgets
// it, and the completion calls tell a completed persistent receive (which
// keeps its handle) by their flag or indices.
func TestPersistentRequestRules(t *testing.T) {
	src, err := generate()
	if err != nil {
		t.Fatal(err)
	}
	text := string(src)
	tests := []struct{ fn, call string }{
		{"MPI_Send_init", "kp_preq_send(*request, comm, dest, tag, count, datatype);"},
		{"MPI_Bsend_init", "kp_preq_send(*request, comm, dest, tag, count, datatype);"},
		{"MPI_Ssend_init", "kp_preq_send(*request, comm, dest, tag, count, datatype);"},
		{"MPI_Rsend_init", "kp_preq_send(*request, comm, dest, tag, count, datatype);"},
		{"MPI_Recv_init", "kp_preq_recv(*request, comm);"},
		{"MPI_Start", "kp_preq_start(*request);"},
		{"MPI_Startall", "kp_preq_start(array_of_requests[i]);"},
		{"MPI_Request_free", "kp_req_drop(*request);"},
		{"MPI_Wait", "kp_completion_end(&cp, rc, request, st, 1, KP_BY_POSITION, 0, NULL);"},
		{"MPI_Test", "kp_completion_end(&cp, rc, request, st, *flag, KP_BY_POSITION, 0, NULL);"},
		{"MPI_Testall", "kp_completion_end(&cp, rc, array_of_requests, st, *flag, KP_BY_POSITION, 0, NULL);"},
		{"MPI_Waitany", "kp_completion_end(&cp, rc, array_of_requests, st, 1, KP_BY_INDEX, 1, index);"},
	}
	for _, tt := range tests {
		if body := wrapperBody(text, tt.fn); !strings.Contains(body, tt.call) {
			t.Errorf("%s does not call %s:\n%s", tt.fn, tt.call, body)
		}
	}
	// The Fortran MPI_Test and MPI_Testall read the flag the call set.
	for _, static := range []string{"kpf_test", "kpf08_testall"} {
		if body := fortranBody(text, static); !strings.Contains(body, "kp_fint(f_flag) != 0, KP_BY_POSITION") {
			t.Errorf("%s does not pass the call's flag:\n%s", static, body)
		}
	}
}
