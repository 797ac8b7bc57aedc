package instrument

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

// MPI families: the MPI wrappers built for one must never be loaded into a
// program of the other (their handles and ABIs differ).
const (
	FamilyOpenMPI = "Open MPI"
	FamilyMPICH   = "MPICH" // and its derivatives: Intel MPI, Cray MPICH, MVAPICH
)

// ErrProgramMPI means the MPI wrappers cannot be built for the MPI the
// command's program uses: the program must run without them (and without
// the rest of the library, whose ranks would be unknown).
var ErrProgramMPI = errors.New("cannot build the MPI wrappers for the program's MPI")

// commandMPI is what the command says of its MPI.
type commandMPI struct {
	launcher bool   // the command is an MPI launcher (mpirun, srun...)
	program  string // the ELF program it runs, "" when not found
	mpiLib   string // the program's C MPI library, resolved; "" when none or unknown
	family   string // FamilyOpenMPI, FamilyMPICH or "" when unknown
	from     string // how family was found, for messages
}

// launcherRE matches the names of MPI launchers, with Debian's suffixes
// (mpirun.openmpi, mpiexec.mpich, mpiexec.hydra).
var launcherRE = regexp.MustCompile(`^(mpirun|mpiexec|orterun|prterun|srun|aprun|jsrun|mpiexec\.hydra)(\..*)?$`)

// launcherFamily is the family a launcher's name (or the name its link
// resolves to) gives away, or "".
func launcherFamily(path string) string {
	names := []string{filepath.Base(path)}
	if real, err := filepath.EvalSymlinks(path); err == nil {
		names = append(names, filepath.Base(real))
	}
	for _, n := range names {
		switch {
		case strings.Contains(n, "openmpi"), strings.HasPrefix(n, "orterun"), strings.HasPrefix(n, "prterun"):
			return FamilyOpenMPI
		case strings.Contains(n, "mpich"), strings.Contains(n, "hydra"):
			return FamilyMPICH
		}
	}
	return ""
}

// isELF says whether path is an executable ELF file.
func isELF(path string) bool {
	st, err := os.Stat(path)
	if err != nil || !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		return false
	}
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	magic := make([]byte, 4)
	_, err = f.Read(magic)
	return err == nil && bytes.Equal(magic, []byte("\x7fELF"))
}

// detectMPI finds the program a command runs (the command itself, or for a
// launcher the first of its arguments that is an ELF executable) and the
// MPI it is linked with, from its shared libraries; without one, the
// launcher's name.
func detectMPI(ctx context.Context, command []string) commandMPI {
	var cm commandMPI
	if len(command) == 0 {
		return cm
	}
	path, err := exec.LookPath(command[0])
	if err != nil {
		path = command[0]
	}
	cm.launcher = launcherRE.MatchString(filepath.Base(command[0]))
	cm.program = commandProgram(command)
	if cm.program != "" {
		cm.mpiLib, cm.family = linkedMPI(ctx, cm.program)
		if cm.family != "" {
			cm.from = fmt.Sprintf("%s is linked with %s", cm.program, cm.mpiLib)
			return cm
		}
	}
	if cm.launcher {
		if cm.family = launcherFamily(path); cm.family != "" {
			cm.from = "the launcher is " + filepath.Base(command[0])
		}
	}
	return cm
}

// commandProgram is the ELF program command runs: the command itself,
// or for an MPI launcher the first of its arguments that is an ELF
// executable; "" when none is found.
func commandProgram(command []string) string {
	if len(command) == 0 {
		return ""
	}
	candidates := command[:1]
	if launcherRE.MatchString(filepath.Base(command[0])) {
		candidates = command[1:]
	}
	for _, a := range candidates {
		if strings.HasPrefix(a, "-") {
			continue
		}
		p, err := exec.LookPath(a)
		if err == nil && isELF(p) {
			return p
		}
	}
	return ""
}

// lddRE matches a line of ldd's output: name => path (address).
var lddRE = regexp.MustCompile(`^\s*(\S+)\s+=>\s+(\S+)\s+\(`)

