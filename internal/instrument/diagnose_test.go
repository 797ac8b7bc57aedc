package instrument

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// ExplainNoEvents names the reasons a run streamed nothing that the command
// and its processes' reports give away, each with what to do.
func TestExplainNoEvents(t *testing.T) {
	if _, err := exec.LookPath("cc"); err != nil {
		t.Skip("no C compiler")
	}
	dir := t.TempDir()
	build := func(name, src string) string {
		c := filepath.Join(dir, name+".c")
		if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(dir, name)
		if b, err := exec.Command("cc", "-O1", "-o", out, c).CombinedOutput(); err != nil {
			t.Fatalf("cc %s: %v\n%s", name, err, b)
		}
		return out
	}
	plain := build("plain", "int main(void) { return 0; }\n")
	// A program with an MPI linked in defines MPI_Init itself.
	static := build("static", "int MPI_Init(int *c, char ***v) { (void)c; (void)v; return 0; }\n"+
		"int main(int c, char **v) { return MPI_Init(&c, &v); }\n")
	cyg := build("cyg", "void __cyg_profile_func_enter(void *f, void *c);\n"+
		"int main(void) { __cyg_profile_func_enter(0, 0); return 0; }\n")
	lib := &Library{Dir: "/lib", Core: "/lib/libkipimo.so"}
	loaded := []Status{{Rank: 0}}
	tests := []struct {
		name    string
		lib     *Library
		command []string
		env     []string
		status  []Status
		want    []string
	}{
		{name: "not MPI, not instrumented", lib: lib, command: []string{plain}, status: loaded,
			want: []string{"is not an MPI program", "kipimo lib --cflags --libs"}},
		{name: "static MPI", lib: lib, command: []string{static}, status: loaded,
			want: []string{"statically", "shared library"}},
		{name: "launcher dropped the library", lib: lib, command: []string{"mpirun", "-np", "2", cyg},
			env: []string{"OMPI_ALLOW_RUN_AS_ROOT=1"}, want: []string{"no process reported loading the library", "-x LD_PRELOAD"}},
		{name: "instrumented, loaded, silent", lib: lib, command: []string{cyg}, status: loaded,
			want: []string{"none arrived"}},
		{name: "uninstrumented", lib: &Library{}, command: []string{plain}, want: []string{"ran uninstrumented"}},
	}
	if os.Geteuid() == 0 {
		tests = append(tests, struct {
			name    string
			lib     *Library
			command []string
			env     []string
			status  []Status
			want    []string
		}{name: "root without Open MPI's variables", lib: lib, command: []string{"mpirun.openmpi", "-np", "2", cyg},
			want: []string{"OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"}})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			why := strings.Join(tt.lib.ExplainNoEvents(context.Background(), tt.command, tt.env, tt.status), "\n")
			for _, w := range tt.want {
				if !strings.Contains(why, w) {
					t.Errorf("reasons\n%s\ndo not say %q", why, w)
				}
			}
		})
	}
}

// A program run uninstrumented (the zero Library) gets its environment as
// it is: no LD_PRELOAD, no KIPIMO_* variables.
func TestEnvironUninstrumented(t *testing.T) {
	base := []string{"PATH=/bin", "LD_PRELOAD=/opt/other.so"}
	got := (&Library{}).Environ(Env{NATSURL: "nats://127.0.0.1:4222", Run: "r1"}, base)
	if strings.Join(got, "\n") != strings.Join(base, "\n") {
		t.Errorf("Environ = %q, want %q", got, base)
	}
}
