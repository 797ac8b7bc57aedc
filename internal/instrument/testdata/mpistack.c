/*
 * mpistack.c: an independent count of every call a program makes to the MPI
 * functions listed below (those that Debian's HPCC, NWChem and LAMMPS and
 * the libraries they link import, C and Fortran entry points), for checking
 * what Kipimo's event library reports IN THE SAME RUN.
 *
 * It is preloaded FIRST (LD_PRELOAD="libmpistack.so <Kipimo's library>"):
 * each of its entry points counts the call and passes it on, with the same
 * arguments, to the next definition of the same symbol in the search order
 * (dlsym(RTLD_NEXT)): Kipimo's wrapper when Kipimo is loaded, the MPI's
 * otherwise. Counting in the run that is measured matters for programs
 * that poll (MPI_Test, MPI_Iprobe in loops), whose counts differ between
 * two runs of the same input.
 *
 * It needs no mpi.h: every argument of these functions is an integer, a
 * handle or a pointer (none is floating point or a structure passed by
 * value), so on x86-64 and AArch64 a forwarder of 16 integer-register-sized
 * arguments passes any of them on unchanged; the rank comes from the
 * launcher's environment. Fortran calls are counted under the MPI name of
 * the function. At exit it writes $MPICOUNT_DIR/count.<rank>, one line per
 * listed function (zeros included), summing the C and Fortran entries:
 *
 *   call MPI_Iprobe 123456
 *
 * Written by hand, sharing nothing with the library it checks.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef long fwd(long, long, long, long, long, long, long, long, long, long, long, long, long, long, long, long);

/* The C entry points: X(symbol). MPI_Wtime and MPI_Wtick (clock reads) and
 * the handle conversions (MPI_Comm_c2f, MPI_Comm_f2c) are not counted: Kipimo
 * leaves them out on purpose (docs/instrumentation.md). */
#define C_FUNCS(X) \
	X(MPI_Abort) X(MPI_Accumulate) X(MPI_Allgather) X(MPI_Allgatherv) X(MPI_Alloc_mem) X(MPI_Allreduce) \
	X(MPI_Alltoall) X(MPI_Alltoallv) X(MPI_Barrier) X(MPI_Bcast) X(MPI_Cancel) X(MPI_Cart_create) \
	X(MPI_Cart_get) X(MPI_Cart_rank) X(MPI_Cart_shift) X(MPI_Comm_create) X(MPI_Comm_dup) X(MPI_Comm_free) \
	X(MPI_Comm_get_attr) X(MPI_Comm_group) X(MPI_Comm_rank) X(MPI_Comm_set_errhandler) X(MPI_Comm_size) \
	X(MPI_Comm_split) X(MPI_Error_class) X(MPI_Error_string) X(MPI_Fetch_and_op) X(MPI_File_close) \
	X(MPI_File_get_size) X(MPI_File_open) X(MPI_File_read_at) X(MPI_File_read_at_all) X(MPI_File_set_size) \
	X(MPI_File_sync) X(MPI_File_write_at) X(MPI_File_write_at_all) X(MPI_Finalize) X(MPI_Finalized) \
	X(MPI_Free_mem) X(MPI_Gather) X(MPI_Gatherv) X(MPI_Get) X(MPI_Get_accumulate) X(MPI_Get_address) \
	X(MPI_Get_count) X(MPI_Get_library_version) X(MPI_Get_processor_name) X(MPI_Get_version) \
	X(MPI_Group_free) X(MPI_Group_incl) X(MPI_Group_translate_ranks) X(MPI_Info_create) X(MPI_Info_free) \
	X(MPI_Info_set) X(MPI_Init) X(MPI_Init_thread) X(MPI_Initialized) X(MPI_Intercomm_create) \
	X(MPI_Intercomm_merge) X(MPI_Iprobe) X(MPI_Irecv) X(MPI_Isend) X(MPI_Issend) X(MPI_Op_create) \
	X(MPI_Op_free) X(MPI_Pack) X(MPI_Pack_size) X(MPI_Probe) X(MPI_Put) X(MPI_Query_thread) X(MPI_Recv) \
	X(MPI_Reduce) X(MPI_Reduce_scatter) X(MPI_Request_free) X(MPI_Rsend) X(MPI_Scan) X(MPI_Scatter) \
	X(MPI_Scatterv) X(MPI_Send) X(MPI_Sendrecv) X(MPI_Ssend) X(MPI_Test) X(MPI_Testall) X(MPI_Testany) \
	X(MPI_Type_commit) X(MPI_Type_contiguous) X(MPI_Type_create_hindexed) \
	X(MPI_Type_create_indexed_block) X(MPI_Type_create_struct) X(MPI_Type_create_subarray) \
	X(MPI_Type_free) X(MPI_Type_get_true_extent) X(MPI_Type_indexed) X(MPI_Type_match_size) \
	X(MPI_Type_size) X(MPI_Type_vector) X(MPI_Unpack) X(MPI_Wait) X(MPI_Waitall) X(MPI_Waitany) \
	X(MPI_Win_allocate) X(MPI_Win_create) X(MPI_Win_flush) X(MPI_Win_flush_all) X(MPI_Win_flush_local) \
	X(MPI_Win_flush_local_all) X(MPI_Win_free) X(MPI_Win_get_attr) X(MPI_Win_lock) X(MPI_Win_lock_all) \
	X(MPI_Win_sync) X(MPI_Win_unlock) X(MPI_Win_unlock_all)

