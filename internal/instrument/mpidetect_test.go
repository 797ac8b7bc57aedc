package instrument

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kipimo-hpc/kipimo/internal/mpitest"
)

// Build, given the command, builds the MPI wrappers for the MPI the
// program is linked with (whatever the launcher), none for a program that
// uses no MPI, the launcher's MPI for a program it cannot read, and fails
// with ErrProgramMPI when told to use the compiler of another MPI.
func TestBuildChoosesTheProgramsMPI(t *testing.T) {
	requireMPI(t)
	mpitest.Require(t, "mpicc.mpich", "mpirun.mpich", "cc")
	dir := t.TempDir()
	plainC := filepath.Join(dir, "plain.c")
	if err := os.WriteFile(plainC, []byte("int main(void) { return 0; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	progs := map[string]string{}
	for name, cc := range map[string]string{"ompi": "mpicc", "mpich": "mpicc.mpich", "serial": "cc"} {
		src := filepath.Join("testdata", "mpiextra.c")
		if name == "serial" {
			src = plainC
		}
		progs[name] = filepath.Join(dir, name)
		if b, err := exec.Command(cc, "-O1", "-o", progs[name], src).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", cc, err, b)
		}
	}
	script := filepath.Join(dir, "job.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\nexec \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ompiLib, _ := linkedMPI(ctx, progs["ompi"])
	mpichLib, _ := linkedMPI(ctx, progs["mpich"])
	if ompiLib == "" || mpichLib == "" || ompiLib == mpichLib {
		t.Fatalf("the programs' MPI libraries: %q and %q", ompiLib, mpichLib)
	}
	tests := []struct {
		name    string
		command []string
		mpicc   string // MPICC set
		wantLib string // the C MPI library the wrappers load; "" for no wrappers
		wantErr error
	}{
		{name: "Open MPI program", command: []string{"mpirun", "-np", "2", progs["ompi"]}, wantLib: ompiLib},
		{name: "MPICH program", command: []string{"mpirun.mpich", "-n", "2", progs["mpich"]}, wantLib: mpichLib},
		{name: "MPICH program, generic launcher", command: []string{"mpiexec", "-np", "2", progs["mpich"]}, wantLib: mpichLib},
		{name: "MPICH program alone", command: []string{progs["mpich"]}, wantLib: mpichLib},
		{name: "no MPI", command: []string{"mpirun", "-np", "2", progs["serial"]}},
		{name: "script under MPICH's launcher", command: []string{"mpirun.mpich", "-n", "2", script, progs["mpich"]}, wantLib: mpichLib},
		{name: "another MPI's compiler", command: []string{"mpirun.mpich", "-n", "2", progs["mpich"]}, mpicc: "mpicc",
			wantErr: ErrProgramMPI},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("MPICC", tt.mpicc)
			lib, err := Build(ctx, BuildOptions{CacheDir: libCache, MPI: true, Command: tt.command})
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("error %v, want %v", err, tt.wantErr)
				}
				t.Log(err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := ""
			if lib.MPI != "" {
				got, _ = linkedMPI(ctx, lib.MPI)
			}
			if got != tt.wantLib {
				t.Errorf("the MPI wrappers load %q, want %q", got, tt.wantLib)
			}
		})
	}
}

// Without a compiler wrapper for the program's MPI, Build says which to
// install.
func TestBuildWithoutTheProgramsMPICompiler(t *testing.T) {
	requireMPI(t)
	mpitest.Require(t, "mpicc.mpich")
	prog := filepath.Join(t.TempDir(), "mpich")
	if b, err := exec.Command("mpicc.mpich", "-O1", "-o", prog, filepath.Join("testdata", "mpiextra.c")).CombinedOutput(); err != nil {
		t.Fatalf("mpicc.mpich: %v\n%s", err, b)
	}
	// A PATH with ldd but no MPI compiler wrapper.
	bin := t.TempDir()
	ldd, err := exec.LookPath("ldd")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(ldd, filepath.Join(bin, "ldd")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin)
	t.Setenv("MPICC", "")
	_, err = Build(context.Background(), BuildOptions{CacheDir: t.TempDir(), MPI: true, Command: []string{prog}})
	if !errors.Is(err, ErrProgramMPI) || !strings.Contains(err.Error(), "libmpich-dev") {
		t.Errorf("error %v, want ErrProgramMPI saying to install libmpich-dev", err)
	}
}
