// Package instrument builds Kipimo's in-process event library and prepares the
// environment of the programs it watches.
//
// The library is C (no Go runtime starts inside an application's ranks). Its
// sources are embedded in every kipimo binary and compiled on first use with
// the machine's C compiler, and with mpicc for the MPI wrappers, into a cache
// directory keyed by the sources and the compilers, so a fresh machine needs
// nothing beyond a C compiler (and an MPI for MPI programs). Build does the
// compiling; Env describes a run to the library through environment
// variables; ReadStatus reads what each process reported at its exit.
package instrument

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

//go:generate go run ./mpigen -o csrc/kipimo_mpi.c

//go:embed csrc/*.c csrc/*.h
var sources embed.FS

// Library names of the built shared objects.
const (
	CoreLibrary   = "libkipimo.so"
	MPILibrary    = "libkipimo-mpi.so"
	OpenCLLibrary = "libkipimo-opencl.so"
	KokkosLibrary = "libkipimo-kokkos.so"
	Header        = "kipimo.h"
)

// ErrNoCompiler means no C compiler was found to build the library.
var ErrNoCompiler = errors.New("no C compiler found: Kipimo builds its event library with the system's C compiler; install one (Debian/Ubuntu: apt-get install gcc) or set CC")

// ErrNoMPI means no MPI compiler wrapper was found to build the MPI wrappers.
var ErrNoMPI = errors.New("no MPI compiler wrapper (mpicc) found: the MPI wrappers need an MPI installation (Debian/Ubuntu: apt-get install openmpi-bin libopenmpi-dev) or MPICC set to its compiler wrapper; compiler instrumentation and the API work without it")

// BuildOptions chooses where and with what the library is built. The zero
// value builds with $CC (or cc) and $MPICC (or mpicc) into the user's cache.
type BuildOptions struct {
	// CacheDir holds one directory per build; default $KIPIMO_CACHE_DIR, else
	// the user's cache directory + /kipimo.
	CacheDir string
	// CC and MPICC are the compilers; defaults $CC or cc, $MPICC or mpicc.
	CC, MPICC string
	// MPI also builds the MPI wrappers; it fails with ErrNoMPI when there is
	// no mpicc.
	MPI bool
	// Command, when set, is the command the library will be loaded into
	// (a program, or an MPI launcher and its program). Unless CC's MPI
	// compiler is chosen (MPICC or $MPICC), Build finds the MPI the
	// program is linked with (or, for a program it cannot read, the one
	// the launcher's name gives away) and builds the MPI wrappers with that
	// MPI's compiler wrapper (mpicc.openmpi, mpicc.mpich, mpicc). It builds
	// none for a program linked with no MPI, and fails with ErrProgramMPI
	// when it cannot build them for the program's MPI.
	Command []string
}

// Library is a built event library.
type Library struct {
	// Dir holds the shared objects and the header.
	Dir string
	// Core is the path of libkipimo.so (compiler instrumentation, the API,
	// the collector); MPI that of libkipimo-mpi.so, empty when not built.
	Core, MPI string
	// OpenCL is the path of libkipimo-opencl.so (the OpenCL API interposed)
	// and Kokkos that of libkipimo-kokkos.so (a Kokkos Tools connector).
	// Both are always built: they need no OpenCL or Kokkos headers.
	OpenCL, Kokkos string
	// UseOpenCL and UseKokkos say that the command Build was given loads
	// libOpenCL or Kokkos's core library: Preload then loads the OpenCL
	// interposer and Environ points Kokkos at the connector.
	UseOpenCL, UseKokkos bool
}

// Include is the directory that holds kipimo.h.
func (l *Library) Include() string { return l.Dir }

// Preload is the LD_PRELOAD value that loads the library into a program.
func (l *Library) Preload() string {
	p := l.Core
	if l.MPI != "" {
		p = l.MPI + " " + p
	}
	if l.UseOpenCL && l.OpenCL != "" {
		p += " " + l.OpenCL
	}
	return p
}

// CFlags are the flags that compile a program with compiler instrumentation
// and the API header; LDFlags link it with the library.
func (l *Library) CFlags() string { return "-finstrument-functions -I" + l.Dir }

// LDFlags link a program with the library (for the explicit API).
func (l *Library) LDFlags() string {
	return "-L" + l.Dir + " -Wl,-rpath," + l.Dir + " -lkipimo"
}

