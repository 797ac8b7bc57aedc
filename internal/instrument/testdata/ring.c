/*
 * ring.c: the instrumentation tests' MPI + OpenMP program, built with
 * -finstrument-functions. Every call count is known from the arguments:
 *
 *   main
 *     setup                          1 call
 *     iterate                        ITERS calls
 *       exchange                     ITERS: MPI_Isend to rank+1, MPI_Irecv from
 *                                    rank-1 (ring), MPI_Waitall; BYTES each
 *       compute                      ITERS
 *         (OpenMP parallel region, THREADS threads)
 *         kernel                     THREADS * INNER per compute call, on
 *                                    each thread INNER calls
 *           leaf                     one per kernel call
 *       MPI_Allreduce                ITERS (one double)
 *     finish                         1 call
 *
 * Usage: ring ITERS INNER BYTES [SLEEP_US]; SLEEP_US (default 0) makes each
 * iteration sleep that long (in libc, so unrecorded), to make runs last.
 * It prints one line per rank: the rank, the
 * number of ranks and a checksum, so that runs with and without Kipimo can be
 * compared.
 */
#include <mpi.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile double sink;

__attribute__((noinline)) static double leaf(int i) {
	double x = 0;
	for (int k = 0; k < 50; k++)
		x += (double)((i + k) % 7);
	return x;
}

__attribute__((noinline)) static double kernel(int i) { return leaf(i) * 0.5; }

__attribute__((noinline)) static double compute(int inner) {
	double total = 0;
#pragma omp parallel reduction(+ : total)
	{
		for (int i = 0; i < inner; i++)
			total += kernel(i + omp_get_thread_num());
	}
	return total;
}

__attribute__((noinline)) static void exchange(int rank, int size, char *out, char *in, int bytes) {
	MPI_Request req[2];
	MPI_Irecv(in, bytes, MPI_CHAR, (rank + size - 1) % size, 7, MPI_COMM_WORLD, &req[0]);
	MPI_Isend(out, bytes, MPI_CHAR, (rank + 1) % size, 7, MPI_COMM_WORLD, &req[1]);
	MPI_Waitall(2, req, MPI_STATUSES_IGNORE);
}

__attribute__((noinline)) static double iterate(int rank, int size, char *out, char *in, int bytes, int inner) {
	exchange(rank, size, out, in, bytes);
	double local = compute(inner), global = 0;
	MPI_Allreduce(&local, &global, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
	return global;
}

__attribute__((noinline)) static void setup(char *buf, int bytes, int rank) { memset(buf, 'a' + rank % 26, (size_t)bytes); }

__attribute__((noinline)) static void finish(int rank, int size, double sum) { printf("rank %d of %d checksum %.1f\n", rank, size, sum); }

int main(int argc, char **argv) {
	int provided, rank, size;
	MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	int iters = argc > 1 ? atoi(argv[1]) : 100;
	int inner = argc > 2 ? atoi(argv[2]) : 10;
	int bytes = argc > 3 ? atoi(argv[3]) : 1024;
	int pause = argc > 4 ? atoi(argv[4]) : 0;
	char *out = malloc((size_t)bytes), *in = malloc((size_t)bytes);
	setup(out, bytes, rank);
	double sum = 0;
	for (int it = 0; it < iters; it++) {
		sum += iterate(rank, size, out, in, bytes, inner);
		if (pause > 0)
			usleep((useconds_t)pause);
	}
	sink = sum;
	finish(rank, size, sum);
	free(out);
	free(in);
	MPI_Finalize();
	return 0;
}
