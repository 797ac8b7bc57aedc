package instrument

import (
	"context"
	"path/filepath"
	"strings"
)

// Variables through which Kokkos loads a tools library: KOKKOS_TOOLS_LIBS
// (Kokkos 4) and KOKKOS_PROFILE_LIBRARY (older releases, Debian's Kokkos 3).
const (
	kokkosToolsVar   = "KOKKOS_TOOLS_LIBS"
	kokkosProfileVar = "KOKKOS_PROFILE_LIBRARY"
)

// detectDevices says whether the program command runs (program, when
// already found) loads an OpenCL ICD loader (libOpenCL) or Kokkos's core
// library (libkokkoscore, Trilinos's libtrilinos_kokkoscore), from the
// shared libraries ldd lists for it.
func detectDevices(ctx context.Context, command []string, program string) (opencl, kokkos bool) {
	if program == "" {
		program = commandProgram(command)
	}
	if program == "" {
		return false, false
	}
	for name := range sharedLibs(ctx, program) {
		base := filepath.Base(name)
		opencl = opencl || strings.HasPrefix(base, "libOpenCL.so")
		kokkos = kokkos || strings.Contains(base, "kokkoscore")
	}
	return opencl, kokkos
}

// kokkosEnv is what points Kokkos at the connector: both variables, unless
// base already names a tools library (the program's own choice stays).
func (l *Library) kokkosEnv(base []string) map[string]string {
	if !l.UseKokkos || l.Kokkos == "" {
		return nil
	}
	for _, kv := range base {
		k, v, _ := strings.Cut(kv, "=")
		if (k == kokkosToolsVar || k == kokkosProfileVar) && v != "" {
			return nil
		}
	}
	return map[string]string{kokkosToolsVar: l.Kokkos, kokkosProfileVar: l.Kokkos}
}