func (o *BuildOptions) defaults() error {
	if o.CacheDir == "" {
		o.CacheDir = os.Getenv("KIPIMO_CACHE_DIR")
	}
	if o.CacheDir == "" {
		d, err := os.UserCacheDir()
		if err != nil {
			return fmt.Errorf("find a cache directory for the event library (set KIPIMO_CACHE_DIR): %w", err)
		}
		o.CacheDir = filepath.Join(d, "kipimo")
	}
	if o.CC == "" {
		o.CC = os.Getenv("CC")
	}
	if o.CC == "" {
		o.CC = "cc"
	}
	if o.MPICC == "" {
		o.MPICC = os.Getenv("MPICC")
	}
	if o.MPICC == "" {
		o.MPICC = "mpicc"
	}
	return nil
}

// coreLDFlags link libkipimo.so. Its soname makes the loader take a
// program's -lkipimo for the copy already preloaded, even one from another
// build directory (the build for another MPI): one process, one core.
var coreLDFlags = []string{"-shared", "-Wl,-soname," + CoreLibrary}

// cflags are the flags every part of the library is compiled with.
var cflags = []string{"-std=gnu11", "-O2", "-g", "-fPIC", "-Wall", "-Wno-format-truncation", "-fvisibility=default", "-pthread"}

// Build compiles the library into the cache unless a build of the same
// sources with the same compilers is already there, and returns it. It is
// safe to call from several processes at once: each builds in a directory
// of its own and the first to finish installs its result.
//
// Build remembers its result in the cache with the files it rests on, so
// that a second Build with the same options, command and environment,
// while those files are unchanged, returns at once without running ldd or
// a compiler (see buildMemo).
func Build(ctx context.Context, opts BuildOptions) (*Library, error) {
	memo := memoPath(opts)
	if lib, ok := readMemo(memo); ok {
		return lib, nil
	}
	lib, cm, used, err := buildFor(ctx, opts)
	if err == nil {
		writeMemo(ctx, memo, lib, memoInputs(opts.Command, cm, used), used.MPICC)
	}
	return lib, err
}

// buildFor is Build without the memo; it also returns what it found of the
// command's MPI and the options it built with.
func buildFor(ctx context.Context, opts BuildOptions) (*Library, commandMPI, BuildOptions, error) {
	explicit := opts.MPICC != "" || os.Getenv("MPICC") != ""
	var cm commandMPI
	if opts.MPI && len(opts.Command) > 0 {
		cm = detectMPI(ctx, opts.Command)
		switch {
		case cm.program != "" && cm.mpiLib == "":
			opts.MPI = false // a program linked with no MPI: nothing to wrap
		case explicit:
		case cm.family != "":
			if opts.MPICC = chooseMPICC(ctx, cm.family); opts.MPICC == "" {
				return nil, cm, opts, missingCompiler(cm)
			}
		}
	}
	if err := opts.defaults(); err != nil {
		return nil, cm, opts, err
	}
	lib, err := build(ctx, opts)
	if err == nil && len(opts.Command) > 0 {
		lib.UseOpenCL, lib.UseKokkos = detectDevices(ctx, opts.Command, cm.program)
	}
	if err != nil || lib.MPI == "" {
		return lib, cm, opts, err
	}
	if err := checkSameMPI(ctx, lib.MPI, cm, opts.MPICC); err != nil {
		return nil, cm, opts, err
	}
	return lib, cm, opts, nil
}