/* The Fortran entry points (gfortran's mpif.h and "use mpi" form):
 * X(symbol, MPI name). mpi_wtime_ is left out as MPI_Wtime is. */
#define F_FUNCS(X) \
	X(mpi_allreduce_, MPI_Allreduce) X(mpi_bcast_, MPI_Bcast) X(mpi_comm_create_, MPI_Comm_create) \
	X(mpi_comm_free_, MPI_Comm_free) X(mpi_comm_group_, MPI_Comm_group) X(mpi_comm_rank_, MPI_Comm_rank) \
	X(mpi_comm_size_, MPI_Comm_size) X(mpi_group_free_, MPI_Group_free) X(mpi_group_incl_, MPI_Group_incl) \
	X(mpi_irecv_, MPI_Irecv) X(mpi_isend_, MPI_Isend) X(mpi_recv_, MPI_Recv) X(mpi_reduce_, MPI_Reduce) \
	X(mpi_send_, MPI_Send) X(mpi_waitall_, MPI_Waitall) X(mpi_init_, MPI_Init) X(mpi_finalize_, MPI_Finalize)

#define C_INDEX(sym) I_##sym,
#define F_INDEX(sym, name) I_##sym,
enum { C_FUNCS(C_INDEX) F_FUNCS(F_INDEX) NENTRIES };

#define C_ENTRY(sym) {#sym, #sym},
#define F_ENTRY(sym, name) {#sym, #name},
static const struct {
	const char *sym, *name;
} entries[NENTRIES] = {C_FUNCS(C_ENTRY) F_FUNCS(F_ENTRY)};

static long calls[NENTRIES];

static fwd *next(int i) {
	fwd *f = (fwd *)dlsym(RTLD_NEXT, entries[i].sym);
	if (f == NULL) {
		fprintf(stderr, "mpistack: no definition of %s after this library\n", entries[i].sym);
		abort();
	}
	return f;
}

#define FORWARD(sym) \
	long sym(long a, long b, long c, long d, long e, long f, long g, long h, long i, long j, long k, long l, \
	         long m, long n, long o, long p) { \
		static fwd *to; \
		fwd *t = __atomic_load_n(&to, __ATOMIC_ACQUIRE); \
		if (t == NULL) { \
			t = next(I_##sym); \
			__atomic_store_n(&to, t, __ATOMIC_RELEASE); \
		} \
		__atomic_fetch_add(&calls[I_##sym], 1, __ATOMIC_RELAXED); \
		return t(a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p); \
	}
#define C_FORWARD(sym) FORWARD(sym)
#define F_FORWARD(sym, name) FORWARD(sym)
C_FUNCS(C_FORWARD)
F_FUNCS(F_FORWARD)

/* rank is this process's rank in MPI_COMM_WORLD as the launcher (Open MPI,
 * Hydra, PMIx) tells it, or -1. */
static int rank(void) {
	static const char *vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"};
	for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
		const char *v = getenv(vars[i]);
		if (v != NULL && *v != '\0')
			return atoi(v);
	}
	return -1;
}

__attribute__((destructor)) static void report(void) {
	const char *dir = getenv("MPICOUNT_DIR");
	int r = rank();
	if (dir == NULL || r < 0)
		return;
	char path[4096];
	snprintf(path, sizeof path, "%s/count.%d", dir, r);
	FILE *out = fopen(path, "w");
	if (out == NULL)
		return;
	for (int i = 0; i < NENTRIES; i++) {
		int first = 1;
		long n = 0;
		for (int j = 0; j < NENTRIES; j++) {
			if (strcmp(entries[j].name, entries[i].name) != 0)
				continue;
			if (j < i)
				first = 0;
			n += __atomic_load_n(&calls[j], __ATOMIC_RELAXED);
		}
		if (first)
			fprintf(out, "call %s %ld\n", entries[i].name, n);
	}
	fclose(out);
}