// sharedLibs lists the shared libraries ldd says file loads: name to
// resolved path.
func sharedLibs(ctx context.Context, file string) map[string]string {
	out, err := exec.CommandContext(ctx, "ldd", file).Output()
	if err != nil {
		return nil
	}
	libs := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if m := lddRE.FindStringSubmatch(sc.Text()); m != nil {
			if real, err := filepath.EvalSymlinks(m[2]); err == nil {
				m[2] = real
			}
			libs[m[1]] = m[2]
		}
	}
	return libs
}

// linkedMPI returns the C MPI library file loads (the libmpi* that defines
// MPI_Init) and its family, told from its symbols: Open MPI's libmpi
// defines ompi_mpi_comm_world, MPICH's and its derivatives' MPIR_*
// functions.
func linkedMPI(ctx context.Context, file string) (lib, family string) {
	for name, path := range sharedLibs(ctx, file) {
		if !strings.HasPrefix(name, "libmpi") {
			continue
		}
		f, err := elf.Open(path)
		if err != nil {
			continue
		}
		syms, err := f.DynamicSymbols()
		f.Close()
		if err != nil {
			continue
		}
		var init, ompi, mpich bool
		for _, s := range syms {
			if s.Section == elf.SHN_UNDEF {
				continue
			}
			switch {
			case s.Name == "MPI_Init":
				init = true
			case s.Name == "ompi_mpi_comm_world":
				ompi = true
			case strings.HasPrefix(s.Name, "MPIR_"):
				mpich = true
			}
		}
		switch {
		case !init:
			continue
		case ompi:
			return path, FamilyOpenMPI
		case mpich:
			return path, FamilyMPICH
		default:
			return path, ""
		}
	}
	return "", ""
}

// mpiccFamily asks mpicc which MPI its mpi.h is.
func mpiccFamily(ctx context.Context, mpicc string) string {
	cmd := exec.CommandContext(ctx, mpicc, "-dM", "-E", "-x", "c", "-")
	cmd.Stdin = strings.NewReader("#include <mpi.h>\n")
	out, err := cmd.Output()
	if err != nil {
		return ""
	}
	switch {
	case bytes.Contains(out, []byte("#define OPEN_MPI ")):
		return FamilyOpenMPI
	case bytes.Contains(out, []byte("#define MPICH_VERSION ")):
		return FamilyMPICH
	}
	return ""
}

// familyCompilers are the compiler wrappers tried for each family, in
// order; Debian names them mpicc.openmpi and mpicc.mpich, with mpicc the
// default one.
var familyCompilers = map[string][]string{
	FamilyOpenMPI: {"mpicc.openmpi", "mpicc"},
	FamilyMPICH:   {"mpicc.mpich", "mpicc", "mpiicc"},
}

// chooseMPICC returns the first compiler wrapper of family that is
// installed and says it is of that family, or "".
func chooseMPICC(ctx context.Context, family string) string {
	for _, c := range familyCompilers[family] {
		if p, err := exec.LookPath(c); err == nil && mpiccFamily(ctx, p) == family {
			return p
		}
	}
	return ""
}

// missingCompiler is the error when no compiler wrapper of cm's family is
// installed.
func missingCompiler(cm commandMPI) error {
	install := "apt-get install libopenmpi-dev"
	if cm.family == FamilyMPICH {
		install = "apt-get install libmpich-dev"
	}
	return fmt.Errorf("%w: %s, which is %s, but no %s compiler wrapper is installed (tried %s); "+
		"install one (Debian/Ubuntu: %s) or set MPICC to the compiler wrapper of the program's MPI",
		ErrProgramMPI, cm.from, cm.family, cm.family, strings.Join(familyCompilers[cm.family], ", "), install)
}

// checkSameMPI fails when the MPI wrappers in built load another C MPI
// library than the program's.
func checkSameMPI(ctx context.Context, built string, cm commandMPI, mpicc string) error {
	if cm.mpiLib == "" {
		return nil
	}
	lib, _ := linkedMPI(ctx, built)
	if lib == cm.mpiLib {
		return nil
	}
	return fmt.Errorf("%w: %s, but the wrappers built with %s load %q; "+
		"set MPICC to the compiler wrapper of the program's MPI", ErrProgramMPI, cm.from, mpicc, lib)
}
