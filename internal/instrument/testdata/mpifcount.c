/*
 * mpifcount.c: an independent count of a Fortran program's MPI calls, for
 * checking what Kipimo's event library reports. Preloaded alone (never
 * together with Kipimo's wrappers), it defines the Fortran entry points of a
 * few MPI functions in the forms gfortran calls them (mpi_x_ for mpif.h and
 * "use mpi", mpi_x_f08_ or mpi_x_f08ts_ for "use mpi_f08"), counts each
 * call, passes it on to the MPI's definition of the same symbol (the next
 * one, found with dlsym), and at MPI_Finalize writes
 * $MPICOUNT_DIR/count.<rank>:
 *
 *   call MPI_Allreduce 1000
 *
 * Written by hand, sharing nothing with the library it checks.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

enum { INIT, RANK, SIZE, VERSION, SRR, ALLREDUCE, FINALIZE, NFUNCS };
static const char *names[NFUNCS] = {"MPI_Init", "MPI_Comm_rank", "MPI_Comm_size", "MPI_Get_version",
                                    "MPI_Sendrecv_replace", "MPI_Allreduce", "MPI_Finalize"};
static long calls[NFUNCS];

typedef void fn(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *);

static fn *real(const char *name) {
	fn *f = (fn *)dlsym(RTLD_NEXT, name);
	if (f == NULL) {
		fprintf(stderr, "mpifcount: no %s\n", name);
		abort();
	}
	return f;
}

static void report(void) {
	int rank = 0;
	PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
	const char *dir = getenv("MPICOUNT_DIR");
	char path[4096];
	snprintf(path, sizeof path, "%s/count.%d", dir ? dir : ".", rank);
	FILE *f = fopen(path, "w");
	if (f == NULL)
		return;
	for (int i = 0; i < NFUNCS; i++)
		fprintf(f, "call %s %ld\n", names[i], calls[i]);
	fclose(f);
}

#define ONE(sym, k) \
	void sym(void *a) { calls[k]++; real(#sym)(a, 0, 0, 0, 0, 0, 0, 0, 0, 0); }
#define THREE(sym, k) \
	void sym(void *a, void *b, void *c) { calls[k]++; real(#sym)(a, b, c, 0, 0, 0, 0, 0, 0, 0); }
#define SEVEN(sym, k) \
	void sym(void *a, void *b, void *c, void *d, void *e, void *f, void *g) { \
		calls[k]++; \
		real(#sym)(a, b, c, d, e, f, g, 0, 0, 0); \
	}
#define TEN(sym, k) \
	void sym(void *a, void *b, void *c, void *d, void *e, void *f, void *g, void *h, void *i, void *j) { \
		calls[k]++; \
		real(#sym)(a, b, c, d, e, f, g, h, i, j); \
	}
#define FINAL(sym) \
	void sym(void *a) { \
		calls[FINALIZE]++; \
		report(); \
		real(#sym)(a, 0, 0, 0, 0, 0, 0, 0, 0, 0); \
	}

ONE(mpi_init_, INIT)
ONE(mpi_init_f08_, INIT)
THREE(mpi_comm_rank_, RANK)
THREE(mpi_comm_rank_f08_, RANK)
THREE(mpi_comm_size_, SIZE)
THREE(mpi_comm_size_f08_, SIZE)
THREE(mpi_get_version_, VERSION)
THREE(mpi_get_version_f08_, VERSION)
TEN(mpi_sendrecv_replace_, SRR)
TEN(mpi_sendrecv_replace_f08_, SRR)
TEN(mpi_sendrecv_replace_f08ts_, SRR)
SEVEN(mpi_allreduce_, ALLREDUCE)
SEVEN(mpi_allreduce_f08_, ALLREDUCE)
SEVEN(mpi_allreduce_f08ts_, ALLREDUCE)
FINAL(mpi_finalize_)
FINAL(mpi_finalize_f08_)
