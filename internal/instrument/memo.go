package instrument

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// A build memo records what Build concluded for one set of inputs (its
// options, the command, the environment that finds programs and libraries)
// together with a stamp of every file that conclusion rests on: the kipimo
// executable, the command's launcher and program, the program's MPI
// library, the compilers, the MPI headers, the loader's cache and the
// built shared objects. A later Build with the same inputs whose files are
// all unchanged answers from the memo without running ldd or a compiler.
// This matters for `kipimo exec`, which every rank of a job runs: asking
// the compilers and ldd costs about half a second of CPU per process,
// several per cent of a run of a few seconds on a node's cores.
type buildMemo struct {
	Lib   Library     `json:"lib"`
	Files []fileStamp `json:"files"`
}

// fileStamp identifies one version of a file: its path and what stat says
// of it.
type fileStamp struct {
	Path  string `json:"path"`
	Size  int64  `json:"size"`
	MTime int64  `json:"mtime_ns"`
	CTime int64  `json:"ctime_ns"`
	Ino   uint64 `json:"ino"`
}

// stampFile stamps path (after its symbolic links); ok is false when it
// cannot be read.
func stampFile(path string) (fileStamp, bool) {
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real
	}
	st, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, false
	}
	s := fileStamp{Path: path, Size: st.Size(), MTime: st.ModTime().UnixNano()}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		s.Ino = sys.Ino
		s.CTime = sys.Ctim.Sec*1e9 + sys.Ctim.Nsec
	}
	return s, true
}

// memoEnv are the variables, besides the options, that change what Build
// finds: the programs and compilers (PATH, CC, MPICC), the libraries ldd
// resolves (LD_LIBRARY_PATH), the cache, and what the MPI compiler
// wrappers and the C compiler read (the compiler a wrapper runs, its flags,
// its installation, the include and library paths).
var memoEnv = []string{"PATH", "LD_LIBRARY_PATH", "CC", "MPICC", "KIPIMO_CACHE_DIR",
	"OMPI_CC", "OMPI_CPPFLAGS", "OMPI_CFLAGS", "OMPI_LDFLAGS", "OMPI_LIBS", "OPAL_PREFIX",
	"MPICH_CC", "MPICH_CFLAGS", "MPICH_LDFLAGS", "MPICH_LIBS", "I_MPI_CC", "I_MPI_ROOT",
	"CPATH", "C_INCLUDE_PATH", "LIBRARY_PATH"}

// memoPath is the file that holds the memo of a Build with opts (as the
// caller gave them); "" when there is none to keep (no cache directory).
func memoPath(opts BuildOptions) string {
	o := opts
	if o.defaults() != nil {
		return ""
	}
	h := sha256.New()
	wd, _ := os.Getwd()
	fmt.Fprintf(h, "cache %q\ncc %q\nmpicc %q\nmpi %v\nwd %q\n", o.CacheDir, opts.CC, opts.MPICC, o.MPI, wd)
	for _, a := range o.Command {
		fmt.Fprintf(h, "arg %q\n", a)
	}
	for _, k := range memoEnv {
		v, set := os.LookupEnv(k)
		fmt.Fprintf(h, "env %s %v %q\n", k, set, v)
	}
	return filepath.Join(o.CacheDir, "memo", hex.EncodeToString(h.Sum(nil))[:32]+".json")
}

// readMemo returns the library a memo at path records when every file it
// rests on is unchanged.
func readMemo(path string) (*Library, bool) {
	if path == "" {
		return nil, false
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, false
	}
	var m buildMemo
	if json.Unmarshal(b, &m) != nil || len(m.Files) == 0 {
		return nil, false
	}
	for _, f := range m.Files {
		if now, ok := stampFile(f.Path); !ok || now != f {
			return nil, false
		}
	}
	lib := m.Lib
	return &lib, true
}

// memoInputs are the files a Build's result rests on besides the built
// library: the kipimo executable (its sources and detection), the
// command's launcher and program, the program's MPI library, the
// compilers and the loader's cache (which ldd resolves libraries by).
func memoInputs(command []string, cm commandMPI, opts BuildOptions) []string {
	var files []string
	if exe, err := os.Executable(); err == nil {
		files = append(files, exe)
	}
	if len(command) > 0 {
		if p, err := exec.LookPath(command[0]); err == nil {
			files = append(files, p)
		}
	}
	files = append(files, cm.program, cm.mpiLib)
	if _, err := os.Stat("/etc/ld.so.cache"); err == nil {
		files = append(files, "/etc/ld.so.cache") // not every C library has one
	}
	if cc, err := exec.LookPath(opts.CC); err == nil {
		files = append(files, cc)
	}
	if opts.MPI {
		if mpicc, err := exec.LookPath(opts.MPICC); err == nil {
			files = append(files, mpicc)
		}
	}
	return files
}

// headerFiles lists the files mpicc reads for #include <mpi.h> (its -M
// output): the MPI's headers, which a reinstalled MPI may change without
// changing its compiler wrapper.
func headerFiles(ctx context.Context, mpicc string) ([]string, error) {
	cmd := exec.CommandContext(ctx, mpicc, "-M", "-x", "c", "-")
	cmd.Stdin = strings.NewReader("#include <mpi.h>\n")
	out, err := cmd.Output()
	if err != nil {
		return nil, err
	}
	_, deps, ok := bytes.Cut(out, []byte(":"))
	if !ok {
		return nil, fmt.Errorf("%s -M: no dependency list", mpicc)
	}
	var files []string
	for _, f := range strings.Fields(string(deps)) {
		if f != "\\" {
			files = append(files, f)
		}
	}
	return files, nil
}

// writeMemo records lib as the result of the Build whose memo lives at
// path, resting on files (which must all be readable) and on the built
// shared objects. A memo that cannot be written is no error: the next
// Build works it all out again.
func writeMemo(ctx context.Context, path string, lib *Library, files []string, mpicc string) {
	if path == "" {
		return
	}
	if lib.MPI != "" {
		hdrs, err := headerFiles(ctx, mpicc)
		if err != nil {
			return
		}
		files = append(files, hdrs...)
	}
	for _, f := range []string{lib.Core, lib.MPI, lib.OpenCL, lib.Kokkos, filepath.Join(lib.Dir, ".complete")} {
		if f != "" {
			files = append(files, f)
		}
	}
	m := buildMemo{Lib: *lib}
	seen := map[string]bool{}
	for _, f := range files {
		if f == "" || seen[f] {
			continue
		}
		seen[f] = true
		s, ok := stampFile(f)
		if !ok {
			return
		}
		m.Files = append(m.Files, s)
	}
	b, err := json.Marshal(m)
	if err != nil || os.MkdirAll(filepath.Dir(path), 0o755) != nil {
		return
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".memo-")
	if err != nil {
		return
	}
	_, werr := tmp.Write(b)
	if cerr := tmp.Close(); werr != nil || cerr != nil || os.Rename(tmp.Name(), path) != nil {
		os.Remove(tmp.Name())
	}
}
