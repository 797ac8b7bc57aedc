/*
 * halo.c: a halo-exchange proxy, built with -finstrument-functions. The
 * ranks form a ring; each iteration every rank
 *
 *   compute      a fixed amount of arithmetic (WORK units): on a slowed
 *                rank it takes longer
 *   halo         MPI_Irecv from both neighbours, MPI_Isend to both,
 *                MPI_Waitall on the four: a late rank holds up its two
 *                neighbours
 *   reduce       MPI_Allreduce of one double: every rank waits for the last
 *
 * Usage: halo ITERS WORK BYTES [PIDDIR]; with PIDDIR each rank writes its
 * process id to PIDDIR/rank<R>.pid once MPI is up (for a harness that slows
 * one rank down). It prints one line per rank: the rank, the number of
 * ranks and a checksum.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile double sink;

__attribute__((noinline)) static double compute(long work) {
	double x = 0;
	for (long i = 0; i < work * 1000; i++)
		x += (double)(i % 13) * 0.5;
	sink = x;
	return x;
}

__attribute__((noinline)) static void halo(int rank, int size, char *out, char *in, int bytes) {
	int left = (rank + size - 1) % size, right = (rank + 1) % size;
	MPI_Request req[4];
	MPI_Irecv(in, bytes, MPI_CHAR, left, 1, MPI_COMM_WORLD, &req[0]);
	MPI_Irecv(in + bytes, bytes, MPI_CHAR, right, 2, MPI_COMM_WORLD, &req[1]);
	MPI_Isend(out, bytes, MPI_CHAR, right, 1, MPI_COMM_WORLD, &req[2]);
	MPI_Isend(out, bytes, MPI_CHAR, left, 2, MPI_COMM_WORLD, &req[3]);
	MPI_Waitall(4, req, MPI_STATUSES_IGNORE);
}

__attribute__((noinline)) static double reduce(double x) {
	double sum = 0;
	MPI_Allreduce(&x, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
	return sum;
}

int main(int argc, char **argv) {
	MPI_Init(&argc, &argv);
	int rank, size;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (argc < 4) {
		if (rank == 0)
			fprintf(stderr, "usage: halo ITERS WORK BYTES [PIDDIR]\n");
		MPI_Finalize();
		return 2;
	}
	int iters = atoi(argv[1]), bytes = atoi(argv[3]);
	long work = atol(argv[2]);
	if (argc > 4) {
		char path[4096];
		snprintf(path, sizeof path, "%s/rank%d.pid", argv[4], rank);
		FILE *f = fopen(path, "w");
		if (f) {
			fprintf(f, "%d\n", (int)getpid());
			fclose(f);
		}
	}
	char *out = malloc((size_t)bytes), *in = malloc(2 * (size_t)bytes);
	memset(out, rank & 0xff, (size_t)bytes);
	double check = 0;
	for (int it = 0; it < iters; it++) {
		double x = compute(work);
		halo(rank, size, out, in, bytes);
		check += reduce(x * 1e-9 + in[0] + in[bytes]);
	}
	printf("rank %d of %d: %.6g\n", rank, size, check);
	free(out);
	free(in);
	MPI_Finalize();
	return 0;
}
