package main

import _ "embed"

// prelude is the fixed C text between the file header and the wrappers: the
// includes and the static helpers the wrappers' snippets call. It is kept as
// a C file (cprelude/prelude.c) so that editors, compilers and linters read it as C;
// it is a fragment of kipimo_mpi.c and includes that file's headers.
//
//go:embed cprelude/prelude.c
var prelude string