// build is Build once the compilers are chosen.
func build(ctx context.Context, opts BuildOptions) (*Library, error) {
	cc, err := exec.LookPath(opts.CC)
	if err != nil {
		return nil, fmt.Errorf("%w (looked for %q)", ErrNoCompiler, opts.CC)
	}
	mpicc := ""
	if opts.MPI {
		if mpicc, err = exec.LookPath(opts.MPICC); err != nil {
			return nil, fmt.Errorf("%w (looked for %q)", ErrNoMPI, opts.MPICC)
		}
	}
	var header []byte
	if mpicc != "" {
		if header, err = mpiHeader(ctx, mpicc); err != nil {
			return nil, err
		}
	}
	key, err := buildKey(ctx, cc, mpicc, header)
	if err != nil {
		return nil, err
	}
	name := "lib-" + key[:16]
	if mpicc == "" {
		name += "-nompi"
	}
	dir := filepath.Join(opts.CacheDir, name)
	lib := &Library{Dir: dir, Core: filepath.Join(dir, CoreLibrary),
		OpenCL: filepath.Join(dir, OpenCLLibrary), Kokkos: filepath.Join(dir, KokkosLibrary)}
	if mpicc != "" {
		lib.MPI = filepath.Join(dir, MPILibrary)
	}
	if _, err := os.Stat(filepath.Join(dir, ".complete")); err == nil {
		return lib, nil
	}
	if err := os.MkdirAll(opts.CacheDir, 0o755); err != nil {
		return nil, fmt.Errorf("create the library cache: %w", err)
	}
	tmp, err := os.MkdirTemp(opts.CacheDir, ".build-")
	if err != nil {
		return nil, fmt.Errorf("create a build directory: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := writeSources(tmp); err != nil {
		return nil, err
	}
	// Link with the path the library will have once installed, so the MPI
	// wrappers find libkipimo.so wherever they are loaded from.
	core := append(append(append([]string{}, cflags...), coreLDFlags...), "-o", CoreLibrary,
		"kipimo_core.c", "kipimo_cyg.c", "kipimo_api.c", "kipimo_device.c", "kipimo_ompt.c", "-ldl")
	if err := compile(ctx, tmp, cc, core); err != nil {
		return nil, err
	}
	// The OpenCL interposer and the Kokkos connector load into a process
	// that has the core; they need no OpenCL or Kokkos headers.
	for _, src := range [][2]string{{OpenCLLibrary, "kipimo_ocl.c"}, {KokkosLibrary, "kipimo_kokkos.c"}} {
		args := append(append([]string{}, cflags...), "-shared", "-o", src[0], src[1], "-ldl",
			"-L.", "-lkipimo", "-Wl,-rpath,"+dir)
		if err := compile(ctx, tmp, cc, args); err != nil {
			return nil, err
		}
	}
	if mpicc != "" {
		hand, err := sources.ReadFile("csrc/kipimo_mpi.c")
		if err != nil {
			return nil, err
		}
		all, _ := generateAll(header, hand)
		if err := os.WriteFile(filepath.Join(tmp, mpiAllSource), all, 0o644); err != nil {
			return nil, fmt.Errorf("write the MPI wrappers: %w", err)
		}
		args := append(append([]string{}, cflags...), "-shared", "-o", MPILibrary, mpiAllSource, "-ldl",
			"-L.", "-lkipimo", "-Wl,-rpath,"+dir)
		if err := compile(ctx, tmp, mpicc, args); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(filepath.Join(tmp, ".complete"), []byte(key+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("mark the library build complete: %w", err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, serr := os.Stat(filepath.Join(dir, ".complete")); serr == nil {
			return lib, nil // another process installed the same build first
		}
		return nil, fmt.Errorf("install the event library in %s: %w", dir, err)
	}
	return lib, nil
}

func writeSources(dir string) error {
	return fs.WalkDir(sources, "csrc", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := sources.ReadFile(path)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, d.Name()), b, 0o644); err != nil {
			return fmt.Errorf("write library source %s: %w", d.Name(), err)
		}
		return nil
	})
}

func compile(ctx context.Context, dir, compiler string, args []string) error {
	cmd := exec.CommandContext(ctx, compiler, args...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("build the event library: %s %s: %w\n%s", compiler, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// buildKey identifies a build: the sources, the compilers' versions (for
// mpicc, also the flags it adds, which name the MPI it builds against) and
// the preprocessed mpi.h the MPI wrappers are generated from.
func buildKey(ctx context.Context, cc, mpicc string, header []byte) (string, error) {
	h := sha256.New()
	var names []string
	if err := fs.WalkDir(sources, "csrc", func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			names = append(names, path)
		}
		return err
	}); err != nil {
		return "", err
	}
	sort.Strings(names)
	for _, n := range names {
		b, err := sources.ReadFile(n)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %d\n", n, len(b))
		h.Write(b)
	}
	fmt.Fprintf(h, "cflags %s\nldflags %s\nmpi.h %d\n", strings.Join(cflags, " "), strings.Join(coreLDFlags, " "), len(header))
	h.Write(header)
	// The MPI compiler wrapper counts by what it says (Open MPI's --showme,
	// MPICH's -show: the compiler and flags it runs), not by its name:
	// mpicc and mpicc.openmpi are one build.
	for _, c := range [][]string{{cc, "--version"}, {mpicc, "--showme"}, {mpicc, "-show"}, {mpicc, "--version"}} {
		if c[0] == "" {
			continue
		}
		out, err := exec.CommandContext(ctx, c[0], c[1:]...).CombinedOutput()
		if err != nil && c[1] != "--showme" && c[1] != "-show" {
			return "", fmt.Errorf("ask %s its version: %w", c[0], err)
		}
		name := c[0]
		if name == mpicc {
			name = "mpicc"
		}
		fmt.Fprintf(h, "%s %s\n%s\n", name, c[1], out)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
